"""Stage ``nbody``: particle-mesh evolution from the ICs to a_final.

Reads ``ic.zarr``; writes ``nbody.zarr`` (docs/outputs.md): ``density`` (a, x, y, z) on the
force mesh at every snapshot and the final ``displacement`` / ``momentum``
(qx, qy, qz, component).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from jax.sharding import Mesh

from pmpipe import config, cosmology, nbody, store
from pmpipe.stages import Progress, main, store_path
from pmpipe.stages.layout import write_lagrangian_coordinates, write_particles


def mesh_node_positions(grid: nbody.PMGrid) -> np.ndarray:
    """Comoving positions (Mpc/h) of the force-mesh nodes: x_j = (j - (B - 1)/2) L / (N B)."""
    cell = grid.box_size / grid.mesh
    return (np.arange(grid.mesh) - (grid.oversample - 1) / 2) * cell


def run(run_file: config.RunFile, run_dir: Path, mesh: Mesh, progress: Progress) -> Path:
    """Evolve the run's ICs and write the snapshots and final particles; returns the path."""
    cfg = run_file.config
    started = store.now()
    ic = store.open_complete(store_path(run_dir, "ic"), run_file.config_hash)
    disp = store.read_sharded(ic["displacement"], mesh)
    mom = store.read_sharded(ic["momentum"], mesh)
    a_init, a_final = float(ic.attrs["a_init"]), cfg.nbody.a_final
    snapshots = sorted({float(a) for a in cfg.nbody.snapshots} | {a_final})
    bounds = nbody.step_boundaries(a_init, a_final, cfg.nbody.steps, snapshots)
    grid = cfg.pm_grid()
    cosmo = cfg.cosmology_params()
    progress(f"{len(bounds) - 1} steps from a = {a_init} to {a_final} on a {grid.mesh}^3 mesh")
    result = nbody.evolve(cosmo, disp, mom, bounds, mesh, grid, snapshots,
                          cosmology.growth_table(cosmo), progress.step)
    path = store_path(run_dir, "nbody")
    group = store.create(path, store.provenance(run_file, "nbody", mesh, started) | {
        "a_init": a_init, "a_final": a_final, "step_boundaries": [float(a) for a in bounds],
        "needed_halo_cells": int(result.needed_halo),
        "step_seconds": [round(t, 4) for t in result.step_seconds]})
    store.write_coordinate(group, "a", snapshots, "1", "scale factor of the snapshot")
    for axis in "xyz":
        store.write_coordinate(group, axis, mesh_node_positions(grid), "Mpc/h",
                               f"comoving {axis} of the force-mesh nodes")
    write_lagrangian_coordinates(group, grid.particles, grid.box_size)
    first = result.snapshots[snapshots[0]]
    density = store.create_array(
        group, "density", (len(snapshots),) + first.shape, first.dtype, ("a", "x", "y", "z"),
        "1", "matter density in units of the mean, rho / rho_mean (CIC)",
        (1,) + store.block_chunks(first))
    for i, a in enumerate(snapshots):
        store.write_blocks(density, result.snapshots[a], (i,))
    write_particles(group, result.disp, result.mom, a_final)
    store.mark_complete(group)
    return path


if __name__ == "__main__":
    sys.exit(main("nbody"))
