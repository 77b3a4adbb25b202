"""The lensing maps' part of the summaries: the C_ℓ of every pair of sources (κ, and the shear's
E and B modes), with the Limber prediction of every pair, and per source the peak counts and
PDF of κ, on the flat-sky and HEALPix maps (docs/outputs.md); with lensing.draws, of every
draw's maps along a leading ``draw`` dimension."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding

from pmpipe.physics import lensing, pseudo_cl, shear_correlation, sky, stats
from pmpipe.run import config, derive, validation
from pmpipe.runtime.parallel import FIELD_SPEC
from pmpipe.stages import layout
from pmpipe.stages.inputs import Inputs
from pmpipe.storage import gathered

RANGE_NAMES = ("ell_min_valid", "ell_max_valid", "ell_min_valid_healpix", "ell_max_valid_healpix")
PAIR_DIMS = ("source", "source2")


def ell_edges_flat(cfg: config.Run) -> np.ndarray:
    """C_ell bin edges of the flat-sky maps: the map's fundamental to its Nyquist multipole."""
    flat = config.section(config.section(cfg.lensing, "lensing").flat_sky, "lensing.flat_sky")
    fov = np.radians(flat.field_of_view)
    return stats.log_bin_edges(2 * np.pi / fov, np.pi * flat.pixels / fov, cfg.summaries.ell_bins)


def ell_edges_healpix(cfg: config.Run) -> np.ndarray:
    """C_ell bin edges of the HEALPix maps: ℓ = 2 to their band limit 3 nside - 1 (inclusive)."""
    full = config.section(config.section(cfg.lensing, "lensing").full_sky, "lensing.full_sky")
    ell_max = sky.healpix_ell_max(full.nside)
    return stats.log_bin_edges(2, ell_max + 1, cfg.summaries.ell_bins)


def kappa_edges(cfg: config.Run) -> np.ndarray:
    return np.linspace(*cfg.summaries.kappa_range, cfg.summaries.kappa_bins + 1)


@dataclasses.dataclass(frozen=True)
class SkyMaps:
    """One kind of map (flat sky or HEALPix) of every source, with what its statistics need:
    ``suffix`` of the names it is written under, ``ell_dim`` its multipole axis, the C_ℓ bin
    ``edges``, the κ maps and shape
    noise maps (or None), per source the κ, E and B modes and noisy κ (None without noise) as
    ``spectrum`` takes them (maps or harmonic coefficients), ``spectrum`` (a, b) -> (ℓ mean,
    C_ℓ, modes) per bin, ``smooth`` (map, σ arcmin) and ``peaks_of`` (map, κ edges)."""

    suffix: str
    ell_dim: str
    edges: np.ndarray
    kappa: list
    noise: list | None
    modes: dict[str, list]
    noisy: list | None
    spectrum: Callable
    smooth: Callable
    peaks_of: Callable


def write_lensing_statistics(group, setup: derive.RunSetup, inputs: Inputs) -> None:
    """C_ell of every pair of sources (with its Limber prediction for the linear P(k)), peak
    counts and PDF of κ per source and smoothing scale, for the flat-sky and the HEALPix maps
    (and for lensing.method both, of Born's maps too, names with '_born'). With lensing.draws,
    those of every draw's maps, with its sources and shape noise, stacked along a leading
    ``draw`` dimension."""
    drawn = derive.draw_sources(setup)
    if drawn is None:
        out = gathered.Gathered()
        _write_statistics(out, setup, inputs)
        gathered.write(group, [out])
        return
    layout.write_draw_axis(group, [values for values, _ in drawn])
    draws = []
    for d, (_, sources) in enumerate(drawn):
        draws.append(gathered.Gathered())
        _write_statistics(draws[-1], dataclasses.replace(setup, sources=sources), inputs, (d,))
    gathered.write(group, draws, varies_by_draw)


def varies_by_draw(name: str, dims: tuple[str, ...]) -> bool:
    """Whether a statistic differs between draws: every array over the sources but their
    coordinates and resolved multipoles (those of the lensing section's sources)."""
    return "source" in dims and name not in dims and name not in RANGE_NAMES


def _write_statistics(out, setup: derive.RunSetup, inputs: Inputs, draw: tuple = ()) -> None:
    """:func:`write_lensing_statistics` of the maps at ``draw`` (() without draws, else the
    draw's index) into ``out`` (pmpipe.storage.gathered.Gathered)."""
    section = config.section(setup.config.lensing, "lensing")
    count = _write_lensing_axes(out, setup, inputs)
    if section.flat_sky is not None:
        _write_map_statistics(out, setup, _flat_sky_maps(setup, inputs, count, draw))
        if section.method == "both":  # Born's maps of the same planes, on the same bins
            born = _flat_sky_maps(setup, inputs, count, draw, "_born")
            _write_spectra_and_peaks(out, setup, born)
    if section.full_sky is not None:
        full = _full_sky_maps(setup, inputs, count, draw)
        _write_map_statistics(out, setup, full)
        _write_shear_correlations(out, setup, full)
        if section.full_sky.mask is not None:
            mask = validation.load_mask(section.full_sky.mask, section.full_sky.nside)
            _write_masked_spectra(out, setup, full, mask)
            _write_masked_peaks(out, setup, full, mask)
        if section.method == "both":
            born = _full_sky_maps(setup, inputs, count, draw, "_born")
            _write_spectra_and_peaks(out, setup, born)


def _write_lensing_axes(out, setup: derive.RunSetup, inputs: Inputs) -> int:
    """The sources (twice: ``source`` and ``source2``, the axes of the pairs) with their
    resolved multipoles, the smoothing scales and the κ bins; returns the number of sources."""
    cfg = setup.config
    scales, edges = cfg.summaries.smoothing_arcmin, kappa_edges(cfg)
    sources = np.array([str(s) for s in inputs.store("lensing")["source"][:]])
    out.write_coordinate("source", sources, "1", "lensing source")
    out.write_coordinate("source2", sources, "1", "second lensing source of a pair")
    lens = inputs.store("lensing")
    for name in (n for n in RANGE_NAMES if n in lens):
        out.write_array(
            name,
            lens[name][:],
            ("source",),
            "1",
            lens[name].attrs["long_name"],
            reasons=lens[name].attrs["reasons"],
        )
    out.write_coordinate(
        "smoothing",
        np.array(scales, np.float64),
        "arcmin",
        "Gaussian smoothing sigma of kappa",
    )
    out.write_coordinate("kappa", 0.5 * (edges[1:] + edges[:-1]), "1", "centre of the kappa bin")
    out.write_array("kappa_lo", edges[:-1], ("kappa",), "1", "lower edge of the kappa bin")
    out.write_array("kappa_hi", edges[1:], ("kappa",), "1", "upper edge of the kappa bin")
    return len(sources)


def _noise_levels(setup: derive.RunSetup) -> list[tuple[float, float]] | None:
    """(σ_e, n_gal) of every source, None without shape noise."""
    noise = setup.config.summaries.shape_noise
    labels = config.section(setup.config.lensing, "lensing").source_labels()
    return None if noise is None else noise.per_source(labels)


def noise_stream(seed: int, source: int, draw: tuple) -> tuple[int, ...]:
    """The random stream of a source's shape noise: (ic.seed, source), and the draw's index
    after them for draws after the first (the first draw's noise is that of the run without
    draws)."""
    return (seed, source, *(d for d in draw if d > 0))


def _flat_sky_maps(
    setup: derive.RunSetup, inputs: Inputs, count: int, draw: tuple = (), suffix=""
) -> SkyMaps:
    """The flat-sky maps of the ``count`` sources (:class:`SkyMaps`) at ``draw``: the run's,
    or with ``suffix`` '_born' Born's of lensing.method both. The shear's E and B modes are those of κ
    and of the rotation ω (0 for Born): the distortion matrix is the Jacobian of the
    deflection, whose gradient part makes κ and the E modes and whose curl part ω and the B
    modes, with equal Fourier amplitudes. κ and ω are local, so their spectra are those of the
    E and B modes without the leakage between them that the shear maps' inverse
    Kaiser-Squires would add by taking a non-periodic ray-traced map as periodic."""
    cfg = setup.config
    lens = config.section(cfg.lensing, "lensing")
    flat = config.section(lens.flat_sky, "lensing.flat_sky")
    sharding = NamedSharding(setup.grid.mesh, FIELD_SPEC)
    kappa = [inputs.field("lensing", f"kappa{suffix}", (*draw, i)) for i in range(count)]
    traced = lens.method != "born" and suffix == ""
    rotation = [
        inputs.field("lensing", "omega", (*draw, i)) if traced else jnp.zeros_like(k)
        for i, k in enumerate(kappa)
    ]
    levels = _noise_levels(setup)
    noise = None
    if levels is not None:
        noise = [
            stats.shape_noise_flat(
                noise_stream(cfg.ic.seed, i, draw),
                flat.pixels,
                flat.field_of_view,
                sigma_e,
                n_gal,
                sharding,
            )
            for i, (sigma_e, n_gal) in enumerate(levels)
        ]
    edges = ell_edges_flat(cfg)
    return SkyMaps(
        suffix,
        "ell",
        edges,
        kappa,
        noise,
        {"": kappa, "_ee": kappa, "_bb": rotation},
        None if noise is None else [k + n for k, n in zip(kappa, noise)],
        lambda a, b: stats.flat_sky_cl(a, flat.field_of_view, edges, b),
        lambda k, s: stats.smooth_flat(k, flat.field_of_view, s),
        stats.peak_counts_flat,
    )


def _full_sky_maps(
    setup: derive.RunSetup, inputs: Inputs, count: int, draw: tuple = (), suffix=""
) -> SkyMaps:
    """The HEALPix maps of the ``count`` sources (:class:`SkyMaps`) at ``draw``: the run's, or
    with ``suffix`` '_born' Born's of lensing.method both."""
    import healpy

    cfg = setup.config
    full = config.section(config.section(cfg.lensing, "lensing").full_sky, "lensing.full_sky")
    nside, ell_max = full.nside, sky.healpix_ell_max(full.nside)
    name = f"{suffix}_healpix"
    kappa = list(np.asarray(inputs.array("lensing", f"kappa{name}", draw), np.float64))
    alm = list(np.asarray(inputs.array("lensing", f"kappa{name}_alm", draw), np.complex128))
    shear = {
        m: list(np.asarray(inputs.array("lensing", f"gamma_{m}{name}_alm", draw), np.complex128))
        for m in "eb"
    }
    levels = _noise_levels(setup)
    noise = None
    if levels is not None:
        depth_map = config.section(cfg.summaries.shape_noise, "summaries.shape_noise").depth_map
        depth = None if depth_map is None else validation.load_depth(depth_map, cfg)
        noise = [
            stats.shape_noise_healpix(
                list(noise_stream(cfg.ic.seed, i, draw)), nside, sigma_e, n_gal, depth
            )
            for i, (sigma_e, n_gal) in enumerate(levels)
        ]
    edges = ell_edges_healpix(cfg)
    return SkyMaps(
        name,
        "ell_healpix",
        edges,
        kappa,
        noise,
        {"": alm, "_ee": shear["e"], "_bb": shear["b"]},
        None
        if noise is None
        else [a + healpy.map2alm(n, lmax=ell_max, iter=3) for a, n in zip(alm, noise)],
        lambda a, b: stats.full_sky_cl(a, edges, b),
        stats.smooth_healpix,
        stats.peak_counts_healpix,
    )


def _write_masked_spectra(out, setup: derive.RunSetup, maps: SkyMaps, mask) -> None:
    """The spectra of every pair of the run's HEALPix ``maps`` times the ``mask``
    (lensing.full_sky.mask), κ and the shear's E and B, decoupled (pmpipe.physics.pseudo_cl)
    in the HEALPix bins up to 2 nside, with their bandpower windows."""
    import healpy

    nside = healpy.npix2nside(mask.size)
    ell_max = 2 * nside
    edges = ell_edges_healpix(setup.config)
    edges = edges[edges <= ell_max + 1]
    mask_cl = pseudo_cl.mask_power(healpy.ud_grade(mask, 2 * nside), 2 * ell_max)
    spin0, spin2 = (
        pseudo_cl.coupling_spin0(mask_cl, ell_max),
        pseudo_cl.coupling_spin2(mask_cl, ell_max),
    )
    count = len(maps.kappa)
    scalar, shear = [], []
    for i in range(count):
        scalar.append(healpy.map2alm(maps.kappa[i] * mask, lmax=ell_max, iter=3))
        q, u = lensing.healpix_spin2_maps(maps.modes["_ee"][i], maps.modes["_bb"][i], nside)
        shear.append(healpy.map2alm_spin([q * mask, u * mask], 2, lmax=ell_max))
    bins = edges.size - 1
    found = {n: np.zeros((count, count, bins)) for n in ("", "_ee", "_bb")}
    for i in range(count):
        for j in range(i, count):
            cl = pseudo_cl.decoupled_spin0(healpy.alm2cl(scalar[i], scalar[j]), spin0, edges)
            ee, bb = pseudo_cl.decoupled_spin2(
                healpy.alm2cl(shear[i][0], shear[j][0]),
                healpy.alm2cl(shear[i][1], shear[j][1]),
                spin2,
                edges,
            )
            for name, values in (("", cl), ("_ee", ee), ("_bb", bb)):
                found[name][i, j] = found[name][j, i] = values
    _write_masked_arrays(out, edges, found, (spin0, spin2), float(mask.mean()))


def _write_masked_arrays(out, edges, found: dict, couplings, sky_fraction: float) -> None:
    """The masked spectra's bins, spectra and windows (:func:`_write_masked_spectra`)."""
    dim, bins = "ell_masked_healpix", edges.size - 1
    out.write_coordinate(
        dim, 0.5 * (edges[1:] + edges[:-1]), "1", "centre of the masked spectra's bin"
    )
    for end, values in (("lo", edges[:-1]), ("hi", edges[1:])):
        out.write_array(f"{dim}_{end}", values, (dim,), "1", f"{end} edge of the bin")
    what = {"": "kappa", "_ee": "the shear's E modes", "_bb": "the shear's B modes"}
    for name, values in found.items():
        out.write_array(
            f"cl{name}_masked_healpix", values, (*PAIR_DIMS, dim), "sr",
            f"C_ell of {what[name]} under lensing.full_sky.mask, decoupled (pseudo-C_ell)",
            sky_fraction=sky_fraction,
        )  # fmt: skip
    spin2 = pseudo_cl.windows_spin2(couplings[1], edges)
    ell = couplings[0].shape[0]
    windows = {
        "": (pseudo_cl.windows_spin0(couplings[0], edges), "kappa's C_ell"),
        "_ee": (spin2[:bins, :ell], "C^EE from C^EE"),
        "_bb": (spin2[bins:, :ell], "C^BB from C^EE (the mask's E to B leakage)"),
    }
    for name, (values, long_name) in windows.items():
        out.write_array(
            f"windows{name}_masked_healpix", values, (dim, "multipole"), "1",
            f"bandpower windows of the masked spectra, {long_name}: their mean is windows @ C_ell",
        )  # fmt: skip


MASK_MARGIN_SIGMAS = 3  # peaks and PDF keep this many smoothing σ (and a pixel) from the cut


def _write_masked_peaks(out, setup: derive.RunSetup, maps: SkyMaps, mask) -> None:
    """Peak counts and PDF of every source's HEALPix κ as observed (with its noise), times
    the mask and smoothed, counted on the pixels MASK_MARGIN_SIGMAS σ and one pixel side
    inside the mask's whole pixels (:func:`pmpipe.physics.stats.interior_healpix`)."""
    import healpy

    scales, edges = setup.config.summaries.smoothing_arcmin, kappa_edges(setup.config)
    side = healpy.nside2resol(healpy.npix2nside(mask.size))
    inside = [
        stats.interior_healpix(mask, MASK_MARGIN_SIGMAS * np.radians(s / 60) + side) for s in scales
    ]
    observed = maps.kappa if maps.noise is None else [k + n for k, n in zip(maps.kappa, maps.noise)]
    peaks, pdfs = [], []
    for values in observed:
        smoothed = [maps.smooth(np.asarray(values) * mask, s) for s in scales]
        peaks.append([maps.peaks_of(m, edges, w) for m, w in zip(smoothed, inside)])
        pdfs.append([stats.pdf(np.asarray(m)[w], edges) for m, w in zip(smoothed, inside)])
    fraction = [float(w.mean()) for w in inside]
    for name, values, what in (
        ("peaks", peaks, "number of peaks"),
        ("pdf", pdfs, "probability density"),
    ):
        out.write_array(
            f"{name}_masked_healpix", np.asarray(values), ("source", "smoothing", "kappa"),
            "1", f"{what} of smoothed kappa times lensing.full_sky.mask, on the pixels "
            f"{MASK_MARGIN_SIGMAS} smoothing sigma and a pixel inside it",
            counted_sky_fraction=fraction,
        )  # fmt: skip


def pair_spectra(fields: list, spectrum: Callable) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """C_ℓ (S, S, L) of every pair of ``fields`` (i ≤ j measured, C_ji = C_ij), with the bins'
    mean multipoles and modes (L,) of the first."""
    count = len(fields)
    out: np.ndarray | None = None
    first = None
    for i in range(count):
        for j in range(i, count):
            measured = spectrum(fields[i], fields[j])
            if out is None:
                first = measured
                out = np.zeros((count, count, measured[1].size))
            out[i, j] = out[j, i] = measured[1]
    assert out is not None and first is not None
    return first[0], out, first[2]


def _write_map_statistics(out, setup: derive.RunSetup, maps: SkyMaps) -> None:
    """The multipole bins, the C_ℓ of every pair with their Limber prediction, peak counts and
    PDF of one kind of map of every source."""
    ell_dim, ell_edges = maps.ell_dim, maps.edges
    centres = np.sqrt(ell_edges[1:] * ell_edges[:-1])
    out.write_coordinate(ell_dim, centres, "1", "geometric centre of the multipole bin")
    for end, values in (("lo", ell_edges[:-1]), ("hi", ell_edges[1:])):
        out.write_array(
            f"{ell_dim}_{end}", values, (ell_dim,), "1",
            f"{'lower' if end == 'lo' else 'upper'} edge of the multipole bin",
        )  # fmt: skip
    ell_mean, mode_counts = _write_spectra_and_peaks(out, setup, maps)
    out.write_array(
         f"{ell_dim}_mean", ell_mean, (ell_dim,), "1",
        "mean multipole of the modes in the bin (weights 2 ell + 1 on the "
        "full sky); the ell at which to compare C_ell with theory",
    )  # fmt: skip
    out.write_array(
         f"cl_modes{maps.suffix}", mode_counts, (ell_dim,), "1",
        "number of multipole modes in the bin",
    )  # fmt: skip
    at = np.where(np.isfinite(ell_mean), ell_mean, centres)
    srcs = [source for _, _, source in setup.sources]
    theory = np.zeros((len(srcs), len(srcs), at.size))
    for i, source in enumerate(srcs):
        for j in range(i, len(srcs)):
            theory[i, j] = theory[j, i] = lensing.limber_convergence_cl(
                setup.cosmology, at, source, setup.power, other=srcs[j]
            )
    out.write_array(
         f"cl_linear{maps.suffix}", theory, (*PAIR_DIMS, ell_dim), "sr",
        "Limber C_ell of kappa with the linear P(k) at the bins' mean multipoles, every pair "
        "(the sources' kernels with their nuisances)",
    )  # fmt: skip


def _write_spectra_and_peaks(out, setup: derive.RunSetup, maps: SkyMaps) -> tuple:
    """The C_ℓ of every pair (κ, E and B modes, with noise), peak counts and PDF of the maps,
    under their names with maps.suffix; returns the bins' mean multipoles and mode counts."""
    suffix, dims = maps.suffix, (*PAIR_DIMS, maps.ell_dim)
    observed = maps.kappa if maps.noise is None else [k + n for k, n in zip(maps.kappa, maps.noise)]
    _write_peaks(out, setup, suffix, observed, maps.smooth, maps.peaks_of)
    spectra: dict[str, tuple] = {}
    for kind, fields in maps.modes.items():  # the flat sky's E modes are κ: measured once
        same = [k for k in spectra if maps.modes[k] is fields]
        spectra[kind] = spectra[same[0]] if same else pair_spectra(fields, maps.spectrum)
    for kind, long_name in (
        ("", "angular power spectrum of kappa (no noise), every pair of sources"),
        ("_ee", "angular power spectrum of the shear's E modes (no noise), every pair"),
        ("_bb", "angular power spectrum of the shear's B modes (no noise), every pair"),
    ):
        out.write_array(f"cl{kind}{suffix}", spectra[kind][1], dims, "sr", long_name)
    if maps.noisy is not None:
        cl = spectra[""][1].copy()
        for i, noisy in enumerate(maps.noisy):
            cl[i, i] = maps.spectrum(noisy, noisy)[1]
        out.write_array(
            f"cl_noisy{suffix}", cl, dims, "sr",
            "angular power spectrum of kappa with shape noise, which enters the auto-spectra "
            "only (the sources' galaxies are independent)",
        )  # fmt: skip
    return spectra[""][0], spectra[""][2]


def _write_peaks(
    out, setup: derive.RunSetup, suffix: str, observed: list, smooth, peaks_of
) -> None:
    """Peak counts and PDF of every source's map as observed (with shape noise when the run
    has it), per smoothing scale."""
    cfg = setup.config
    scales, edges = cfg.summaries.smoothing_arcmin, kappa_edges(cfg)
    peaks, pdfs = [], []
    for observed_map in observed:
        smoothed = [smooth(observed_map, s) for s in scales]
        peaks.append([peaks_of(m, edges) for m in smoothed])
        pdfs.append([stats.pdf(m, edges) for m in smoothed])
    label = "" if cfg.summaries.shape_noise is None else " with shape noise"
    out.write_array(
        "peaks" + suffix,
        np.asarray(peaks),
        ("source", "smoothing", "kappa"),
        "1",
        f"number of peaks of smoothed kappa{label} per kappa bin",
    )
    out.write_array(
        "pdf" + suffix,
        np.asarray(pdfs),
        ("source", "smoothing", "kappa"),
        "1",
        f"probability density of smoothed kappa{label}",
    )


XI_PIXELS = 3  # pixel sides: the smallest default angle of ξ±


def xi_angles(cfg: config.Run) -> np.ndarray:
    """Angles (arcmin) of the full-sky ξ±, log-spaced: summaries.xi_theta_arcmin, or from 3
    pixel sides to 300 arcmin (at least 10 times further, at most 180 degrees)."""
    full = config.section(config.section(cfg.lensing, "lensing").full_sky, "lensing.full_sky")
    low = XI_PIXELS * sky.pixel_arcmin(full.nside)
    low, high = cfg.summaries.xi_theta_arcmin or (low, min(max(300.0, 10 * low), 10800.0))
    return np.geomspace(low, high, cfg.summaries.xi_bins)


def _write_shear_correlations(out, setup: derive.RunSetup, maps: SkyMaps) -> None:
    """ξ+ and ξ- (source, source2, theta) of every pair of sources from the E and B modes of
    the full-sky shear (:mod:`pmpipe.physics.shear_correlation`; no pixel window: the maps
    are point samples)."""
    import healpy

    theta = xi_angles(setup.config)
    e, b = maps.modes["_ee"], maps.modes["_bb"]
    count = len(e)
    xi = np.zeros((2, count, count, theta.size))
    for i in range(count):
        for j in range(i, count):
            cl_ee, cl_bb = healpy.alm2cl(e[i], e[j]), healpy.alm2cl(b[i], b[j])
            pair = shear_correlation.shear_correlations(cl_ee, cl_bb, np.radians(theta / 60))
            xi[:, i, j] = xi[:, j, i] = pair
    out.write_coordinate("theta", theta, "arcmin", "angle of the shear correlations")
    for sign, name in ((0, "plus"), (1, "minus")):
        out.write_array(
            f"xi_{name}_healpix", xi[sign], (*PAIR_DIMS, "theta"), "1",
            f"shear correlation xi_{'+' if sign == 0 else '-'} of every pair of sources, from "
            "the E and B spectra to the band limit",
        )  # fmt: skip
