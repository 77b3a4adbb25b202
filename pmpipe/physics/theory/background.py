"""Background expansion of flat ΛCDM / w0waCDM with photons and neutrinos, massless or of
total mass m_nu.

The densities and H(a) are written with arithmetic only, so the same functions serve numpy
arrays (here: distances on the host, for checks and estimates made before JAX starts) and
JAX arrays (:mod:`pmpipe.physics.theory.cosmology`, whose growth and distance tables integrate them).
``cosmo`` is any object with the fields of :class:`pmpipe.physics.theory.cosmology.Cosmology` (Omega_m, h,
w0, wa, T_cmb, N_eff, m_nu; neutrino_hierarchy, 'degenerate' when absent).

Neutrinos follow CAMB's convention. With m_nu = 0 all N_eff species are radiation. With
m_nu > 0 three massive species carry N_EFF_MASSIVE (or N_eff when it is smaller) of the
effective number, their excess over 3 expressed as a higher temperature; the rest of N_eff is
massless. Their masses sum to m_nu: equal (``neutrino_hierarchy`` 'degenerate'), or split as
the oscillations' mass-squared differences require for the normal or inverted ordering
(:func:`neutrino_masses`). Their density at every a is the sum of each species' Fermi-Dirac
integral, and Ω_m counts their full density today: Ω_m = Ω_cb + Ω_ν.

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
_K_B_EV = 8.617333262e-5  # Boltzmann constant, eV / K
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
    "m_nu": 0.0,
}

NEUTRINO_SPECIES = 3  # massive species, their masses summing to m_nu
HIERARCHIES = ("degenerate", "normal", "inverted")  # how m_nu splits among them
# The mass-squared differences of the oscillations (eV²), rounded global-fit values (Particle
# Data Group 2024, "Neutrino masses, mixing and oscillations"): solar m2² - m1², atmospheric
# m3² - m1² (normal ordering) or m2² - m3² (inverted ordering)
DM2_SOLAR = 7.5e-5
DM2_ATMOSPHERIC = 2.5e-3
N_EFF_MASSIVE = 3.044  # the part of N_eff the massive species carry (CAMB's standard N_eff)
_NU_PER_PHOTON = 7.0 / 8.0 * (4.0 / 11.0) ** (4.0 / 3.0)  # ρ of one massless species / ρ_γ
_FD_RELATIVISTIC = 7.0 * math.pi**4 / 120.0  # ∫ x³ / (e^x + 1) dx
# Gauss-Laguerre nodes for the Fermi-Dirac integrals ∫ x² f(x) / (e^x + 1) dx = ∫ e^-x g(x) dx
_FD_NODES, _FD_WEIGHTS = np.polynomial.laguerre.laggauss(48)
_FD_WEIGHTS = _FD_WEIGHTS / (1.0 + np.exp(-_FD_NODES))


def omega_photons(cosmo):
    """Ω_γ today: photons at T_cmb."""
    rho_crit = 3.0 * (1e5 / _MPC_M) ** 2 / (8.0 * math.pi * _G_SI)  # kg/m^3 for h = 1
    omega_gamma_h2_per_T4 = 4.0 * _SIGMA_SB / _C_SI**3 / rho_crit
    return omega_gamma_h2_per_T4 * cosmo.T_cmb**4 / cosmo.h**2


def _massive(cosmo):
    """1 when the neutrinos have mass (m_nu > 0), else 0 (numpy or JAX)."""
    return 1.0 * (cosmo.m_nu > 0)


def massive_neutrino_number(cosmo):
    """The part of N_eff the massive species carry: min(N_eff, N_EFF_MASSIVE), 0 if m_nu = 0."""
    smaller = 0.5 * (cosmo.N_eff + N_EFF_MASSIVE - abs(cosmo.N_eff - N_EFF_MASSIVE))
    return _massive(cosmo) * smaller


def omega_radiation(cosmo):
    """Ω_r today: photons at T_cmb plus the massless neutrino species."""
    massless = cosmo.N_eff - massive_neutrino_number(cosmo)
    return omega_photons(cosmo) * (1.0 + massless * _NU_PER_PHOTON)


def neutrino_temperature_ratio(cosmo):
    """T_ν / T_cmb of the massive species today: the massless neutrinos' (4/11)^(1/3) times
    (N_massive / 3)^(1/4), which makes the three carry N_massive of N_eff."""
    degeneracy = massive_neutrino_number(cosmo) / NEUTRINO_SPECIES + (1.0 - _massive(cosmo))
    return (4.0 / 11.0) ** (1.0 / 3.0) * degeneracy**0.25


def hierarchy(cosmo) -> str:
    """How ``cosmo``'s m_nu splits among the species: its neutrino_hierarchy, else 'degenerate'."""
    return getattr(cosmo, "neutrino_hierarchy", HIERARCHIES[0])


def _heavier_offsets(name: str) -> tuple[float, float]:
    """m² - m_lightest² (eV²) of the two heavier species of hierarchy ``name`` (not degenerate)."""
    if name == "normal":  # m1 lightest: m2² = m1² + solar, m3² = m1² + atmospheric
        return DM2_SOLAR, DM2_ATMOSPHERIC
    if name == "inverted":  # m3 lightest: m2² = m3² + atmospheric, m1² = m2² - solar
        return DM2_ATMOSPHERIC - DM2_SOLAR, DM2_ATMOSPHERIC
    raise ValueError(f"neutrino_hierarchy {name!r}: one of {', '.join(HIERARCHIES)}")


def minimum_mass_sum(name: str) -> float:
    """The smallest m_nu (eV) hierarchy ``name`` allows: its lightest species massless (0 for
    'degenerate')."""
    if name == HIERARCHIES[0]:
        return 0.0
    return sum(math.sqrt(offset) for offset in _heavier_offsets(name))


_NEWTON_STEPS = 8  # from m_nu / 3 to the lightest mass: at most 7 change it above rounding


def neutrino_masses(cosmo) -> tuple:
    """The three species' masses (eV, ascending), summing to m_nu (numpy or JAX): m_nu / 3 each when
    degenerate; else the lightest m solves m + Σ sqrt(m² + offset) = m_nu over the heavier
    species' offsets (Newton's method from m_nu / 3, where the convex sum is at or above m_nu,
    so that it descends to the root; m_nu at least :func:`minimum_mass_sum`)."""
    name = hierarchy(cosmo)
    if name == HIERARCHIES[0]:
        return (cosmo.m_nu / NEUTRINO_SPECIES,) * NEUTRINO_SPECIES
    offsets = _heavier_offsets(name)
    light = cosmo.m_nu / NEUTRINO_SPECIES
    for _ in range(_NEWTON_STEPS):
        roots = [(light * light + offset) ** 0.5 for offset in offsets]
        excess = light + sum(roots) - cosmo.m_nu
        light = light - excess / (1.0 + sum(light / root for root in roots))
    light = 0.5 * (light + abs(light))  # at the smallest sum, 0 for a rounding below it
    return (light, *((light * light + offset) ** 0.5 for offset in offsets))


def _neutrino_mass_ratio(cosmo, mass, a):
    """m / (k_B T) of a massive species of ``mass`` (eV) at scale factor a, T its
    temperature (:func:`neutrino_temperature_ratio`)."""
    t_nu = neutrino_temperature_ratio(cosmo) * cosmo.T_cmb
    no_relics = 1.0 * (cosmo.T_cmb == 0)  # then no neutrino density either, and no 0 / 0
    return mass * a / (_K_B_EV * t_nu + no_relics)


def _fermi_dirac(y):
    """(ρ, P) of one species with m / (k_B T) = y, in units of _FD_RELATIVISTIC times its
    relativistic density."""
    x = _FD_NODES.reshape(_FD_NODES.shape + (1,) * np.ndim(y))  # nodes on a leading axis
    w = _FD_WEIGHTS.reshape(x.shape)
    energy = (x * x + y * y) ** 0.5
    rho = (w * x * x * energy).sum(axis=0)
    pressure = (w * x**4 / (3.0 * energy)).sum(axis=0)
    return rho, pressure


def neutrino_density_pressure(cosmo, a):
    """(ρ_ν, P_ν)(a) / ρ_crit,0 of the massive species together (both 0 if m_nu = 0): the
    mean of the species' Fermi-Dirac integrals, scaled by N_massive relativistic species."""
    scale = omega_photons(cosmo) * _NU_PER_PHOTON * massive_neutrino_number(cosmo) * a**-4.0
    if hierarchy(cosmo) == HIERARCHIES[0]:  # one integral for the three equal masses
        y = _neutrino_mass_ratio(cosmo, cosmo.m_nu / NEUTRINO_SPECIES, a)
        rho, pressure = _fermi_dirac(y)
    else:
        each = _each_species(cosmo, a)
        rho = sum(r for r, _ in each) / NEUTRINO_SPECIES
        pressure = sum(p for _, p in each) / NEUTRINO_SPECIES
    return scale * rho / _FD_RELATIVISTIC, scale * pressure / _FD_RELATIVISTIC


def _each_species(cosmo, a) -> list:
    """:func:`_fermi_dirac` (ρ, P) of each species of :func:`neutrino_masses` at scale factor a."""
    return [_fermi_dirac(_neutrino_mass_ratio(cosmo, m, a)) for m in neutrino_masses(cosmo)]


def neutrino_density_shares(cosmo, a=1.0) -> tuple:
    """Each species' part of the massive neutrinos' density at scale factor a (in the order
    of :func:`neutrino_masses`; summing to 1)."""
    rho = [r for r, _ in _each_species(cosmo, a)]
    return tuple(r / sum(rho) for r in rho)


def omega_nu(cosmo):
    """Ω_ν: the massive neutrinos' density today (0 if m_nu = 0), part of Ω_m."""
    return neutrino_density_pressure(cosmo, 1.0)[0]


def omega_cb(cosmo):
    """Ω_cb = Ω_m - Ω_ν: CDM and baryons today (the particles of the N-body)."""
    return cosmo.Omega_m - omega_nu(cosmo)


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
        + omega_cb(cosmo) * a**-3
        + neutrino_density_pressure(cosmo, a)[0]
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
    from a first guess interpolated in a table of 64 scale factors, which the steps refine to
    the rounding of float64)."""
    chi = np.asarray(chi, np.float64)
    grid = np.linspace(math.log(1e-3), 0.0, 64)
    lna = np.interp(-chi, -comoving_distance(cosmo, np.exp(grid)), grid)
    for _ in range(4):
        a = np.exp(lna)
        lna = lna - (comoving_distance(cosmo, a) - chi) / (
            -HUBBLE_DISTANCE / (a * np.sqrt(E2(cosmo, a)))
        )
    return np.exp(lna)
