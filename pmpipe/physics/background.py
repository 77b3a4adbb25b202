"""Background expansion of flat ΛCDM / w0waCDM with photons and massless neutrinos.

The densities and H(a) are written with arithmetic only, so the same functions serve numpy
arrays (here: distances on the host, for checks and estimates made before JAX starts) and
JAX arrays (:mod:`pmpipe.physics.cosmology`, whose growth and distance tables integrate them).
``cosmo`` is any object with the fields of :class:`pmpipe.physics.cosmology.Cosmology` (Omega_m, h,
w0, wa, T_cmb, N_eff).

Units: distances in Mpc/h.
"""

from __future__ import annotations

import math

import numpy as np

# Physical constants (SI), used once to get the photon density.
_SIGMA_SB = 5.670374419e-8  # W m^-2 K^-4
_C_SI = 299792458.0  # m / s
_G_SI = 6.67430e-11  # m^3 kg^-1 s^-2
_MPC_M = 3.0856775814913673e22  # m
C_KM_S = 299792.458  # speed of light, km / s
HUBBLE_DISTANCE = C_KM_S / 100.0  # c / H0 in Mpc/h

# The fiducial cosmology (Planck-like): a run's defaults and the physics' defaults
FIDUCIAL = {
    "Omega_m": 0.3111,
    "Omega_b": 0.0490,
    "h": 0.6766,
    "n_s": 0.9665,
    "sigma8": 0.8102,
    "w0": -1.0,
    "wa": 0.0,
    "T_cmb": 2.7255,
    "N_eff": 3.046,
}


def omega_radiation(cosmo):
    """Ω_r today: photons at T_cmb plus N_eff massless neutrino species."""
    rho_crit = 3.0 * (1e5 / _MPC_M) ** 2 / (8.0 * math.pi * _G_SI)  # kg/m^3 for h = 1
    omega_gamma_h2_per_T4 = 4.0 * _SIGMA_SB / _C_SI**3 / rho_crit
    omega_gamma = omega_gamma_h2_per_T4 * cosmo.T_cmb**4 / cosmo.h**2
    return omega_gamma * (1.0 + cosmo.N_eff * 7.0 / 8.0 * (4.0 / 11.0) ** (4.0 / 3.0))


def omega_de(cosmo):
    """Dark energy density today, closing a flat universe."""
    return 1.0 - cosmo.Omega_m - omega_radiation(cosmo)


def de_scaling(cosmo, a):
    """ρ_de(a) / ρ_de(1) for the CPL equation of state."""
    return a ** (-3.0 * (1.0 + cosmo.w0 + cosmo.wa)) * math.e ** (-3.0 * cosmo.wa * (1.0 - a))


def E2(cosmo, a):
    """(H(a) / H0)^2."""
    return (
        omega_radiation(cosmo) * a**-4
        + cosmo.Omega_m * a**-3
        + omega_de(cosmo) * de_scaling(cosmo, a)
    )


# Gauss-Legendre nodes on [0, 1] for χ(a) = c/H0 ∫ dln a' / (a' E(a')) from ln a to 0: the
# integrand is smooth, and 64 nodes give χ to 1e-12 relative for a >= 0.01.
_NODES, _WEIGHTS = np.polynomial.legendre.leggauss(64)
_NODES, _WEIGHTS = 0.5 * (_NODES + 1.0), 0.5 * _WEIGHTS


def comoving_distance(cosmo, a) -> np.ndarray:
    """χ(a) from a = 1 in Mpc/h, for numpy scale factors a of any shape (float64)."""
    lna = np.log(np.asarray(a, np.float64))[..., None]
    x = lna * (1.0 - _NODES)  # from ln a to 0
    a_x = np.exp(x)
    integrand = 1.0 / (a_x * np.sqrt(E2(cosmo, a_x)))
    return HUBBLE_DISTANCE * (-lna[..., 0]) * (integrand @ _WEIGHTS)


def scale_factor_at_distance(cosmo, chi) -> np.ndarray:
    """Inverse of :func:`comoving_distance`: a(χ) for numpy χ in Mpc/h (Newton steps in ln a
    from a tabulated first guess)."""
    chi = np.asarray(chi, np.float64)
    grid = np.linspace(math.log(1e-3), 0.0, 512)
    lna = np.interp(-chi, -comoving_distance(cosmo, np.exp(grid)), grid)
    for _ in range(4):
        a = np.exp(lna)
        lna = lna - (comoving_distance(cosmo, a) - chi) / (
            -HUBBLE_DISTANCE / (a * np.sqrt(E2(cosmo, a)))
        )
    return np.exp(lna)
