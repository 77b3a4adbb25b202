"""The quick-start campaign's maps are ones its runs resolve: no resolution warning from plan,
at least MIN_BINS resolved multipole bins per source on every map, smoothing of at least two
pixels."""

from pathlib import Path

import numpy as np

from pmpipe import cli
from pmpipe.orchestration import campaign
from pmpipe.physics import sky
from pmpipe.run import derive
from pmpipe.stages import lensing, sky_maps

QUICKSTART = Path(__file__).resolve().parent.parent / "config" / "quickstart.yaml"
MIN_BINS = 4


def test_the_quick_start_plan_prints_no_warning(tmp_path, capsys):
    assert cli.main(["plan", str(QUICKSTART), "--results", str(tmp_path)]) == 0
    assert "warning" not in capsys.readouterr().err


def test_every_source_of_every_quick_start_run_has_resolved_bins_on_every_map():
    camp = campaign.load(QUICKSTART)
    points = {spec.run_id.rsplit("-r", 1)[0]: spec for spec in camp.runs}  # seeds change no range
    assert len(points) == 3
    for spec in points.values():
        setup = derive.setup(campaign.run_file(camp, spec), None)
        cfg = setup.config
        ranges = lensing.valid_ranges(setup, setup.planes.chi_edges)
        edges = {"": sky_maps.ell_edges_flat, "_healpix": sky_maps.ell_edges_healpix}
        assert set(ranges) == {
            m for m, on in (("", cfg.lensing.flat_sky), ("_healpix", cfg.lensing.full_sky)) if on
        }
        for suffix, rows in ranges.items():
            e = edges[suffix](cfg)
            for (label, _, _), r in zip(setup.sources, rows, strict=True):
                inside = np.sum((e[:-1] >= r.ell_min) & (e[1:] <= r.ell_max))
                assert inside >= MIN_BINS, (spec.run_id, suffix, label, r)


def test_the_quick_start_smooths_over_at_least_two_pixels_of_every_map():
    cfg = campaign.load(QUICKSTART).runs[0].run
    pixels = []
    if cfg.lensing.flat_sky is not None:
        pixels.append(cfg.lensing.flat_sky.field_of_view * 60 / cfg.lensing.flat_sky.pixels)
    if cfg.lensing.full_sky is not None:
        pixels.append(sky.pixel_arcmin(cfg.lensing.full_sky.nside))
    assert pixels and min(cfg.summaries.smoothing_arcmin) >= 2 * max(pixels)
