"""Stage ``ic``: white noise -> linear density at a = 1 -> LPT particle state at a_init.

Writes ``ic.zarr`` (docs/outputs.md): ``linear_density`` (x, y, z) on the particle grid and
``displacement`` / ``momentum`` (qx, qy, qz, component) at ``a_init``, as far as
``outputs.ic`` keeps them (the seed and config always: the ICs can be made again), and always
the linear P(k) at a = 1 they were drawn from (``linear_power`` over ``k_linear``) with its
source in the attribute ``linear_power``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from pmpipe.run import derive
from pmpipe.stages import store_path
from pmpipe.stages.inputs import Inputs, ic_fields
from pmpipe.stages.layout import write_lagrangian_coordinates, write_particles
from pmpipe.stages.progress import Progress
from pmpipe.storage import provenance, store


def run(setup: derive.RunSetup, inputs: Inputs, progress: Progress) -> Path:
    """Compute the run's ICs (kept for the next stages) and write what outputs.ic keeps;
    returns the store's path."""
    mesh, kept = setup.grid.mesh, setup.kept
    started = store.now()
    n, box_size, a_init = setup.grid.particles, setup.grid.box_size, setup.a_init
    init = derive.initial_conditions(setup, progress.timed)
    progress(f"{setup.ic.lpt_order}LPT at a = {a_init} on {n}^3 particles")
    path = store_path(inputs.run_dir, "ic")
    group = store.create(
        path,
        provenance.provenance(setup.run_file, "ic", mesh, started, inputs.made_from("ic"))
        | {
            "a_init": a_init,
            "seed": setup.seed,
            "kept": kept.ic,
            "linear_power": derive.linear_power_source(setup),
        },
        keepbits=kept.keepbits,
    )
    k, pk = derive.linear_power_table(setup)
    store.write_coordinate(group, "k_linear", k, "h/Mpc", "wavenumber of the linear power")
    store.write_array(
        group, "linear_power", pk, ("k_linear",), "(Mpc/h)^3", "linear matter power at a = 1"
    )
    if kept.ic != "none":
        spacing = box_size / n
        for axis in "xyz":
            store.write_coordinate(
                group,
                axis,
                np.arange(n) * spacing,
                "Mpc/h",
                f"comoving {axis} of the particle-grid nodes",
            )
        store.write_array(
            group,
            "linear_density",
            init.delta_linear,
            ("x", "y", "z"),
            "1",
            "linear density contrast at a = 1",
        )
    if kept.ic == "all":
        write_lagrangian_coordinates(group, n, box_size)
        write_particles(group, init.disp, init.mom, a_init)
    store.mark_complete(group)
    for name, data in ic_fields(init).items():
        inputs.keep("ic", name, data)
    return path


if __name__ == "__main__":
    from pmpipe.stages import runner

    sys.exit(runner.main("ic", run))
