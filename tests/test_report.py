"""Report figures: labels by design parameters, ranges fitted to the data, unresolved ranges
shaded, a density slice without empty lattice rows."""

import itertools

import numpy as np
import pytest
import zarr

from pmpipe.campaigns import design
from pmpipe.results import campaign_figures, plotting, report


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plotting.pyplot().close("all")


def summaries_group(tmp_path, omega_m):
    """A campaign store's per-run arrays as the aggregate writes them: a design parameter, a
    derived one, seed and paired, named in pk's coordinates."""
    g = zarr.open_group(tmp_path / "summaries.zarr", mode="w")
    runs = len(omega_m)
    # variable-length text, as pmpipe.storage.store writes a run id (numpy's U has no zarr v3 spec)
    g.create_array("run", shape=(runs,), dtype=str)[:] = [f"run{i}" for i in range(runs)]
    columns = {
        "Omega_m": (np.asarray(omega_m, float), design.describe("Omega_m")),
        "S8": (np.linspace(0.7, 0.9, runs), "S8 of the run: derived"),
        "seed": (np.arange(runs), "seed of the run"),
        "paired": (np.zeros(runs), "paired phase"),
    }
    for name, (values, long_name) in columns.items():
        g.create_array(name, data=values).attrs["long_name"] = long_name
    pk = g.create_array("pk", data=np.ones((runs, 1, 4)))
    pk.attrs["coordinates"] = " ".join(columns)
    return g


def test_runs_are_labelled_by_their_design_parameters_only(tmp_path):
    g = summaries_group(tmp_path, [0.3, 0.28, 0.32, 0.3])
    params, labels = campaign_figures.cosmology_labels(g)
    assert params == ["Omega_m"]
    assert labels == ["Omega_m = 0.3", "Omega_m = 0.28", "Omega_m = 0.32", "Omega_m = 0.3"]


def test_few_cosmologies_get_a_colour_each_many_a_colour_scale():
    colours, mappable = campaign_figures.run_colours(["a", "b", "a"], np.array([1.0, 2.0, 1.0]))
    assert mappable is None and colours[0] == colours[2] != colours[1]
    labels = [f"x = {i}" for i in range(campaign_figures.MAX_LEGEND_COSMOLOGIES + 1)]
    values = np.arange(len(labels), dtype=float)
    colours, mappable = campaign_figures.run_colours(labels, values)
    assert mappable is not None and mappable.norm.vmax == values.max()
    assert colours[0] != colours[-1]


def test_the_campaign_power_figure_has_a_legend_per_cosmology_and_shades_what_no_run_resolves():
    plt = plotting.pyplot()
    k = np.geomspace(0.02, 2.0, 30)
    ratio = np.stack([1 + k * s for s in (1.0, 1.1, 1.0, 1.2)])
    ratio[:, k > 0.8] = 50.0  # beyond the resolved range: must not set the y range
    labels = ["Omega_m = 0.3", "Omega_m = 0.28", "Omega_m = 0.3", "Omega_m = 0.32"]
    _fig, ax = plt.subplots()
    assert campaign_figures.draw_power_ratios(ax, k, ratio, labels, None, 0.8) is None
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["Omega_m = 0.3", "Omega_m = 0.28", "Omega_m = 0.32", "not resolved"]
    low, high = ax.get_ylim()
    assert low < 1.03 and 1 + 0.8 * 1.2 <= high < 2.1
    spans = [p for p in ax.patches if p.get_label() == "not resolved"]
    assert len(spans) == 1 and spans[0].get_x() == pytest.approx(0.8)


def test_the_peaks_figure_fits_its_kappa_range_to_the_data_with_few_ticks():
    plt = plotting.pyplot()
    kappa = np.linspace(-0.05, 0.15, 41)
    bump = np.exp(-0.5 * ((kappa - 0.01) / 0.005) ** 2)
    peaks, pdf = np.stack([bump * 100, bump * 90]), np.stack([bump, bump])
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))  # as plot_peaks draws it
    campaign_figures.draw_peaks(left, right, kappa, peaks, pdf, ["fiducial", "fiducial"])
    low, high = left.get_xlim()
    assert -0.02 < low < 0.0 and 0.02 < high < 0.04  # not the bins' -0.05 to 0.15
    assert right.get_xlim() == (low, high)
    fig.canvas.draw()
    ticks = [t for t in left.get_xticklabels() if low <= t.get_position()[0] <= high]
    assert 2 <= len(ticks) <= 5
    boxes = [t.get_window_extent() for t in ticks]
    assert all(a.x1 < b.x0 for a, b in itertools.pairwise(boxes))  # no overlapping labels
    assert [t.get_text() for t in left.get_legend().get_texts()] == ["fiducial"]


def test_fitted_range_keeps_the_bins_with_data_and_one_beyond():
    x = np.arange(10.0)
    assert plotting.fitted_range(x, [[0, 0, 0, 1, 5, 2, 0, 0, 0, 0]]) == (2.0, 6.0)
    assert plotting.fitted_range(x, [np.zeros(10)]) == (0.0, 9.0)


def test_the_slab_of_a_lattice_with_empty_rows_has_no_empty_cells_and_keeps_its_mean():
    cells, oversample = 32, 2
    density = np.zeros((1, cells, cells, cells))
    density[0, ::oversample, ::oversample, :] = oversample**2  # particles on their lattice
    slab = report.slab_density(density, cells // oversample)
    assert slab.shape == (cells, cells)
    assert slab.min() > 0.5 and slab.mean() == pytest.approx(1.0)
    low, high = report.log_density_limits(slab)
    assert low < high <= np.log10(slab.max()) + 1e-12


def test_the_campaign_power_figure_of_runs_that_resolve_no_bin_fits_every_bin():
    plt = plotting.pyplot()
    k = np.geomspace(0.5, 2.0, 8)
    ratio = np.stack([np.linspace(0.9, 1.4, 8), np.full(8, np.nan)])
    _fig, ax = plt.subplots()
    campaign_figures.draw_power_ratios(ax, k, ratio, ["fiducial", "fiducial"], None, 0.1)
    low, high = ax.get_ylim()
    assert low < 0.9 and 1.4 < high < 1.5


def test_the_design_figure_draws_each_pair_of_parameters_and_every_run_by_its_state(tmp_path):
    from pmpipe.storage import store

    g = store.create(tmp_path / "c" / "summaries.zarr", {"stage": "collect", "campaign": "c"})
    runs = 30
    store.write_coordinate(g, "run", np.array([f"c-p{i:04d}-r0" for i in range(runs)]), "1", "id")
    rng = np.random.default_rng(2)
    for name in ("Omega_m", "sigma8", "h"):
        store.write_array(g, name, rng.random(runs), ("run",), "1", design.describe(name))
    state = np.array(["done"] * 25 + ["failed"] * 3 + ["pending"] * 2)
    store.write_array(g, "state", state, ("run",), "1", "state")
    store.write_array(
        g, "pk", np.ones((runs, 1, 4)), ("run", "a", "k"), "1", "P", coordinates="Omega_m sigma8 h"
    )
    store.mark_complete(g)
    opened = store.open_complete(tmp_path / "c" / "summaries.zarr")
    panels = campaign_figures.design_axes(opened)
    assert [(x, y) for x, _, y, _ in panels] == [
        ("Omega_m", "sigma8"),
        ("Omega_m", "h"),
        ("sigma8", "h"),
    ]
    out = tmp_path / "c" / "report" / "design.png"
    campaign_figures.plot_design(tmp_path / "c" / "summaries.zarr", out)
    assert out.stat().st_size > 5000


def test_a_large_campaign_shows_the_spread_of_its_runs_not_each_run():
    rng = np.random.default_rng(3)
    k = np.geomspace(0.05, 1.0, 12)
    ratio = 1.0 + 0.1 * rng.standard_normal((campaign_figures.MAX_LINES + 50, k.size))
    ratio[5] = np.nan  # a run not collected
    plt = plotting.pyplot()
    _, ax = plt.subplots()
    campaign_figures.draw_power_spread(ax, k, ratio, k_max=0.5)
    labels = set(ax.get_legend_handles_labels()[1])
    assert labels == {"not resolved", "95 % of runs", "68 % of runs", "median"}
    assert len(ax.lines) == 2  # the median and the line at 1, no line per run
    low, high = ax.get_ylim()
    resolved = ratio[:, k <= 0.5]
    assert low < np.nanpercentile(resolved, 2.5) and high > np.nanpercentile(resolved, 97.5)
    assert high < np.nanmax(resolved)  # fitted to the band, not to the most extreme run


def lensing_campaign(tmp_path, omega_m, base_omega_m):
    """A collected lensing campaign's store: two sources, C_ℓ 5 % above Limber with scatter."""
    from pmpipe.storage import store

    runs, ell = len(omega_m), np.geomspace(20, 2000, 10)
    g = store.create(
        tmp_path / "c" / "summaries.zarr",
        {
            "stage": "collect",
            "campaign": "c",
            "campaign_config": {"base": {"cosmology": {"Omega_m": base_omega_m}}},
        },
    )
    store.write_coordinate(g, "run", np.array([f"c-p{i:04d}-r0" for i in range(runs)]), "1", "id")
    store.write_coordinate(g, "source", np.array(["z0.5", "z1"]), "1", "source")
    store.write_array(g, "Omega_m", np.asarray(omega_m), ("run",), "1", design.describe("Omega_m"))
    lin = np.broadcast_to(1e-9 / ell, (runs, 2, 2, ell.size))
    rng = np.random.default_rng(4)
    cl = lin * (1.05 + 0.02 * rng.standard_normal((runs, 1, 1, ell.size)))
    dims = ("run", "source", "source2", "ell")
    for name, values in (("cl", cl), ("cl_linear", lin)):
        store.write_array(g, name, np.array(values), dims, "sr", name, coordinates="Omega_m")
    store.write_array(g, "ell_mean", np.tile(ell, (runs, 1)), ("run", "ell"), "1", "ℓ")
    pk = np.ones((runs, 1, 4))
    store.write_array(g, "pk", pk, ("run", "a", "k"), "1", "P", coordinates="Omega_m")
    for name, value in (("ell_min_valid", 30.0), ("ell_max_valid", 1000.0)):
        store.write_array(g, name, np.full((runs, 2), value), ("run", "source"), "1", name)
    store.mark_complete(g)
    return store.open_complete(tmp_path / "c" / "summaries.zarr")


def test_the_fiducial_runs_are_those_at_the_base_cosmology_else_the_nearest(tmp_path):
    g = lensing_campaign(tmp_path, [0.3, 0.28, 0.32, 0.3], base_omega_m=0.3)
    every = np.ones(4, bool)
    nearest, exact = campaign_figures.fiducial_runs(g, every)
    assert nearest.tolist() == [0, 3] and exact
    nearest, exact = campaign_figures.fiducial_runs(g, np.array([False, True, True, True]))
    assert nearest.tolist() == [3] and exact  # a run not collected is left out
    g = lensing_campaign(tmp_path, [0.3, 0.28, 0.33, 0.3], base_omega_m=0.32)
    nearest, exact = campaign_figures.fiducial_runs(g, every)
    assert nearest.tolist() == [2] and not exact


@pytest.mark.parametrize("runs", [4, campaign_figures.MAX_LINES + 10])
def test_the_campaign_cl_figure_draws_a_panel_per_source_with_the_fiducial(tmp_path, runs):
    g = lensing_campaign(tmp_path, np.linspace(0.28, 0.32, runs), base_omega_m=0.3)
    fig = campaign_figures.cl_spread_figure(g)
    panels = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in panels] == ["source z0.5", "source z1"]
    legend = set(panels[0].get_legend_handles_labels()[1])
    assert "runs nearest the fiducial" in legend and "not resolved" in legend
    assert ("median" in legend) == (runs > campaign_figures.MAX_LINES)
    out = tmp_path / "c" / "report" / "cl_ratio.png"
    campaign_figures.plot_cl_spread(tmp_path / "c" / "summaries.zarr", out)
    assert out.stat().st_size > 10_000
