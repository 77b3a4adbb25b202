"""Campaigns of many runs: a 40-run campaign in which 3 runs fail collects the other 37,
says which failed and why (summaries.zarr, manifest.csv, pmpipe status), and a rerun after
the cause is removed computes those 3 only; a bounded report; job arrays within the
cluster's MaxArraySize; a Sobol design extended without moving the runs that exist."""

import csv
import json
import re
import shutil
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import zarr
from conftest import REPO, finished, snakemake_tiny

from pmpipe import cli, stages
from pmpipe.campaigns import campaign, run_index
from pmpipe.cluster import launch, site
from pmpipe.results import aggregate, campaign_status, report, summary_parts
from pmpipe.stages import registry
from pmpipe.storage import run_record, store

MANY = """\
name: many
seed: 5
base:
  box: {box_size: 64.0, particles: 8}
  nbody: {steps: 2}
design:
  kind: latin_hypercube
  parameters: {Omega_m: [0.28, 0.34], sigma8: [0.75, 0.85]}
  samples: 40
execution: {platform: cpu, cpus_per_task: 1, device_memory_gb: 2, runs_per_job: 20}
"""
BROKEN = (5, 20, 30)  # positions of the runs whose ICs are damaged before the workflow


def corrupt_ics(run_dir):
    """Make the run's ICs and damage every chunk of their displacement, so that the N-body of
    the run fails reading them (the store still looks complete when the workflow plans)."""
    registry.run_stage("ic", run_dir / "config.json")
    chunks = [p for p in (run_dir / "ic.zarr" / "displacement").rglob("*") if p.is_file()]
    for chunk in (c for c in chunks if c.name != "zarr.json"):
        chunk.write_bytes(b"x" * chunk.stat().st_size)


def snakemake(workdir, check):
    return snakemake_tiny(workdir, check=check, campaign="many.yaml")


def status(folder) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "pmpipe.cli", "status", str(folder), "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout)


@pytest.fixture(scope="module")
def many(tmp_path_factory):
    """The 40-run campaign through the workflow with 3 runs' ICs damaged: (workdir, runs,
    output of the failing invocation)."""
    workdir = tmp_path_factory.mktemp("many")
    (workdir / "many.yaml").write_text(MANY)
    camp = campaign.load(workdir / "many.yaml")
    campaign.write_run_files(camp, workdir / "results")
    folder = workdir / "results" / "many"
    for i in BROKEN:
        corrupt_ics(folder / camp.runs[i].run_id)
    return workdir, [s.run_id for s in camp.runs], snakemake(workdir, check=False)


@pytest.mark.slow
def test_failed_runs_are_collected_as_failed_and_the_others_in_full(many):
    workdir, runs, out = many
    folder = workdir / "results" / "many"
    assert out.returncode != 0
    assert "the runs complete so far are in" in out.stderr
    g = zarr.open_group(folder / "summaries.zarr", mode="r")
    complete = g["complete"][:]
    failed = [runs[i] for i in BROKEN]
    assert complete.sum() == 37 and list(g["run"][:][~complete]) == failed
    assert list(g["state"][:][~complete]) == ["failed"] * 3
    assert all(f.startswith("nbody: ValueError") for f in g["failure"][:][~complete])
    assert np.isnan(g["pk"][:][~complete]).all() and np.isfinite(g["pk"][:][complete]).all()
    done = store.open_complete(folder / runs[0] / "summaries.zarr")
    np.testing.assert_array_equal(g["pk"][0], done["pk"][:])
    with (folder / "manifest.csv").open() as fh:
        rows = {row["run_id"]: row["status"] for row in csv.DictReader(fh)}
    assert [r for r, s in rows.items() if s.startswith("failed in nbody: ")] == failed
    report_state = status(folder)
    assert (report_state["done"], report_state["failed"], report_state["pending"]) == (37, 3, 0)
    assert [f["run_id"] for f in report_state["failures"]] == failed
    parts = {p.name: summary_parts.current_rows(p, folder) for p in (folder / "parts").iterdir()}
    assert {name: len(rows) for name, rows in parts.items()} == {
        "job0000.zarr": 19,
        "job0001.zarr": 18,
    }
    row = parts["job0000.zarr"][runs[0]]
    np.testing.assert_array_equal(row.part["pk"][row.index], done["pk"][:])


@pytest.mark.slow
def test_a_rerun_after_the_cause_is_removed_computes_the_failed_runs_only(many):
    workdir, runs, _ = many
    folder = workdir / "results" / "many"
    before = {
        r: finished(folder / r / "summaries.zarr")
        for r in runs
        if r not in [runs[i] for i in BROKEN]
    }
    for i in BROKEN:
        shutil.rmtree(folder / runs[i] / "ic.zarr")
    snakemake(workdir, check=True)
    after = {r: finished(folder / r / "summaries.zarr") for r in before}
    assert after == before
    for i in BROKEN:
        for stage in stages.STAGES[:2] + ("summaries",):
            assert store.is_complete(folder / runs[i] / f"{stage}.zarr")
    assert campaign_status.campaign_status(folder)["done"] == 40
    assert zarr.open_group(folder / "summaries.zarr", mode="r")["complete"][:].all()
    # each rerun job's part kept the rows of its runs done before and added the rerun ones
    rows = [summary_parts.current_rows(p, folder) for p in (folder / "parts").iterdir()]
    assert sorted(r for found in rows for r in found) == sorted(runs)
    figures = sorted(p.relative_to(folder) for p in (folder / "report").rglob("*.png"))
    assert len(figures) == 2 * report.SAMPLED_RUNS + 2, figures  # pk, slice; pk_ratio, design


@pytest.mark.slow
def test_the_exported_table_and_the_docs_emulator_read_the_campaign(many):
    workdir, runs, _ = many
    folder = workdir / "results" / "many"
    assert cli.main(["export", str(folder)]) == 0
    frame = pd.read_parquet(folder / "many.parquet")
    g = zarr.open_group(folder / "summaries.zarr", mode="r")
    assert list(frame["run_id"]) == runs
    for name in ("Omega_m", "sigma8", "seed", "complete"):
        np.testing.assert_array_equal(frame[name].to_numpy(), g[name][:])
    final = f"{g['a'][-1]:.6g}"
    for j, k in enumerate(g["k"][:]):
        np.testing.assert_array_equal(frame[f"pk[a={final}, k={k:.6g}]"], g["pk"][:, -1, j])
    docs = (REPO / "docs/outputs.md").read_text()
    block = re.search(r"```python\n(import numpy as np\nimport pmpipe\n.*?)```", docs, re.DOTALL)
    script = workdir / "emulator.py"  # the docs' emulator, run as a user runs it
    script.write_text(block.group(1).replace('"results/lh16"', repr(str(folder))))
    out = subprocess.run([sys.executable, script], capture_output=True, text=True, check=True)
    assert "median |error| over the k bins of 20 runs held out" in out.stdout


@pytest.mark.slow
def test_collection_reads_a_run_written_since_its_part_from_its_own_store(many, capfd):
    workdir, runs, _ = many
    folder = workdir / "results" / "many"
    part, moved = folder / "parts" / "job0001.zarr", 25
    assert runs[moved] in summary_parts.current_rows(part, folder)
    metadata = folder / runs[moved] / "summaries.zarr" / "zarr.json"
    metadata.write_bytes(metadata.read_bytes())  # written again: another fingerprint
    assert runs[moved] not in summary_parts.current_rows(part, folder)
    aggregate.collect(workdir / "many.yaml", workdir / "results")
    logged = capfd.readouterr().err
    assert "40 of 40 runs collected: 39 from their jobs' parts, 1 from their own" in logged
    g = zarr.open_group(folder / "summaries.zarr", mode="r")
    own = store.open_complete(folder / runs[moved] / "summaries.zarr")
    np.testing.assert_array_equal(g["pk"][moved], own["pk"][:])
    zarr.open_group(part, mode="r+").attrs["layout"] = 0  # another summaries layout
    assert summary_parts.current_rows(part, folder) == {}


def test_statistics_stack_rows_of_parts_runs_own_stores_and_fills():
    part = {"pk": np.arange(12.0).reshape(3, 4), "n": np.arange(3)}
    own = {"pk": np.full(4, -1.0), "n": np.array(7)}
    sources = [summary_parts.Row(part, 2), own, None, summary_parts.Row(part, 0)]
    pk = summary_parts.stacked("pk", sources, (4,), np.dtype(float))
    np.testing.assert_array_equal(pk[[0, 1, 3]], [part["pk"][2], own["pk"], part["pk"][0]])
    assert np.isnan(pk[2]).all()
    n = summary_parts.stacked("n", sources, (), np.dtype(int))
    assert n.tolist() == [2, 7, 0, 0]


def test_the_report_samples_a_bounded_number_of_runs():
    runs = [f"r{i}" for i in range(10_000)]
    sampled = report.sampled_runs(runs)
    assert len(sampled) == report.SAMPLED_RUNS and sampled[0] == "r0" and sampled[-1] == "r9999"
    assert report.sampled_runs(runs[:5]) == runs[:5]


def test_job_arrays_stay_within_max_array_size_and_max_submit_jobs():
    groups = [[i] for i in range(10_000)]
    arrays = launch.split_arrays(groups, 1001, None)
    assert [len(a) for a in arrays] == [1001] * 9 + [991]
    assert [g for a in arrays for g in a] == groups
    first_wave = launch.split_arrays(groups, 300, 1000)
    assert [len(a) for a in first_wave] == [300, 300, 300, 100]
    assert first_wave[0][0] == [0] and first_wave[-1][-1] == [999]
    assert launch.array_count(10_000, 1001, None) == 10
    assert launch.array_count(10_000, 1001, 1500) == 6 * 2 + 1  # 6 waves of 1500, one of 1000
    waves, left = 0, groups
    while left:  # what pmpipe submit --wait submits, wave after wave
        wave = launch.split_arrays(left, 1001, 1500)
        waves, left = waves + len(wave), left[sum(map(len, wave)) :]
    assert waves == 13
    assert launch.array_count(10_000, 300, 1000) == 10 * 4
    assert launch.parallel_share(64, 10) == 6 and launch.parallel_share(4, 10) == 1


def test_max_array_size_from_the_site_then_scontrol_then_slurms_default():
    text = "MaxArraySize            = 40001\nMaxJobCount             = 10000\n"
    assert site.max_array_size(site.Site(max_array_size=500), text)[0] == 500
    assert site.max_array_size(site.Site(), text) == (40001, "MaxArraySize of scontrol show config")
    assert site.max_array_size(None, None)[0] == site.DEFAULT_MAX_ARRAY_SIZE == 1001


def sobol(samples: int, **extra):
    return campaign.Campaign.model_validate(
        {
            "name": "s",
            "seed": 4,
            "base": {"box": {"particles": 16}},
            "design": {
                "kind": "sobol",
                "parameters": {"Omega_m": [0.25, 0.35], "sigma8": [0.7, 0.9]},
                "samples": samples,
            },
            "execution": {"runs_per_job": 4},
            **extra,
        }
    )


def test_a_sobol_design_extended_keeps_its_runs_ids_parameters_seeds_and_jobs():
    small, large = sobol(8), sobol(16)
    for a, b in zip(small.runs, large.runs[:8], strict=True):
        assert (a.run_id, a.parameters, a.seed, a.run) == (b.run_id, b.parameters, b.seed, b.run)
    assert {r.run_id for r in large.runs[8:]}.isdisjoint(r.run_id for r in small.runs)
    old_jobs = campaign.job_groups(small.runs, 4)
    new_jobs = campaign.job_groups(large.runs, 4)
    assert all(new_jobs[j] == runs for j, runs in old_jobs.items())


def test_the_run_index_is_what_status_reads(tmp_path):
    camp = sobol(8)
    campaign.write_run_files(camp, tmp_path)
    index = run_index.read(tmp_path / "s")
    assert index["stages"] == list(stages.run_stages(camp.base))
    assert [r for runs in index["jobs"].values() for r in runs] == [s.run_id for s in camp.runs]
    state = campaign_status.campaign_status(tmp_path / "s")
    assert (state["runs"], state["pending"], state["runs_per_hour"]) == (8, 8, None)


def test_status_trusts_a_done_record_until_a_store_is_written_again(tmp_path):
    """A run is done by its stores' markers; a done record's fingerprints of the stores' root
    metadata spare reading them, until a store is written again (here: marked damaged, as
    pmpipe verify does). A run left 'started' with no live lock was stopped: failed."""
    camp = sobol(8)
    campaign.write_run_files(camp, tmp_path)
    run_dir = tmp_path / "s" / camp.runs[0].run_id
    names = stages.run_stages(camp.base)
    for stage in names:
        store.mark_complete(store.create(stages.store_path(run_dir, stage), {"stage": stage}))
    state = campaign_status.campaign_status(tmp_path / "s")
    assert (state["done"], state["runs_per_hour"]) == (1, None)  # no record: markers read
    prints = {s: run_record.fingerprint(stages.store_path(run_dir, s)) for s in names}
    run_record.write(run_dir, None, None, 12.0, 1000, prints)
    assert campaign_status.campaign_status(tmp_path / "s")["done"] == 1
    store.invalidate(stages.store_path(run_dir, "nbody"), ["a shard is damaged"])
    assert run_record.fingerprint(stages.store_path(run_dir, "nbody")) != prints["nbody"]
    state = campaign_status.campaign_status(tmp_path / "s")
    assert (state["done"], state["pending"]) == (0, 8)
    run_record.write(run_dir, "ValueError: bad", "nbody", 3.0, 0)
    state = campaign_status.campaign_status(tmp_path / "s")
    assert state["failed"] == 1 and state["failures"][0]["error"] == "ValueError: bad"
    assert "failed: s-p0000-r0 in stage nbody at " in campaign_status.status_text(state)
    stopped = tmp_path / "s" / camp.runs[1].run_id
    run_record.write_started(stopped)  # its job was killed: no outcome, no lock
    state = campaign_status.campaign_status(tmp_path / "s")
    assert state["failed"] == 2 and state["failures"][1]["error"] == campaign_status.STOPPED
    assert campaign_status.manifest_status(stopped, names).startswith("failed: stopped before")


def test_a_10000_run_campaign_is_submitted_as_arrays_within_max_array_size(tmp_path, capsys):
    """pmpipe submit --dry-run of 10,000 runs, one a task, with a site MaxArraySize of 3000
    and --max-parallel 100: 4 arrays, the first of 3000 tasks, 25 of each at a time."""
    campaign_file = tmp_path / "lh.yaml"
    campaign_file.write_text(
        MANY.replace("name: many", "name: lh")
        .replace("samples: 40", "samples: 10000")
        .replace("runs_per_job: 20", "runs_per_job: 1")
    )
    site_file = tmp_path / "site.yaml"
    site_file.write_text("site: {partition: gpu, max_array_size: 3000}\n")
    args = ["submit", str(campaign_file), "--site", str(site_file), "--results", str(tmp_path)]
    assert cli.main([*args, "--max-parallel", "100", "--dry-run"]) == 0
    out = capsys.readouterr()
    assert "10000 runs packed into 10000 task(s)" in out.err
    assert "4 SLURM array(s) of at most 3000 tasks (site max_array_size)" in out.err
    assert "#SBATCH --array=0-2999%25" in out.out
    assert not (tmp_path / "lh").exists()  # a dry run writes nothing


def test_more_points_and_realisations_keep_every_run_with_the_pairing_seed_index():
    small = sobol(8, realisations=2, seed_index="pairing")
    large = sobol(16, realisations=3, seed_index="pairing")
    grown = {s.run_id: s for s in large.runs}
    for a in small.runs:
        b = grown[a.run_id]
        assert (a.parameters, a.seed, a.run) == (b.parameters, b.seed, b.run)
    assert len({s.seed for s in large.runs}) == 48
    before = {s.run_id: s.seed for s in sobol(8, realisations=2).runs}  # point-major
    after = {s.run_id: s.seed for s in sobol(8, realisations=3).runs}
    assert sum(before[r] != after[r] for r in before) == 14  # all but point 0's
    positions = campaign.seed_positions(3, 2, False, "pairing").tolist()
    assert positions == [0, 2, 1, 4, 3, 7]  # (p + r)(p + r + 1)/2 + r
    with pytest.raises(ValueError, match="seed_index pairing: 100000 points x 2"):
        campaign.seed_positions(100_000, 2, False, "pairing")
