"""One simulation from white noise to the final particles: ICs -> LPT -> PM.

The building block of the ic / nbody stages, the benchmark and the tests; parameters are
plain frozen objects (a validated :class:`pmpipe.config.Run` converts to them).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence

import jax
import numpy as np
from jax.sharding import Mesh

from pmpipe import cosmology, fft, ics, lpt, nbody


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


def power_function(cosmo: cosmology.Cosmology, kind: str = "eisenstein_hu",
                   table=None) -> cosmology.LinearPower:
    """P(k) at a = 1 as a callable of k [h/Mpc]: kind 'eisenstein_hu', 'eisenstein_hu_nowiggle',
    or 'table' with table = (k, P) arrays from :func:`pmpipe.cosmology.load_power_table`."""
    if kind not in cosmology.POWER_KINDS:
        raise ValueError(
            f"power.kind must be 'eisenstein_hu', 'eisenstein_hu_nowiggle' or 'table', got {kind!r}"
        )
    if kind == "table":
        return cosmology.LinearPower(kind, cosmo, *(np.asarray(x) for x in table))
    return cosmology.LinearPower(kind, cosmo)


def initial_conditions(cosmo: cosmology.Cosmology, noise, power: Callable, mesh: Mesh,
                       box_size: float, a_init: float, lpt_order: int = 2,
                       fixed_amplitude: bool = False, paired: bool = False, table=None) -> Initial:
    """Linear field and LPT particle state at a_init from white noise (N, N, N).

    power: a :class:`pmpipe.cosmology.LinearPower` (an argument of the compiled program, like
    the cosmology and a_init) or any callable of k (part of the program: compiled per callable).
    """
    if not isinstance(power, cosmology.LinearPower):
        power = jax.tree_util.Partial(power)
    fields = _initial_fields(cosmo, noise, a_init, table, power, mesh=mesh, box_size=box_size,
                             lpt_order=lpt_order, fixed_amplitude=fixed_amplitude, paired=paired)
    return Initial(*fields, a_init)


@functools.partial(jax.jit, static_argnames=("mesh", "box_size", "lpt_order", "fixed_amplitude",
                                             "paired"))
def _initial_fields(cosmo, noise, a_init, table, power, *, mesh, box_size, lpt_order,
                    fixed_amplitude, paired):
    """(δ_lin, s1, s2, disp, mom), compiled as one program."""
    modes = ics.linear_modes(noise, power, box_size, mesh, fixed_amplitude, paired)
    delta = fft.c2r(modes, mesh)
    s1, s2 = lpt.lpt_displacements(modes, mesh, box_size, lpt_order)
    disp, mom = lpt.lpt_state(cosmo, s1, s2, a_init, table)
    return delta, s1, s2, disp, mom


def simulate(cosmo: cosmology.Cosmology, noise, mesh: Mesh, grid: nbody.PMGrid, a_init: float,
             a_final: float, steps: int | Sequence[float], power: Callable | None = None,
             lpt_order: int = 2, fixed_amplitude: bool = False, paired: bool = False,
             snapshots: Sequence[float] = (), progress=None):
    """Run ICs, LPT and PM steps; returns (Initial, NBodyResult). The final a is always a
    snapshot."""
    power = power_function(cosmo) if power is None else power
    table = cosmology.growth_table(cosmo)
    init = initial_conditions(cosmo, noise, power, mesh, grid.box_size, a_init, lpt_order,
                              fixed_amplitude, paired, table)
    snaps = tuple(sorted(set(float(s) for s in snapshots) | {float(a_final)}))
    bounds = nbody.step_boundaries(a_init, a_final, steps, snaps)
    result = nbody.evolve(cosmo, init.disp, init.mom, bounds, mesh, grid, snaps, table, progress)
    return init, result
