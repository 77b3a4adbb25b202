"""Several draws of the lensing nuisances per N-body run (lensing.draws): seeded by the run,
checked before any job, one pass over the planes for every draw, the first draw's maps and
statistics those of the run without draws, one manifest row per run and draw."""

import csv

import numpy as np
import pytest
import zarr
from conftest import run_every_stage

from pmpipe.bench import draw_cost as bench_draws
from pmpipe.campaigns import campaign, resources
from pmpipe.physics.theory import baryons
from pmpipe.results import manifest
from pmpipe.run import config, derive, draws, validation
from pmpipe.stages.inputs import Inputs
from pmpipe.storage import power_cache

BINS = [
    {"kind": "table", "name": f"bin{i}", "z": [0.0, 0.5, 1.0, 1.5], "n": [0, 1, 1, 0]}
    for i in range(2)
]
SAMPLED = {
    "kind": "latin_hypercube",
    "count": 8,
    "parameters": {"A_IA": [-1.0, 2.0], "photo_z_shift.bin1": [-0.05, 0.05], "shear_bias": [-0.02, 0.02]},
}  # fmt: skip


def _run(seed=1, **lensing) -> config.Run:
    return config.Run.model_validate(
        {
            "box": {"particles": 16, "box_size": 64.0},
            "ic": {"seed": seed},
            "lightcone": {"z_max": 2.0, "plane_thickness": 32.0},
            "lensing": {
                "source_redshifts": [1.0],
                "distributions": BINS,
                "intrinsic_alignment": {"A_IA": 0.5, "eta_IA": 1.0},
                "flat_sky": None,
                "full_sky": {"nside": 8},
                **lensing,
            },
        }
    )


def test_a_latin_hypercube_of_draws_is_seeded_by_the_run_and_fills_its_ranges():
    run = _run(draws=SAMPLED)
    found = draws.points(run.lensing.draws, run.ic.seed)
    assert found == draws.points(_run(draws=SAMPLED).lensing.draws, 1)
    assert found != draws.points(run.lensing.draws, 2)  # another N-body, other draws
    assert len(found) == 8
    for name, (low, high) in SAMPLED["parameters"].items():
        values = np.array([p[name] for p in found])
        strata = np.floor((values - low) / (high - low) * 8).astype(int)
        assert sorted(strata) == list(range(8)), name  # one draw in each eighth of the range


def test_a_draw_sees_the_run_with_its_values_and_the_section_elsewhere():
    run = _run(photo_z_shift=[0.0, 0.01, 0.02], draws=SAMPLED)
    drawn = draws.draw_run(run, {"A_IA": -0.7, "photo_z_shift.bin1": 0.03, "shear_bias": 0.01})
    lens = drawn.lensing
    assert lens.draws is None and lens.photo_z_shift == [0.0, 0.01, 0.03]
    assert lens.shear_bias == 0.01
    assert (lens.intrinsic_alignment.A_IA, lens.intrinsic_alignment.eta_IA) == (-0.7, 1.0)
    assert drawn.box == run.box and drawn.cosmology == run.cosmology


@pytest.mark.parametrize(
    "draw_section, message",
    [
        (
            {"kind": "list", "points": [{"photo_z_shift.bin7": 0.01}]},
            (
                r"lensing.draws parameter 'photo_z_shift.bin7' is not one the run can vary: use "
                r"A_IA, eta_IA, photo_z_shift, shear_bias, log_T_AGN, photo_z_shift.z=1, "
            ),
        ),
        (
            {"kind": "list", "points": [{"shear_bias": 0.01, "shear_bias.bin0": 0.02}]},
            "varies shear_bias for every source and shear_bias.bin0 for one",
        ),
        (
            {"kind": "latin_hypercube", "count": 4, "parameters": {"A_IA": [1.0, 0.0]}},
            r"range inverted or empty",
        ),
    ],
)
def test_draws_the_run_cannot_make_are_refused_naming_the_parameter(draw_section, message):
    with pytest.raises(ValueError, match=message):
        _run(draws=draw_section)


def test_alignment_draws_need_an_alignment_section():
    with pytest.raises(ValueError, match="A_IA needs lensing.intrinsic_alignment"):
        _run(intrinsic_alignment=None, draws={"kind": "list", "points": [{"A_IA": 1.0}]})


@pytest.mark.parametrize(
    "draw_section, message",
    [
        (  # a range beyond the field's limits: its corner is refused, whatever the draws
            {**SAMPLED, "parameters": {"A_IA": [-1.0, 12.0]}},
            (
                r"lensing.draws, draw with every high end \{'A_IA': 12.0\}(.|\n)*"
                r"lensing.intrinsic_alignment.A_IA: Input should be less than or equal to 10"
            ),
        ),
        (
            {"kind": "list", "points": [{"shear_bias": 0.0}, {"photo_z_shift": 0.6}]},
            (
                r"lensing.draws, draw 1 \{'photo_z_shift': 0.6\}(.|\n)*"
                r"lensing.photo_z_shift values must lie from -0.5 to 0.5"
            ),
        ),
    ],
)
def test_a_draw_outside_the_fields_limits_is_refused_before_any_job(draw_section, message):
    with pytest.raises(ValueError, match=message):
        validation.check_run(_run(draws=draw_section))


def test_the_manifest_has_a_row_per_run_and_draw_with_the_drawn_values(tmp_path):
    base = _run(draws=SAMPLED).model_dump(mode="json", exclude={"ic": {"seed"}})
    camp = campaign.Campaign.model_validate(
        {"name": "c", "base": base, "realisations": 2, "seed": 5}
    )
    rows = manifest.manifest_rows(camp, tmp_path, str)
    assert len(rows) == 2 * 8
    assert list(rows[0])[:5] == ["run_id", "draw", "A_IA", "photo_z_shift.bin1", "shear_bias"]
    for spec in camp.runs:
        mine = [r for r in rows if r["run_id"] == spec.run_id]
        assert [r["draw"] for r in mine] == list(range(8))
        expected = draws.points(spec.run.lensing.draws, spec.seed)
        assert [{n: r[n] for n in SAMPLED["parameters"]} for r in mine] == expected
        assert all(r["seed"] == spec.seed for r in mine)
    path = tmp_path / "c" / "manifest.csv"
    path.parent.mkdir()
    manifest.write_manifest(camp, path, str)
    assert len(list(csv.DictReader(path.open()))) == 16


TINY = {
    "box": {"particles": 16, "box_size": 64.0},
    "nbody": {"steps": 3},
    "lightcone": {"z_max": 0.05, "plane_thickness": 32.0},
    "lensing": {
        "source_redshifts": [0.04],
        "distributions": [
            {"kind": "table", "name": "wide", "z": [0.01, 0.03, 0.05], "n": [1, 2, 1]}
        ],
        "flat_sky": {"field_of_view": 20.0, "pixels": 32},
        "full_sky": {"nside": 8},
        "method": "both",
    },
    "summaries": {"shape_noise": {}},
}


@pytest.fixture(scope="module")
def with_and_without_draws(tmp_path_factory, request):
    """The stores of one run without draws and with three (the lensing section's nuisances,
    m = 0.1, Δz = -0.005 of the distribution), with the planes each run's lensing stage read."""
    out = {}
    monkeypatch = pytest.MonkeyPatch()
    request.addfinalizer(monkeypatch.undo)
    read: list = []
    field, array = Inputs.field, Inputs.array
    monkeypatch.setattr(
        Inputs, "field", lambda self, *a, **k: read.append(a[:2]) or field(self, *a, **k)
    )
    monkeypatch.setattr(
        Inputs, "array", lambda self, *a, **k: read.append(a[:2]) or array(self, *a, **k)
    )
    points = [{"shear_bias": 0.0}, {"shear_bias": 0.1}, {"photo_z_shift.wide": -0.005}]
    for name, extra in (("plain", {}), ("drawn", {"draws": {"kind": "list", "points": points}})):
        run = config.Run.model_validate({**TINY, "lensing": {**TINY["lensing"], **extra}})
        read.clear()
        run_dir = run_every_stage(tmp_path_factory.mktemp(name), run)
        out[name] = {
            stage: zarr.open_group(run_dir / f"{stage}.zarr", mode="r")
            for stage in ("nbody", "lensing", "summaries")
        }
        out[name]["planes read"] = [r for r in read if r[0] == "nbody" and "lightcone" in r[1]]
    return out


@pytest.mark.slow
def test_every_draw_comes_from_one_pass_over_the_planes(with_and_without_draws):
    """Three draws read each plane (flat sky) and the shells (full sky) as often as one draw
    does (for method both, each plane once for Born and once for ray tracing): an extra draw costs its maps and statistics, no N-body and no plane read."""
    plain, drawn = with_and_without_draws["plain"], with_and_without_draws["drawn"]
    planes = plain["nbody"]["plane"].shape[0]
    assert sorted(plain["planes read"]) == sorted(drawn["planes read"])
    flat = ("nbody", "lightcone_density")
    assert drawn["planes read"].count(flat) == 2 * planes  # method both: Born's pass, ray tracing's
    assert drawn["planes read"].count(("nbody", "lightcone_healpix_alm")) == 1


@pytest.mark.slow
def test_the_first_draw_is_the_run_without_draws_bit_for_bit(with_and_without_draws):
    plain, drawn = with_and_without_draws["plain"], with_and_without_draws["drawn"]
    for stage in ("lensing", "summaries"):
        extra = set(drawn[stage].array_keys()) - set(plain[stage].array_keys())
        assert extra == {"draw", "draw_parameter", "draw_values"}
        for name in plain[stage].array_keys():
            one, many = plain[stage][name], drawn[stage][name]
            if "draw" in many.metadata.dimension_names:
                assert many.metadata.dimension_names[1:] == one.metadata.dimension_names, name
                assert np.array_equal(many[0], one[:], equal_nan=True), (stage, name)
            else:
                assert np.array_equal(many[:], one[:], equal_nan=True), (stage, name)
    values = drawn["summaries"]["draw_values"][:]
    assert list(drawn["summaries"]["draw_parameter"][:]) == ["shear_bias", "photo_z_shift.wide"]
    np.testing.assert_array_equal(values, [[0.0, 0.0], [0.1, 0.0], [0.0, -0.005]])


@pytest.mark.slow
def test_each_draw_carries_its_nuisances_and_its_own_noise(with_and_without_draws):
    """m = 0.1 scales every map by 1.1 (float32 noise aside) and the noise-free C_ℓ by 1.21;
    Δz = -0.005 moves the distribution's Limber C_ℓ and maps, not the single source's; each
    draw draws its own shape noise, of the same level."""
    lensing, stats = (with_and_without_draws["drawn"][s] for s in ("lensing", "summaries"))
    for name in ("kappa", "kappa_healpix", "gamma1", "kappa_born_healpix"):
        maps = lensing[name][:]
        scale = np.abs(maps[0]).max()
        assert np.abs(maps[1] - 1.1 * maps[0]).max() < 1e-5 * scale, name
        assert np.array_equal(maps[2, 0], maps[0, 0])  # the single source has no shift
        assert np.abs(maps[2, 1] - maps[0, 1]).max() > 1e-3 * scale, name
    for name in ("cl", "cl_healpix", "cl_linear", "xi_plus_healpix"):
        values = stats[name][:]
        np.testing.assert_allclose(values[1], 1.21 * values[0], rtol=1e-4, atol=0, err_msg=name)
    theory = stats["cl_linear"][:]
    assert np.all(theory[2, 1, 1] < theory[0, 1, 1])  # the distribution moved nearer
    np.testing.assert_array_equal(theory[2, 0, 0], theory[0, 0, 0])
    for name in ("cl", "cl_healpix"):  # the single source's maps are the same in draws 0 and 2
        noise = stats[name.replace("cl", "cl_noisy")][:, 0, 0] - stats[name][:, 0, 0]
        noise = noise[:, np.all(np.isfinite(noise), axis=0)]  # bins with modes
        assert noise.shape[1] >= 3
        assert not np.allclose(noise[2], noise[0], rtol=1e-3, atol=0)
        np.testing.assert_allclose(noise[2].mean(), noise[0].mean(), rtol=0.5)


@pytest.mark.slow
def test_drawn_feedback_makes_each_draw_the_run_with_its_log_T_AGN(tmp_path, monkeypatch):
    """Draws of log_T_AGN (8.0, and the section's 7.8 with m = 0.1): a pass over the planes per
    value, each draw's maps, S(k, z) and pk_baryons those of a run without draws with its
    values; S(k, z) of every value made in one CAMB call by the first stage that reads them,
    which the next stage and the runs of each value alone read from the results folder's
    power cache."""
    read: list = []
    field = Inputs.field
    monkeypatch.setattr(
        Inputs, "field", lambda self, *a, **k: read.append(a[:2]) or field(self, *a, **k)
    )
    monkeypatch.setattr(power_cache, "folder_of", lambda _: tmp_path / power_cache.FOLDER)
    made: list = []  # the temperatures of every CAMB call
    hmcode = baryons.suppressions
    monkeypatch.setattr(baryons, "suppressions", lambda *a: made.append(tuple(a[2])) or hmcode(*a))
    points = [{"log_T_AGN": 8.0}, {"shear_bias": 0.1}]
    stores = {}
    for name, feedback, extra in (
        ("drawn", 7.8, {"draws": {"kind": "list", "points": points}}),
        ("hot", 8.0, {}),
        ("biased", 7.8, {"shear_bias": 0.1}),
    ):
        lens = {**TINY["lensing"], "method": "born", **extra}
        run = config.Run.model_validate(
            {**TINY, "lensing": lens, "baryons": {"log_T_AGN": feedback}}
        )
        read.clear()
        made.clear()
        run_dir = run_every_stage(tmp_path / name, run)
        stores[name] = {
            s: zarr.open_group(run_dir / f"{s}.zarr", mode="r") for s in ("lensing", "summaries")
        }
        stores[name]["reads"] = sum(r == ("nbody", "lightcone_density") for r in read)
        stores[name]["suppressions"] = list(made)
    drawn = stores["drawn"]
    assert drawn["reads"] == 2 * stores["hot"]["reads"] > 0  # a pass per log_T_AGN
    # by the lensing stage of the drawn run, every value in one call; none by ic or nbody
    assert [stores[n]["suppressions"] for n in ("drawn", "hot", "biased")] == [[(7.8, 8.0)], [], []]
    for d, alone in enumerate((stores["hot"], stores["biased"])):
        for stage, name in (
            ("lensing", "kappa"), ("lensing", "gamma1"), ("lensing", "kappa_healpix"),
            ("lensing", "baryon_suppression"), ("summaries", "pk_baryons"), ("summaries", "cl"),
        ):  # fmt: skip
            np.testing.assert_array_equal(drawn[stage][name][d], alone[stage][name][:], (d, name))
    assert drawn["lensing"]["baryon_suppression"].metadata.dimension_names[0] == "draw"
    assert list(drawn["summaries"]["draw_parameter"][:]) == ["log_T_AGN", "shear_bias"]


def test_each_log_T_AGN_drawn_takes_a_pass_over_the_planes():
    def passes(section):
        data = _run(draws=section).model_dump()
        data["baryons"] = {"log_T_AGN": 7.8}
        return draws.plane_passes(config.Run.model_validate(data))

    assert passes(SAMPLED) == 1  # the lensing nuisances share one pass
    assert passes({**SAMPLED, "parameters": {"log_T_AGN": [7.6, 8.0], "A_IA": [0, 1]}}) == 8
    listed = [
        {"log_T_AGN": 7.9},
        {"A_IA": 0.2},
        {"log_T_AGN": 7.9, "A_IA": 1.0},
        {"log_T_AGN": 7.8},
    ]
    assert passes({"kind": "list", "points": listed}) == 2  # 7.9, and the section's 7.8


def test_feedback_draws_need_a_baryons_section_and_its_range():
    drawn = {"kind": "list", "points": [{"log_T_AGN": 7.9}]}
    with pytest.raises(ValueError, match="log_T_AGN needs a baryons section"):
        validation.check_run(_run(draws=drawn))
    with_baryons = _run(draws={**SAMPLED, "parameters": {"log_T_AGN": [7.5, 7.9]}}).model_dump()
    with_baryons["baryons"] = {"log_T_AGN": 7.8}
    with pytest.raises(ValueError, match=r"baryons.log_T_AGN: Input should be greater than or"):
        validation.check_run(config.Run.model_validate(with_baryons))


@pytest.mark.slow
def test_the_draws_benchmark_times_each_stage_with_and_without_draws():
    record = bench_draws.bench_draws(particles=16, pixels=32, nside=8, draws=2)
    for attempt in ("first", "again"):
        for count in (1, 2):
            seconds = record[f"{attempt}_{count}_draws"]
            assert list(seconds) == ["ic", "nbody", "lensing", "summaries"]
            assert all(s > 0 for s in seconds.values())
        assert np.isfinite(record[f"{attempt}_extra_draw_over_first"])
    with pytest.raises(ValueError, match="--draws must be at least 2"):
        bench_draws.bench_draws(32, 32, 8, 1)


def _campaign(design: dict, baryons=True) -> campaign.Campaign:
    base = _run().model_dump(mode="json", exclude={"ic": {"seed"}})
    base["baryons"] = {"log_T_AGN": 7.8} if baryons else None
    return campaign.Campaign.model_validate({"name": "c", "base": base, "design": design})


def test_a_campaign_design_varies_nuisances_beside_the_cosmology(tmp_path):
    """Design parameters A_IA, log_T_AGN and photo_z_shift.<source> set those fields of each
    run; derivatives step from the base's values; the manifest holds each run's values."""
    grid = {"A_IA": [0.0, 1.0], "log_T_AGN": [7.7], "photo_z_shift.bin1": [0.02], "sigma8": [0.8]}
    specs = campaign.expand(_campaign({"kind": "grid", "parameters": grid}))
    assert [s.run.lensing.intrinsic_alignment.A_IA for s in specs] == [0.0, 1.0]
    for spec in specs:
        assert spec.run.baryons.log_T_AGN == 7.7 and spec.run.cosmology.sigma8 == 0.8
        assert spec.run.lensing.photo_z_shift == [0.0, 0.0, 0.02]
        assert spec.run.lensing.intrinsic_alignment.eta_IA == 1.0  # the base's
    assert len({config.config_hash(s.run) for s in specs}) == 2
    steps = {"kind": "derivatives", "parameters": {"A_IA": 0.25, "shear_bias": 0.01}}
    by_point = {s.point: s.run.lensing for s in campaign.expand(_campaign(steps))}
    assert by_point["A_IA-minus"].intrinsic_alignment.A_IA == 0.25  # the base's 0.5 - 0.25
    assert by_point["shear_bias-plus"].shear_bias == 0.01
    assert by_point["fiducial"] == _run().lensing
    rows = manifest.manifest_rows(_campaign({"kind": "grid", "parameters": grid}), tmp_path, str)
    assert [(r["A_IA"], r["log_T_AGN"], r["photo_z_shift.bin1"]) for r in rows] == [
        (0.0, 7.7, 0.02),
        (1.0, 7.7, 0.02),
    ]


@pytest.mark.parametrize(
    "parameters, baryons, message",
    [
        ({"photo_z_shift.bin7": [0.01]}, True, "'photo_z_shift.bin7' is not one the run can vary"),
        ({"log_T_AGN": [7.8]}, False, "log_T_AGN needs a baryons section"),
        ({"log_T_AGN": [8.3]}, True, r"baryons.log_T_AGN: Input should be less than or equal to 8"),
        ({"A_IA": [11.0]}, True, r"lensing.intrinsic_alignment.A_IA: Input should be less than"),
        ({"gamma_IA": [1.0]}, True, "unknown design parameter 'gamma_IA'"),
    ],
)
def test_a_nuisance_design_the_base_cannot_take_is_refused_naming_it(parameters, baryons, message):
    with pytest.raises(ValueError, match=message):
        _campaign({"kind": "grid", "parameters": parameters}, baryons)


def test_a_design_may_not_vary_what_the_draws_draw_nor_a_source_the_base_lacks():
    base = _run(draws={"kind": "list", "points": [{"photo_z_shift.bin0": 0.01}]})
    camp = {"name": "c", "base": base.model_dump(mode="json", exclude={"ic": {"seed"}})}
    design = {"kind": "grid", "parameters": {"photo_z_shift.bin1": [0.02]}}
    with pytest.raises(ValueError, match="base.lensing.draws draws photo_z_shift too"):
        campaign.Campaign.model_validate({**camp, "design": design})
    design = {"kind": "derivatives", "parameters": {"shear_bias.bin7": 0.01}}
    with pytest.raises(ValueError, match="'shear_bias.bin7' is not one the run can vary"):
        campaign.Campaign.model_validate({**camp, "design": design})


def test_the_plan_counts_every_draw_s_maps_on_disk():
    one, eight = (resources.disk_bytes(_run(draws=d))["lensing"] for d in (None, SAMPLED))
    assert one > 0 and eight == 8 * one


@pytest.mark.slow
def test_a_job_makes_a_runs_sources_draws_suppressions_and_planes_once(tmp_path, monkeypatch):
    """In a packed job the run's setup makes the sources (once, and once per draw), the
    baryons' S(k, z) (in one call, for the section's log_T_AGN and the one drawn) and the
    planes, and every stage uses them; the job's planes are those the plan counts (validation.planes)."""
    from collections import Counter

    from pmpipe.job import pipeline
    from pmpipe.physics.theory import baryons

    calls: Counter = Counter()
    monkeypatch.setattr(power_cache, "folder_of", lambda _: tmp_path / power_cache.FOLDER)
    for module, name in ((derive, "sources"), (baryons, "suppressions"), (validation, "planes")):
        real = getattr(module, name)
        monkeypatch.setattr(
            module, name, lambda *a, _r=real, _n=name, **k: calls.update([_n]) or _r(*a, **k)
        )
    points = [{"log_T_AGN": 8.0}, {"shear_bias": 0.1}]
    lens = {**TINY["lensing"], "method": "born", "draws": {"kind": "list", "points": points}}
    run = config.Run.model_validate({**TINY, "lensing": lens, "baryons": {"log_T_AGN": 7.8}})
    path = tmp_path / "run" / "config.json"
    path.parent.mkdir()
    path.write_text(config.RunFile.build("test", "run", 0, {}, run).to_json())
    (outcome,) = pipeline.run_all([path])
    assert outcome.error is None and outcome.stages == ("ic", "nbody", "lensing", "summaries")
    # planes: the run file's check when the job loads it, and the run's setup
    assert calls == {"sources": 1 + len(points), "suppressions": 1, "planes": 2}, calls
    nbody = zarr.open_group(path.parent / "nbody.zarr", mode="r")
    planned = validation.planes(run)
    np.testing.assert_array_equal(nbody["plane_chi_lo"][:], planned.chi_edges[:-1])
    np.testing.assert_array_equal(nbody["plane_chi_hi"][:], planned.chi_edges[1:])
    np.testing.assert_array_equal(nbody["plane"][:], planned.chi)
