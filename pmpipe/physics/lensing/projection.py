"""Weak-lensing convergence in the Born approximation from lightcone planes, and shear.

κ(θ) = Σ_i w_i Σ_i(χ_i θ), with Σ_i the projected overdensity of plane i (Mpc/h, from
:mod:`pmpipe.physics.evolution.lightcone`) and w_i the lensing efficiency averaged over the plane,

    q(χ) = 3/2 Ω_m (H0/c)² χ / a(χ) ∫_χ dχ_s n(χ_s) (χ_s - χ) / χ_s     [h/Mpc],

for a source distribution n(χ_s) normalised to 1 (a single source redshift: a delta function).
A source's nuisances enter through its kernel, which takes q's place: (1 + m)(q + n F), with the
intrinsic alignment's n F (pmpipe.physics.lensing.intrinsic_alignment) and the multiplicative shear
bias m (:func:`kernel`). Flat sky: pixel centres θ on a square field of view around the line
of sight (the observer's z axis), planes read by exact Fourier interpolation of their periodic
grids. Full sky: HEALPix shells, κ as the same weighted sum; shear from κ through spin-2
harmonic transforms (healpy).
"""

from __future__ import annotations

import dataclasses
import math
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding

from pmpipe.physics.lensing import intrinsic_alignment
from pmpipe.physics.mesh import fft, painting
from pmpipe.physics.mesh.domain import Grid
from pmpipe.physics.theory import cosmology
from pmpipe.runtime.parallel import FIELD_SPEC

LENSING_PREFACTOR = 1.5 / cosmology.HUBBLE_DISTANCE**2  # 3/2 (H0/c)^2 in (h/Mpc)^2, times Ω_m
_MAPS_SPEC = jax.P(None, *FIELD_SPEC)  # flat-sky maps (source, theta_x, theta_y)


def smail(z, z0: float, alpha: float, beta: float):
    """Smail et al. (1994) shape n(z) ∝ z^α exp(-(z/z0)^β), unnormalised."""
    z = np.asarray(z, dtype=np.float64)
    return z**alpha * np.exp(-((z / z0) ** beta))


def source_distribution(cosmo: cosmology.Cosmology, z, n):
    """A tabulated n(z) (any normalisation) as comoving distances χ_s (Mpc/h) with weights
    summing to 1 (trapezoid rule)."""
    z = np.asarray(z, dtype=np.float64)
    n = np.asarray(n, dtype=np.float64)
    widths = np.zeros_like(z)
    widths[1:] += 0.5 * np.diff(z)
    widths[:-1] += 0.5 * np.diff(z)
    weights = n * widths
    chi = cosmology.on_host(cosmology.comoving_distance, cosmo, 1.0 / (1.0 + z))
    return chi, weights / weights.sum()


def lensing_efficiency(cosmo: cosmology.Cosmology, chi, source_chi, source_weights):
    """q(χ) in h/Mpc at comoving distances chi (Mpc/h) for sources at source_chi with
    source_weights (summing to 1)."""
    chi = np.asarray(chi, dtype=np.float64)
    a = cosmology.on_host(cosmology.scale_factor_at_distance, cosmo, chi)
    chi_s = np.asarray(source_chi, np.float64)[None, :]
    behind = chi_s > chi[:, None]  # sources at χ_s = 0 (z = 0) are never behind a lens
    ratio = np.divide(chi_s - chi[:, None], chi_s, out=np.zeros(behind.shape), where=behind)
    return LENSING_PREFACTOR * cosmo.Omega_m * chi / a * (ratio @ np.asarray(source_weights))


@dataclasses.dataclass(frozen=True)
class Source:
    """A population of sources: comoving distances ``chi`` (Mpc/h) with ``weights`` summing to 1
    (one distance: a single source plane), its intrinsic alignment (None: none;
    pmpipe.physics.lensing.intrinsic_alignment) and its multiplicative shear bias m (the shear
    measured is (1 + m) times the true one)."""

    chi: np.ndarray
    weights: np.ndarray
    alignment: intrinsic_alignment.NLA | None = None
    shear_bias: float = 0.0


def single_plane(chi_s: float) -> Source:
    """Sources at one comoving distance chi_s (Mpc/h)."""
    return Source(np.atleast_1d(np.asarray(chi_s, np.float64)), np.ones(1))


def kernel(cosmo: cosmology.Cosmology, chi, source: Source) -> np.ndarray:
    """The kernel (h/Mpc) of the source's maps at comoving distances chi (Mpc/h), κ = ∫ kernel
    δ dχ: (1 + m) times the lensing efficiency plus the intrinsic alignment's kernel."""
    q = lensing_efficiency(cosmo, chi, source.chi, source.weights)
    if source.alignment is not None:
        q = q + intrinsic_alignment.kernel(cosmo, chi, source.chi, source.weights, source.alignment)
    return q if source.shear_bias == 0 else (1.0 + source.shear_bias) * q


def plane_weights(cosmo: cosmology.Cosmology, chi_edges, source: Source, samples: int = 64):
    """Weight w_i of each plane [χ_i, χ_i+1) in the source's maps: its :func:`kernel` averaged
    over the plane (h/Mpc), so that κ = Σ_i w_i Σ_i with Σ_i the plane's projected overdensity
    in Mpc/h (Born's weight, the lensing efficiency's mean, without nuisances)."""
    edges = np.asarray(chi_edges, np.float64)
    frac = (np.arange(samples) + 0.5) / samples  # midpoints
    chi = edges[:-1, None] + frac[None, :] * np.diff(edges)[:, None]
    return kernel(cosmo, chi.reshape(-1), source).reshape(chi.shape).mean(axis=1)


def pixel_centres(fov_deg: float, pixels: int) -> np.ndarray:
    """Angles (pixels,) in radians of the pixel centres along one side, centred on 0."""
    step = math.radians(fov_deg) / pixels
    return (np.arange(pixels) + 0.5 - 0.5 * pixels) * step


def fourier_phases(positions, mesh_n: int, box_size: float, dtype) -> np.ndarray:
    """Positions (n,) Mpc/h as the (3, n) parts hi + mid + lo of their fraction of the box,
    x/L mod 1 (float64 on the host), in the real ``dtype`` as JAX holds it (float32 unless x64
    is on): hi and mid multiples of 2^-b and 2^-2b with b bits each, b such that their products
    with any wavenumber index |m| <= M/2 are exact in that dtype, lo the rest. From them
    :func:`fourier_matrix` computes the phases on the device to the precision of that dtype."""
    dtype = jax.dtypes.canonicalize_dtype(dtype)
    scale = 2.0 ** (np.finfo(dtype).nmant + 1 - (mesh_n // 2).bit_length())
    u = np.mod(np.asarray(positions, np.float64) / box_size, 1.0)
    hi = np.floor(u * scale) / scale
    mid = np.floor((u - hi) * scale**2) / scale**2
    return np.stack([hi, mid, u - hi - mid]).astype(dtype)


def fourier_matrix(phases, mesh_n: int, columns: int | None = None):
    """exp(i k x) (n, M) for positions given by :func:`fourier_phases` (3, n) and the
    wavenumbers k = 2π m / L of a periodic grid of M points (FFT order; the first ``columns``
    of them only, when given), in the complex dtype that goes with that of ``phases``: a JAX
    array, computed where it is traced."""
    m = jnp.asarray(np.fft.fftfreq(mesh_n, 1.0 / mesh_n)[:columns], phases.dtype)
    turns = sum(t - jnp.round(t) for t in (part[:, None] * m[None, :] for part in phases))
    return jnp.exp(1j * (2 * np.pi) * (turns - jnp.round(turns)))


def _cic_window_2d(mesh_n: int, box_size: float):
    """CIC window sinc²(k_x Δ/2) sinc²(k_y Δ/2) of a periodic (M, M) grid."""
    cell = box_size / mesh_n
    w = painting.cic_window_1d(fft.angular_frequencies(mesh_n, cell), cell, np)
    return w[:, None] * w[None, :]


def plane_on_pixels(plane, px, py, transfer, sharding=None):
    """Values (n, n) of a periodic plane (M, M) at the transverse positions px, py (3, n) from
    :func:`fourier_phases`, by band-limited (Fourier) interpolation, the plane's modes
    multiplied by ``transfer`` (M, M) first; ``sharding``: the plane's layout (see
    :func:`pmpipe.physics.mesh.fft.fft2`)."""
    mesh_n = plane.shape[0]
    ex, ey = fourier_matrix(px, mesh_n), fourier_matrix(py, mesh_n)
    modes = fft.fft2(plane, sharding) * transfer
    return (ex @ modes @ ey.T).real / mesh_n**2


def map_band_limit(mesh_n: int, box_size: float, chi: float, pixel: float):
    """(M, M) mask of a plane's modes at distance chi (Mpc/h) that a flat map of pixels of
    ``pixel`` rad holds: |k_x| and |k_y| at most the map's Nyquist multipole π / pixel over chi.
    Reading the plane without the modes above would fold them onto lower multipoles."""
    k = np.abs(fft.angular_frequencies(mesh_n, box_size / mesh_n))
    keep = k <= np.pi / pixel / chi
    return keep[:, None] & keep[None, :]


def plane_transfer(mesh_n: int, box_size: float, chi: float, pixel: float) -> np.ndarray:
    """(M, M) factor a flat map applies to the modes of a plane at distance chi (Mpc/h) before
    reading it on pixels of ``pixel`` rad: the plane's CIC window divided out, its modes above
    the map's Nyquist multipole removed (:func:`map_band_limit`), and those at the grid's own
    Nyquist frequency (whose phase between grid points a periodic grid does not fix), so that
    the plane's modes come in conjugate pairs."""
    transfer = map_band_limit(mesh_n, box_size, chi, pixel) / _cic_window_2d(mesh_n, box_size)
    if mesh_n % 2 == 0:
        transfer[mesh_n // 2, :] = transfer[:, mesh_n // 2] = 0.0
    return transfer


@partial(jax.jit, static_argnames="mesh")
def _add_plane(maps, plane, weights, px, py, transfer, mesh: Mesh):
    """maps (S, n, n) plus weights (S,) times the plane's values on the pixels."""
    values = plane_on_pixels(plane, px, py, transfer, NamedSharding(mesh, FIELD_SPEC))
    maps = maps + weights[:, None, None] * values[None].astype(maps.dtype)
    return jax.lax.with_sharding_constraint(maps, NamedSharding(mesh, _MAPS_SPEC))


def flat_sky_convergence(planes, weights, chi, theta, offsets, grid: Grid):
    """κ (S, n, n) for S sources: planes P callables returning plane i's projected overdensity
    (M, M) on the force mesh of ``grid`` (its box, device mesh and dtype), weights (S, P),
    chi (P,) plane distances, offsets (P, 2), theta (n,) the pixel centres (rad, equally
    spaced). The maps are sharded like a field's first two axes. Every
    plane goes through one compiled program (distances, offsets, weights and the plane's
    transfer are its arguments; :func:`plane_transfer`)."""
    box_size, mesh, dtype = grid.box_size, grid.mesh, np.dtype(grid.dtype)
    theta = np.asarray(theta)
    weights = np.asarray(weights)
    pixel = float(theta[1] - theta[0]) if theta.size > 1 else math.inf
    maps = jax.device_put(
        np.zeros((weights.shape[0], theta.size, theta.size), dtype), NamedSharding(mesh, _MAPS_SPEC)
    )
    for i, plane in enumerate(planes):
        if not np.any(weights[:, i]):
            continue  # beyond every source
        plane = plane()
        mesh_n = plane.shape[0]
        px, py = (
            fourier_phases(float(chi[i]) * theta + offsets[i][j], mesh_n, box_size, dtype)
            for j in range(2)
        )
        transfer = plane_transfer(mesh_n, box_size, float(chi[i]), pixel)
        maps = _add_plane(
            maps, plane, weights[:, i].astype(dtype), px, py, transfer.astype(dtype), mesh=mesh
        )
    return maps


def _kaiser_squires_kernel(shape):
    """(ℓ1² - ℓ2² + 2i ℓ1 ℓ2) / ℓ² on an (n1, n2) grid (0 at ℓ = 0)."""
    l1 = jnp.fft.fftfreq(shape[0])[:, None]
    l2 = jnp.fft.fftfreq(shape[1])[None, :]
    l_sq = l1**2 + l2**2
    return jnp.where(l_sq > 0, (l1**2 - l2**2 + 2j * l1 * l2) / jnp.where(l_sq > 0, l_sq, 1.0), 0.0)


def shear_from_convergence(kappa):
    """Kaiser & Squires (1993): (γ1, γ2) of a flat-sky κ (..., n1, n2), axes (θx, θy), by FFT,
    laid out like κ.

    The map is taken as periodic: pixels within a few correlation lengths of the edges carry
    the wrap-around of a field that is not.
    """
    return _shear(kappa, sharding=fft.map_sharding(kappa))


@partial(jax.jit, static_argnames="sharding")
def _shear(kappa, sharding):
    gamma = fft.filter_2d(kappa, _kaiser_squires_kernel(kappa.shape[-2:]), sharding)
    return fft.laid_out(gamma.real, sharding), fft.laid_out(gamma.imag, sharding)


def shear_modes(gamma1, gamma2):
    """E and B modes (..., n1, n2) of a flat-sky shear field as convergences, E + iB the inverse
    Kaiser-Squires transform of γ1 + iγ2 (zero mean; the map taken as periodic, so a field that
    is not leaks E into B near the edges), laid out like γ1."""
    return _modes(gamma1, gamma2, sharding=fft.map_sharding(gamma1))


@partial(jax.jit, static_argnames="sharding")
def _modes(gamma1, gamma2, sharding):
    kernel = jnp.conj(_kaiser_squires_kernel(gamma1.shape[-2:]))
    modes = fft.filter_2d(gamma1 + 1j * gamma2, kernel, sharding)
    return fft.laid_out(modes.real, sharding), fft.laid_out(modes.imag, sharding)


def spin2_factor(lmax: int) -> np.ndarray:
    """sqrt((ℓ+2)(ℓ-1) / (ℓ(ℓ+1))) for ℓ = 0 .. lmax (0 for ℓ < 2)."""
    ell = np.arange(lmax + 1, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        f = np.sqrt((ell + 2) * (ell - 1) / (ell * (ell + 1)))
    f[:2] = 0.0
    return f


def born_shear_alm(kappa_alm) -> tuple[np.ndarray, np.ndarray]:
    """E and B harmonic coefficients (healpy's ordering) of the shear of a convergence with
    coefficients ``kappa_alm``: E = f_ℓ κ_ℓm, B = 0 (f_ℓ = sqrt((ℓ+2)(ℓ-1) / (ℓ(ℓ+1))))."""
    import healpy

    kappa_alm = np.asarray(kappa_alm, np.complex128)
    e_alm = healpy.almxfl(kappa_alm, spin2_factor(healpy.Alm.getlmax(kappa_alm.size)))
    return e_alm, np.zeros_like(e_alm)


def healpix_shear(kappa_alm, nside: int):
    """(γ1, γ2) HEALPix maps (RING) of ``nside`` from κ's harmonic coefficients (healpy's
    ordering, ℓ ≤ lmax): the modes of :func:`born_shear_alm` through healpy's spin-2 synthesis
    (γ1, γ2 as healpy's Q, U)."""
    return healpix_spin2_maps(*born_shear_alm(kappa_alm), nside)


def healpix_spin2_maps(e_alm, b_alm, nside: int):
    """(Q, U) HEALPix maps (RING) of ``nside`` of the spin-2 field with E and B coefficients
    e_alm, b_alm (healpy's ordering)."""
    import healpy

    return healpy.alm2map_spin([e_alm, b_alm], nside, 2, healpy.Alm.getlmax(e_alm.size))


def limber_integrand(
    cosmo: cosmology.Cosmology,
    ell,
    source: Source,
    power,
    samples: int = 256,
    other: Source | None = None,
):
    """The Limber integrand of κ's C_ℓ with the linear power D1(a)² P_lin(k) (power: callable
    of k [h/Mpc] giving (Mpc/h)³), K(χ)² / χ² P((ℓ + 1/2)/χ, a(χ)) with K the source's
    :func:`kernel`, at ``samples`` distances up to the farthest source; with ``other``, the
    cross spectrum's K K_other / χ² P, up to the nearer of the two farthest sources. Returns
    (χ (X,) Mpc/h, integrand (L, X) sr h/Mpc, dχ Mpc/h)."""
    chi_max = float(np.max(source.chi))
    if other is not None:
        chi_max = min(chi_max, float(np.max(other.chi)))
    chi = (np.arange(samples) + 0.5) * chi_max / samples
    cosmo = cosmology.tabulated(cosmo)
    q = kernel(cosmo, chi, source)
    q_other = q if other is None else kernel(cosmo, chi, other)
    a = cosmology.scale_factor_at_distance(cosmo, chi)
    growth = np.asarray(cosmology.growth_factor(cosmo, a), np.float64)
    k = (np.asarray(ell, np.float64)[:, None] + 0.5) / chi[None, :]
    pk = np.asarray(power(k), np.float64) * growth[None, :] ** 2
    return chi, q * q_other / chi**2 * pk, chi_max / samples


def limber_convergence_cl(
    cosmo: cosmology.Cosmology,
    ell,
    source: Source,
    power,
    samples: int = 256,
    other: Source | None = None,
):
    """Limber C_ℓ (L,) of κ with the linear power (with ``other``, the cross spectrum with a
    second source): the sum of :func:`limber_integrand`."""
    _, integrand, dchi = limber_integrand(cosmo, ell, source, power, samples, other)
    return np.sum(integrand, axis=1) * dchi
