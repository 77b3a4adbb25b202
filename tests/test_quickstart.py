"""The quick-start campaign's maps, and those of the lensing campaign docs/campaigns.md shows,
are ones their runs resolve: no warning from plan, at least MIN_BINS resolved multipole bins
per source on every map, smoothing of at least two pixels."""

import re
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO

from pmpipe import cli
from pmpipe.campaigns import campaign
from pmpipe.physics.evolution import sky
from pmpipe.run import derive
from pmpipe.stages import lensing

QUICKSTART = REPO / "config" / "quickstart.yaml"
MIN_BINS = 4
POINTS_CHECKED = 3  # design points whose ranges are computed (plan checks every run)


def lensing_example(folder: Path) -> Path:
    """The YAML block of docs/campaigns.md's lensing section, written to ``folder``."""
    text = (REPO / "docs" / "campaigns.md").read_text()
    section = text.split("## A campaign with lensing", 1)[1]
    path = folder / "lensing.yaml"
    path.write_text(re.search(r"```yaml\n(.*?)```", section, re.DOTALL).group(1))
    return path


def _campaign(name: str, folder: Path) -> Path:
    """The quick start ('quickstart') or the docs' lensing campaign ('docs', written to
    ``folder``)."""
    return QUICKSTART if name == "quickstart" else lensing_example(folder)


@pytest.fixture(params=["quickstart", "docs"])
def campaign_file(request, tmp_path) -> Path:
    return _campaign(request.param, tmp_path)


# the docs' campaign plans 64 design points (9 s on 2 cores): in the slow tier
@pytest.mark.parametrize("name", ["quickstart", pytest.param("docs", marks=pytest.mark.slow)])
def test_the_plan_prints_no_warning(name, tmp_path, capsys):
    path = _campaign(name, tmp_path)
    assert cli.main(["plan", str(path), "--results", str(tmp_path / "results")]) == 0
    assert "warning" not in capsys.readouterr().err


def test_every_source_has_resolved_bins_on_every_map(campaign_file):
    camp = campaign.load(campaign_file)
    points = {tuple(sorted(spec.parameters.items())): spec for spec in camp.runs}
    for spec in list(points.values())[:POINTS_CHECKED]:
        setup = derive.setup(campaign.run_file(camp, spec), None)
        cfg = setup.config
        ranges = lensing.valid_ranges(setup, setup.lightcone.planes.chi_edges)
        made = {"": cfg.lensing.flat_sky, "_healpix": cfg.lensing.full_sky}
        assert set(ranges) == {suffix for suffix, on in made.items() if on is not None}
        edges = {"": setup.lensing.flat, "_healpix": setup.lensing.full}
        for suffix, rows in ranges.items():
            e = edges[suffix].ell_edges
            for (label, _, _), r in zip(setup.lensing.sources, rows, strict=True):
                inside = np.sum((e[:-1] >= r.ell_min) & (e[1:] <= r.ell_max))
                assert inside >= MIN_BINS, (spec.run_id, suffix, label, r)


def test_the_smoothing_spans_at_least_two_pixels_of_every_map(campaign_file):
    cfg = campaign.load(campaign_file).runs[0].run
    pixels = []
    if cfg.lensing.flat_sky is not None:
        pixels.append(cfg.lensing.flat_sky.field_of_view * 60 / cfg.lensing.flat_sky.pixels)
    if cfg.lensing.full_sky is not None:
        pixels.append(sky.pixel_arcmin(cfg.lensing.full_sky.nside))
    assert pixels and min(cfg.summaries.smoothing_arcmin) >= 2 * max(pixels)


def test_the_quick_start_makes_maps():
    cfg = campaign.load(QUICKSTART).runs[0].run
    assert cfg.lensing is not None and cfg.lensing.full_sky is not None
    assert len(cfg.lensing.source_redshifts) + len(cfg.lensing.distributions) == 3


def test_the_readme_and_the_quick_start_state_the_same_time():
    pattern = r"about (\d+ min(?: \d+ s)?) the\s+(?:#\s+)?first time.*?(\d+ min(?: \d+ s)?) again"
    said = [
        re.search(pattern, path.read_text(), re.DOTALL).groups()
        for path in (REPO / "README.md", QUICKSTART)
    ]
    assert said[0] == said[1]
