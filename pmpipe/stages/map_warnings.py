"""What `pmpipe plan` warns of in a run's lensing maps before anything runs: maps whose pixels
reach far beyond the multipoles the run resolves, sources whose resolved multipoles hold no
C_ℓ bin, smoothing scales that leave nothing to count or less than a pixel, and plane
geometries that lose power (pmpipe.physics.statistics.resolution)."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from pmpipe.physics.evolution import sky
from pmpipe.physics.lensing import raytrace_flat
from pmpipe.physics.statistics import resolution
from pmpipe.run import derive
from pmpipe.run.setup_parts import LensingSetup
from pmpipe.stages.lensing import valid_ranges

MIN_SMOOTHING_AREAS = 10  # a map with fewer Gaussian areas A / (2π σ²) has almost no peaks


def resolution_warnings(setup: derive.RunSetup, far: float = 2.0) -> dict[str, tuple[float, str]]:
    """Per map field whose pixels or nside reach multipoles over ``far`` times the highest one
    the run resolves for any of its sources: (that multipole, a warning naming the field to
    change)."""
    if setup.lensing is None:
        return {}
    cone, lens = setup.lensed()
    ranges = valid_ranges(setup, cone.planes.chi_edges)
    grid = setup.grid
    k_valid = resolution.k_max_valid(grid.particles, grid.box_size, grid.oversample)
    out = {}
    thickness = cone.plane_thickness
    if lens.method != "born" and thickness > raytrace_flat.MAX_PLANE_THICKNESS:
        field = f"lightcone.plane_thickness = {thickness:g} Mpc/h"
        out[field] = (
            0.0,
            (
                f"{field} is too thick for ray tracing (lensing.method = "
                f"{lens.method}, {len(cone.planes)} planes): "
                "lens-lens coupling needs planes of at most "
                f"{raytrace_flat.MAX_PLANE_THICKNESS:g} Mpc/h: set it to at most that, with "
                "lightcone.copy_every 'box' so that thin planes keep their power at low "
                "multipoles (docs/lensing.md)"
            ),
        )
    if cone.copy_every == "plane" and thickness < grid.box_size:
        field = "lightcone.copy_every = plane"
        out[field] = (
            0.0,
            (
                f"{field}: each plane of {thickness:g} Mpc/h sees its own copy of the "
                f"{grid.box_size:g} Mpc/h box, so the maps lose the correlations between "
                "neighbouring planes (power at low multipoles, a narrower resolved range): "
                "set lightcone.copy_every to box (docs/lensing.md)"
            ),
        )
    reaches = _map_reaches(lens)
    for suffix, rows in ranges.items():
        best = max(range(len(rows)), key=lambda i: rows[i].ell_max)
        resolved = rows[best].ell_max
        reach, field, change = reaches[suffix]
        empty = _binless_warning(setup, suffix, rows)
        if empty is not None:  # no bin anywhere: no pixel count helps, the mesh must change
            out[empty[0]] = (resolved, empty[1])
        elif reach > far * resolved:
            out[field] = (
                resolved,
                (
                    f"{field} reaches multipole {reach:.0f}, but the mesh resolves "
                    f"the maps to {resolved:.0f} at most (source {lens.sources[best][0]}; "
                    f"k_max_valid = {k_valid:.3g} h/Mpc): {change(resolved)}, or raise "
                    "box.particles or box.oversample (docs/lensing.md)"
                ),
            )
    out.update(_smoothing_warnings(setup))
    return out


def _binless_warning(setup: derive.RunSetup, suffix: str, rows) -> tuple[str, str] | None:
    """(field, warning) when a source's resolved multipoles (rows: MultipoleRange per source
    of the map ``suffix``) hold no whole C_ℓ bin of that map; None when every source's do."""
    _, lens = setup.lensed()
    sky_map = lens.flat if suffix == "" else lens.full
    assert sky_map is not None  # a map with resolved ranges
    edges = np.asarray(sky_map.ell_edges)
    empty = [
        f"{source[0]} ({'none' if row.ell_max <= row.ell_min else f'{row.ell_min:.0f}-{row.ell_max:.0f}'})"
        for source, row in zip(lens.sources, rows)
        if not resolution.bins_within(edges[:-1], edges[1:], row.ell_min, row.ell_max).any()
    ]
    if not empty:
        return None
    field = "lensing.flat_sky" if suffix == "" else "lensing.full_sky"
    return field, (
        f"{field}: no C_ell bin of the map ({edges[0]:.0f}-{edges[-1]:.0f}) lies within the "
        f"multipoles the run resolves for {', '.join(empty)}: its C_ell, peaks and PDF "
        "measure the mesh, not the cosmology; choose bins within them (summaries.ell_range, "
        "summaries.ell_bins), or raise box.particles (or box.oversample) to resolve higher "
        "multipoles, box.box_size lower ones (docs/lensing.md)"
    )


def _smoothing_warnings(setup: derive.RunSetup) -> dict[str, tuple[float, str]]:
    """Per map: a warning naming summaries.smoothing_arcmin when a scale leaves fewer than
    MIN_SMOOTHING_AREAS Gaussian areas A / (2π σ²) in the map (its peaks and PDF count almost
    nothing), or is above 0 but below half a pixel side (they count the pixels' noise)."""
    _, lens = setup.lensed()
    maps = []
    if (flat := lens.flat) is not None:
        side = flat.field_of_view * 60
        maps.append(("flat", side * side, side / flat.pixels))
    if (full := lens.full) is not None:
        maps.append(("full", 4 * math.pi * (180 * 60 / math.pi) ** 2, sky.pixel_arcmin(full.nside)))
    out = {}
    for kind, area, pixel in maps:
        for sigma in setup.summaries.smoothing_arcmin:
            if sigma <= 0:
                continue
            areas = area / (2 * math.pi * sigma**2)
            if areas >= MIN_SMOOTHING_AREAS and sigma >= pixel / 2:
                continue
            field = f"summaries.smoothing_arcmin = {sigma:g} ({kind} sky)"
            what = (
                f"leaves {areas:.2g} Gaussian areas in the {kind}-sky map, whose peaks and PDF "
                f"then count almost nothing: use at most {math.sqrt(area / (2 * math.pi * MIN_SMOOTHING_AREAS)):.0f} arcmin"
                if areas < MIN_SMOOTHING_AREAS
                else f"is below half the {kind}-sky map's pixel side of {pixel:.3g} arcmin (a FWHM "
                "of under 1.2 pixels): its peaks and PDF count the pixels' noise; use at least "
                "half a pixel side"
            )
            out[field] = (0.0, f"{field} {what} (docs/lensing.md)")
    return out


def _map_reaches(lens: LensingSetup) -> dict[str, tuple[float, str, Callable[[float], str]]]:
    """Per map (:func:`valid_ranges`' suffixes) the highest multipole its pixels reach, the
    field that sets it, and the change of that field for maps resolved to a given multipole."""
    out: dict[str, tuple[float, str, Callable[[float], str]]] = {}
    if (flat := lens.flat) is not None:
        fov = flat.field_of_view
        out[""] = (
            np.pi * flat.pixels / np.radians(fov),
            f"lensing.flat_sky.pixels = {flat.pixels} ({fov:g} deg)",
            lambda resolved: (
                "lower lensing.flat_sky.pixels to about "
                f"{max(1, math.ceil(resolved * np.radians(fov) / np.pi))}"
            ),
        )
    if (full := lens.full) is not None:
        out["_healpix"] = (
            sky.healpix_ell_max(full.nside),
            f"lensing.full_sky.nside = {full.nside}",
            lambda resolved: (
                "lower lensing.full_sky.nside to "
                f"{max(1, 1 << max(0, math.ceil((resolved + 1) / 3) - 1).bit_length())}"
            ),
        )
    return out
