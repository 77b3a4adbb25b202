"""lightcone.copy_every: thin planes that share a copy of the box make, together, the thick
plane of that copy (paired runs of one seed), and keep the resolved multipoles of planes that
thick; thin planes of their own copies are independent of each other."""

import numpy as np
import pytest
import zarr
from conftest import run_every_stage

from pmpipe.run import config, derive
from pmpipe.stages import lensing

RUN = {
    "box": {"particles": 32, "box_size": 64.0},
    "nbody": {"steps": 4},
    "lensing": {
        "source_redshifts": [0.3],
        "flat_sky": {"field_of_view": 4.0, "pixels": 64},
    },
    "summaries": {"smoothing_arcmin": [0.0], "ell_bins": 6},
}


def _maps(root, name: str, thickness: float, every: str) -> dict:
    data = {**RUN, "lightcone": {"z_max": 0.3, "plane_thickness": thickness, "copy_every": every}}
    run_dir = run_every_stage(root / name, config.Run.model_validate(data))
    lens = zarr.open_group(run_dir / "lensing.zarr", mode="r")
    summaries = zarr.open_group(run_dir / "summaries.zarr", mode="r")
    nbody = zarr.open_group(run_dir / "nbody.zarr", mode="r")
    return {
        "kappa": np.asarray(lens["kappa"][0], np.float64),
        "cl": np.asarray(summaries["cl"][0, 0]),
        "ell_min_valid": float(lens["ell_min_valid"][0]),
        "slabs": [t["slab_cells"] for t in nbody.attrs["plane_transforms"]],
    }


def _correlation(a, b) -> float:
    return float(np.corrcoef(a.ravel(), b.ravel())[0, 1])


@pytest.mark.slow
def test_thin_planes_of_one_copy_make_its_thick_plane(tmp_path):
    """Planes 16 Mpc/h thick, four to a copy, against planes one box (64 Mpc/h) thick, one to a
    copy: copy i of either is drawn from the same stream, so the maps agree but for the thin
    planes' own crossing times and lensing weights (measured: correlation 0.95, rms within
    1 %); with a copy per thin plane the map is another realisation (correlation -0.03)."""
    thick = _maps(tmp_path, "thick", 64.0, "plane")
    tiled = _maps(tmp_path, "tiled", 16.0, "box")
    apart = _maps(tmp_path, "apart", 16.0, "plane")
    assert tiled["slabs"][:8] == [0, 8, 16, 24] * 2  # 8 cells of 2 Mpc/h to a plane
    assert set(apart["slabs"]) == {0}
    assert _correlation(tiled["kappa"], thick["kappa"]) > 0.9
    assert abs(_correlation(apart["kappa"], thick["kappa"])) < 0.3
    np.testing.assert_allclose(tiled["kappa"].std(), thick["kappa"].std(), rtol=0.05)


def _resolved(thickness: float, every: str) -> tuple[float, float]:
    """The flat map's resolved multipoles for the source at z = 0.5 of 128^3 particles in
    128 Mpc/h."""
    data = {
        **RUN,
        "box": {"particles": 128, "box_size": 128.0, "oversample": 2},
        "lightcone": {"z_max": 0.5, "plane_thickness": thickness, "copy_every": every},
        "lensing": {"source_redshifts": [0.5], "flat_sky": {"field_of_view": 4.5, "pixels": 256}},
    }
    run = config.Run.model_validate(data)
    found = derive.setup(config.RunFile.build("copies", "r", 0, {}, run), None)
    best = lensing.valid_ranges(found, found.lightcone.planes.chi_edges)[""][0]
    return best.ell_min, best.ell_max


def test_planes_of_one_copy_keep_the_resolved_multipoles_of_one_thick_plane():
    """Four 32 Mpc/h planes to a copy resolve what planes one box thick do; 32 Mpc/h planes
    of their own copies lose power at low multipoles, so resolve fewer."""
    thick, tiled, apart = (
        _resolved(128.0, "plane"),
        _resolved(32.0, "box"),
        _resolved(32.0, "plane"),
    )
    assert tiled == thick
    assert apart[0] > 1.2 * thick[0] and apart[1] - apart[0] < thick[1] - thick[0]


def test_planes_per_copy_follow_the_box_length():
    data = {**RUN, "lightcone": {"z_max": 0.3, "plane_thickness": 24.0, "copy_every": "box"}}
    assert config.Run.model_validate(data).planes_per_copy() == 2  # ⌊64 / 24⌋
    data["lightcone"]["copy_every"] = "plane"
    assert config.Run.model_validate(data).planes_per_copy() == 1
