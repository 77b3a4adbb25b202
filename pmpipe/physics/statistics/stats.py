"""Summary statistics of (sharded) fields."""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from pmpipe.physics.evolution import ics
from pmpipe.physics.mesh import fft
from pmpipe.physics.mesh.painting import cic_compensation
from pmpipe.runtime.parallel import to_host


def power_spectrum(
    field,
    mesh: Mesh,
    box_size: float,
    n_bins: int | None = None,
    field2=None,
    compensate_cic: bool = False,
    compensate_cic2: bool | None = None,
):
    """Spherically averaged power spectrum of a real (N, N, N) field (or cross spectrum with field2).

    Bins are linear in |k| with width the fundamental mode 2π/L, from 0 up to the Nyquist
    frequency (N/2 bins by default); empty bins give NaN. ``compensate_cic`` divides the modes of
    field by the CIC window, ``compensate_cic2`` those of field2 (default: as field). Returns numpy arrays
    (k_mean [h/Mpc], P [(Mpc/h)^3], modes per bin) for the bins 1..n_bins (k = 0 excluded).
    """
    n = field.shape[0]
    n_bins = n // 2 if n_bins is None else n_bins
    compensate_cic2 = compensate_cic if compensate_cic2 is None else compensate_cic2
    if field2 is None:
        sums = _binned_sums((field,), mesh, n_bins, (compensate_cic,), ((0, 0),))
    else:
        flags = (compensate_cic, compensate_cic2)
        sums = _binned_sums((field, field2), mesh, n_bins, flags, ((0, 1),))
    return _from_sums(sums, n, box_size)


def _from_sums(sums, n: int, box_size: float) -> tuple:
    """(k_mean [h/Mpc], P [(Mpc/h)^3] of each power sum, modes) per bin 1..n_bins of a mesh
    of n cells a side from its bin sums (count, |k| sum, power sums...) (rows, n_bins + 1)."""
    count, ksum, *psums = np.asarray(sums, dtype=np.float64)[:, 1:]
    with np.errstate(invalid="ignore", divide="ignore"):
        spectra = [p / count * box_size**3 / float(n) ** 6 for p in psums]
        return ksum / count * (2 * np.pi / box_size), *spectra, count


# |k| in units of the fundamental mode: a box of 2π. The CIC window depends on k times the
# cell size alone, so one program serves every box of a mesh size
UNIT_BOX = 2 * np.pi


@partial(jax.jit, static_argnames=("mesh", "n_bins", "compensate", "pairs"))
def _binned_sums(fields, mesh: Mesh, n_bins: int, compensate: tuple, pairs: tuple):
    """Sums per |k| bin 0..n_bins (2 + len(pairs), n_bins + 1) of the mode weights, of |k| in
    units of the fundamental mode times them, and of Re(δ_a δ_b*) times them for each pair
    (a, b) of ``fields`` (N, N, N): one transform of each, CIC-compensated where
    ``compensate`` (one flag per field) says."""
    modes = []
    for field, compensated in zip(fields, compensate, strict=True):
        m = fft.r2c(field, mesh)
        modes.append(cic_compensation(m, mesh, UNIT_BOX) if compensated else m)
    k = fft.wavenumber(modes[0], mesh, UNIT_BOX)
    weights = jnp.broadcast_to(fft.mode_weights(modes[0], mesh), modes[0].shape)
    idx = jnp.floor(k + 0.5).astype(jnp.int32)
    values = [weights, k * weights]
    values += [(modes[a] * jnp.conj(modes[b])).real * weights for a, b in pairs]
    # scattered from the (N, N, N) arrays as they are: flattening the distributed FFT's
    # output first makes XLA's CPU backend fail (RET_CHECK in fft_thunk)
    bins = jnp.zeros(n_bins + 1, jnp.result_type(*values))
    return jnp.stack([bins.at[idx].add(x, mode="drop") for x in values])


def auto_and_cross_spectra(
    field,
    field2,
    mesh: Mesh,
    box_size: float,
    n_bins: int,
    compensate_cic: bool = False,
    compensate_cic2: bool = False,
):
    """:func:`power_spectrum` of field, of field2 and their cross spectrum, from one transform
    of each in one program, each field CIC-compensated where its own flag says (field2 not by
    default): numpy arrays (k_mean, P_11, P_22, P_12, modes) per bin 1..n_bins."""
    flags, pairs = (compensate_cic, compensate_cic2), ((0, 0), (1, 1), (0, 1))
    sums = _binned_sums((field, field2), mesh, n_bins, flags, pairs)
    return _from_sums(sums, field.shape[0], box_size)


def correlation_coefficient(pk_cross, pk_a, pk_b):
    """r(k) = P_ab / sqrt(P_a P_b)."""
    return np.asarray(pk_cross) / np.sqrt(np.asarray(pk_a) * np.asarray(pk_b))


def log_bin_edges(low: float, high: float, bins: int) -> np.ndarray:
    """bins + 1 logarithmically spaced edges from low to high."""
    return np.geomspace(low, high, bins + 1)


def _bin(x, values, weights, edges):
    """Weighted means of x and values in the bins of x given by edges (x outside ignored), and
    the summed weights; empty bins give NaN."""
    x = np.asarray(x, np.float64).ravel()
    idx = np.digitize(x, edges) - 1
    ok = (idx >= 0) & (idx < len(edges) - 1)
    n = len(edges) - 1
    w = np.asarray(weights, np.float64).ravel()[ok]
    count = np.bincount(idx[ok], w, n)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_x = np.bincount(idx[ok], w * x[ok], n) / count
        mean_v = np.bincount(idx[ok], w * np.asarray(values, np.float64).ravel()[ok], n) / count
    return mean_x, mean_v, count


def _flat_wavenumbers(n: int, fov_deg: float):
    """|ℓ| (n, n) of an n x n flat-sky map of side fov_deg degrees, and the pixel size (rad)."""
    pixel = np.radians(fov_deg) / n
    ell = fft.angular_frequencies(n, pixel)
    return np.hypot(ell[:, None], ell[None, :]), pixel


def flat_sky_cl(kappa, fov_deg: float, ell_edges, kappa2=None):
    """Binned angular (cross) power spectrum of a square flat-sky map (n, n) of side fov_deg
    degrees (a sharded or plain array). C_ℓ = Re(κ̂ κ̂2*) / A with κ̂ = Δθ² Σ κ e^{-iℓθ} and
    A the map's area (sr). Returns numpy (ell_mean, cl, modes) per bin; ℓ = 0 excluded.
    The multipoles and their bins are geometry, computed on the host in float64; each device
    sums the power of its block of the map per bin."""
    n = kappa.shape[0]
    ell, pixel = _flat_wavenumbers(n, fov_deg)
    edges = np.asarray(ell_edges, np.float64)
    bins = edges.size - 1
    index = np.digitize(np.where(ell > 0, ell, -1.0), edges) - 1  # the mean is no multipole
    index = np.where((index >= 0) & (index < bins), index, bins).astype(np.int32)
    sharding = fft.map_sharding(kappa)
    placed = (
        index
        if sharding is None
        else jax.make_array_from_callback(index.shape, sharding, lambda block: index[block])
    )
    power = to_host(
        _binned_flat_power(
            kappa, kappa if kappa2 is None else kappa2, placed, bins=bins, sharding=sharding
        )
    ).astype(np.float64)[:bins]
    count = np.bincount(index.ravel(), minlength=bins + 1)[:bins].astype(np.float64)
    ell_sum = np.bincount(index.ravel(), ell.ravel(), bins + 1)[:bins]
    with np.errstate(invalid="ignore", divide="ignore"):
        return ell_sum / count, power / count * pixel**4 / (n * pixel) ** 2, count


@partial(jax.jit, static_argnames=("bins", "sharding"))
def _binned_flat_power(a, b, index, bins: int, sharding):
    """Sums of Re(â b̂*) of maps a, b (n, n) per bin, index (n, n) the bin of each mode (bins:
    none), (bins + 1,). The transforms run on whole maps (:func:`fft.fft2`); the sums on each
    device's block, so only the bin sums cross devices."""
    power = fft.laid_out((fft.fft2(a, sharding) * jnp.conj(fft.fft2(b, sharding))).real, sharding)
    return jnp.zeros(bins + 1, power.dtype).at[index].add(power)


def full_sky_cl(alm, ell_edges, alm2=None):
    """Binned angular (cross) power spectrum of full-sky maps from their harmonic coefficients
    (healpy's ordering; pmpipe's maps are band-limited to them, so the C_ℓ is exact), bins
    weighted by 2ℓ + 1; returns numpy (ell_mean, cl, modes), ℓ = 0 excluded."""
    import healpy

    cl = healpy.alm2cl(
        np.asarray(alm, np.complex128), None if alm2 is None else np.asarray(alm2, np.complex128)
    )
    ell = np.arange(cl.size, dtype=np.float64)
    ell[0] = -1.0
    return _bin(ell, cl, 2 * np.arange(cl.size) + 1.0, ell_edges)


def smooth_flat(kappa, fov_deg: float, sigma_arcmin: float):
    """Gaussian smoothing (σ in arcmin) of a flat-sky map (n, n) by FFT, taken as periodic."""
    if sigma_arcmin == 0:
        return kappa
    ell, _ = _flat_wavenumbers(kappa.shape[0], fov_deg)
    sigma = np.radians(sigma_arcmin / 60)
    kernel = np.exp(-0.5 * (ell * sigma) ** 2).astype(kappa.dtype)
    return _filter_2d(kappa, kernel, sharding=fft.map_sharding(kappa))


@partial(jax.jit, static_argnames="sharding")
def _filter_2d(field, kernel, sharding):
    """A real map (n, n) multiplied by kernel (n, n) in Fourier space, laid out like the input."""
    return fft.laid_out(fft.filter_2d(field, kernel, sharding).real.astype(field.dtype), sharding)


def smooth_healpix(kappa_map, sigma_arcmin: float):
    """Gaussian smoothing (σ in arcmin) of a HEALPix map (RING)."""
    if sigma_arcmin == 0:
        return np.asarray(kappa_map)
    import healpy

    return healpy.smoothing(np.asarray(kappa_map, np.float64), sigma=np.radians(sigma_arcmin / 60))


def smooth_healpix_alm(alm, nside: int, sigma_arcmin: float) -> np.ndarray:
    """The HEALPix map (RING, float64) of ``nside`` of a field band-limited to its harmonic
    coefficients ``alm`` (healpy's ordering, up to ℓ = 3 nside - 1), smoothed by a Gaussian
    of σ (arcmin): what :func:`smooth_healpix` makes of the field's map, without analysing
    the map again (one synthesis; a map's analysis is off by percents above 2 nside)."""
    import healpy

    alm = np.asarray(alm, np.complex128)
    lmax = healpy.Alm.getlmax(alm.size)
    if sigma_arcmin != 0:
        fwhm = np.radians(sigma_arcmin / 60) * np.sqrt(8 * np.log(2))
        alm = healpy.almxfl(alm, healpy.gauss_beam(fwhm, lmax=lmax))
    return healpy.alm2map(alm, nside, lmax=lmax)


def shape_noise_sigma(pixel_arcmin2: float, sigma_e: float, n_gal: float) -> float:
    """Per-pixel κ noise σ_e / sqrt(n_gal A_pix): σ_e per ellipticity component, n_gal per
    arcmin², A_pix in arcmin²."""
    return sigma_e / np.sqrt(n_gal * pixel_arcmin2)


def shape_noise_flat(
    stream: tuple[int, ...], n: int, fov_deg: float, sigma_e: float, n_gal: float, sharding=None
):
    """Gaussian shape-noise map (n, n) for a flat-sky map of side fov_deg degrees, drawn with
    the key of ``stream`` = (seed, index, ...): fold_in(key(seed), index), folded in turn with
    each further index (the seed and last index are arguments of the compiled program)."""
    sigma = shape_noise_sigma((fov_deg * 60 / n) ** 2, sigma_e, n_gal)
    key = ics.key_data(stream[0])
    for index in stream[1:-1]:
        key = jax.random.key_data(jax.random.fold_in(ics.as_key(jnp.asarray(key)), index))
    return _normal_map(key, np.uint32(stream[-1]), np.float32(sigma), n=n, sharding=sharding)


@partial(jax.jit, static_argnames=("n", "sharding"))
def _normal_map(key, index, sigma, n: int, sharding):
    """Gaussian map (n, n) of standard deviation sigma, laid out by sharding (None: default)."""
    key = jax.random.fold_in(ics.as_key(key), index)
    return fft.laid_out(sigma * jax.random.normal(key, (n, n), jnp.float32), sharding)


def shape_noise_healpix(seed, nside: int, sigma_e: float, n_gal: float, depth=None) -> np.ndarray:
    """Gaussian shape-noise HEALPix map (numpy generator seeded by seed); with ``depth``
    (npix,) ≥ 0, n_gal times depth galaxies per arcmin² at each pixel (none, no noise, where
    it is 0)."""
    import healpy

    area = healpy.nside2pixarea(nside, degrees=True) * 3600
    sigma = shape_noise_sigma(area, sigma_e, n_gal)
    noise = sigma * np.random.default_rng(seed).standard_normal(healpy.nside2npix(nside))
    if depth is None:
        return noise
    depth = np.asarray(depth, np.float64)
    return noise * np.divide(1.0, np.sqrt(depth), out=np.zeros_like(depth), where=depth > 0)


def _histogram(values, edges) -> np.ndarray:
    """Counts of values in the bins given by edges (values outside ignored)."""
    return np.histogram(np.asarray(values, np.float64), bins=np.asarray(edges))[0].astype(
        np.float64
    )


@jax.jit
def _is_peak(kappa):
    """True where a pixel is higher than its 8 neighbours and not on the map's border."""
    peak = jnp.ones(kappa.shape, bool)
    for dx in (-1, 0, 1):
        for dy in (-1, 0, 1):
            if dx or dy:
                peak = peak & (kappa > jnp.roll(kappa, (dx, dy), axis=(0, 1)))
    inner = jnp.zeros(kappa.shape, bool).at[1:-1, 1:-1].set(True)
    return peak & inner


def peak_counts_flat(kappa, edges, where=None) -> np.ndarray:
    """Histogram of the heights of the local maxima of a flat-sky map (n, n) (higher than all 8
    neighbours; border pixels excluded); with ``where`` (n, n) bool, of those at the pixels
    it marks only."""
    peaks = to_host(_is_peak(kappa))
    if where is not None:
        peaks = peaks & np.asarray(where, bool)
    return _histogram(to_host(kappa)[peaks], edges)


def interior_flat(mask, radius_pixels: float) -> np.ndarray:
    """The pixels (n, n) bool of a flat-sky mask that are whole (value 1) and lie more than
    ``radius_pixels`` pixel sides (centre to centre) from every pixel that is not, across the
    map's edges too (the map is smoothed as periodic)."""
    from scipy import ndimage

    whole = np.asarray(mask, np.float64) >= 1.0
    if whole.all():
        return whole
    n, pad = whole.shape[0], int(np.ceil(radius_pixels)) + 1
    distance = ndimage.distance_transform_edt(np.pad(whole, pad, mode="wrap"))
    return distance[pad : pad + n, pad : pad + n] > radius_pixels


def healpix_neighbours(nside: int) -> np.ndarray:
    """The 8 neighbours (8, npix) of every pixel of a HEALPix grid (RING); -1: none."""
    import healpy

    found = healpy.get_all_neighbours(nside, np.arange(healpy.nside2npix(nside)))
    return found.astype(np.int32)  # half the memory: 1.6 GB at nside 2048


def peak_counts_healpix(kappa_map, edges, where=None, neighbours=None) -> np.ndarray:
    """Histogram of the heights of the local maxima of a HEALPix map (RING), higher than all
    their neighbours; with ``where`` (npix,) bool, of those at the pixels it marks only;
    ``neighbours``: the grid's :func:`healpix_neighbours`, made here when None."""
    import healpy

    values = np.asarray(kappa_map, np.float64)
    if neighbours is None:
        neighbours = healpix_neighbours(healpy.npix2nside(values.size))
    higher = np.all(np.where(neighbours >= 0, values[None, :] > values[neighbours], True), axis=0)
    return _histogram(values[higher if where is None else higher & where], edges)


def interior_healpix(mask, radius: float) -> np.ndarray:
    """The pixels (npix,) bool of a HEALPix mask (RING) that are whole (value 1) and do not
    overlap the disc of ``radius`` (rad) around any pixel that is not (the nearest such pixel
    borders a whole one: only those are searched)."""
    import healpy

    mask = np.asarray(mask, np.float64)
    nside = healpy.npix2nside(mask.size)
    whole = mask >= 1.0
    neighbours = healpy.get_all_neighbours(nside, np.arange(mask.size))
    touching = np.where(neighbours >= 0, whole[neighbours], False).any(axis=0)
    near = np.zeros(mask.size, bool)
    for pixel in np.flatnonzero(~whole & touching):  # the edge: cut pixels beside whole ones
        near[healpy.query_disc(nside, healpy.pix2vec(nside, pixel), radius, inclusive=True)] = True
    return whole & ~near


def pdf(values, edges) -> np.ndarray:
    """Probability density of the values in the bins (counts / (all values x bin width));
    values outside the edges count in the total only."""
    values = to_host(values).astype(np.float64).ravel()
    return _histogram(values, edges) / (values.size * np.diff(edges))
