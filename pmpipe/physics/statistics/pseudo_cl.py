"""Angular power spectra of masked full-sky maps: the pseudo-C_ℓ of the masked map with the
mask's mode coupling removed (the MASTER estimator of Hivon et al. 2002; spin 2 as Brown,
Castro & Taylor 2005 write it).

A mask w (its power W_ℓ) couples the multipoles of a field: the masked field's spectrum is
on average C̃_ℓ = Σ_ℓ' M_ℓℓ' C_ℓ' with

    spin 0:  M_ℓℓ' = (2ℓ'+1)/4π Σ_L (2L+1) W_L (ℓ ℓ' L; 0 0 0)²
    spin 2:  C̃^EE = M⁺ C^EE + M⁻ C^BB,  C̃^BB = M⁻ C^EE + M⁺ C^BB,
             M^±_ℓℓ' = (2ℓ'+1)/8π Σ_L (2L+1) W_L (ℓ ℓ' L; 2 −2 0)² (1 ± (−1)^(ℓ+ℓ'+L)).

The sums over L are integrals of products of Wigner functions against the mask's correlation
function ξ(x) = Σ_L (2L+1) W_L P_L(x), x = cos θ:

    Σ_L (2L+1) W_L (ℓ ℓ' L; 0 0 0)² = ½ ∫ P_ℓ P_ℓ' ξ dx,
    Σ_L (2L+1) W_L (ℓ ℓ' L; 2 −2 0)² (±1)^(ℓ+ℓ'+L) = ½ ∫ d^ℓ_{2,±2} d^ℓ'_{2,±2} ξ dx,

which Gauss-Legendre quadrature with enough nodes makes exact. The spectra are recovered in
multipole bins: C_b = (P M Q)⁻¹ P C̃, P averaging a bin's multipoles and Q spreading a bin's
value evenly over them. On average C_b is not the bin's mean of C_ℓ but the spectrum seen
through the bandpower window (P M Q)⁻¹ P M (:func:`windows_spin0`, :func:`windows_spin2`),
which differs from the mean where C_ℓ is not flat across a bin: theory is compared through the
windows. Unbiased on average, not mode by mode: on one sky, a masked E field still puts power
into the B estimate (the ambiguous modes at the mask's edges).
"""

from __future__ import annotations

import numpy as np

from pmpipe.physics.statistics import shear_correlation


def mask_power(mask, ell_max: int) -> np.ndarray:
    """W_ℓ (ℓ ≤ ell_max) of a HEALPix mask (RING), at most to 3 nside − 1 (zero beyond)."""
    import healpy

    mask = np.asarray(mask, np.float64)
    reach = min(ell_max, 3 * healpy.npix2nside(mask.size) - 1)
    power = np.zeros(ell_max + 1)
    power[: reach + 1] = healpy.anafast(mask, lmax=reach, iter=3)
    return power


def _quadrature(mask_cl, ell_max: int):
    """Gauss-Legendre nodes x, and weights times the mask's ξ(x)/2, exact for the couplings of
    multipoles up to ell_max with the mask's multipoles."""
    nodes = (2 * ell_max + mask_cl.size) // 2 + 2
    x, weights = np.polynomial.legendre.leggauss(nodes)
    ell = np.arange(mask_cl.size)
    xi = np.polynomial.legendre.legval(x, (2 * ell + 1) * mask_cl)
    return x, 0.5 * weights * xi


def coupling_spin0(mask_cl, ell_max: int) -> np.ndarray:
    """M_ℓℓ' (ell_max + 1, ell_max + 1) of a scalar field under a mask of power mask_cl."""
    x, weights = _quadrature(mask_cl, ell_max)
    legendre = np.polynomial.legendre.legvander(x, ell_max).T  # (ℓ, nodes)
    ell = np.arange(ell_max + 1)
    return (legendre * weights) @ legendre.T * (2 * ell + 1)[None, :] / (4 * np.pi)


def coupling_spin2(mask_cl, ell_max: int) -> tuple[np.ndarray, np.ndarray]:
    """(M⁺, M⁻), each (ell_max + 1, ell_max + 1), of a spin-2 field under a mask of power
    mask_cl (rows and columns below ℓ = 2 are 0)."""
    x, weights = _quadrature(mask_cl, ell_max)
    d_plus, d_minus = shear_correlation.wigner_d2(ell_max, np.arccos(x))
    same = (d_plus * weights) @ d_plus.T  # the sum without the sign
    signed = (d_minus * weights) @ d_minus.T  # with (-1)^(ℓ+ℓ'+L)
    column = (2 * np.arange(ell_max + 1) + 1)[None, :] / (8 * np.pi)
    return (same + signed) * column, (same - signed) * column


def _binning(edges, ell_max: int) -> tuple[np.ndarray, np.ndarray]:
    """P (B, ℓ) averaging each bin [edges_b, edges_b+1) and Q (ℓ, B) spreading a bin's value
    over its multipoles."""
    ell = np.arange(ell_max + 1)
    edges = np.asarray(edges)
    inside = (ell[None, :] >= edges[:-1, None]) & (ell[None, :] < edges[1:, None])
    average = inside / inside.sum(axis=1, keepdims=True)
    return average, inside.T.astype(np.float64)


def windows_spin0(coupling, edges) -> np.ndarray:
    """Bandpower windows (B, ℓ): the mean of C_b is windows @ C_ℓ."""
    average, spread = _binning(edges, coupling.shape[0] - 1)
    return np.linalg.solve(average @ coupling @ spread, average @ coupling)


def windows_spin2(couplings, edges) -> np.ndarray:
    """Bandpower windows (2B, 2(ℓ_max + 1)) of a spin-2 field: the means of (C^EE_b, C^BB_b),
    concatenated, are windows @ (C^EE_ℓ, C^BB_ℓ) concatenated."""
    plus, minus = couplings
    average, spread = _binning(edges, plus.shape[0] - 1)
    bp, bm = average @ plus @ spread, average @ minus @ spread
    coupled = np.block([[average @ plus, average @ minus], [average @ minus, average @ plus]])
    return np.linalg.solve(np.block([[bp, bm], [bm, bp]]), coupled)


def decoupled_spin0(pseudo_cl, coupling, edges) -> np.ndarray:
    """Binned C_b (..., B) from the pseudo-C_ℓ (..., ℓ) of masked maps, the coupling M and
    multipole bin edges (B + 1,) within 0 .. ℓ_max + 1."""
    average, spread = _binning(edges, coupling.shape[0] - 1)
    return np.linalg.solve(average @ coupling @ spread, (np.asarray(pseudo_cl) @ average.T).T).T


def decoupled_spin2(pseudo_ee, pseudo_bb, couplings, edges) -> tuple[np.ndarray, np.ndarray]:
    """Binned (C^EE_b, C^BB_b) (..., B) from the pseudo-spectra (..., ℓ) of a masked spin-2
    field, its couplings (M⁺, M⁻) and multipole bin edges (B + 1,)."""
    plus, minus = couplings
    average, spread = _binning(edges, plus.shape[0] - 1)
    bp, bm = average @ plus @ spread, average @ minus @ spread
    system = np.block([[bp, bm], [bm, bp]])
    pseudo = np.concatenate(
        [np.asarray(pseudo_ee) @ average.T, np.asarray(pseudo_bb) @ average.T], axis=-1
    )
    solved = np.linalg.solve(system, pseudo.T).T
    bins = bp.shape[0]
    return solved[..., :bins], solved[..., bins:]
