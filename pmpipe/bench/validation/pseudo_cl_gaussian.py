"""``pmpipe bench pseudo-cl``: the masked-sky estimator (pmpipe.physics.statistics.pseudo_cl) on Gaussian
realisations with a known spectrum.

Each realisation is a scalar field and a pure-E spin-2 field of one spectrum C_ℓ (healpy's
synfast, no pixel window), multiplied by a mask (a band |b| < 20° and ten 6° holes at random,
seeded, or a HEALPix mask file); their pseudo-spectra are decoupled in bins of Δℓ = 16 from
ℓ = 8 to 2 nside. The record gives per bin the mean of the estimates over the input seen
through the bandpower windows (which is what the estimator is unbiased for), its standard
error, the mean over the bin's plain average of C_ℓ, and the E→B leakage: the mean B estimate
over the E input.
"""

from __future__ import annotations

import itertools
import time

import numpy as np

from pmpipe.physics.statistics import pseudo_cl

BIN_WIDTH = 16
FIRST_ELL = 8


def default_mask(nside: int, seed: int = 3) -> np.ndarray:
    """A band of galactic latitude |b| < 20° and ten discs of 6° removed (0), the rest 1."""
    import healpy

    theta, _ = healpy.pix2ang(nside, np.arange(healpy.nside2npix(nside)))
    mask = (np.abs(np.pi / 2 - theta) > np.radians(20)).astype(np.float64)
    for u, v in np.random.default_rng(seed).uniform(size=(10, 2)):
        centre = healpy.ang2vec(np.arccos(2 * u - 1), 2 * np.pi * v)
        mask[healpy.query_disc(nside, centre, np.radians(6))] = 0.0
    return mask


def input_spectrum(ell_max: int) -> np.ndarray:
    """C_ℓ = (ℓ + 10)^-1.5 exp(-(ℓ/80)²) (0 below ℓ = 2): steep at low ℓ, small near 3 nside
    for nside ≥ 32."""
    ell = np.arange(ell_max + 1, dtype=np.float64)
    return np.where(ell >= 2, (ell + 10.0) ** -1.5 * np.exp(-((ell / 80.0) ** 2)), 0.0)


def bench_pseudo_cl(nside: int, realisations: int, mask=None, seed: int = 1) -> dict:
    """The record of the module docstring."""
    import healpy

    start = time.perf_counter()
    mask = default_mask(nside) if mask is None else np.asarray(mask, np.float64)
    ell_max = 2 * nside
    edges = np.arange(FIRST_ELL, ell_max + 2, BIN_WIDTH)
    cl = input_spectrum(3 * nside - 1)
    mask_cl = pseudo_cl.mask_power(healpy.ud_grade(mask, 4 * nside), 2 * ell_max)
    spin0 = pseudo_cl.coupling_spin0(mask_cl, ell_max)
    spin2 = pseudo_cl.coupling_spin2(mask_cl, ell_max)
    bins = edges.size - 1
    windowed_0 = pseudo_cl.windows_spin0(spin0, edges) @ cl[: ell_max + 1]
    windowed_2 = pseudo_cl.windows_spin2(spin2, edges)[:, : ell_max + 1] @ cl[: ell_max + 1]
    plain = np.array([cl[lo:hi].mean() for lo, hi in itertools.pairwise(edges)])
    coupled = time.perf_counter() - start
    np.random.seed(seed)  # synfast draws from numpy's global generator
    found: dict[str, list] = {"scalar": [], "e": [], "b": []}
    for _ in range(realisations):
        t, q, u = healpy.synfast([cl, cl, 0 * cl, 0 * cl], nside, new=True, pixwin=False)
        found["scalar"].append(
            pseudo_cl.decoupled_spin0(healpy.anafast(t * mask, lmax=ell_max), spin0, edges)
        )
        e_alm, b_alm = healpy.map2alm_spin([q * mask, u * mask], 2, lmax=ell_max)
        e, b = pseudo_cl.decoupled_spin2(healpy.alm2cl(e_alm), healpy.alm2cl(b_alm), spin2, edges)
        found["e"].append(e)
        found["b"].append(b)
    scalar, e, b = (np.asarray(found[k]) for k in ("scalar", "e", "b"))
    return {
        "nside": nside,
        "realisations": realisations,
        "sky_fraction": float(mask.mean()),
        "ell_edges": edges.tolist(),
        "scalar_over_windowed": (scalar.mean(0) / windowed_0 - 1).tolist(),
        "scalar_standard_error": (scalar.std(0) / np.sqrt(realisations) / windowed_0).tolist(),
        "scalar_over_bin_mean": (scalar.mean(0) / plain - 1).tolist(),
        "e_over_windowed": (e.mean(0) / windowed_2[:bins] - 1).tolist(),
        "e_standard_error": (e.std(0) / np.sqrt(realisations) / windowed_2[:bins]).tolist(),
        "b_leakage": (b.mean(0) / windowed_2[:bins]).tolist(),
        "seconds_couplings": coupled,
        "seconds": time.perf_counter() - start,
    }


def default_flat_mask(pixels: int, fov_deg: float, seed: int = 3) -> np.ndarray:
    """A square map's mask: the first tenth of its columns and five discs of 0.08 times its
    side removed (0), the rest 1."""
    centre = (np.arange(pixels) + 0.5) / pixels
    x, y = np.meshgrid(centre, centre, indexing="ij")
    mask = np.ones((pixels, pixels))
    for cx, cy in np.random.default_rng(seed).uniform(0.1, 0.9, size=(5, 2)):
        mask[(x - cx) ** 2 + (y - cy) ** 2 < 0.08**2] = 0.0
    mask[:, : pixels // 10] = 0.0
    return mask


def flat_spectrum(ell) -> np.ndarray:
    """C_ℓ = (ℓ + 100)^-1.5 exp(-(ℓ/1500)²) (0 at ℓ = 0): steep over a few-degree map's
    multipoles."""
    ell = np.asarray(ell, np.float64)
    return np.where(ell > 0, (ell + 100.0) ** -1.5 * np.exp(-((ell / 1500.0) ** 2)), 0.0)


def bench_pseudo_cl_flat(
    pixels: int, realisations: int, fov_deg: float = 10.0, mask=None, seed: int = 1
) -> dict:
    """The flat-sky estimator (pmpipe.physics.statistics.pseudo_cl_flat) on periodic Gaussian
    realisations of :func:`flat_spectrum`, a scalar and a pure-E shear field,
    under ``mask`` (default :func:`default_flat_mask`) in 8 log bins from the map's
    fundamental to its Nyquist multipole (flat_sky_cl's): the record of the module docstring,
    with the windows' own error (their rings against every mode's C_ℓ) as
    ``windows_over_exact``."""
    from pmpipe.physics.statistics import pseudo_cl_flat, stats

    start = time.perf_counter()
    mask = default_flat_mask(pixels, fov_deg) if mask is None else np.asarray(mask, np.float64)
    side = np.radians(fov_deg)
    edges = stats.log_bin_edges(2 * np.pi / side, np.pi * pixels / side, 8)
    ell, _ = pseudo_cl_flat.modes(pixels, fov_deg)
    spectrum = flat_spectrum(ell)
    coupled = pseudo_cl_flat.couplings(mask, fov_deg, edges)
    seconds_couplings = time.perf_counter() - start
    found = pseudo_cl_flat.windows(coupled)
    windowed = {k: w @ flat_spectrum(coupled["rings"]) for k, w in found.items()}
    index = pseudo_cl_flat.bin_index(ell, edges)
    plain = np.array([spectrum[index == b].mean() for b in range(edges.size - 1)])
    exact = pseudo_cl_flat.decoupled_spin0(
        _binned_expectation(mask, fov_deg, spectrum, index, edges.size - 1), coupled
    )
    rng = np.random.default_rng(seed)
    amplitude = np.sqrt(spectrum) * pixels / side  # white noise to a field of that C_ℓ
    results: dict[str, list] = {"scalar": [], "e": [], "b": []}
    for _ in range(realisations):
        field_k = np.fft.fft2(rng.standard_normal((pixels, pixels))) * amplitude
        scalar = np.fft.ifft2(field_k).real
        shear = pseudo_cl_flat.shear_of(scalar, np.zeros_like(scalar))  # pure E
        maps = pseudo_cl_flat.masked_modes(scalar, shear, mask)
        pseudo = [stats.flat_sky_cl(m, fov_deg, edges)[1] for m in maps]
        results["scalar"].append(pseudo_cl_flat.decoupled_spin0(pseudo[0], coupled))
        e, b = pseudo_cl_flat.decoupled_spin2(pseudo[1], pseudo[2], coupled)
        results["e"].append(e)
        results["b"].append(b)
    scalar, e, b = (np.asarray(results[k]) for k in ("scalar", "e", "b"))
    return {
        "pixels": pixels,
        "field_of_view_deg": fov_deg,
        "realisations": realisations,
        "sky_fraction": float(mask.mean()),
        "ell_edges": edges.tolist(),
        "scalar_over_windowed": (scalar.mean(0) / windowed[""] - 1).tolist(),
        "scalar_standard_error": (scalar.std(0) / np.sqrt(realisations) / windowed[""]).tolist(),
        "scalar_over_bin_mean": (scalar.mean(0) / plain - 1).tolist(),
        "e_over_windowed": (e.mean(0) / windowed["_ee"] - 1).tolist(),
        "e_standard_error": (e.std(0) / np.sqrt(realisations) / windowed["_ee"]).tolist(),
        "b_leakage": (b.mean(0) / windowed["_ee"]).tolist(),
        "windows_over_exact": (windowed[""] / exact - 1).tolist(),
        "seconds_couplings": seconds_couplings,
        "seconds": time.perf_counter() - start,
    }


def _binned_expectation(mask, fov_deg: float, spectrum, index, bins: int) -> np.ndarray:
    """The binned pseudo-spectrum a scalar field of ``spectrum`` (every mode's C) has on
    average under the mask: the kernel's convolution with it, averaged over each bin."""
    from pmpipe.physics.statistics import pseudo_cl_flat

    k_hat = np.fft.fft2(pseudo_cl_flat.kernel(mask, fov_deg))
    mean = np.fft.ifft2(k_hat * np.fft.fft2(spectrum)).real
    counts = np.bincount(index.ravel(), minlength=bins + 1)[:bins]
    return np.bincount(index.ravel(), mean.ravel(), bins + 1)[:bins] / counts
