"""One simulation from white noise to the final particles: ICs -> LPT -> PM.

The building block of the ic / nbody stages, the benchmark and the tests; parameters are
plain frozen objects (a validated :class:`pmpipe.config.Run` converts to them).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Sequence

import jax
import numpy as np
from jax.sharding import Mesh

from pmpipe import config
from pmpipe.physics import cosmology, fft, ics, lpt, nbody, timesteps
from pmpipe.physics.domain import Grid


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
    or 'table' with table = (k, P) arrays from :func:`pmpipe.physics.power_table.load_power_table`."""
    if kind not in config.POWER_KINDS:
        raise ValueError(
            f"power.kind must be 'eisenstein_hu', 'eisenstein_hu_nowiggle' or 'table', got {kind!r}"
        )
    if kind == "table":
        k_table, p_table = table
        return cosmology.LinearPower(kind, cosmo, np.asarray(k_table), np.asarray(p_table))
    return cosmology.LinearPower(kind, cosmo)


def initial_conditions(
    cosmo: cosmology.Cosmology,
    noise,
    power: Callable,
    mesh: Mesh,
    box_size: float,
    a_init: float,
    lpt_order: int = 2,
    fixed_amplitude: bool = False,
    paired: bool = False,
    table=None,
) -> Initial:
    """Linear field and LPT particle state at a_init from white noise (N, N, N).

    power: a :class:`pmpipe.physics.cosmology.LinearPower` (an argument of the compiled program, like
    the cosmology and a_init) or any callable of k (part of the program: compiled per callable).
    """
    if not isinstance(power, cosmology.LinearPower):
        power = jax.tree_util.Partial(power)
    fields = _initial_fields(
        cosmo,
        noise,
        a_init,
        table,
        power,
        mesh=mesh,
        box_size=box_size,
        lpt_order=lpt_order,
        fixed_amplitude=fixed_amplitude,
        paired=paired,
    )
    delta, s1, s2, disp, mom = fields
    return Initial(delta, s1, s2, disp, mom, a_init)


@functools.partial(
    jax.jit, static_argnames=("mesh", "box_size", "lpt_order", "fixed_amplitude", "paired")
)
def _initial_fields(
    cosmo, noise, a_init, table, power, *, mesh, box_size, lpt_order, fixed_amplitude, paired
):
    """(δ_lin, s1, s2, disp, mom), compiled as one program."""
    modes = ics.linear_modes(noise, power, box_size, mesh, fixed_amplitude, paired)
    delta = fft.c2r(modes, mesh)
    s1, s2 = lpt.lpt_displacements(modes, mesh, box_size, lpt_order)
    disp, mom = lpt.lpt_state(cosmo, s1, s2, a_init, table)
    return delta, s1, s2, disp, mom


def simulate(
    cosmo: cosmology.Cosmology,
    noise,
    grid: Grid,
    a_init: float,
    a_final: float,
    steps: int | Sequence[float],
    power: Callable | None = None,
    lpt_order: int = 2,
    fixed_amplitude: bool = False,
    paired: bool = False,
    snapshots: Sequence[float] = (),
):
    """Run ICs, LPT and PM steps as one compiled program; returns (Initial, NBodyResult). The
    final a is always a snapshot."""
    power = power_function(cosmo) if power is None else power
    if not isinstance(power, cosmology.LinearPower):
        power = jax.tree_util.Partial(power)
    table = cosmology.growth_table(cosmo)
    snaps = tuple(sorted({float(s) for s in snapshots} | {float(a_final)}))
    bounds = timesteps.step_boundaries(a_init, a_final, steps, snaps)
    start = time.perf_counter()
    fields, out = _simulation(
        cosmo,
        noise,
        a_init,
        table,
        power,
        bounds.astype(noise.dtype),
        nbody.snapshot_slots(bounds, snaps),
        grid=grid,
        lpt_order=lpt_order,
        fixed_amplitude=fixed_amplitude,
        paired=paired,
        n_snapshots=len(snaps),
    )
    delta, s1, s2, disp, mom = fields
    return Initial(delta, s1, s2, disp, mom, a_init), nbody.finish(
        out, bounds, snaps, grid, None, start
    )


@functools.partial(
    jax.jit, static_argnames=("grid", "lpt_order", "fixed_amplitude", "paired", "n_snapshots")
)
def _simulation(
    cosmo,
    noise,
    a_init,
    table,
    power,
    a_steps,
    slots,
    *,
    grid,
    lpt_order,
    fixed_amplitude,
    paired,
    n_snapshots,
):
    """(δ_lin, s1, s2, disp, mom) and the outputs of :func:`pmpipe.physics.nbody.evolution`."""
    fields = _initial_fields(
        cosmo,
        noise,
        a_init,
        table,
        power,
        mesh=grid.mesh,
        box_size=grid.box_size,
        lpt_order=lpt_order,
        fixed_amplitude=fixed_amplitude,
        paired=paired,
    )
    no_crossings = np.zeros((a_steps.shape[0] - 1, 0), np.int32)
    return fields, nbody.evolution(
        cosmo,
        fields[3],
        fields[4],
        a_steps,
        slots,
        no_crossings,
        table,
        None,
        grid=grid,
        n_snapshots=n_snapshots,
    )
