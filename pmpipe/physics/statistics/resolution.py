"""Resolved ranges: the wavenumbers and multipoles a run's box, particle grid, force mesh and
maps can be trusted for.

- :func:`power_transfer`: the matter power at a = 1 of N particles per side with a force mesh
  of B cells per particle spacing, relative to a run of 2N per side from the same large-scale
  modes (:data:`POWER_TRANSFER`, measured per particle spacing L / N as a function of k over
  the particle grid's Nyquist frequency π N / L); zero above that frequency, the highest the
  particles carry. Below 1 the run misses power (coarse force, missing small-scale modes);
  above 1 its particles' discreteness noise adds some.
- k_max_valid (h/Mpc): where that transfer first departs from 1 by POWER_TOLERANCE.
- :func:`thickness_transfer`: what independent planes of finite thickness hold at k_perp
  relative to Limber's projection, which matters at low multipoles.
- ell_min_valid, ell_max_valid per lensing source and map: the widest run of multipoles whose
  Limber C_ℓ (linear power) the planes are expected to get wrong by at most LIMBER_TOLERANCE
  (modes longer than the box, k < 2π / L, missing; the two transfers; for full-sky shells
  their band limit), within what the map holds (flat: FLAT_FUNDAMENTALS times 2π / field of
  view to its Nyquist multipole; HEALPix: 2 to 3 nside - 1).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from pmpipe.physics.lensing import projection
from pmpipe.physics.theory import cosmology

POWER_TOLERANCE = 0.05
LIMBER_TOLERANCE = 0.05
# P_{N,B}(k) / P_{2N,2}(k) at a = 1, at k / (π N / L) = TRANSFER_K, per particle spacing L / N
# (Mpc/h) and force mesh B: `pmpipe bench force --particles 64 --box L --oversamples 1 2` with
# L = 128, 256 and 512 Mpc/h (10 steps linear in a; docs/validation.md). Between spacings the
# transfer is interpolated in log spacing, outside them the nearest spacing's is used; meshes
# finer than B = 2 use B = 2's.
TRANSFER_K = (0.0, 0.098, 0.159, 0.251, 0.346, 0.5, 0.689, 1.0)
POWER_TRANSFER = {
    2.0: {
        1: (1.0, 0.987, 0.976, 0.948, 0.915, 0.851, 0.765, 0.658),
        2: (1.0, 1.0, 0.998, 0.997, 0.992, 0.983, 0.968, 0.929),
    },
    4.0: {
        1: (1.0, 0.976, 0.958, 0.897, 0.85, 0.732, 0.601, 0.485),
        2: (1.0, 1.001, 1.0, 1.001, 0.998, 0.991, 0.977, 0.985),
    },
    8.0: {
        1: (1.0, 0.968, 0.937, 0.852, 0.77, 0.601, 0.426, 0.265),
        2: (1.0, 1.0, 0.999, 0.998, 0.995, 0.978, 0.97, 0.972),
    },
}
FLAT_FUNDAMENTALS = 3  # a flat map is valid from this many fundamentals 2π / field of view up:
# below, a bin holds a few modes of a few planes, each plane's made of the box's discrete
# transverse modes, and scatters by tens of percent between runs (docs/validation.md)
ELL_SAMPLES = 256  # multipoles, log spaced, at which the Limber shares are evaluated
THICKNESS_MODES = 32  # line-of-sight modes each side, per oversampling, in thickness_transfer
THICKNESS_GRID = 512  # k_perp, log spaced, at which thickness_transfer is tabulated


def _transfer_table(particles: int, box_size: float, oversample: int) -> np.ndarray:
    """:data:`POWER_TRANSFER` at TRANSFER_K for this particle spacing and force mesh."""
    spacings = np.array(sorted(POWER_TRANSFER))
    b = min(oversample, max(POWER_TRANSFER[spacings[0]]))
    rows = np.array([POWER_TRANSFER[s][b] for s in spacings])
    where = np.log(np.clip(box_size / particles, spacings[0], spacings[-1]))
    return np.array([np.interp(where, np.log(spacings), column) for column in rows.T])


def power_transfer(k, particles: int, box_size: float, oversample: int):
    """P(k) of the run relative to a converged one (see the module), for k (any shape,
    h/Mpc)."""
    k_nyquist = math.pi * particles / box_size
    k = np.asarray(k, np.float64)
    table = _transfer_table(particles, box_size, oversample)
    return np.where(k <= k_nyquist, np.interp(k / k_nyquist, TRANSFER_K, table), 0.0)


def k_max_valid(particles: int, box_size: float, oversample: int) -> float:
    """Wavenumber (h/Mpc) up to which the run's matter power is within POWER_TOLERANCE of a run
    with twice the particles per side: where :func:`power_transfer` first departs from 1 by
    more. A resolution criterion: that run, too, misses the power of scales it does not
    resolve (docs/validation.md compares both with HMcode-2020)."""
    x, ratio = np.asarray(TRANSFER_K), _transfer_table(particles, box_size, oversample)
    off = np.flatnonzero(np.abs(ratio - 1.0) > POWER_TOLERANCE)
    if off.size == 0:
        fraction = x[-1]
    else:
        i = off[0]  # between the last point within and the first beyond
        edge = 1.0 + math.copysign(POWER_TOLERANCE, ratio[i] - 1.0)
        fraction = x[i - 1] + (edge - ratio[i - 1]) / (ratio[i] - ratio[i - 1]) * (x[i] - x[i - 1])
    return float(fraction) * math.pi * particles / box_size


@dataclasses.dataclass(frozen=True)
class MultipoleRange:
    """Resolved multipoles of one map of one source and what sets each end."""

    ell_min: float
    ell_max: float
    min_reason: str
    max_reason: str


def bins_within(lo, hi, ell_min: float, ell_max: float) -> np.ndarray:
    """Which multipole bins, of edges lo and hi (L,), lie wholly within [ell_min, ell_max], the
    multipoles a map resolves: the bins it resolves (L,) bool."""
    return (np.asarray(lo) >= ell_min) & (np.asarray(hi) <= ell_max)


def thickness_transfer(k_perp, thickness: float, box_size: float, power, oversampling: int = 1):
    """Power a plane of ``thickness`` Mpc/h holds at transverse wavenumbers k_perp (h/Mpc, any
    shape), relative to Limber's thickness × P(k_perp): P(sqrt(k_perp² + k_par²)) averaged
    with the weights of the plane's projection, Δχ sinc²(k_par Δχ / 2) / L', over
    k_par = 2π m / L' with L' = oversampling × box_size (1: the box's own modes, which a slab
    along a box axis holds; 4: nearly all, as a shell's radial rays see). pmpipe's planes see
    independent copies of the box, so the correlations between neighbours that would make up
    the difference are absent; the shortfall shrinks as k_perp × thickness grows and vanishes
    for slabs one box thick."""
    span = oversampling * box_size
    m = np.arange(-THICKNESS_MODES * oversampling, THICKNESS_MODES * oversampling + 1)
    weights = thickness / span * np.sinc(m * thickness / span) ** 2
    k_par = 2 * np.pi * m / span
    k_perp = np.asarray(k_perp, np.float64)
    positive = k_perp[k_perp > 0]
    if positive.size == 0:
        return np.ones_like(k_perp)
    grid = np.geomspace(positive.min(), positive.max() * (1 + 1e-9), THICKNESS_GRID)
    averaged = np.asarray(power(np.sqrt(grid[:, None] ** 2 + k_par[None, :] ** 2)), np.float64)
    table = averaged @ weights / np.sum(weights) / np.asarray(power(grid), np.float64)
    return np.interp(np.log(np.maximum(k_perp, grid[0])), np.log(grid), table)


def resolved_multipoles(
    cosmo: cosmology.Cosmology,
    power,
    chi_edges,
    box_size: float,
    transfer,
    source: projection.Source,
    held: MultipoleRange,
) -> MultipoleRange:
    """The widest run of multipoles within ``held`` (what the map holds, with its reasons)
    whose Limber C_ℓ of the source the planes of edges
    chi_edges get wrong by at most LIMBER_TOLERANCE: the share of the Limber integral (linear
    ``power``) at k < 2π / box_size plus its share weighted by |1 - transfer(k, plane)|, with
    transfer (callable of k (L, S) h/Mpc and plane index (S,)) a plane's power at k relative to
    Limber's from a converged run."""
    ell = np.geomspace(held.ell_min, held.ell_max, ELL_SAMPLES)
    chi, integrand, _ = projection.limber_integrand(cosmo, ell, source, power)
    edges = np.asarray(chi_edges, np.float64)
    plane = np.clip(np.searchsorted(edges, chi, side="right") - 1, 0, edges.size - 2)
    k = (ell[:, None] + 0.5) / chi[None, :]
    missing = np.where(k < 2 * np.pi / box_size, 1.0, np.abs(1.0 - transfer(k, plane)))
    ok = np.sum(integrand * missing, axis=1) / np.sum(integrand, axis=1) <= LIMBER_TOLERANCE
    if not ok.any():
        return MultipoleRange(float(held.ell_min), 0.0, held.min_reason, _EMPTY)
    runs = np.split(np.arange(ell.size), np.flatnonzero(np.diff(ok.astype(int))) + 1)
    best = max((r for r in runs if ok[r[0]]), key=len)
    first, last = best[0], best[-1]
    return MultipoleRange(
        float(ell[first]),
        float(ell[last]),
        held.min_reason if first == 0 else _BELOW,
        held.max_reason if last == ell.size - 1 else _ABOVE,
    )


_BELOW = (
    f"geometry: below, the planes get over {LIMBER_TOLERANCE:.0%} of the Limber C_ell "
    "wrong (modes longer than the box, plane thickness; pmpipe.physics.statistics.resolution)"
)
_ABOVE = (
    f"resolution: above, the planes get over {LIMBER_TOLERANCE:.0%} of the Limber C_ell "
    "wrong (particle grid, force mesh, band limit, plane thickness; pmpipe.physics.statistics.resolution)"
)
_EMPTY = (
    f"no multipole of the map gets under {LIMBER_TOLERANCE:.0%} of the Limber C_ell "
    "wrong (pmpipe.physics.statistics.resolution)"
)
