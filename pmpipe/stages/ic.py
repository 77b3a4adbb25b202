"""Stage ``ic``: white noise -> linear density at a = 1 -> LPT particle state at a_init.

Writes ``ic.zarr`` (docs/outputs.md): ``linear_density`` (x, y, z) on the particle grid and
``displacement`` / ``momentum`` (qx, qy, qz, component) at ``a_init``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from pmpipe import config, cosmology, ics, simulation, store
from pmpipe.stages import Inputs, Progress, main, store_path
from pmpipe.stages.layout import write_lagrangian_coordinates, write_particles


def run(run_file: config.RunFile, run_dir: Path, inputs: Inputs, progress: Progress) -> Path:
    """Compute and write the run's ICs (kept for the next stages); returns the store's path."""
    cfg, mesh = run_file.config, inputs.mesh
    started = store.now()
    cosmo = cfg.cosmology_params()
    n, box_size, a_init = cfg.box.particles, cfg.box.box_size, cfg.ic.a_init
    dtype = np.dtype(cfg.nbody.dtype)
    noise = ics.white_noise(cfg.ic.seed, n, mesh, dtype)
    init = simulation.initial_conditions(
        cosmo, noise, cfg.linear_power(), mesh, box_size, a_init, cfg.ic.lpt_order,
        cfg.ic.fixed_amplitude, cfg.ic.paired, cosmology.growth_table(cosmo))
    progress(f"{cfg.ic.lpt_order}LPT at a = {a_init} on {n}^3 particles")
    path = store_path(run_dir, "ic")
    group = store.create(path, store.provenance(run_file, "ic", mesh, started)
                         | {"a_init": a_init, "seed": cfg.ic.seed})
    spacing = box_size / n
    for axis in "xyz":
        store.write_coordinate(group, axis, np.arange(n) * spacing, "Mpc/h",
                               f"comoving {axis} of the particle-grid nodes")
    write_lagrangian_coordinates(group, n, box_size)
    store.write_array(group, "linear_density", init.delta_linear, ("x", "y", "z"), "1",
                      "linear density contrast at a = 1")
    write_particles(group, init.disp, init.mom, a_init)
    store.mark_complete(group)
    inputs.keep("ic", "linear_density", init.delta_linear)
    inputs.keep("ic", "displacement", init.disp)
    inputs.keep("ic", "momentum", init.mom)
    return path


if __name__ == "__main__":
    sys.exit(main("ic"))
