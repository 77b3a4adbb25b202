"""The adapter between configuration and physics: the physics inputs of a validated run (its
cosmology, grid, step times, linear P(k), lightcone planes, lensing sources and ICs), built by
the stages from a :class:`pmpipe.config.Run` that :mod:`pmpipe.validation` checked."""

from __future__ import annotations

import contextlib
from functools import partial

import numpy as np

from pmpipe import config
from pmpipe.physics import (
    cosmology,
    domain,
    ics,
    lensing,
    lightcone,
    power_table,
    simulation,
    sky,
    timesteps,
)
from pmpipe.validation import k_range


def cosmology_params(run: config.Run) -> cosmology.Cosmology:
    """The run's cosmology as the physics' pytree."""
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
    """Linear P(k) at a = 1 [(Mpc/h)^3] as a callable of k [h/Mpc]."""
    table = None
    if run.power.kind == "table":
        table = power_table.load_power_table(run.power.table, *k_range(run))
    return simulation.power_function(cosmology_params(run), run.power.kind, table)


def step_boundaries(run: config.Run, table=None) -> np.ndarray:
    """Scale factors bounding the N-body's steps, snapshots included
    (:func:`pmpipe.physics.timesteps.step_boundaries`; ``table``: the cosmology's growth table)."""
    growth = None
    if run.nbody.spacing == "growth" and isinstance(run.nbody.steps, int):
        growth = partial(
            cosmology.on_host, cosmology.growth_factor, cosmology_params(run), table=table
        )
    return timesteps.step_boundaries(
        run.ic.a_init,
        run.nbody.a_final,
        run.nbody.steps,
        run.nbody.snapshots,
        run.nbody.spacing,
        growth,
    )


def planes(run: config.Run, table=None) -> sky.Planes:
    """The lightcone's planes (:func:`pmpipe.physics.lightcone.plane_geometry`)."""
    return lightcone.plane_geometry(
        cosmology_params(run),
        config.section(run.lightcone, "lightcone").z_max,
        run.plane_thickness(),
        table,
    )


def shell_band_limits(run: config.Run, found: sky.Planes) -> np.ndarray:
    """Band limit (h/Mpc) of each plane's full-sky shell (:func:`pmpipe.physics.sky.shell_band_limits`
    for this box, mesh and nside)."""
    return sky.shell_band_limits(
        found.chi_edges[1:],
        sky.shell_k_max(run.box.particles, run.force_cells(), run.box.box_size),
        sky.rays_nside(
            config.section(
                config.section(run.lensing, "lensing").full_sky, "lensing.full_sky"
            ).nside
        ),
    )


def initial_conditions(run: config.Run, mesh, timed=None) -> simulation.Initial:
    """The run's ICs on the devices of ``mesh``: white noise, linear density at a = 1 and the
    LPT particle state at a_init. ``timed(phase)``, a context manager, times the phases
    'white_noise' and 'lpt' (pmpipe.stages.runner.Progress.timed); each waits for its results."""
    import jax

    timed = timed or (lambda _: contextlib.nullcontext())
    cosmo = cosmology_params(run)
    with timed("white_noise"):
        noise = jax.block_until_ready(
            ics.white_noise(run.ic.seed, run.box.particles, mesh, np.dtype(run.nbody.dtype))
        )
    with timed("lpt"):
        init = simulation.initial_conditions(
            cosmo,
            noise,
            linear_power(run),
            mesh,
            run.box.box_size,
            run.ic.a_init,
            run.ic.lpt_order,
            run.ic.fixed_amplitude,
            run.ic.paired,
            cosmology.growth_table(cosmo),
        )
        jax.block_until_ready((init.delta_linear, init.disp, init.mom))
    return init


REDSHIFT_SAMPLES = 512  # redshifts at which a parametric n(z) is tabulated


def sources(run: config.Run, cosmo: cosmology.Cosmology, table) -> list[tuple]:
    """(label, mean redshift, comoving distances (Mpc/h), weights) of every source of the run's
    lensing section, in store order."""
    lens, z_max = (
        config.section(run.lensing, "lensing"),
        config.section(run.lightcone, "lightcone").z_max,
    )
    out = []
    for z_s in lens.source_redshifts:
        chi = np.asarray(cosmology.comoving_distance(cosmo, 1.0 / (1.0 + z_s), table), np.float64)
        out.append((f"z={z_s:g}", z_s, np.atleast_1d(chi), np.ones(1)))
    for dist in lens.distributions:
        if isinstance(dist, config.SmailSources):
            z = np.linspace(0.0, z_max, REDSHIFT_SAMPLES)
            n = lensing.smail(z, dist.z0, dist.alpha, dist.beta)
        else:
            z, n = np.asarray(dist.z), np.asarray(dist.n)
        chi, weights = lensing.source_distribution(cosmo, z, n, table)
        out.append((dist.name, float(np.sum(weights * z)), chi, weights))
    return out
