"""The lensing maps' part of the summaries: the C_ℓ of every pair of sources (κ, and the shear's
E and B modes), with the Limber prediction of every pair, and per source the peak counts and
PDF of κ, on the flat-sky and HEALPix maps (docs/outputs.md); with lensing.draws, of every
draw's maps along a leading ``draw`` dimension."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from pmpipe.physics.lensing import projection
from pmpipe.physics.statistics import shear_correlation, stats
from pmpipe.run import derive
from pmpipe.run.setup_parts import LensingSetup
from pmpipe.stages import layout, masked_statistics, sky_maps
from pmpipe.stages.inputs import Inputs
from pmpipe.stages.sky_maps import PAIR_DIMS, SkyMaps
from pmpipe.storage import gathered

RANGE_NAMES = ("ell_min_valid", "ell_max_valid", "ell_min_valid_healpix", "ell_max_valid_healpix")


def write_lensing_statistics(group, setup: derive.RunSetup, inputs: Inputs) -> None:
    """C_ell of every pair of sources (with its Limber prediction for the linear P(k)), peak
    counts and PDF of κ per source and smoothing scale, for the flat-sky and the HEALPix maps
    (and for lensing.method both, of Born's maps too, names with '_born'). With lensing.draws,
    those of every draw's maps, with its sources and shape noise, stacked along a leading
    ``draw`` dimension."""
    _, lens = setup.lensed()
    drawn = lens.draws
    masks = masked_statistics.masks(lens)
    if drawn is None:
        out = gathered.Gathered()
        _write_statistics(out, setup, lens, inputs, masks)
        gathered.write(group, [out])
        return
    layout.write_draw_axis(group, [values for values, _ in drawn])
    draws = []
    for d, (_, sources) in enumerate(drawn):
        draws.append(gathered.Gathered())
        drawn_lens = dataclasses.replace(lens, sources=sources)
        _write_statistics(draws[-1], setup, drawn_lens, inputs, masks, (d,))
    gathered.write(group, draws, varies_by_draw)


def varies_by_draw(name: str, dims: tuple[str, ...]) -> bool:
    """Whether a statistic differs between draws: every array over the sources but their
    coordinates and resolved multipoles (those of the lensing section's sources)."""
    return "source" in dims and name not in dims and name not in RANGE_NAMES


def _write_statistics(
    out,
    setup: derive.RunSetup,
    lens: LensingSetup,
    inputs: Inputs,
    masks: masked_statistics.Masks,
    draw: tuple = (),
) -> None:
    """:func:`write_lensing_statistics` of the maps at ``draw`` (() without draws, else the
    draw's index, ``lens`` with the draw's sources) into ``out``
    (pmpipe.storage.gathered.Gathered), under the run's ``masks``."""
    _write_lensing_axes(out, setup, inputs)
    if lens.flat is not None:
        flat = sky_maps.flat_sky_maps(setup, lens, lens.flat, inputs, draw)
        _write_map_statistics(out, setup, lens.sources, flat)
        if masks.flat is not None:
            masked_statistics.write_masked_flat(out, setup, lens.flat, flat, masks)
        if lens.method == "both":  # Born's maps of the same planes, on the same bins
            born = sky_maps.flat_sky_maps(setup, lens, lens.flat, inputs, draw, "_born")
            _write_spectra_and_peaks(out, setup, born)
            if masks.flat is not None:
                masked_statistics.write_masked_flat(out, setup, lens.flat, born, masks)
    if lens.full is not None:
        full = sky_maps.full_sky_maps(setup, lens, lens.full, inputs, draw)
        _write_map_statistics(out, setup, lens.sources, full)
        _write_shear_correlations(out, lens.full.xi_theta, full)
        if masks.healpix is not None:
            masked_statistics.write_masked_healpix(out, setup, full, masks)
        if lens.method == "both":
            born = sky_maps.full_sky_maps(setup, lens, lens.full, inputs, draw, "_born")
            _write_spectra_and_peaks(out, setup, born)
            if masks.healpix is not None:
                masked_statistics.write_masked_healpix(out, setup, born, masks)


def _write_lensing_axes(out, setup: derive.RunSetup, inputs: Inputs) -> None:
    """The sources (twice: ``source`` and ``source2``, the axes of the pairs) with their
    resolved multipoles, the smoothing scales and the κ bins."""
    scales, edges = setup.summaries.smoothing_arcmin, setup.summaries.kappa_edges
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


def _write_map_statistics(out, setup: derive.RunSetup, sources: tuple, maps: SkyMaps) -> None:
    """The multipole bins, the C_ℓ of every pair with their Limber prediction (for the lensing
    setup's ``sources``), peak counts and PDF of one kind of map of every source."""
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
    srcs = [source for _, _, source in sources]
    theory = np.zeros((len(srcs), len(srcs), at.size))
    for i, source in enumerate(srcs):
        for j in range(i, len(srcs)):
            theory[i, j] = theory[j, i] = projection.limber_convergence_cl(
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
    _write_peaks(out, setup, maps)
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


def _write_peaks(out, setup: derive.RunSetup, maps: SkyMaps) -> None:
    """Peak counts and PDF of every source's map as observed (with shape noise when the run
    has it), per smoothing scale, under their names with maps.suffix."""
    scales, edges = setup.summaries.smoothing_arcmin, setup.summaries.kappa_edges
    observed = maps.kappa if maps.noise is None else [k + n for k, n in zip(maps.kappa, maps.noise)]
    observed_modes = maps.modes[""] if maps.noisy is None else maps.noisy
    peaks, pdfs = [], []
    for observed_map, modes in zip(observed, observed_modes):
        smoothed = [maps.smooth_modes(modes, s) if s else observed_map for s in scales]
        peaks.append([maps.peaks_of(m, edges) for m in smoothed])
        pdfs.append([stats.pdf(m, edges) for m in smoothed])
    label = "" if maps.noise is None else " with shape noise"
    suffix = maps.suffix
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


def _write_shear_correlations(out, theta: np.ndarray, maps: SkyMaps) -> None:
    """ξ+ and ξ- (source, source2, theta) of every pair of sources at the angles ``theta``
    (arcmin) from the E and B modes of the full-sky shear
    (:mod:`pmpipe.physics.statistics.shear_correlation`; no pixel window: the maps are point
    samples)."""
    import healpy

    e, b = maps.modes["_ee"], maps.modes["_bb"]
    count = len(e)
    pairs = [(i, j) for i in range(count) for j in range(i, count)]
    cl_ee = np.stack([healpy.alm2cl(e[i], e[j]) for i, j in pairs])
    cl_bb = np.stack([healpy.alm2cl(b[i], b[j]) for i, j in pairs])
    found = np.stack(shear_correlation.shear_correlations(cl_ee, cl_bb, np.radians(theta / 60)))
    xi = np.zeros((2, count, count, theta.size))
    for p, (i, j) in enumerate(pairs):
        xi[:, i, j] = xi[:, j, i] = found[:, p]
    out.write_coordinate("theta", theta, "arcmin", "angle of the shear correlations")
    for sign, name in ((0, "plus"), (1, "minus")):
        out.write_array(
            f"xi_{name}_healpix", xi[sign], (*PAIR_DIMS, "theta"), "1",
            f"shear correlation xi_{'+' if sign == 0 else '-'} of every pair of sources, from "
            "the E and B spectra to the band limit",
        )  # fmt: skip
