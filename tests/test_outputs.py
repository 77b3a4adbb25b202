"""What a run's stores keep (config.Outputs): arrays present or absent, downsampled density,
the same summaries whatever is kept, ICs made again from the seed, clear errors for a stage
that needs what was not kept, a job that makes such a stage again with its readers, and
`pmpipe plan`'s disk estimate."""

import json
import logging
import re
import shutil

import numpy as np
import pytest
import yaml
import zarr
from conftest import REPO

from pmpipe import cli, stages
from pmpipe.campaigns import resources
from pmpipe.job import pipeline
from pmpipe.run import config, validation
from pmpipe.stages import inputs, registry, status
from pmpipe.storage import store

RUN = {
    "box": {"particles": 16, "box_size": 64.0},
    "nbody": {"steps": 3, "snapshots": [0.5]},
    "parallel": {"pdims": [2, 2], "halo_cells": 4},
    "lightcone": {"z_max": 0.05, "plane_thickness": 32.0},
    "lensing": {
        "source_redshifts": [0.05],
        "flat_sky": {"field_of_view": 20.0, "pixels": 32},
        "full_sky": {"nside": 8},
    },
    "summaries": {"kappa_range": [-0.01, 0.01]},
}
LEAN = {"particles": False, "density": 2, "ic": "linear", "lightcone": False}
BIG_ARRAYS = (
    "linear_density",
    "displacement",
    "momentum",
    "density",
    "lightcone_density",
    "lightcone_healpix",
    "lightcone_healpix_alm",
    "kappa",
    "gamma1",
    "gamma2",
    "kappa_healpix",
    "kappa_healpix_alm",
    "gamma1_healpix",
    "gamma2_healpix",
)


def _write_run(run_dir, outputs=None):
    data = json.loads(json.dumps(RUN))
    if outputs is not None:
        data["outputs"] = outputs
    run = config.Run.model_validate(data)
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "config.json"
    path.write_text(config.RunFile.build("test", "run", 0, {}, run).to_json())
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The same run with every array kept and with LEAN outputs, each through `pmpipe run all`."""
    root = tmp_path_factory.mktemp("outputs")
    paths = {"full": _write_run(root / "full"), "lean": _write_run(root / "lean", LEAN)}
    outcomes = pipeline.run_all(list(paths.values()))
    assert all(o.error is None for o in outcomes), [o.error for o in outcomes]
    return {name: path.parent for name, path in paths.items()}


def _arrays(run_dir, stage):
    return set(zarr.open_group(run_dir / f"{stage}.zarr", mode="r").array_keys())


@pytest.mark.slow
def test_lean_outputs_leave_out_what_they_say(runs):
    full, lean = runs["full"], runs["lean"]
    assert {"displacement", "momentum", "linear_density"} <= _arrays(full, "ic")
    assert "linear_density" in _arrays(lean, "ic")
    assert not {"displacement", "momentum"} & _arrays(lean, "ic")
    assert not (
        {
            "displacement",
            "momentum",
            "lightcone_density",
            "lightcone_healpix",
            "lightcone_healpix_alm",
        }
        & _arrays(lean, "nbody")
    )
    assert {"plane", "plane_a", "plane_chi_lo"} <= _arrays(lean, "nbody")  # geometry always
    assert not {"kappa", "kappa_healpix", "kappa_healpix_alm", "gamma1"} & _arrays(lean, "lensing")
    assert "plane_weight" in _arrays(lean, "lensing")
    for stage in stages.STAGES:
        assert store.is_complete(lean / f"{stage}.zarr")


@pytest.mark.slow
def test_downsampled_density_is_the_mean_of_the_full_one(runs):
    full = zarr.open_group(runs["full"] / "nbody.zarr", mode="r")["density"][:]
    lean = zarr.open_group(runs["lean"] / "nbody.zarr", mode="r")
    assert lean["density"].shape == (2, 8, 8, 8) and lean["density"].attrs["downsampled"] == 2
    expected = full.reshape(2, 8, 2, 8, 2, 8, 2).mean(axis=(2, 4, 6))
    np.testing.assert_allclose(lean["density"][:], expected, rtol=1e-5)
    np.testing.assert_allclose(lean["x"][:], full_x(runs).reshape(8, 2).mean(axis=1))


def full_x(runs):
    return zarr.open_group(runs["full"] / "nbody.zarr", mode="r")["x"][:]


@pytest.mark.slow
def test_summaries_do_not_depend_on_what_the_stores_keep(runs):
    full = zarr.open_group(runs["full"] / "summaries.zarr", mode="r")
    lean = zarr.open_group(runs["lean"] / "summaries.zarr", mode="r")
    assert sorted(full.array_keys()) == sorted(lean.array_keys())
    for name in full.array_keys():
        x, y = lean[name][:], full[name][:]
        if x.dtype.kind in "fc":
            np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-12, err_msg=name)
        else:
            assert np.array_equal(x, y), name


@pytest.mark.slow
def test_a_stage_that_needs_what_was_not_kept_says_which_setting(runs, tmp_path):
    with pytest.raises(
        store.IncompleteStoreError, match=r"density at full resolution \(outputs.density"
    ):
        registry.run_stage("summaries", runs["lean"] / "config.json")
    assert registry.run_checked("lensing", runs["lean"] / "config.json") == 2  # planes not kept


def test_a_store_that_leaves_out_what_a_later_stage_reads_is_named_with_the_setting():
    lean = config.Run.model_validate({**RUN, "outputs": LEAN})
    lensing, summaries = inputs.left_out("nbody", ["lensing", "summaries"], lean)
    assert lensing == (
        "lensing reads lightcone_density, lightcone_healpix_alm, which outputs.lightcone does "
        "not keep whole"
    )
    assert summaries == (
        "summaries reads density, displacement, which outputs.density and outputs.particles "
        "do not keep whole"
    )
    assert inputs.left_out("lensing", ["summaries"], lean)[0].startswith("summaries reads kappa")
    assert inputs.left_out("ic", ["nbody", "summaries"], lean) == []  # made again from the seed
    assert inputs.left_out("nbody", ["lensing", "summaries"], config.Run.model_validate(RUN)) == []


def test_the_density_is_kept_as_a_preview_of_at_most_128_cells_a_side_by_default():
    """A force mesh of at most 128^3 cells whole; one of 256^3 as means over 2^3 cells, which
    the summaries, run on their own, cannot measure P(k) from; one of 192^3 over 2 x 2
    devices (blocks of 96 cells) over 2^3 cells; one of 512^3 over 4^3."""
    assert config.Run.model_validate(RUN).density_factor() == 1
    box = {"box_size": 256.0, "particles": 64, "oversample": 4}
    run = config.Run.model_validate({**RUN, "box": box})
    assert run.outputs.density == "preview" and run.density_factor() == 2
    full = config.Run.model_validate({**RUN, "box": box, "outputs": {"density": "full"}})
    saved = resources.disk_bytes(full)["nbody"] - resources.disk_bytes(run)["nbody"]
    assert saved == 2 * 4 * (256**3 - 128**3)  # two float32 snapshots: 128^3 means of 256^3
    (found,) = inputs.left_out("nbody", ["summaries"], run)
    assert found.startswith("summaries reads density, which outputs.density")
    # hashed as what it keeps: as 'full' where it is the force mesh, as its factor otherwise
    same = config.Run.model_validate({**RUN, "outputs": {"density": "full"}})
    assert config.config_hash(same) == config.config_hash(config.Run.model_validate(RUN))
    two = config.Run.model_validate({**RUN, "box": box, "outputs": {"density": 2}})
    assert config.config_hash(run) == config.config_hash(two) != config.config_hash(full)
    for particles, oversample, factor in ((96, 2, 2), (256, 2, 4)):
        box = {"box_size": 256.0, "particles": particles, "oversample": oversample}
        assert config.Run.model_validate({**RUN, "box": box}).density_factor() == factor


def test_plan_shows_the_gpu_campaign_writing_at_most_0_15_gb_a_run(capsys):
    """config/examples/gpu_256.yaml (512^3 force mesh, 2 snapshots): its density preview is
    the largest array, 2 x 128^3 float32."""
    assert cli.main(["plan", str(REPO / "config/examples/gpu_256.yaml")]) == 0
    out = capsys.readouterr().out
    per_stage = re.search(r"per run in GB: (.*)", out).group(1).split(", ")
    assert sum(float(s.split()[1]) for s in per_stage) <= 0.15, per_stage
    assert "largest arrays of a run in GB: nbody.zarr density 0.017," in out


@pytest.mark.slow
def test_a_run_whose_summaries_are_lost_makes_again_the_stores_they_read(runs, tmp_path):
    """The lean run (planes and particles not kept, density downsampled) with its summaries
    deleted: the job makes its N-body and lensing again with them, and the summaries are those
    it had; the full run makes its summaries alone."""
    for name, pending in (("full", ("summaries",)), ("lean", ("nbody", "lensing", "summaries"))):
        copy = shutil.copytree(runs[name], tmp_path / name)
        shutil.rmtree(copy / "summaries.zarr")
        run_file = validation.load_run_file(copy / "config.json")
        assert status.pending_stages(run_file.config, run_file.config_hash, copy) == pending
    (outcome,) = pipeline.run_all([tmp_path / "lean" / "config.json"])
    assert outcome.error is None and outcome.stages == pending, outcome
    before = zarr.open_group(runs["lean"] / "summaries.zarr", mode="r")
    after = zarr.open_group(tmp_path / "lean" / "summaries.zarr", mode="r")
    for name in before.array_keys():  # bit for bit (NaN where a bin has no modes)
        np.testing.assert_array_equal(before[name][:], after[name][:], err_msg=name)


@pytest.mark.slow
def test_the_workflow_makes_the_n_body_again_with_the_lost_summaries_of_a_lean_run(tmp_path):
    """The tiny campaign keeping its density at half resolution and no particles: its plan,
    after a run's summaries are deleted, makes that run's N-body, lensing and summaries, and
    its log says why the complete N-body is made again."""
    from conftest import TINY

    from pmpipe.campaigns import campaign
    from pmpipe.cluster import workflow

    data = yaml.safe_load(TINY)
    data["realisations"], data["base"]["outputs"] = 1, {"density": 2, "particles": False}
    path = tmp_path / "lean.yaml"
    path.write_text(yaml.safe_dump(data))
    results = tmp_path / "results"
    (config_path,) = campaign.write_run_files(campaign.load(path), results)
    assert pipeline.run_all([config_path])[0].error is None
    shutil.rmtree(config_path.parent / "summaries.zarr")
    warnings = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: warnings.append(record.getMessage())
    logging.getLogger("pmpipe").addHandler(handler)
    try:
        (job,) = workflow.prepare({"campaign": str(path)}, results=results).jobs
    finally:
        logging.getLogger("pmpipe").removeHandler(handler)
    run = config_path.parent.name
    assert job.stores == ((run, "nbody"), (run, "lensing"), (run, "summaries"))
    assert any(
        line.endswith(
            "nbody.zarr summaries reads density, displacement, which outputs.density and "
            "outputs.particles do not keep whole, so it is made again"
        )
        for line in warnings
    ), warnings


@pytest.mark.slow
def test_ics_not_kept_are_made_again_from_the_seed(runs, tmp_path):
    """nbody run alone on a store with the linear density only equals the packed run."""
    path = _write_run(tmp_path / "lean", LEAN)
    registry.run_stage("ic", path)
    assert "displacement" not in _arrays(tmp_path / "lean", "ic")
    registry.run_stage("nbody", path)
    ours = zarr.open_group(tmp_path / "lean" / "nbody.zarr", mode="r")["density"][:]
    packed = zarr.open_group(runs["lean"] / "nbody.zarr", mode="r")["density"][:]
    np.testing.assert_allclose(ours, packed, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["full", "lean"])
def test_plan_disk_estimate_equals_the_arrays_written(runs, name):
    run_file = validation.load_run_file(runs[name] / "config.json")
    estimate = resources.disk_bytes(run_file.config)
    for stage in ("ic", "nbody", "lensing"):  # summaries: small arrays only
        group = zarr.open_group(runs[name] / f"{stage}.zarr", mode="r")
        written = sum(group[a].nbytes for a in group.array_keys() if a in BIG_ARRAYS)
        assert estimate[stage] == written, (stage, estimate[stage], written)


def test_bad_outputs_are_rejected_naming_the_field():
    with pytest.raises(ValueError, match="outputs.density = 3 must divide"):
        config.Run.model_validate({**RUN, "outputs": {"density": 3}})
    with pytest.raises(ValueError, match="outputs.ic"):
        config.Run.model_validate({**RUN, "outputs": {"ic": "some"}})
