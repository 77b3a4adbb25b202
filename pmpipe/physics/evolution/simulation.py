"""One simulation from white noise to the final particles: ICs -> LPT -> PM.

The building block of the ic / nbody stages, the benchmark and the tests; parameters are
plain frozen objects (:mod:`pmpipe.run.derive` makes them from a validated run).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable

import jax
import numpy as np

from pmpipe.physics.evolution import ics, lpt, particle_mesh, schedule, timesteps
from pmpipe.physics.mesh import fft
from pmpipe.physics.mesh.domain import Grid
from pmpipe.physics.theory import cosmology, neutrinos, power_table


@dataclasses.dataclass(frozen=True)
class Initial:
    """Linear density at a = 1 on the particle grid, LPT fields per unit growth, and the
    particle state at a_init (all sharded like the mesh)."""

    delta_linear: jax.Array
    s1: jax.Array
    s2: jax.Array | None
    disp: jax.Array
    mom: jax.Array
    a_init: float


def power_function(
    cosmo: cosmology.Cosmology, kind: str = "eisenstein_hu", table=None
) -> cosmology.LinearPower:
    """P(k) at a = 1 as a callable of k [h/Mpc]: kind 'eisenstein_hu', 'eisenstein_hu_nowiggle',
    or a tabulated kind ('camb', 'class', 'table') with table = (k, P) arrays (a Boltzmann code's, or
    from :func:`pmpipe.physics.theory.power_table.check_power_table`)."""
    if kind not in power_table.POWER_KINDS:
        raise ValueError(
            f"power.kind must be one of {', '.join(power_table.POWER_KINDS)}, got {kind!r}"
        )
    if kind in power_table.TABULATED_KINDS:
        k_table, p_table = table
        return cosmology.LinearPower(kind, cosmo, np.asarray(k_table), np.asarray(p_table))
    return cosmology.LinearPower(kind, cosmo)


@dataclasses.dataclass(frozen=True)
class ICOptions:
    """How the initial field is drawn and displaced (static in the compiled programs): the LPT
    order (1 or 2), fixed amplitudes (|δ_k|² = P(k) exactly) and the paired field (phases
    shifted by π)."""

    lpt_order: int = 2
    fixed_amplitude: bool = False
    paired: bool = False


def initial_conditions(
    cosmo: cosmology.Cosmology,
    noise,
    power: Callable,
    grid: Grid,
    a_init: float,
    options: ICOptions = ICOptions(),
) -> Initial:
    """Linear field and LPT particle state at a_init from white noise (N, N, N) on the particle
    grid of ``grid`` (its mesh and box).

    power: a :class:`pmpipe.physics.theory.cosmology.LinearPower` (an argument of the compiled program, like
    the cosmology and a_init) or any callable of k (part of the program: compiled per callable).
    """
    if not isinstance(power, cosmology.LinearPower):
        power = jax.tree_util.Partial(power)
    # the ICs read the particle grid alone: runs of other force meshes or halos share them
    particle_grid = dataclasses.replace(grid, oversample=1, halo=0)
    fields = _initial_fields(cosmo, noise, a_init, power, grid=particle_grid, options=options)
    delta, s1, s2, disp, mom = fields
    return Initial(delta, s1, s2, disp, mom, a_init)


@functools.partial(jax.jit, static_argnames=("grid", "options"))
def _initial_fields(cosmo, noise, a_init, power, *, grid: Grid, options: ICOptions):
    """(δ_lin, s1, s2, disp, mom), compiled as one program."""
    mesh, box_size = grid.mesh, grid.box_size
    modes = ics.linear_modes(noise, power, box_size, mesh, options.fixed_amplitude, options.paired)
    delta = fft.c2r(modes, mesh)
    velocity = None
    if neutrinos.has_tables(cosmo):  # scale-dependent growth to a_init, and growth rate there
        growth, rate = neutrinos.ic_factors(cosmo, fft.wavenumber(modes, mesh, box_size))
        modes = modes * growth.astype(modes.real.dtype)
        velocity = -fft.gradient(
            fft.inverse_laplacian(modes * rate.astype(modes.real.dtype), mesh, box_size),
            mesh,
            box_size,
        )
    s1, s2 = lpt.lpt_displacements(modes, mesh, box_size, options.lpt_order)
    disp, mom = lpt.lpt_state(cosmo, s1, s2, a_init, velocity)
    return delta, s1, s2, disp, mom


def simulate(
    cosmo: cosmology.Cosmology,
    noise,
    grid: Grid,
    timeline: timesteps.Timeline,
    power: Callable | None = None,
    options: ICOptions = ICOptions(),
):
    """Run ICs at the first boundary of ``timeline``, LPT and PM steps as one compiled program;
    returns (Initial, NBodyResult) with the densities at the timeline's snapshots."""
    power = power_function(cosmo) if power is None else power
    if not isinstance(power, cosmology.LinearPower):
        power = jax.tree_util.Partial(power)
    cosmo = cosmology.tabulated(cosmo)
    a_init = float(timeline.bounds[0])
    start = time.perf_counter()
    plan = schedule.build(timeline, None, noise.dtype)
    fields, out = _simulation(cosmo, noise, a_init, power, plan, grid=grid, options=options)
    delta, s1, s2, disp, mom = fields
    return Initial(delta, s1, s2, disp, mom, a_init), particle_mesh.finish(
        out, timeline, grid, None, start
    )


@functools.partial(jax.jit, static_argnames=("grid", "options"))
def _simulation(cosmo, noise, a_init, power, plan, *, grid: Grid, options: ICOptions):
    """(δ_lin, s1, s2, disp, mom) and the outputs of :func:`pmpipe.physics.evolution.particle_mesh.evolution`."""
    fields = _initial_fields(cosmo, noise, a_init, power, grid=grid, options=options)
    return fields, particle_mesh.evolution(cosmo, fields[3], fields[4], plan, None, grid=grid)
