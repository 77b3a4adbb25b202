"""A collected campaign in the forms training code reads: pmpipe.open_campaign (xarray, run
indexed by the design parameters) and pmpipe export (Parquet, npz): one row per run and draw,
a column per parameter and per element of every statistic, values as summaries.zarr has them."""

import numpy as np
import pandas as pd
import pytest

import pmpipe
from pmpipe import cli
from pmpipe.campaigns import design
from pmpipe.results import export
from pmpipe.run import config
from pmpipe.storage import store

RUNS = np.array(["c-p0000-r0", "c-p0001-r0", "c-p0002-r0"])


@pytest.fixture
def campaign_dir(tmp_path):
    """A campaign store as pmpipe.results.aggregate writes one: 3 runs (the last not
    complete), a design parameter, a statistic of (run, a, k), one of (run, draw, source,
    source2) and a drawn nuisance of (run, draw)."""
    rng = np.random.default_rng(1)
    g = store.create(tmp_path / "c" / "summaries.zarr", {"stage": "collect"})
    store.write_coordinate(g, "run", RUNS, "1", "run id")
    store.write_coordinate(g, "a", np.array([0.5, 1.0]), "1", "scale factor")
    store.write_coordinate(g, "k", np.array([0.1, 0.2, 0.4]), "h/Mpc", "k")
    store.write_coordinate(g, "source", np.array(["z=0.5", "z=1"]), "1", "source")
    store.write_coordinate(g, "source2", np.array(["z=0.5", "z=1"]), "1", "source")
    omega = np.array([0.28, 0.31, 0.34])
    store.write_array(g, "Omega_m", omega, ("run",), "1", f"Omega_m {design.DESIGN_PARAMETER}")
    store.write_array(g, "seed", np.array([7, 8, 9]), ("run",), "1", "seed")
    store.write_array(g, "complete", np.array([True, True, False]), ("run",), "1", "collected")
    store.write_array(g, "state", np.array(["done", "done", "failed"]), ("run",), "1", "state")
    store.write_array(g, "pk", rng.random((3, 2, 3)), ("run", "a", "k"), "(Mpc/h)^3", "P(k)")
    cl = rng.random((3, 4, 2, 2))
    store.write_array(g, "cl", cl, ("run", "draw", "source", "source2"), "1", "C_ell")
    store.write_array(g, "shear_bias", rng.random((3, 4)), ("run", "draw"), "1", "m drawn")
    store.mark_complete(g)
    return tmp_path / "c"


def test_the_table_has_a_row_per_run_and_draw_and_a_column_per_element(campaign_dir):
    table = export.campaign_table(campaign_dir)
    g = store.open_complete(campaign_dir / "summaries.zarr")
    assert (
        list(table["run_id"]) == list(np.repeat(RUNS, 4))
        and list(table["draw"]) == [0, 1, 2, 3] * 3
    )
    np.testing.assert_array_equal(table["Omega_m"], np.repeat(g["Omega_m"][:], 4))
    np.testing.assert_array_equal(table["pk[a=1, k=0.2]"], np.repeat(g["pk"][:, 1, 1], 4))
    np.testing.assert_array_equal(
        table["cl[source=z=0.5, source2=z=1]"], g["cl"][:, :, 0, 1].ravel()
    )
    assert "cl[source=z=1, source2=z=0.5]" not in table  # one column per unordered pair
    np.testing.assert_array_equal(table["shear_bias"], g["shear_bias"][:].ravel())
    assert sum(name.startswith("pk[") for name in table) == 6


@pytest.mark.parametrize("fmt", ["parquet", "npz"])
def test_export_writes_what_pandas_and_numpy_read(campaign_dir, fmt, capsys):
    assert cli.main(["export", str(campaign_dir), "--format", fmt]) == 0
    path = campaign_dir / f"c.{fmt}"
    assert f"wrote {path}" in capsys.readouterr().out
    table = export.campaign_table(campaign_dir)
    if fmt == "parquet":
        frame = pd.read_parquet(path)
        assert list(frame.columns) == list(table) and len(frame) == 12
        loaded = {name: frame[name].to_numpy() for name in frame.columns}
    else:
        loaded = dict(np.load(path))  # no pickled objects
    for name, values in table.items():
        np.testing.assert_array_equal(loaded[name], values.astype(loaded[name].dtype), name)


def test_open_campaign_indexes_runs_by_the_design_parameters(campaign_dir):
    ds = pmpipe.open_campaign(campaign_dir)
    assert ds.indexes["run"].names == ["Omega_m"]
    assert str(ds.run_id.sel(Omega_m=0.31).values) == "c-p0001-r0"
    np.testing.assert_array_equal(
        ds.pk.sel(Omega_m=0.34).values,
        store.open_complete(campaign_dir / "summaries.zarr")["pk"][2],
    )


def test_export_needs_a_collected_campaign_and_a_known_format(tmp_path, campaign_dir):
    with pytest.raises(store.IncompleteStoreError, match="collect the campaign first"):
        export.campaign_table(tmp_path)
    with pytest.raises(config.ConfigError, match="choose one of parquet, npz"):
        export.export(campaign_dir, "csv")
