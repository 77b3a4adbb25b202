"""Weak-lensing convergence in the Born approximation from lightcone planes, and shear.

κ(θ) = Σ_i w_i Σ_i(χ_i θ), with Σ_i the projected overdensity of plane i (Mpc/h, from
:mod:`pmpipe.lightcone`) and w_i the lensing efficiency averaged over the plane,

    q(χ) = 3/2 Ω_m (H0/c)² χ / a(χ) ∫_χ dχ_s n(χ_s) (χ_s - χ) / χ_s     [h/Mpc],

for a source distribution n(χ_s) normalised to 1 (a single source redshift: a delta function).
Flat sky: pixel centres θ on a square field of view around the line of sight (the observer's z
axis), planes read by exact Fourier interpolation of their periodic grids. Full sky: HEALPix
shells, κ as the same weighted sum; shear from κ through spin-2 harmonic transforms (healpy).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding

from pmpipe import cosmology
from pmpipe.parallel import FIELD_SPEC

LENSING_PREFACTOR = 1.5 / cosmology.HUBBLE_DISTANCE**2  # 3/2 (H0/c)^2 in (h/Mpc)^2, times Ω_m


def smail(z, z0: float, alpha: float, beta: float):
    """Smail et al. (1994) shape n(z) ∝ z^α exp(-(z/z0)^β), unnormalised."""
    z = np.asarray(z, dtype=np.float64)
    return z**alpha * np.exp(-((z / z0) ** beta))


def source_distribution(cosmo: cosmology.Cosmology, z, n, table=None):
    """A tabulated n(z) (any normalisation) as comoving distances χ_s (Mpc/h) with weights
    summing to 1 (trapezoid rule)."""
    z = np.asarray(z, dtype=np.float64)
    n = np.asarray(n, dtype=np.float64)
    widths = np.zeros_like(z)
    widths[1:] += 0.5 * np.diff(z)
    widths[:-1] += 0.5 * np.diff(z)
    weights = n * widths
    chi = np.asarray(cosmology.comoving_distance(cosmo, 1.0 / (1.0 + z), table), np.float64)
    return chi, weights / weights.sum()


def lensing_efficiency(cosmo: cosmology.Cosmology, chi, source_chi, source_weights, table=None):
    """q(χ) in h/Mpc at comoving distances chi (Mpc/h) for sources at source_chi with
    source_weights (summing to 1)."""
    chi = np.asarray(chi, dtype=np.float64)
    a = np.asarray(cosmology.scale_factor_at_distance(cosmo, chi, table), np.float64)
    chi_s = np.asarray(source_chi, np.float64)[None, :]
    ratio = np.where(chi_s > chi[:, None], (chi_s - chi[:, None]) / chi_s, 0.0)
    return LENSING_PREFACTOR * cosmo.Omega_m * chi / a * (ratio @ np.asarray(source_weights))


def plane_weights(cosmo: cosmology.Cosmology, chi_edges, source_chi, source_weights, table=None,
                  samples: int = 64):
    """Born weight w_i of each plane [χ_i, χ_i+1): q averaged over the plane (h/Mpc), so that
    κ = Σ_i w_i Σ_i with Σ_i the plane's projected overdensity in Mpc/h."""
    edges = np.asarray(chi_edges, np.float64)
    frac = (np.arange(samples) + 0.5) / samples  # midpoints
    chi = edges[:-1, None] + frac[None, :] * np.diff(edges)[:, None]
    q = lensing_efficiency(cosmo, chi.reshape(-1), source_chi, source_weights, table)
    return q.reshape(chi.shape).mean(axis=1)


def pixel_centres(fov_deg: float, pixels: int) -> np.ndarray:
    """Angles (pixels,) in radians of the pixel centres along one side, centred on 0."""
    step = math.radians(fov_deg) / pixels
    return (np.arange(pixels) + 0.5 - 0.5 * pixels) * step


def _fourier_matrix(positions, mesh_n: int, box_size: float):
    """exp(i k x) for positions (n,) in Mpc/h and the grid's wavenumbers (M,)."""
    k = 2 * np.pi * np.fft.fftfreq(mesh_n, d=box_size / mesh_n)
    return np.exp(1j * positions[:, None] * k[None, :])


def _cic_window_2d(mesh_n: int, box_size: float):
    """CIC window sinc²(k_x Δ/2) sinc²(k_y Δ/2) of a periodic (M, M) grid."""
    k = 2 * np.pi * np.fft.fftfreq(mesh_n, d=box_size / mesh_n)
    w = np.sinc(k * box_size / mesh_n / (2 * np.pi)) ** 2
    return w[:, None] * w[None, :]


def plane_on_pixels(plane, box_size: float, chi: float, theta, offsets, compensate: bool = True):
    """Values (n, n) of a periodic plane (M, M) at transverse positions chi θ + offset (Mpc/h),
    by exact band-limited (Fourier) interpolation; the plane's CIC window divided out when
    ``compensate``."""
    mesh_n = plane.shape[0]
    modes = jnp.fft.fft2(plane)
    if compensate:
        modes = modes / _cic_window_2d(mesh_n, box_size)
    ex = jnp.asarray(_fourier_matrix(chi * theta + offsets[0], mesh_n, box_size), modes.dtype)
    ey = jnp.asarray(_fourier_matrix(chi * theta + offsets[1], mesh_n, box_size), modes.dtype)
    return (ex @ modes @ ey.T).real / mesh_n**2


def flat_sky_convergence(planes, weights, box_size: float, chi, theta, offsets, mesh: Mesh,
                         dtype=jnp.float32):
    """κ (S, n, n) for S sources: planes P callables returning plane i's projected overdensity
    (M, M), weights (S, P), chi (P,) plane distances, offsets (P, 2). The maps are sharded
    like a field's first two axes."""
    theta = np.asarray(theta)
    maps = jnp.zeros((weights.shape[0], theta.size, theta.size), dtype)
    for i, plane in enumerate(planes):
        if not np.any(weights[:, i]):
            continue  # beyond every source
        values = plane_on_pixels(plane(), box_size, float(chi[i]), theta, offsets[i])
        maps = maps + jnp.asarray(weights[:, i], dtype)[:, None, None] * values[None]
    spec = jax.P(None, *FIELD_SPEC)
    return jax.lax.with_sharding_constraint(maps, NamedSharding(mesh, spec))


def _kaiser_squires_kernel(shape):
    """(ℓ1² - ℓ2² + 2i ℓ1 ℓ2) / ℓ² on an (n1, n2) grid (0 at ℓ = 0)."""
    l1 = np.fft.fftfreq(shape[0])[:, None]
    l2 = np.fft.fftfreq(shape[1])[None, :]
    l_sq = l1**2 + l2**2
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(l_sq > 0, (l1**2 - l2**2 + 2j * l1 * l2) / l_sq, 0.0)


def shear_from_convergence(kappa):
    """Kaiser & Squires (1993): (γ1, γ2) of a flat-sky κ (..., n1, n2), axes (θx, θy), by FFT.

    The map is taken as periodic: pixels within a few correlation lengths of the edges carry
    the wrap-around of a field that is not.
    """
    gamma = jnp.fft.ifft2(jnp.fft.fft2(kappa) * _kaiser_squires_kernel(kappa.shape[-2:]))
    return gamma.real, gamma.imag


def convergence_from_shear(gamma1, gamma2):
    """Inverse Kaiser-Squires: the E-mode κ (..., n1, n2) of a flat-sky shear field (zero mean)."""
    modes = jnp.fft.fft2(gamma1 + 1j * gamma2)
    return jnp.fft.ifft2(modes * np.conj(_kaiser_squires_kernel(gamma1.shape[-2:]))).real


def _spin2_factor(lmax: int) -> np.ndarray:
    """sqrt((ℓ+2)(ℓ-1) / (ℓ(ℓ+1))) for ℓ = 0 .. lmax (0 for ℓ < 2)."""
    ell = np.arange(lmax + 1, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        f = np.sqrt((ell + 2) * (ell - 1) / (ell * (ell + 1)))
    f[:2] = 0.0
    return f


def healpix_shear_from_convergence(kappa, lmax: int | None = None):
    """(γ1, γ2) of a full-sky κ map (HEALPix RING): E-mode alm = f_ℓ κ_ℓm, B = 0, through
    healpy's spin-2 transform (γ1, γ2 as healpy's Q, U)."""
    import healpy

    nside = healpy.npix2nside(kappa.size)
    lmax = 3 * nside - 1 if lmax is None else lmax
    alm = healpy.map2alm(np.asarray(kappa, np.float64), lmax=lmax, iter=3)
    e_alm = healpy.almxfl(alm, _spin2_factor(lmax))
    g1, g2 = healpy.alm2map_spin([e_alm, np.zeros_like(e_alm)], nside, 2, lmax)
    return g1, g2


def healpix_convergence_from_shear(gamma1, gamma2, lmax: int | None = None):
    """Inverse of :func:`healpix_shear_from_convergence`: κ from the shear's E modes."""
    import healpy

    nside = healpy.npix2nside(np.size(gamma1))
    lmax = 3 * nside - 1 if lmax is None else lmax
    e_alm, _ = healpy.map2alm_spin([np.asarray(gamma1, np.float64), np.asarray(gamma2, np.float64)],
                                   2, lmax=lmax)
    with np.errstate(invalid="ignore", divide="ignore"):
        inverse = np.where(_spin2_factor(lmax) > 0, 1.0 / _spin2_factor(lmax), 0.0)
    return healpy.alm2map(healpy.almxfl(e_alm, inverse), nside, lmax=lmax)


def limber_convergence_cl(cosmo: cosmology.Cosmology, ell, source_chi, source_weights, power,
                          table=None, samples: int = 256):
    """Limber C_ℓ of κ with the linear power D1(a)² P_lin(k) (power: callable of k [h/Mpc]
    giving (Mpc/h)³): C_ℓ = ∫ q(χ)² / χ² P(ℓ/χ, a(χ)) dχ up to the farthest source."""
    chi_max = float(np.max(source_chi))
    chi = (np.arange(samples) + 0.5) * chi_max / samples
    q = lensing_efficiency(cosmo, chi, source_chi, source_weights, table)
    a = cosmology.scale_factor_at_distance(cosmo, chi, table)
    growth = np.asarray(cosmology.growth_factor(cosmo, a, table), np.float64)
    k = (np.asarray(ell, np.float64)[:, None] + 0.5) / chi[None, :]
    pk = np.asarray(power(k), np.float64) * growth[None, :] ** 2
    return np.sum(q**2 / chi**2 * pk, axis=1) * (chi_max / samples)
