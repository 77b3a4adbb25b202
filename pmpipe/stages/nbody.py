"""Stage ``nbody``: particle-mesh evolution from the ICs to a_final.

Reads ``ic.zarr``; writes ``nbody.zarr`` (docs/outputs.md): ``density`` (a, x, y, z) on the
force mesh (or means over f^3 cells) at every snapshot and the final ``displacement`` /
``momentum`` (qx, qy, qz, component); with a lightcone, the planes ``lightcone_density``
(plane, u, v) and, for full-sky lensing, ``lightcone_healpix`` (plane, pixel), captured as the
light cone crosses them. ``outputs`` decides which of them the store keeps.
"""

from __future__ import annotations

import functools
import sys
import time
from pathlib import Path

import jax
import numpy as np
from jax.sharding import Mesh

from pmpipe import config, cosmology, lightcone, nbody, painting, store
from pmpipe.parallel import FIELD_SPEC
from pmpipe.stages import Inputs, Progress, main, store_path
from pmpipe.stages.layout import write_lagrangian_coordinates, write_particles


def mesh_node_positions(grid: nbody.PMGrid) -> np.ndarray:
    """Comoving positions (Mpc/h) of the force-mesh nodes: x_j = (j - (B - 1)/2) L / (N B)."""
    cell = grid.box_size / grid.mesh
    return (np.arange(grid.mesh) - (grid.oversample - 1) / 2) * cell


RAYS_PER_PIXEL_SIDE = 2  # full-sky shells are sampled on 4 rays per pixel, then averaged


class LightconeCapture:
    """Receives the particles at each plane's crossing time during the N-body (as
    ``on_crossing``) and keeps the plane's flat projection and, for full-sky lensing, its
    HEALPix shell."""

    def __init__(self, cfg: config.Run, mesh: Mesh, progress: Progress):
        self.cfg, self.mesh, self.progress = cfg, mesh, progress
        self.grid = grid = cfg.pm_grid()
        self.planes = cfg.planes()
        self.transforms = lightcone.plane_transforms(cfg.ic.seed, len(self.planes), self.grid.mesh,
                                                     cfg.lightcone.randomize)
        full = cfg.lensing.full_sky if cfg.lensing is not None else None
        self.nside = full.nside if full is not None else None
        self.directions = None
        if self.nside is not None:
            import healpy

            fine = self.nside * RAYS_PER_PIXEL_SIDE  # rays through sub-pixels, averaged per pixel
            self.directions = jax.device_put(  # on the devices once, for every plane
                np.stack(healpy.pix2vec(fine, np.arange(healpy.nside2npix(fine))), axis=-1)
                .astype(cfg.nbody.dtype))
        self.k_max = lightcone.shell_k_max(grid.particles, grid.mesh, cfg.box.box_size)
        self.flat, self.shells, self.needed = {}, {}, 0

    def __call__(self, j: int, disp) -> None:
        with self.progress.timed("lightcone"):
            self._capture(j, disp)
        self.progress(f"lightcone plane {j} at chi = {self.planes.chi[j]:.0f} Mpc/h, "
                      f"a = {self.planes.a[j]:.4f}")

    def _capture(self, j: int, disp) -> None:
        grid, box = self.grid, self.cfg.box.box_size
        rho, needed = painting.paint(disp, self.mesh, grid.mesh, box, grid.halo,
                                     mass=float(grid.oversample**3))
        self.needed = max(self.needed, int(needed))
        painting.check_halo(self.needed, grid.halo)
        transform = self.transforms[j]
        self.flat[j] = lightcone.flat_plane(rho, self.mesh, box, self.cfg.plane_cells(), transform)
        if self.nside is not None:
            import healpy

            fine = np.asarray(lightcone.shell_healpix(
                lightcone.band_limited_overdensity(rho, self.mesh, box, self.k_max), self.mesh, box,
                self.directions, float(self.planes.chi_edges[j]), float(self.planes.chi_edges[j + 1]),
                self.cfg.lightcone.observer, transform), np.float64)
            self.shells[j] = healpy.ud_grade(fine, self.nside).astype(np.float32)
        jax.block_until_ready(self.flat[j])

    def write(self, group, planes_kept: bool) -> None:
        """The planes' distances, scale factors and transforms into the store, and with
        ``planes_kept`` (outputs.lightcone) the planes themselves."""
        missing = sorted(set(range(len(self.planes))) - set(self.flat))
        if missing:
            raise RuntimeError(f"lightcone planes {missing} were never crossed during the N-body")
        planes, cell = self.planes, self.cfg.box.box_size / self.grid.mesh
        store.write_coordinate(group, "plane", planes.chi, "Mpc/h",
                               "comoving distance of the plane's centre from the observer")
        store.write_array(group, "plane_a", planes.a, ("plane",), "1",
                          "scale factor at which the light cone crosses the plane's centre")
        store.write_array(group, "plane_chi_lo", planes.chi_edges[:-1], ("plane",), "Mpc/h",
                          "comoving distance of the plane's near edge")
        store.write_array(group, "plane_chi_hi", planes.chi_edges[1:], ("plane",), "Mpc/h",
                          "comoving distance of the plane's far edge")
        observer = self.cfg.lightcone.observer
        group.attrs.update({
            "plane_thickness": self.cfg.plane_thickness(), "plane_cells": self.cfg.plane_cells(),
            "observer": list(observer), "lightcone_needed_halo_cells": self.needed,
            "plane_transforms": [
                {"axes": list(t.axes), "flips": list(t.flips), "shift_cells": list(t.shift),
                 "offsets": list(lightcone.plane_offsets(observer, t))} for t in self.transforms]})
        if not planes_kept:
            return
        for axis in "uv":
            store.write_coordinate(group, axis, np.arange(self.grid.mesh) * cell, "Mpc/h",
                                   f"transverse {axis} of the plane grid (observer axes)")
        first = self.flat[0]
        array = store.create_array(
            group, "lightcone_density", (len(planes),) + first.shape, first.dtype,
            ("plane", "u", "v"), "Mpc/h",
            "projected overdensity of the plane, integral of delta along the line of sight, "
            "plane mean removed (CIC window not divided out)", (1,) + store.block_chunks(first))
        for j in range(len(planes)):
            store.write_blocks(array, self.flat[j], (j,))
        if self.nside is not None:
            shells = np.stack([self.shells[j] for j in range(len(planes))])
            store.write_array(group, "lightcone_healpix", shells, ("plane", "pixel"), "Mpc/h",
                              "projected overdensity of the shell on HEALPix pixel centres, "
                              "sphere mean removed", grid_name="HEALPix", nside=self.nside,
                              nest=False)

    def keep(self, inputs: Inputs) -> None:
        """Hand the planes and shells to the lensing stage of this process."""
        for j, plane in self.flat.items():
            inputs.keep("nbody", "lightcone_density", plane, (j,))
        if self.nside is not None:
            inputs.keep("nbody", "lightcone_healpix",
                        np.stack([self.shells[j] for j in range(len(self.planes))]))


def _block_mean(block, factor: int):
    x, y, z = (n // factor for n in block.shape)
    return block.reshape(x, factor, y, factor, z, factor).mean(axis=(1, 3, 5))


@functools.partial(jax.jit, static_argnames=("factor", "mesh"))
def downsample(field, factor: int, mesh: Mesh):
    """Means over factor^3 cells of a sharded (M, M, M) field: (M/f, M/f, M/f), each device
    averaging its own block (f divides the block)."""
    return jax.shard_map(functools.partial(_block_mean, factor=factor), mesh=mesh,
                         in_specs=FIELD_SPEC, out_specs=FIELD_SPEC)(field)


def run(run_file: config.RunFile, run_dir: Path, inputs: Inputs, progress: Progress) -> Path:
    """Evolve the run's ICs and write the snapshots, final particles and lightcone planes as
    far as outputs keeps them (all kept for the next stages); returns the path."""
    cfg, mesh = run_file.config, inputs.mesh
    started = store.now()
    ic = inputs.store("ic")
    disp = inputs.field("ic", "displacement")
    mom = inputs.field("ic", "momentum")
    a_init, a_final = float(ic.attrs["a_init"]), cfg.nbody.a_final
    snapshots = sorted({float(a) for a in cfg.nbody.snapshots} | {a_final})
    bounds = nbody.step_boundaries(a_init, a_final, cfg.nbody.steps, snapshots)
    grid = cfg.pm_grid()
    cosmo = cfg.cosmology_params()
    progress(f"{len(bounds) - 1} steps from a = {a_init} to {a_final} on a {grid.mesh}^3 mesh")
    capture = LightconeCapture(cfg, mesh, progress) if cfg.lightcone is not None else None
    evolving = time.perf_counter()
    result = nbody.evolve(cosmo, disp, mom, bounds, mesh, grid, snapshots,
                          cosmology.growth_table(cosmo), progress.step,
                          capture.planes.a if capture else (), capture)
    jax.block_until_ready((result.disp, result.mom))
    progress.physics["pm_steps"] = (time.perf_counter() - evolving
                                    - progress.physics.get("lightcone", 0.0))
    out = cfg.outputs
    path = store_path(run_dir, "nbody")
    group = store.create(path, store.provenance(run_file, "nbody", mesh, started) | {
        "a_init": a_init, "a_final": a_final, "step_boundaries": [float(a) for a in bounds],
        "needed_halo_cells": int(result.needed_halo),
        "step_seconds": [round(t, 4) for t in result.step_seconds],
        "density_kept": out.density, "particles_kept": out.particles,
        "lightcone_kept": out.lightcone}, keepbits=out.keepbits)
    store.write_coordinate(group, "a", snapshots, "1", "scale factor of the snapshot")
    if out.density != "none":
        factor = 1 if out.density == "full" else out.density
        nodes = mesh_node_positions(grid).reshape(-1, factor).mean(axis=1)
        for axis in "xyz":
            store.write_coordinate(group, axis, nodes, "Mpc/h",
                                   f"comoving {axis} of the force-mesh nodes"
                                   + (f" (centres of {factor}^3 cells)" if factor > 1 else ""))
        kept = [result.snapshots[a] if factor == 1 else downsample(result.snapshots[a], factor, mesh)
                for a in snapshots]
        density = store.create_array(
            group, "density", (len(snapshots),) + kept[0].shape, kept[0].dtype,
            ("a", "x", "y", "z"), "1", "matter density in units of the mean, rho / rho_mean (CIC)"
            + (f", mean over {factor}^3 force-mesh cells" if factor > 1 else ""),
            (1,) + store.block_chunks(kept[0]), downsampled=factor)
        for i, field in enumerate(kept):
            store.write_blocks(density, field, (i,))
    if out.particles:
        write_lagrangian_coordinates(group, grid.particles, grid.box_size)
        write_particles(group, result.disp, result.mom, a_final)
    if capture is not None:
        capture.write(group, out.lightcone)
    store.mark_complete(group)
    for i, a in enumerate(snapshots):
        inputs.keep("nbody", "density", result.snapshots[a], (i,))
    inputs.keep("nbody", "displacement", result.disp)
    if capture is not None:
        capture.keep(inputs)
    return path


if __name__ == "__main__":
    sys.exit(main("nbody"))
