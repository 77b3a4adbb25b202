"""The PM job that `pmpipe tune` and the benchmarks time: 2LPT particles at a = 0.1 in a
256 Mpc/h box, and one PM step of them, best of a few calls."""

from __future__ import annotations

import functools
import time

import jax
import jax.numpy as jnp

from pmpipe.physics.evolution import ics, particle_mesh, simulation
from pmpipe.physics.mesh.domain import Grid
from pmpipe.physics.theory import cosmology

BOX_SIZE = 256.0
A_INIT = 0.1

# Dynamics without radiation: JaxPM's background (jax_cosmo) has none, so --compare jaxpm is
# like for like. The initial P(k) (Eisenstein-Hu) is that of the default cosmology.
COSMOLOGY = cosmology.Cosmology(T_cmb=0.0)
POWER = simulation.power_function(cosmology.Cosmology())


def lpt_particles(particles: int, mesh, seed: int = 0):
    """2LPT displacements and momenta (N, N, N, 3) at A_INIT of COSMOLOGY in a BOX_SIZE box,
    from the white noise of ``seed``, sharded over ``mesh``."""
    noise = ics.white_noise(seed, particles, mesh)
    grid = Grid(mesh, particles, box_size=BOX_SIZE)
    init = simulation.initial_conditions(COSMOLOGY, noise, POWER, grid, A_INIT)
    return init.disp, init.mom


def timed(fn, *args, repeat: int = 5) -> float:
    """Best-of-`repeat` wall time (s) of a jitted call, after one warm-up call."""
    jax.block_until_ready(fn(*args))
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        best = min(best, time.perf_counter() - t0)
    return best


@functools.partial(jax.jit, static_argnames="grid")
def pm_step(disp, mom, omega_m, grid: Grid):
    """One PM step (drift, paint, force, read, kick) of the particles ``disp``, ``mom``
    (N^3 x 3, sharded over the grid's devices) by 0.01 in drift and kick; returns (disp, mom)."""
    step = jnp.float32(0.01)
    cosmo = cosmology.Cosmology(Omega_m=omega_m)
    return particle_mesh.advance(disp, mom, step, step, cosmo, jnp.float32(1.0), grid)[:2]


def step_seconds(disp, mom, grid: Grid, omega_m: float, repeat: int = 5) -> float:
    """Best-of-``repeat`` seconds of one PM step (:func:`pm_step`)."""
    return timed(functools.partial(pm_step, grid=grid), disp, mom, omega_m, repeat=repeat)
