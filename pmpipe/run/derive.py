"""The adapter between configuration and physics: the frozen :class:`RunSetup` of a validated
run (its cosmology with growth and distance tables, linear P(k), grid, time steps, lightcone
planes and lensing sources), derived once per run and handed to every stage, and the run's ICs
made from it."""

from __future__ import annotations

import contextlib
import dataclasses
from functools import partial

import numpy as np

from pmpipe.physics import (
    cosmology,
    domain,
    ics,
    lensing,
    lightcone,
    simulation,
    sky,
    timesteps,
)
from pmpipe.physics.cosmology import Cosmology, LinearPower
from pmpipe.run import config, validation
from pmpipe.run.validation import k_range

REDSHIFT_SAMPLES = 512  # redshifts at which a parametric n(z) is tabulated


@dataclasses.dataclass(frozen=True, eq=False)
class RunSetup:
    """Everything a run's stages need that follows from its configuration, computed once
    (:func:`setup`): the validated run file; the grid on the device mesh; the cosmology
    carrying its growth and distance tables (a pytree whose parameters and tables are traced
    leaves: runs of one size share their compiled programs); the linear P(k) at a = 1; the
    N-body's steps and snapshots; with a lightcone its planes, and with full-sky lensing each
    plane's band limit (h/Mpc); with lensing the sources, (label, mean redshift, comoving
    distances (Mpc/h), weights) in store order."""

    run_file: config.RunFile
    grid: domain.Grid
    cosmology: Cosmology
    power: LinearPower
    timeline: timesteps.Timeline
    planes: sky.Planes | None = None
    shell_k_max: np.ndarray | None = None
    sources: tuple[tuple, ...] = ()

    @property
    def config(self) -> config.Run:
        """The run's resolved configuration."""
        return self.run_file.config


def setup(run_file: config.RunFile, mesh) -> RunSetup:
    """The setup of a run checked by :mod:`pmpipe.run.validation`, on the device mesh
    ``mesh`` (made for run.parallel.pdims; None for a setup that only plans: its grid holds
    no devices)."""
    run = run_file.config
    cosmo = cosmology.tabulated(cosmology_params(run))
    planes = plane_geometry(run, cosmo) if run.lightcone is not None else None
    full = run.lensing.full_sky if run.lensing is not None else None
    return RunSetup(
        run_file,
        grid(run, mesh),
        cosmo,
        linear_power(run),
        timeline(run, cosmo),
        planes,
        shell_band_limits(run, planes) if full is not None and planes is not None else None,
        sources(run, cosmo) if run.lensing is not None else (),
    )


def cosmology_params(run: config.Run) -> cosmology.Cosmology:
    """The run's cosmological parameters as the physics' pytree (no tables)."""
    return cosmology.Cosmology(**run.cosmology.model_dump())


def grid(run: config.Run, mesh) -> domain.Grid:
    """The run's particles, force-mesh oversampling, box, halo and dtype on the device mesh
    ``mesh`` (made for run.parallel.pdims)."""
    return domain.Grid(
        mesh,
        run.box.particles,
        run.box.oversample,
        run.box.box_size,
        run.parallel.halo_cells,
        run.nbody.dtype,
    )


def linear_power(run: config.Run) -> cosmology.LinearPower:
    """Linear P(k) at a = 1 [(Mpc/h)^3] as a callable of k [h/Mpc] (a tabulated P(k) read
    from its file here)."""
    table = None
    if run.power.kind == "table":
        table = validation.load_power_table(run.power.table, *k_range(run))
    return simulation.power_function(cosmology_params(run), run.power.kind, table)


def timeline(run: config.Run, cosmo: cosmology.Cosmology) -> timesteps.Timeline:
    """The N-body's steps with its snapshots, a_final among them (spacing 'growth' inverts
    the growth factor of ``cosmo``)."""
    growth = None
    if run.nbody.spacing == "growth" and isinstance(run.nbody.steps, int):
        growth = partial(cosmology.on_host, cosmology.growth_factor, cosmo)
    return timesteps.timeline(
        run.ic.a_init,
        run.nbody.a_final,
        run.nbody.steps,
        run.nbody.snapshots,
        run.nbody.spacing,
        growth,
    )


def plane_geometry(run: config.Run, cosmo: cosmology.Cosmology) -> sky.Planes:
    """The lightcone's planes (:func:`pmpipe.physics.lightcone.plane_geometry`)."""
    return lightcone.plane_geometry(
        cosmo, config.section(run.lightcone, "lightcone").z_max, run.plane_thickness()
    )


def shell_band_limits(run: config.Run, found: sky.Planes) -> np.ndarray:
    """Band limit (h/Mpc) of each plane's full-sky shell (:func:`pmpipe.physics.sky.shell_band_limits`
    for this box, mesh and nside)."""
    full = config.section(config.section(run.lensing, "lensing").full_sky, "lensing.full_sky")
    return sky.shell_band_limits(
        found.chi_edges[1:],
        sky.shell_k_max(run.box.particles, run.force_cells(), run.box.box_size),
        sky.rays_nside(full.nside),
    )


def sources(run: config.Run, cosmo: cosmology.Cosmology) -> tuple[tuple, ...]:
    """(label, mean redshift, comoving distances (Mpc/h), weights) of every source of the run's
    lensing section, in store order."""
    lens, z_max = (
        config.section(run.lensing, "lensing"),
        config.section(run.lightcone, "lightcone").z_max,
    )
    out = []
    for z_s in lens.source_redshifts:
        chi = np.asarray(cosmology.comoving_distance(cosmo, 1.0 / (1.0 + z_s)), np.float64)
        out.append((f"z={z_s:g}", z_s, np.atleast_1d(chi), np.ones(1)))
    for dist in lens.distributions:
        if isinstance(dist, config.SmailSources):
            z = np.linspace(0.0, z_max, REDSHIFT_SAMPLES)
            n = lensing.smail(z, dist.z0, dist.alpha, dist.beta)
        else:
            z, n = np.asarray(dist.z), np.asarray(dist.n)
        chi, weights = lensing.source_distribution(cosmo, z, n)
        out.append((dist.name, float(np.sum(weights * z)), chi, weights))
    return tuple(out)


def initial_conditions(run_setup: RunSetup, timed=None) -> simulation.Initial:
    """The run's ICs on the devices of its grid: white noise, linear density at a = 1 and the
    LPT particle state at a_init. ``timed(phase)``, a context manager, times the phases
    'white_noise' and 'lpt' (pmpipe.stages.progress.Progress.timed); each waits for its
    results."""
    import jax

    run, grid = run_setup.config, run_setup.grid
    timed = timed or (lambda _: contextlib.nullcontext())
    with timed("white_noise"):
        noise = jax.block_until_ready(
            ics.white_noise(run.ic.seed, grid.particles, grid.mesh, np.dtype(grid.dtype))
        )
    with timed("lpt"):
        init = simulation.initial_conditions(
            run_setup.cosmology,
            noise,
            run_setup.power,
            grid,
            run.ic.a_init,
            simulation.ICOptions(run.ic.lpt_order, run.ic.fixed_amplitude, run.ic.paired),
        )
        jax.block_until_ready((init.delta_linear, init.disp, init.mom))
    return init
