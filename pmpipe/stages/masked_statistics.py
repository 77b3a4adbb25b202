"""The statistics of the lensing maps under a survey mask: the spectra of every pair of masked
maps, decoupled from the mask (pseudo-C_ℓ), with their bandpower windows, and the peak counts
and PDF of κ counted inside the mask, away from its edges (lensing.full_sky.mask,
lensing.flat_sky.mask)."""

from __future__ import annotations

import dataclasses

import numpy as np

from pmpipe.physics.lensing import projection
from pmpipe.physics.statistics import pseudo_cl, pseudo_cl_flat, stats
from pmpipe.run import derive
from pmpipe.run.setup_parts import FlatSkySetup, LensingSetup
from pmpipe.stages.sky_maps import PAIR_DIMS, SkyMaps


@dataclasses.dataclass(frozen=True)
class Masks:
    """The run's masks with their couplings, made once for all its draws: ``flat`` (the mask,
    pmpipe.physics.statistics.pseudo_cl_flat.couplings) and ``healpix`` (the mask, the bin edges up to
    2 nside, the spin-0 and spin-2 coupling matrices), each None without that mask."""

    flat: tuple | None
    healpix: tuple | None


def masks(lens: LensingSetup) -> Masks:
    """The :class:`Masks` of the run's lensing.flat_sky.mask and lensing.full_sky.mask
    (``lens``: its lensing setup)."""
    flat = healpix = None
    if lens.flat is not None and lens.flat.mask is not None:
        mask = lens.flat.mask
        flat = (mask, pseudo_cl_flat.couplings(mask, lens.flat.field_of_view, lens.flat.ell_edges))
    if lens.full is not None and lens.full.mask is not None:
        import healpy  # here, so that a flat-sky run's stage imports neither it nor matplotlib

        nside, mask, edges = lens.full.nside, lens.full.mask, lens.full.ell_edges
        ell_max = 2 * nside
        mask_cl = pseudo_cl.mask_power(healpy.ud_grade(mask, 2 * nside), 2 * ell_max)
        healpix = (
            mask,
            edges[edges <= ell_max + 1],
            pseudo_cl.coupling_spin0(mask_cl, ell_max),
            pseudo_cl.coupling_spin2(mask_cl, ell_max),
        )
    return Masks(flat, healpix)


def _born(maps: SkyMaps) -> str:
    """'_born' for Born's maps of lensing.method both (their statistics' names carry it before
    '_masked'), '' for the run's."""
    return "_born" if maps.suffix.startswith("_born") else ""


def write_masked_healpix(out, setup: derive.RunSetup, maps: SkyMaps, masked: Masks) -> None:
    """The HEALPix maps' masked spectra (:func:`_write_masked_spectra_healpix`), peaks and PDF
    (:func:`_write_masked_peaks_healpix`); the bins and windows with the run's maps."""
    assert masked.healpix is not None  # the run has a full-sky mask
    _write_masked_spectra_healpix(out, maps, masked.healpix)
    _write_masked_peaks_healpix(out, setup, maps, masked.healpix[0])


def write_masked_flat(
    out, setup: derive.RunSetup, flat: FlatSkySetup, maps: SkyMaps, masked: Masks
) -> None:
    """The masked spectra (:func:`_write_masked_spectra_flat`), peaks and PDF
    (:func:`_write_masked_peaks_flat`) of the ``flat`` sky's maps; the windows with the run's
    maps."""
    assert masked.flat is not None  # the run has a flat-sky mask
    _write_masked_spectra_flat(out, maps, masked.flat)
    _write_masked_peaks_flat(out, setup, flat.pixel_arcmin, maps, masked.flat[0])


def _write_masked_spectra_healpix(out, maps: SkyMaps, masked: tuple) -> None:
    """The spectra of every pair of the run's HEALPix ``maps`` times the mask
    (lensing.full_sky.mask), κ and the shear's E and B, decoupled (pmpipe.physics.statistics.pseudo_cl)
    in the HEALPix bins up to 2 nside, with their bandpower windows (``masked``: the mask,
    the edges, the spin-0 and spin-2 couplings)."""
    import healpy

    mask, edges, spin0, spin2 = masked
    nside = healpy.npix2nside(mask.size)
    ell_max = 2 * nside
    count = len(maps.kappa)
    scalar, shear = [], []
    for i in range(count):
        scalar.append(healpy.map2alm(maps.kappa[i] * mask, lmax=ell_max, iter=3))
        q, u = projection.healpix_spin2_maps(maps.modes["_ee"][i], maps.modes["_bb"][i], nside)
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
    dim = "ell_masked_healpix"
    what = {"": "kappa", "_ee": "the shear's E modes", "_bb": "the shear's B modes"}
    for name, values in found.items():
        out.write_array(
            f"cl{name}{_born(maps)}_masked_healpix", values, (*PAIR_DIMS, dim), "sr",
            f"C_ell of {what[name]} of {_kind(maps)} maps under "
            "lensing.full_sky.mask, decoupled (pseudo-C_ell)",
            sky_fraction=float(mask.mean()),
        )  # fmt: skip
    if not _born(maps):
        _write_masked_bins_healpix(out, edges, (spin0, spin2))


def _kind(maps: SkyMaps) -> str:
    return "Born's" if _born(maps) else "the run's"


def _write_masked_bins_healpix(out, edges, couplings) -> None:
    """The masked HEALPix spectra's bins and windows (:func:`_write_masked_spectra_healpix`)."""
    dim, bins = "ell_masked_healpix", edges.size - 1
    out.write_coordinate(
        dim, 0.5 * (edges[1:] + edges[:-1]), "1", "centre of the masked spectra's bin"
    )
    for end, values in (("lo", edges[:-1]), ("hi", edges[1:])):
        out.write_array(f"{dim}_{end}", values, (dim,), "1", f"{end} edge of the bin")
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


def _write_masked_peaks_healpix(out, setup: derive.RunSetup, maps: SkyMaps, mask) -> None:
    """Peak counts and PDF of every source's HEALPix κ as observed (with its noise), times
    the mask and smoothed, counted on the pixels MASK_MARGIN_SIGMAS σ and one pixel side
    inside the mask's whole pixels (:func:`pmpipe.physics.statistics.stats.interior_healpix`)."""
    import healpy

    scales, edges = setup.summaries.smoothing_arcmin, setup.summaries.kappa_edges
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
    _write_masked_counts(out, maps, peaks, pdfs, [float(w.mean()) for w in inside])


def _write_masked_counts(out, maps: SkyMaps, peaks, pdfs, fraction: list[float]) -> None:
    """peaks_masked and pdf_masked (source, smoothing, kappa) of one kind of map (names with
    '_born' before '_masked' for Born's, '_healpix' after it for the full sky), with the share
    of the map counted per smoothing scale."""
    full = maps.suffix.endswith("_healpix")
    field = "lensing.full_sky.mask" if full else "lensing.flat_sky.mask"
    for name, values, what in (
        ("peaks", peaks, "number of peaks"),
        ("pdf", pdfs, "probability density"),
    ):
        out.write_array(
            f"{name}{_born(maps)}_masked{'_healpix' if full else ''}", np.asarray(values),
            ("source", "smoothing", "kappa"), "1",
            f"{what} of {_kind(maps)} smoothed kappa times {field}, on the pixels "
            f"{MASK_MARGIN_SIGMAS} smoothing sigma and a pixel inside it",
            counted_sky_fraction=fraction,
        )  # fmt: skip


def _write_masked_spectra_flat(out, maps: SkyMaps, masked) -> None:
    """The spectra of every pair of the run's flat-sky ``maps`` times the mask
    (lensing.flat_sky.mask), in the flat-sky bins: κ, and the E and B modes of the shear whose
    E and B are κ and ω (:func:`pmpipe.physics.statistics.pseudo_cl_flat.shear_of`), decoupled
    (pmpipe.physics.statistics.pseudo_cl_flat), with their bandpower windows over rings of |ℓ|
    (``masked``: the mask and its couplings)."""
    edges = maps.edges
    mask, coupled = masked
    fields = []
    for kappa, omega in zip(maps.modes[""], maps.modes["_bb"]):
        shear = pseudo_cl_flat.shear_of(kappa, omega)
        fields.append(pseudo_cl_flat.masked_modes(kappa, shear, mask))
    count, bins = len(fields), edges.size - 1
    found = {n: np.zeros((count, count, bins)) for n in ("", "_ee", "_bb")}
    for i in range(count):
        for j in range(i, count):
            pseudo = [maps.spectrum(a, b)[1] for a, b in zip(fields[i], fields[j])]
            ee, bb = pseudo_cl_flat.decoupled_spin2(pseudo[1], pseudo[2], coupled)
            for name, values in (
                ("", pseudo_cl_flat.decoupled_spin0(pseudo[0], coupled)),
                ("_ee", ee),
                ("_bb", bb),
            ):
                found[name][i, j] = found[name][j, i] = values
    what = {"": "kappa", "_ee": "the shear's E modes", "_bb": "the shear's B modes"}
    for name, values in found.items():
        out.write_array(
            f"cl{name}{_born(maps)}_masked", values, (*PAIR_DIMS, "ell"), "sr",
            f"C_ell of {what[name]} of {_kind(maps)} maps under lensing.flat_sky.mask, "
            "decoupled (pseudo-C_ell)",
            sky_fraction=float(np.mean(mask)),
        )  # fmt: skip
    if _born(maps):
        return
    out.write_coordinate(
        "multipole_flat", coupled["rings"], "1", "mean |ell| of a ring of the flat-sky windows"
    )
    windows = pseudo_cl_flat.windows(coupled)
    for name, long_name in (
        ("", "kappa's C_ell"),
        ("_ee", "C^EE from C^EE"),
        ("_bb", "C^BB from C^EE (the mask's E to B leakage)"),
    ):
        out.write_array(
            f"windows{name}_masked", windows[name], ("ell", "multipole_flat"), "1",
            f"bandpower windows of the flat-sky masked spectra, {long_name}: their mean is "
            "windows @ C(multipole_flat)",
        )  # fmt: skip


def _write_masked_peaks_flat(
    out, setup: derive.RunSetup, pixel_arcmin: float, maps: SkyMaps, mask
) -> None:
    """Peak counts and PDF of every source's flat-sky κ as observed (with its noise), times the
    mask and smoothed, counted on the whole pixels MASK_MARGIN_SIGMAS σ and one pixel side
    from every pixel that is not (:func:`pmpipe.physics.statistics.stats.interior_flat`)."""
    scales, edges = setup.summaries.smoothing_arcmin, setup.summaries.kappa_edges
    inside = [stats.interior_flat(mask, MASK_MARGIN_SIGMAS * s / pixel_arcmin + 1) for s in scales]
    observed = maps.kappa if maps.noise is None else [k + n for k, n in zip(maps.kappa, maps.noise)]
    peaks, pdfs = [], []
    for values in observed:
        smoothed = [maps.smooth(values * mask.astype(values.dtype), s) for s in scales]
        peaks.append([maps.peaks_of(m, edges, w) for m, w in zip(smoothed, inside)])
        pdfs.append([stats.pdf(np.asarray(m)[w], edges) for m, w in zip(smoothed, inside)])
    _write_masked_counts(out, maps, peaks, pdfs, [float(w.mean()) for w in inside])
