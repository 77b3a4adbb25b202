"""The Eisenstein & Hu (1998) fit to the linear matter spectrum, written once for numpy and
jax.numpy (``xp``): pmpipe.physics.theory.cosmology evaluates it in JAX; the estimates here evaluate it
in numpy, without importing JAX, for many cosmologies at once (a campaign's plan)."""

from __future__ import annotations

import dataclasses
import math
import types

import numpy as np

from pmpipe.physics.theory.background import HUBBLE_DISTANCE


def vars_of(cosmo) -> dict:
    """The fields of a cosmology (a dataclass or a namespace) as a dict."""
    if dataclasses.is_dataclass(cosmo):
        return {f.name: getattr(cosmo, f.name) for f in dataclasses.fields(cosmo)}
    return dict(vars(cosmo))


def tophat_window(x, xp=np):
    """Fourier transform of a unit-volume spherical top hat, W(x) = 3 (sin x - x cos x) / x^3."""
    x = xp.maximum(x, 1e-4)
    return 3.0 * (xp.sin(x) - x * xp.cos(x)) / x**3


def sigma_r(k, pk, radius, xp=np):
    """rms of a field with power pk(k) (log-spaced k, h/Mpc, the last axis) in top-hat spheres
    of radius Mpc/h."""
    integrand = k**3 * pk * tophat_window(k * radius, xp) ** 2 / (2.0 * xp.pi**2)
    return xp.sqrt(xp.trapezoid(integrand, xp.log(k), axis=-1))


def transfer(cosmo, k, wiggles: bool = True, xp=np):
    """Eisenstein & Hu (1998) matter transfer function; k in h/Mpc.

    wiggles=True: the full fit with baryon acoustic oscillations (their eqs. 16-24);
    wiggles=False: the smooth "zero-baryon shape" fit with the effective shape Γ_eff (eqs. 29-31).
    ``cosmo``: any object with the fields of pmpipe.physics.theory.cosmology.Cosmology; ``xp``: numpy
    or jax.numpy.
    """
    h = cosmo.h
    om = cosmo.Omega_m * h**2
    ob = cosmo.Omega_b * h**2
    fb = cosmo.Omega_b / cosmo.Omega_m
    fc = 1.0 - fb
    theta = cosmo.T_cmb / 2.7
    kmpc = k * h  # 1/Mpc
    if not wiggles:
        s = 44.5 * xp.log(9.83 / om) / xp.sqrt(1.0 + 10.0 * ob**0.75)
        alpha = 1.0 - 0.328 * xp.log(431.0 * om) * fb + 0.38 * xp.log(22.3 * om) * fb**2
        gamma_eff = cosmo.Omega_m * h * (alpha + (1.0 - alpha) / (1.0 + (0.43 * kmpc * s) ** 4))
        q = k * theta**2 / gamma_eff
        L0 = xp.log(2.0 * xp.e + 1.8 * q)
        C0 = 14.2 + 731.0 / (1.0 + 62.5 * q)
        return L0 / (L0 + C0 * q * q)

    z_eq = 2.50e4 * om * theta**-4
    k_eq = 7.46e-2 * om * theta**-2
    b1 = 0.313 * om**-0.419 * (1.0 + 0.607 * om**0.674)
    b2 = 0.238 * om**0.223
    z_d = 1291.0 * om**0.251 / (1.0 + 0.659 * om**0.828) * (1.0 + b1 * ob**b2)
    R_d = 31.5 * ob * theta**-4 * (1e3 / z_d)
    R_eq = 31.5 * ob * theta**-4 * (1e3 / z_eq)
    s = (
        2.0
        / (3.0 * k_eq)
        * xp.sqrt(6.0 / R_eq)
        * xp.log((xp.sqrt(1.0 + R_d) + xp.sqrt(R_d + R_eq)) / (1.0 + xp.sqrt(R_eq)))
    )
    k_silk = 1.6 * ob**0.52 * om**0.73 * (1.0 + (10.4 * om) ** -0.95)
    q = kmpc / (13.41 * k_eq)

    def t0_tilde(alpha, beta):
        L = xp.log(xp.e + 1.8 * beta * q)
        C = 14.2 / alpha + 386.0 / (1.0 + 69.9 * q**1.08)
        return L / (L + C * q * q)

    a1 = (46.9 * om) ** 0.670 * (1.0 + (32.1 * om) ** -0.532)
    a2 = (12.0 * om) ** 0.424 * (1.0 + (45.0 * om) ** -0.582)
    alpha_c = a1**-fb * a2 ** (-(fb**3))
    bb1 = 0.944 / (1.0 + (458.0 * om) ** -0.708)
    bb2 = (0.395 * om) ** -0.0266
    beta_c = 1.0 / (1.0 + bb1 * (fc**bb2 - 1.0))
    f = 1.0 / (1.0 + (kmpc * s / 5.4) ** 4)
    T_c = f * t0_tilde(1.0, beta_c) + (1.0 - f) * t0_tilde(alpha_c, beta_c)

    y = (1.0 + z_eq) / (1.0 + z_d)
    sq = xp.sqrt(1.0 + y)
    G = y * (-6.0 * sq + (2.0 + 3.0 * y) * xp.log((sq + 1.0) / (sq - 1.0)))
    alpha_b = 2.07 * k_eq * s * (1.0 + R_d) ** -0.75 * G
    beta_b = 0.5 + fb + (3.0 - 2.0 * fb) * xp.sqrt((17.2 * om) ** 2 + 1.0)
    beta_node = 8.41 * om**0.435
    s_tilde = s / (1.0 + (beta_node / (kmpc * s)) ** 3) ** (1.0 / 3.0)
    ks = kmpc * s_tilde
    T_b = (
        t0_tilde(1.0, 1.0) / (1.0 + (kmpc * s / 5.2) ** 2)
        + alpha_b / (1.0 + (beta_b / (kmpc * s)) ** 3) * xp.exp(-((kmpc / k_silk) ** 1.4))
    ) * xp.sinc(ks / xp.pi)
    return fb * T_b + fc * T_c


K_PIVOT = 0.05  # A_s's pivot wavenumber, 1/Mpc


def growth_suppression(omega_m):
    """D(a) / a at the time the matter density is omega_m, for a flat universe of matter and a
    cosmological constant (Carroll, Press & Turner 1992, eq. 29; within about 1 %)."""
    omega_l = 1.0 - omega_m
    return 2.5 * omega_m / (omega_m ** (4 / 7) - omega_l + (1 + omega_m / 2) * (1 + omega_l / 70))


def approximate_growth(cosmo, a):
    """D(a) / D(1) from :func:`growth_suppression` (no tables: for estimates only)."""
    omega_a = cosmo.Omega_m / (cosmo.Omega_m + (1 - cosmo.Omega_m) * a**3)
    return a * growth_suppression(omega_a) / growth_suppression(cosmo.Omega_m)


def linear_power(cosmo, k, A_s=None):
    """Linear P(k) at a = 1 [(Mpc/h)^3] of the Eisenstein-Hu fit with BAO in numpy, for estimates
    (no JAX: cheap for many cosmologies at once, whose fields may be arrays broadcasting against
    k [h/Mpc] along a new last axis): normalised to cosmo.sigma8, or with A_s to the primordial
    amplitude at K_PIVOT, Δ²(k) = (4/25) A_s (k/k_pivot)^(n_s-1) (k c/H0)^4 T(k)² (D(1)/a)² /
    Omega_m² (σ8 2.5 % above CAMB's at the fiducial cosmology with 0.06 eV neutrinos)."""
    kk = np.logspace(-4, 2, 600)  # σ8 within 1e-4 of the fine integral's
    leaves = {f: np.asarray(getattr(cosmo, f))[..., None] for f in ("Omega_m", "Omega_b", "h")}
    leaves |= {f: np.asarray(getattr(cosmo, f))[..., None] for f in ("n_s", "sigma8", "T_cmb")}
    c = types.SimpleNamespace(**{**vars_of(cosmo), **leaves})
    shape = lambda q: q**c.n_s * transfer(c, q) ** 2
    if A_s is None:
        norm = (c.sigma8 / sigma_r(kk, shape(kk), 8.0)[..., None]) ** 2
    else:
        primordial = 0.16 * np.asarray(A_s)[..., None] * (c.h / K_PIVOT) ** (c.n_s - 1)
        norm = 2 * np.pi**2 * primordial * HUBBLE_DISTANCE**4 / c.Omega_m**2
        norm = norm * growth_suppression(c.Omega_m) ** 2
    return norm * shape(np.asarray(k))


def linear_rms_displacement(cosmo, box_size: float, particles: int, a, A_s=None):
    """rms of one Cartesian component of the linear (Zel'dovich) displacement at scale factor a,
    Mpc/h, from the modes between the box's fundamental 2π/box_size and the particle Nyquist
    π particles/box_size of :func:`linear_power`: sqrt(∫ P(k) dk / 6π²) D(a)/D(1)."""
    k = np.logspace(
        math.log10(2 * math.pi / box_size), math.log10(math.pi * particles / box_size), 256
    )
    pk = linear_power(cosmo, k, A_s)
    var = np.trapezoid(k * pk, np.log(k), axis=-1) / (6 * np.pi**2)
    return np.sqrt(var) * approximate_growth(cosmo, np.asarray(a))
