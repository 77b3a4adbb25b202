"""`pmpipe bench steps` and `pmpipe bench force`: accuracy of the PM evolution against
converged references from the same initial conditions, as JSON.

- steps: S steps equally spaced in each of nbody.spacing's variables against a reference of
  many steps (equal in ln a) with the same force mesh; the reference's own error is that of
  half as many steps.
- force: N particles per side with force meshes B = 1, 2, ... against 2N particles with a
  B = 2 mesh from the same large-scale modes and steps; the ratio P_B(k) / P_ref(k) per k bin
  and the wavenumbers below which it stays within 2, 5 and 10 %.

Both compare P(k) of the final (a = 1) particles painted with CIC (steps: on the particle
grid; force: on the 2N grid, the window divided out).
"""

from __future__ import annotations

import time
from typing import Any

import jax
import numpy as np

from pmpipe.bench.pm_core import A_INIT, COSMOLOGY, POWER, accuracy
from pmpipe.physics.evolution import ics, simulation, timesteps
from pmpipe.physics.mesh import painting
from pmpipe.physics.mesh.domain import Grid
from pmpipe.physics.statistics import stats
from pmpipe.physics.theory import cosmology
from pmpipe.runtime import parallel

FORCE_TOLERANCES = (0.02, 0.05, 0.10)  # power deficits at which bench force reports k
FORCE_HALO = 8  # halo cells of bench force on one device (a reference of 2N keeps its own)


def _final_particles(noise, grid: Grid, bounds):
    """(disp (N, N, N, 3) at a = 1, evolution seconds) from white noise (N, N, N)."""
    times = timesteps.timeline(A_INIT, 1.0, list(bounds))
    _, res = simulation.simulate(COSMOLOGY, noise, grid, times, POWER)
    return jax.block_until_ready(res.disp), res.seconds


def _growth(a):
    return cosmology.on_host(cosmology.growth_factor, cosmology.tabulated(COSMOLOGY), a)


def _coarse_white_noise(noise, n: int):
    """Unit white noise (n, n, n) with the modes of ``noise`` (M, M, M), M > n, that an n grid
    holds (its Nyquist planes zeroed), so that both grids' ICs share their large scales."""
    m = noise.shape[0]
    modes = np.fft.fftn(noise.astype(np.float64)) * (n / m) ** 1.5
    index = np.r_[0 : n // 2, m - n // 2 : m]
    coarse = modes[np.ix_(index, index, index)]
    coarse[n // 2] = coarse[:, n // 2] = coarse[:, :, n // 2] = 0.0
    return np.fft.ifftn(coarse).real.astype(np.float32)


def bench_steps(
    particles: int,
    box_size: float,
    steps: int,
    reference_steps: int,
    oversample: int = 1,
    seed: int = 0,
    halo: int = 8,
) -> dict:
    """P(k) and r(k) below k_Nyquist / 4 of ``steps`` steps per spacing against
    ``reference_steps`` steps equal in ln a; returns the JSON-ready record."""
    mesh = parallel.make_mesh((1, 1))
    grid = Grid(mesh, particles, oversample, box_size, halo)
    noise = ics.white_noise(seed, particles, mesh)

    def run(n_steps, spacing):
        bounds = timesteps.step_boundaries(A_INIT, 1.0, n_steps, (), spacing, _growth)
        return _final_particles(noise, grid, bounds)

    t0 = time.perf_counter()
    reference, _ = run(reference_steps, "log_a")
    half, _ = run(reference_steps // 2, "log_a")
    record: dict[str, Any] = {
        "benchmark": "steps",
        "particles": particles,
        "box_size": box_size,
        "oversample": oversample,
        "steps": steps,
        "reference_steps": reference_steps,
        "reference_spacing": "log_a",
        "seed": seed,
        "reference_error": accuracy(half, reference, mesh, halo, box_size),
        "spacings": {},
    }
    for spacing in timesteps.STEP_SPACINGS:
        disp, seconds = run(steps, spacing)
        record["spacings"][spacing] = accuracy(disp, reference, mesh, halo, box_size) | {
            "evolution_s": seconds
        }
    record["wall_s"] = time.perf_counter() - t0
    return record


def bench_force(
    particles: int,
    box_size: float,
    steps: int,
    oversamples=(1, 2),
    reference_oversample: int = 2,
    spacing: str = "a",
    seed: int = 0,
) -> dict:
    """P_B(k) / P_ref(k) at a = 1 for N = ``particles`` per side and force meshes B =
    ``oversamples`` against a reference of 2N per side (the same modes below the N-grid's
    Nyquist frequency, plus the next octave) and force mesh ``reference_oversample``, all with
    ``steps`` steps of ``spacing``. Both are painted on a 2N grid, CIC divided out; the
    particles' discreteness noise stays in, as it does in pmpipe's P(k) and maps. Per B: the
    ratio per k bin up to N's Nyquist frequency and the largest k (h/Mpc, and over that
    frequency) below which every bin is within each of FORCE_TOLERANCES."""
    mesh = parallel.make_mesh((1, 1))
    bounds = timesteps.step_boundaries(A_INIT, 1.0, steps, (), spacing, _growth)
    k_nyquist = np.pi * particles / box_size
    grid_n = 2 * particles

    def power(n, oversample, noise):
        grid = Grid(mesh, n, oversample, box_size, oversample * FORCE_HALO)
        disp, seconds = _final_particles(noise, grid, bounds)
        on_grid_n = Grid(mesh, n, grid_n // n, box_size, FORCE_HALO)
        rho = painting.paint(disp, on_grid_n, (grid_n / n) ** 3)[0]
        k, p, _ = stats.power_spectrum(rho - 1.0, mesh, box_size, particles, compensate_cic=True)
        return k, p, seconds

    t0 = time.perf_counter()
    fine_noise = ics.white_noise(seed, grid_n, mesh)
    k, p_ref, _ = power(grid_n, reference_oversample, fine_noise)
    record = {
        "benchmark": "force",
        "particles": particles,
        "box_size": box_size,
        "steps": steps,
        "spacing": spacing,
        "seed": seed,
        "reference_particles": grid_n,
        "reference_oversample": reference_oversample,
        "k_nyquist": k_nyquist,
        "k": k.tolist(),
        "oversamples": {},
    }
    coarse_noise = _coarse_white_noise(np.asarray(fine_noise), particles)
    for b in oversamples:
        _, p, seconds = power(particles, b, coarse_noise)
        ratio = p / p_ref
        resolved = {}
        for tol in FORCE_TOLERANCES:
            bad = np.flatnonzero(np.abs(ratio - 1.0) > tol)
            first = bad[0] if bad.size else k.size  # the first bin off by more
            k_ok = float(k[first - 1]) if first > 0 else 0.0
            resolved[f"{tol:g}"] = {"k": k_ok, "k_over_nyquist": k_ok / k_nyquist}
        record["oversamples"][str(b)] = {
            "ratio": ratio.tolist(),
            "k_within": resolved,
            "evolution_s": seconds,
        }
    record["wall_s"] = time.perf_counter() - t0
    return record
