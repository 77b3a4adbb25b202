"""Stage ``nbody``: particle-mesh evolution from the ICs to a_final.

Reads ``ic.zarr``; writes ``nbody.zarr`` (docs/outputs.md): ``density`` (a, x, y, z) on the
force mesh (or means over f^3 cells) at every snapshot and the final ``displacement`` /
``momentum`` (qx, qy, qz, component); with a lightcone, the planes ``lightcone_density``
(plane, u, v) and, for full-sky lensing, the shells ``lightcone_healpix`` (plane, pixel) with
their harmonic coefficients ``lightcone_healpix_alm`` (plane, alm), captured as the light cone
crosses them. ``outputs`` decides which of them the store keeps.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from pmpipe.physics.evolution import lightcone, particle_mesh, sky
from pmpipe.physics.mesh.domain import Grid
from pmpipe.run import derive
from pmpipe.run.setup_parts import LightconeSetup
from pmpipe.runtime import parallel
from pmpipe.runtime.parallel import FIELD_SPEC
from pmpipe.stages import store_path
from pmpipe.stages.inputs import Inputs
from pmpipe.stages.layout import write_lagrangian_coordinates, write_particles
from pmpipe.stages.progress import Progress, StepClock
from pmpipe.storage import checkpoint, encoding, provenance, store


def mesh_node_positions(grid: Grid) -> np.ndarray:
    """Comoving positions (Mpc/h) of the force-mesh nodes: x_j = (j - (B - 1)/2) L / (N B)."""
    return (np.arange(grid.force_cells) - (grid.oversample - 1) / 2) * grid.cell_size


class LightconeCapture:
    """The lightcone planes of a run: the :class:`pmpipe.physics.evolution.lightcone.Capture` the N-body program
    fills as the light cone crosses them, then the planes' flat projections and, for full-sky
    lensing, their HEALPix shells: harmonic coefficients up to ℓ = 3 nside - 1 of the rays'
    samples (:func:`pmpipe.physics.evolution.lightcone.shell_alm`) and their maps."""

    def __init__(self, setup: derive.RunSetup, cone: LightconeSetup):
        grid = setup.grid
        self.cone, self.grid, self.planes = cone, grid, cone.planes
        self.transforms = lightcone.plane_transforms(
            setup.seed,
            len(self.planes),
            grid.force_cells,
            cone.randomize,
            cone.planes_per_copy,
            cone.plane_cells,
        )
        full = setup.lensing.full if setup.lensing is not None else None
        self.nside = full.nside if full is not None else None
        rays_nside, self.k_max = None, np.zeros(len(self.planes))
        if full is not None:
            rays_nside, self.k_max = sky.rays_nside(full.nside), full.shell_k_max
        self.capture = lightcone.capture_plan(
            self.planes,
            self.transforms,
            cone.observer,
            grid,
            cone.plane_cells,
            rays_nside,
            self.k_max,
        )
        self.flat: dict[int, jax.Array] = {}
        self.alm: np.ndarray | None = None
        self.needed = 0

    def receive(self, result: particle_mesh.NBodyResult) -> None:
        """Take the planes from the N-body's result."""
        self.needed = int(result.needed_halo)
        planes = result.planes
        assert planes is not None  # the program captured the planes of its plan
        self.flat = {j: planes[j] for j in range(len(self.planes))}
        if self.nside is not None:
            rays = parallel.to_host(result.shells)[: len(self.planes)].astype(
                np.float64
            )  # rows beyond: padding
            self.alm = np.stack([lightcone.shell_alm(r, self.nside) for r in rays])

    def write(self, group, planes_kept: bool) -> None:
        """The planes' distances, scale factors and transforms into the store, and with
        ``planes_kept`` (outputs.lightcone) the planes themselves."""
        self._write_geometry(group)
        if planes_kept:
            self._write_flat(group)
            if self.nside is not None and self.alm is not None:
                self._write_shells(group, self.nside, self.alm)

    def _write_geometry(self, group) -> None:
        """Each plane's distances and scale factor, the band limits of the shells and the
        transforms the planes were seen through."""
        missing = sorted(set(range(len(self.planes))) - set(self.flat))
        if missing:
            raise RuntimeError(f"lightcone planes {missing} were never crossed during the N-body")
        planes = self.planes
        store.write_coordinate(
            group,
            "plane",
            planes.chi,
            "Mpc/h",
            "comoving distance of the plane's centre from the observer",
        )
        store.write_array(
            group,
            "plane_a",
            planes.a,
            ("plane",),
            "1",
            "scale factor at which the light cone crosses the plane's centre",
        )
        store.write_array(
            group,
            "plane_chi_lo",
            planes.chi_edges[:-1],
            ("plane",),
            "Mpc/h",
            "comoving distance of the plane's near edge",
        )
        store.write_array(
            group,
            "plane_chi_hi",
            planes.chi_edges[1:],
            ("plane",),
            "Mpc/h",
            "comoving distance of the plane's far edge",
        )
        if self.nside is not None:
            store.write_array(
                group,
                "plane_k_max_healpix",
                self.k_max,
                ("plane",),
                "h/Mpc",
                "band limit of the density sampled for the plane's full-sky shell",
            )
        observer = self.cone.observer
        group.update_attributes(
            {
                "plane_thickness": self.cone.plane_thickness,
                "plane_cells": self.cone.plane_cells,
                "observer": list(observer),
                "lightcone_needed_halo_cells": self.needed,
                "plane_transforms": [
                    {
                        "axes": list(t.axes),
                        "flips": list(t.flips),
                        "shift_cells": list(t.shift),
                        "slab_cells": t.slab,
                        "offsets": list(lightcone.plane_offsets(observer, t)),
                    }
                    for t in self.transforms
                ],
            }
        )

    def _write_flat(self, group) -> None:
        """The flat planes (plane, u, v), block by block."""
        planes, cell = self.planes, self.grid.cell_size
        for axis in "uv":
            store.write_coordinate(
                group,
                axis,
                np.arange(self.grid.force_cells) * cell,
                "Mpc/h",
                f"transverse {axis} of the plane grid (observer axes)",
            )
        first = self.flat[0]
        array = store.create_array(
            group,
            "lightcone_density",
            (len(planes),) + first.shape,
            first.dtype,
            store.Labels(
                ("plane", "u", "v"),
                "Mpc/h",
                "projected overdensity of the plane, integral of delta along the line of sight, "
                "plane mean removed (CIC window not divided out)",
            ),
            (1,) + encoding.block_shards(first),
        )
        for j in range(len(planes)):
            store.write_blocks(array, self.flat[j], (j,))

    def _write_shells(self, group, nside: int, alm: np.ndarray) -> None:
        """The full-sky shells' maps (plane, pixel) and harmonic coefficients (plane, alm) of
        HEALPix resolution nside."""
        ell_max = sky.healpix_ell_max(nside)
        shells = np.stack([lightcone.healpix_map(a, nside) for a in alm])
        store.write_array(
            group,
            "lightcone_healpix",
            shells.astype(np.float32),
            ("plane", "pixel"),
            "Mpc/h",
            "projected overdensity of the shell, band-limited to "
            "ell <= 3 nside - 1 (no pixel window), pixel mean removed",
            grid_name="HEALPix",
            nside=nside,
            nest=False,
            ell_band_limit=ell_max,
            pixel_window="none",
        )
        store.write_array(
            group,
            "lightcone_healpix_alm",
            alm.astype(np.complex64),
            ("plane", "alm"),
            "Mpc/h",
            "harmonic coefficients of the shell up to ell_max (healpy's ordering), monopole 0",
            ell_max=ell_max,
            ordering="healpy",
        )

    def keep(self, inputs: Inputs) -> None:
        """Hand the planes and shells to the lensing stage of this process."""
        for j, plane in self.flat.items():
            inputs.keep("nbody", "lightcone_density", plane, (j,))
        if self.nside is not None:
            inputs.keep("nbody", "lightcone_healpix_alm", self.alm)


def _block_mean(block, factor: int):
    x, y, z = (n // factor for n in block.shape)
    return block.reshape(x, factor, y, factor, z, factor).mean(axis=(1, 3, 5))


@functools.partial(jax.jit, static_argnames=("factor", "mesh"))
def downsample(field, factor: int, mesh: Mesh):
    """Means over factor^3 cells of a sharded (M, M, M) field: (M/f, M/f, M/f), each device
    averaging its own block (f divides the block)."""
    return jax.shard_map(
        functools.partial(_block_mean, factor=factor),
        mesh=mesh,
        in_specs=FIELD_SPEC,
        out_specs=FIELD_SPEC,
    )(field)


def run(setup: derive.RunSetup, inputs: Inputs, progress: Progress) -> Path:
    """Evolve the run's ICs and write the snapshots, final particles and lightcone planes as
    far as outputs keeps them (all kept for the next stages); returns the path."""
    grid, times, every = setup.grid, setup.timeline, setup.checkpoints
    started = store.now()
    a_init = float(inputs.store("ic").attrs["a_init"])
    progress(
        f"{len(times.bounds) - 1} steps from a = {a_init} to {setup.a_final} on a "
        f"{grid.force_cells}^3 mesh"
    )
    cone = setup.lightcone
    capture = LightconeCapture(setup, cone) if cone is not None else None
    plan = capture.capture if capture is not None else None
    if every is None:
        with progress.timed("pm_steps"):
            result = _evolve_stepwise(setup, inputs, None, plan, progress)
        return _finish(setup, inputs, progress, result, capture, started)
    schedule = checkpoint.Schedule(every.every_steps, every.every_minutes)
    with schedule.listening():
        with progress.timed("pm_steps"):
            result = _evolve_stepwise(setup, inputs, schedule, plan, progress)
        path = _finish(setup, inputs, progress, result, capture, started)
    if not every.kept:
        checkpoint.remove(inputs.run_dir)
    return path


def _evolve_stepwise(
    setup: derive.RunSetup,
    inputs: Inputs,
    schedule: checkpoint.Schedule | None,
    plan: lightcone.Capture | None,
    progress: Progress,
) -> particle_mesh.NBodyResult:
    """The evolution one step at a time from the run's newest checkpoint (else from the ICs),
    writing checkpoints when ``schedule`` says (None: from the ICs, none written); after a
    signal, a checkpoint and Preempted. A progress line (step, a, time, time left) at most
    every pmpipe.stages.progress.REPORT_SECONDS."""
    cosmo, grid, times = setup.cosmology, setup.grid, setup.timeline
    run_dir, run_file, mesh = inputs.run_dir, setup.run_file, grid.mesh
    bounds, steps = times.bounds, len(times.bounds) - 1
    found = None if schedule is None else checkpoint.newest(run_dir, run_file.config_hash)
    if found is None:
        disp, mom = inputs.field("ic", "displacement"), inputs.field("ic", "momentum")
        state, done = particle_mesh.start_state(cosmo, disp, mom, times, grid, plan), 0
    else:
        particles = jax.ShapeDtypeStruct(
            (grid.particles,) * 3 + (3,),
            np.dtype(grid.dtype),
            sharding=parallel.field_sharding(mesh),
        )
        like = particle_mesh.start_state(cosmo, particles, particles, times, grid, plan)
        state, done = checkpoint.read(found, mesh, like)
        progress(f"resumed after step {done} of {steps} (a = {bounds[done]:.4g}) from {found}")
    _check_finite_start(state, found or store_path(run_dir, "ic"), bounds[done])
    clock = StepClock(progress, bounds, done)

    def after_step(state: particle_mesh.State, step: int) -> None:
        clock.after(step)
        if schedule is None:
            return
        stop = step < steps and schedule.stop_requested()
        if stop or (step < steps and schedule.due(step)):
            # none of a broken state
            particle_mesh.check_state(state.trouble, state.needed, bounds, grid.halo)
            written = checkpoint.write(run_dir, run_file, mesh, state, step, bounds[step])
            schedule.written()
            progress(f"checkpoint after step {step} of {steps} (a = {bounds[step]:.4g}): {written}")
            if stop:
                raise checkpoint.Preempted(
                    f"stopped by a signal after step {step} of {steps}; its checkpoint "
                    f"{written} resumes the run when it is started again",
                    schedule.signalled,
                )

    return particle_mesh.evolve_stepwise(cosmo, state, done, times, grid, plan, after_step)


@jax.jit
def _finite(disp: jax.Array, mom: jax.Array) -> jax.Array:
    return jnp.isfinite(disp).all() & jnp.isfinite(mom).all()


def _check_finite_start(state: particle_mesh.State, source: Path, a: float) -> None:
    """NumericalError when the particles the evolution starts from, read from ``source`` (the
    ICs or a checkpoint, at scale factor ``a``), hold NaN or Inf: no step made them so."""
    if not bool(parallel.to_host(_finite(state.disp, state.mom))):
        raise particle_mesh.NumericalError(
            f"the particle state read from {source} (a = {a:.4g}) holds NaN or Inf before the "
            "evolution ran a step: that store was written so or changed since; remove it and "
            "run again (a checkpoint: the run resumes from the one before; the ICs: the ic "
            "stage makes them again)"
        )


def _finish(
    setup: derive.RunSetup,
    inputs: Inputs,
    progress: Progress,
    result: particle_mesh.NBodyResult,
    capture: LightconeCapture | None,
    started: str,
) -> Path:
    """Write nbody.zarr from the evolution's result; keep its fields for the next stages."""
    grid, mesh = setup.grid, setup.grid.mesh
    bounds, snapshots = setup.timeline.bounds, setup.timeline.snapshots
    a_init, a_final = float(bounds[0]), setup.a_final
    if capture is not None:
        capture.receive(result)
    progress(
        f"evolved {len(bounds) - 1} steps"
        + (f" and {len(capture.planes)} lightcone planes" if capture else "")
        + f" in {result.seconds:.2f} s"
    )
    out = setup.kept
    path = store_path(inputs.run_dir, "nbody")
    group = store.create(
        path,
        provenance.provenance(setup.run_file, "nbody", mesh, started, inputs.made_from("nbody"))
        | {
            "a_init": a_init,
            "a_final": a_final,
            "step_boundaries": [float(a) for a in bounds],
            "needed_halo_cells": int(result.needed_halo),
            "evolution_seconds": round(result.seconds, 4),
            "density_kept": out.density,  # cells per side averaged (null: none)
            "particles_kept": out.particles,
            "lightcone_kept": out.lightcone,
        },
        keepbits=out.keepbits,
    )
    store.write_coordinate(group, "a", list(snapshots), "1", "scale factor of the snapshot")
    if out.density is not None:
        _write_density(group, result, setup, out.density)
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


def _write_density(group, result: particle_mesh.NBodyResult, setup: derive.RunSetup, factor):
    """The density snapshots of ``result`` in nbody.zarr, averaged over ``factor``^3
    force-mesh cells (1: whole; outputs.density), with their nodes' coordinates."""
    grid, mesh, snapshots = setup.grid, setup.grid.mesh, setup.timeline.snapshots
    nodes = mesh_node_positions(grid).reshape(-1, factor).mean(axis=1)
    for axis in "xyz":
        store.write_coordinate(
            group,
            axis,
            nodes,
            "Mpc/h",
            f"comoving {axis} of the force-mesh nodes"
            + (f" (centres of {factor}^3 cells)" if factor > 1 else ""),
        )
    kept = [
        result.snapshots[a] if factor == 1 else downsample(result.snapshots[a], factor, mesh)
        for a in snapshots
    ]
    density = store.create_array(
        group,
        "density",
        (len(snapshots),) + kept[0].shape,
        kept[0].dtype,
        store.Labels(
            ("a", "x", "y", "z"),
            "1",
            "matter density in units of the mean, rho / rho_mean (CIC)"
            + (f", mean over {factor}^3 force-mesh cells" if factor > 1 else ""),
        ),
        (1,) + encoding.block_shards(kept[0]),
        downsampled=factor,
    )
    for i, field in enumerate(kept):
        store.write_blocks(density, field, (i,))


if __name__ == "__main__":
    from pmpipe.stages import runner

    sys.exit(runner.main("nbody", run))
