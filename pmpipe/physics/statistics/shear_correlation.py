"""Real-space shear two-point functions of full-sky maps from their E and B spectra:

    ξ±(θ) = Σ_ℓ (2ℓ + 1) / 4π  (C_ℓ^EE ± C_ℓ^BB)  d^ℓ_{2,±2}(θ),

the sum running to the maps' band limit; pmpipe's maps are point samples of band-limited
fields, so no pixel window enters. The Wigner functions come from the three-term
recursion in ℓ (numpy, float64; stable upwards).
"""

from __future__ import annotations

import math

import numpy as np


def wigner_d2(ell_max: int, theta) -> tuple[np.ndarray, np.ndarray]:
    """d^ℓ_{2,2}(θ) and d^ℓ_{2,-2}(θ), each (ℓ_max + 1, T) for ℓ = 0 .. ℓ_max (0 below ℓ = 2),
    at angles theta (T,) in rad."""
    x = np.cos(np.atleast_1d(np.asarray(theta, np.float64)))
    out = []
    for second in (2, -2):
        d = np.zeros((ell_max + 1, x.size))
        if ell_max >= 2:
            d[2] = (0.5 * (1 + math.copysign(1, second) * x)) ** 2
        for j in range(2, ell_max):
            scale = math.sqrt(((j + 1) ** 2 - 4) * ((j + 1) ** 2 - second**2))
            rise = (j + 1) * (2 * j + 1) / scale
            fall = (j + 1) * math.sqrt((j * j - 4) * (j * j - second**2)) / (j * scale)
            d[j + 1] = rise * (x - 2 * second / (j * (j + 1))) * d[j] - fall * d[j - 1]
        out.append(d)
    return out[0], out[1]


def shear_correlations(cl_ee, cl_bb, theta) -> tuple[np.ndarray, np.ndarray]:
    """(ξ+, ξ-) (..., T) at angles theta (T,) rad from the E and B spectra (..., ℓ_max + 1) per
    multipole ℓ = 0 .. ℓ_max (sr), every leading index (pairs of sources) from one recursion;
    a pixel window, where maps have one, is for the caller to multiply the spectra by
    (squared)."""
    cl_ee, cl_bb = np.asarray(cl_ee, np.float64), np.asarray(cl_bb, np.float64)
    ell = np.arange(cl_ee.shape[-1])
    weight = (2 * ell + 1) / (4 * np.pi)
    d_plus, d_minus = wigner_d2(ell.size - 1, theta)
    return ((cl_ee + cl_bb) * weight) @ d_plus, ((cl_ee - cl_bb) * weight) @ d_minus
