"""Particle-mesh N-body with FastPM kick-drift-kick stepping (Feng et al. 2016).

State: displacements ``disp`` from the Lagrangian grid and momenta ``mom`` = a² dx/dt / H0, both
(N, N, N, 3) in Mpc/h and sharded like the meshes. Equations of motion in a:
dx/da = p / (a³ E), dp/da = F / (a² E), F = -1.5 Ω_m ∇∇⁻²δ on a force mesh of (B N)³ cells.
FastPM's modified kick and drift factors make each step exact for the linear growing mode:
drift Δx = p (D1(a1) - D1(a0)) / G_p(a_c) and kick Δp = F (G_p(a1) - G_p(a0)) / G_f(a_c) with
G_p = a³ E dD1/da and G_f = a² E dG_p/da = 1.5 Ω_m D1.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from pmpipe import cosmology, fft, painting


@dataclasses.dataclass(frozen=True)
class PMGrid:
    """Static sizes of a PM run: particles per side, force-mesh oversampling B, box (Mpc/h),
    halo width in force-mesh cells."""

    particles: int
    oversample: int = 1
    box_size: float = 256.0
    halo: int = 4

    @property
    def mesh(self) -> int:
        return self.particles * self.oversample


def forces(disp, omega_m, mesh: Mesh, grid: PMGrid):
    """PM accelerations F = -1.5 Ω_m ∇∇⁻²δ at the particles, (N, N, N, 3) in Mpc/h.

    Returns (forces, density, needed_halo) with density ρ/ρ̄ on the (B N)³ force mesh.
    """
    rho, needed = painting.paint(disp, mesh, grid.mesh, grid.box_size, grid.halo,
                                 mass=float(grid.oversample**3))
    delta_k = fft.r2c(rho, mesh)
    pot_k = 1.5 * omega_m * fft.inverse_laplacian(delta_k, mesh, grid.box_size)
    force_mesh = -fft.gradient(pot_k, mesh, grid.box_size,
                                fft.finite_difference_kernels(pot_k, mesh, grid.box_size))
    acc, needed_read = painting.read(force_mesh, disp, mesh, grid.box_size, grid.halo)
    return acc, rho, jnp.maximum(needed, needed_read)


def _growth_momentum(cosmo, a, table):
    """G_p(a) = a³ E dD1/da = a² E dD1/dlna."""
    return a**2 * cosmology.E(cosmo, a) * cosmology.growth_factor_derivative(cosmo, a, table)


def _growth_force(cosmo, a, table):
    """G_f(a) = 1.5 Ω_m D1(a)."""
    return 1.5 * cosmo.Omega_m * cosmology.growth_factor(cosmo, a, table)


@jax.jit
def kdk_coefficients(cosmo: cosmology.Cosmology, a_steps, table=None):
    """FastPM factors per step i (a_i -> a_{i+1}, midpoint a_h): first half kick, drift and
    second half kick, each of shape (S,) for a_steps (S + 1,)."""
    table = cosmology.growth_table(cosmo) if table is None else table
    a0, a1 = a_steps[:-1], a_steps[1:]
    ah = 0.5 * (a0 + a1)
    gp = lambda a: _growth_momentum(cosmo, a, table)  # noqa: E731
    gf = lambda a: _growth_force(cosmo, a, table)  # noqa: E731
    d1 = lambda a: cosmology.growth_factor(cosmo, a, table)  # noqa: E731
    kick1 = (gp(ah) - gp(a0)) / gf(a0)
    drift = (d1(a1) - d1(a0)) / gp(ah)
    kick2 = (gp(a1) - gp(ah)) / gf(a1)
    return kick1, drift, kick2


@jax.jit
def partial_drift(cosmo: cosmology.Cosmology, a0, a1, a_stop, table=None):
    """Drift factor from a0 to a_stop (a0 < a_stop <= a1) with the momentum of the step a0 -> a1,
    (D1(a_stop) - D1(a0)) / G_p(a_h): the FastPM drift stopped part-way (arrays broadcast)."""
    table = cosmology.growth_table(cosmo) if table is None else table
    d1 = lambda a: cosmology.growth_factor(cosmo, a, table)  # noqa: E731
    return (d1(a_stop) - d1(a0)) / _growth_momentum(cosmo, 0.5 * (a0 + a1), table)


@jax.jit
def _drift_to(disp, mom, acc, kick1, drifts, i, j):
    """Positions part-way through step i: half kick, then the partial drift j."""
    return disp + drifts[j].astype(disp.dtype) * (mom + kick1[i].astype(disp.dtype) * acc)


def step_boundaries(a_init: float, a_final: float, steps: int | Sequence[float],
                    snapshots: Sequence[float] = ()) -> np.ndarray:
    """Scale factors bounding the steps: ``steps`` linear in a, or an explicit increasing list
    from a_init to a_final; snapshot times not on a boundary are inserted as boundaries."""
    if not 0 < a_init < a_final:
        raise ValueError(
            f"nbody.a_final = {a_final} must be greater than ic.a_init = {a_init} (and a_init > 0)"
        )
    if isinstance(steps, int):
        if steps < 1:
            raise ValueError(f"nbody.steps must be >= 1, got {steps}")
        bounds = np.linspace(a_init, a_final, steps + 1)
    else:
        bounds = np.asarray(steps, dtype=np.float64)
        if bounds.ndim != 1 or bounds.size < 2 or np.any(np.diff(bounds) <= 0):
            raise ValueError("nbody.steps as a list must be strictly increasing scale factors")
        if not (np.isclose(bounds[0], a_init) and np.isclose(bounds[-1], a_final)):
            raise ValueError(
                f"nbody.steps must run from ic.a_init = {a_init} to nbody.a_final = {a_final}"
            )
    for a in snapshots:
        if not a_init <= a <= a_final:
            raise ValueError(
                f"nbody.snapshots value {a} lies outside [a_init, a_final] = [{a_init}, {a_final}]"
            )
    extra = [a for a in snapshots if not np.isclose(bounds, a, rtol=0, atol=1e-9).any()]
    return np.unique(np.concatenate([bounds, np.asarray(extra, dtype=np.float64)]))


@dataclasses.dataclass
class NBodyResult:
    """Final displacement and momentum (Mpc/h), snapshot densities {a: ρ/ρ̄ on the force mesh},
    the halo (cells) the particles needed, and timings."""

    disp: jax.Array
    mom: jax.Array
    a: float
    snapshots: dict
    needed_halo: jax.Array
    step_seconds: list


@partial(jax.jit, static_argnums=(3, 4))
def _start(disp, mom, omega_m, mesh, grid):
    """Copies of the particle state (the steps overwrite theirs) and the forces on it."""
    acc, rho, needed = forces(disp, jnp.asarray(omega_m, disp.dtype), mesh, grid)
    return jnp.copy(disp), jnp.copy(mom), acc, needed, rho


def _kdk(disp, mom, acc, needed, factors, i, omega_m, mesh, grid):
    """Step i of the FastPM factors (kick1, drift, kick2), each (S,); returns the new state,
    its density and the halo needed so far."""
    kick1, drift, kick2 = (f[i].astype(disp.dtype) for f in factors)
    mom = mom + kick1 * acc
    disp = disp + drift * mom
    acc, rho, need = forces(disp, jnp.asarray(omega_m, disp.dtype), mesh, grid)
    # materialise the interpolated forces once: otherwise XLA fuses the gathers into both
    # consumers (the returned acc and the kick) and interpolates twice
    acc = jax.lax.optimization_barrier(acc)
    mom = mom + kick2 * acc
    return disp, mom, acc, jnp.maximum(needed, need), rho


# Outside of transformations each step's particle state replaces the previous one in place
# (donated buffers). Under jax.grad the previous states are residuals of the backward pass and
# must stay alive.
_step_in_place = jax.jit(_kdk, static_argnums=(7, 8), donate_argnums=(0, 1, 2))
_step = jax.jit(_kdk, static_argnums=(7, 8))


def evolve(cosmo: cosmology.Cosmology, disp, mom, a_steps, mesh: Mesh, grid: PMGrid,
           snapshots: Sequence[float] = (), table=None,
           progress: Callable[[int, int, float, float], None] | None = None,
           crossings: Sequence[float] = (),
           on_crossing: Callable[[int, jax.Array], None] | None = None) -> NBodyResult:
    """Evolve particles through the steps bounded by a_steps (numpy, from :func:`step_boundaries`).

    Densities are kept at every boundary listed in ``snapshots``. For each scale factor j in
    ``crossings`` (in (a_steps[0], a_steps[-1]]), ``on_crossing(j, disp)`` receives the
    displacements drifted to that time within the step that contains it. The cosmology, the
    step boundaries and the crossings are arguments of the compiled programs: runs with as many
    steps (and crossings) on the same sizes share them. Differentiable with respect to the
    initial state and the cosmology; a halo shortfall raises painting.HaloError (checked
    when values are concrete). The caller's disp and mom stay valid.
    """
    table = cosmology.growth_table(cosmo) if table is None else table
    a_steps = np.asarray(a_steps, dtype=np.float64)
    factors = kdk_coefficients(cosmo, a_steps.astype(disp.dtype), table)
    crossings = np.asarray(crossings, dtype=np.float64)
    step_of = np.searchsorted(a_steps, crossings, side="left") - 1  # a_i < crossing <= a_i+1
    inside = (crossings > a_steps[0]) & (crossings <= a_steps[-1])
    at = np.clip(step_of, 0, len(a_steps) - 2)
    drifts = None if not inside.any() else partial_drift(
        cosmo, a_steps[at].astype(disp.dtype), a_steps[at + 1].astype(disp.dtype),
        crossings.astype(disp.dtype), table)
    concrete = not any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves((disp, mom, cosmo)))
    step_fn = _step_in_place if concrete else _step
    disp, mom, acc, needed, rho = _start(disp, mom, cosmo.Omega_m, mesh, grid)
    snaps = {}
    wanted = [float(s) for s in snapshots]

    def keep(a, rho):
        for s in wanted:
            if abs(s - a) < 1e-9:
                snaps[s] = rho

    keep(float(a_steps[0]), rho)
    timings = []
    start = time.perf_counter()
    for i in range(len(a_steps) - 1):
        t0 = time.perf_counter()
        for j in np.flatnonzero(inside & (step_of == i)):
            on_crossing(int(j), _drift_to(disp, mom, acc, factors[0], drifts, np.int32(i),
                                          np.int32(j)))
        disp, mom, acc, needed, rho = step_fn(disp, mom, acc, needed, factors, np.int32(i),
                                              cosmo.Omega_m, mesh, grid)
        keep(float(a_steps[i + 1]), rho)
        if concrete:
            jax.block_until_ready(disp)
        if progress is not None and concrete:
            progress(i + 1, len(a_steps) - 1, float(a_steps[i + 1]), time.perf_counter() - start)
        timings.append(time.perf_counter() - t0)
    if concrete:  # values are concrete outside of jax.grad / jit
        painting.check_halo(needed, grid.halo)
    return NBodyResult(disp, mom, float(a_steps[-1]), snaps, needed, timings)
