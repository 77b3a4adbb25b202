"""Packed jobs: every stage of several runs in one process (pmpipe.job.pipeline), equal to
the stages run one by one; complete runs skipped; a failing run reported without stopping the
others; Snakemake then reruns only that run."""

import shutil
import subprocess
import sys

import jax
import pytest
import yaml
from conftest import COLLECT, RUN_FIGURES, TINY, finished, same_store
from conftest import snakemake_tiny as snakemake

from pmpipe import stages
from pmpipe.campaigns import campaign
from pmpipe.job import one_run
from pmpipe.runtime import log
from pmpipe.stages import registry
from pmpipe.storage import store

RUNS = [f"tiny-fiducial-r{i}" for i in range(4)]


def four_runs_in_one_job() -> str:
    data = yaml.safe_load(TINY)
    data["realisations"] = 4
    data["execution"]["runs_per_job"] = 4
    return yaml.safe_dump(data)


def stamps(results):
    return {
        (run, s): finished(results / run / f"{s}.zarr")
        for run in RUNS
        for s in stages.STAGES
        if store.is_complete(results / run / f"{s}.zarr")
    }


def corrupt(array_dir):
    """Overwrite every chunk of a stored array with bytes that do not decode, of the chunk's
    own size (the store still looks complete when the workflow plans; pmpipe verify finds it)."""
    chunks = [p for p in array_dir.rglob("*") if p.is_file() and p.name != "zarr.json"]
    assert chunks
    for chunk in chunks:
        chunk.write_bytes(b"x" * chunk.stat().st_size)


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    """The 4-run campaign through Snakemake, with run r2's ICs made beforehand and damaged:
    (workdir, output of the failing invocation)."""
    workdir = tmp_path_factory.mktemp("packed")
    (workdir / "tiny.yaml").write_text(four_runs_in_one_job())
    # the runs' config.json files, as the Snakefile writes them
    campaign.write_run_files(campaign.load(workdir / "tiny.yaml"), workdir / "results")
    results = workdir / "results" / "tiny"
    registry.run_stage("ic", results / RUNS[2] / "config.json")
    corrupt(results / RUNS[2] / "ic.zarr" / "displacement")
    out = snakemake(workdir, check=False)
    return workdir, out


def test_a_run_failing_on_another_process_than_0_says_why_there(tmp_path, monkeypatch, capfd):
    """Process 0 writes the traceback; any other process writes its reason in one line, the
    only record of a failure that process met alone."""
    monkeypatch.setattr(jax, "process_index", lambda: 1)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.json").write_text("{")
    log.configure(process=1)
    try:
        outcome = one_run.run_one(tmp_path / "run" / "config.json", mesh_of=None).result()
    finally:
        log.configure()
    err = capfd.readouterr().err
    assert outcome.error is not None and "traceback" not in err
    assert f"[pmpipe run run] process 1: {outcome.error}" in err


@pytest.mark.slow
def test_a_failing_run_does_not_stop_the_others(packed):
    workdir, out = packed
    results = workdir / "results" / "tiny"
    assert out.returncode != 0
    log = (results / "logs" / "job0000.log").read_text()
    assert f"[pmpipe run {RUNS[2]}] FAILED in stage nbody" in log, log[-3000:]
    assert f"1 of 4 runs failed: {RUNS[2]}" in log
    for run in (RUNS[0], RUNS[1], RUNS[3]):
        for stage in stages.STAGES:
            assert store.is_complete(results / run / f"{stage}.zarr"), (run, stage)
    assert not store.is_complete(results / RUNS[2] / "nbody.zarr")
    assert not (results / RUNS[2] / "summaries.zarr").exists()


@pytest.mark.slow
def test_snakemake_then_reruns_only_the_failed_run(packed):
    workdir, _ = packed
    results = workdir / "results" / "tiny"
    before = stamps(results)
    shutil.rmtree(results / RUNS[2] / "ic.zarr")  # the damaged input is removed
    out = snakemake(workdir, "--omit-from", COLLECT, RUN_FIGURES)  # the runs only
    assert "runs_job0000" in out.stdout + out.stderr
    after = stamps(results)
    changed = {key for key in after if before.get(key) != after[key]}
    assert changed == {(RUNS[2], s) for s in stages.STAGES}
    log = (results / "logs" / "job0000.log").read_text()
    assert f"[pmpipe run {RUNS[2]}] ic, nbody, lensing, summaries done" in log
    assert RUNS[0] not in log  # the finished runs were not part of the job


@pytest.mark.slow
def test_packed_stores_equal_the_stages_run_one_by_one(packed, tmp_path):
    workdir, _ = packed
    results = workdir / "results" / "tiny"
    for run in RUNS:
        run_dir = tmp_path / run
        run_dir.mkdir()
        shutil.copy(results / run / "config.json", run_dir / "config.json")
        for stage in stages.STAGES:
            registry.run_stage(stage, run_dir / "config.json")
        for stage in stages.STAGES:
            same_store(results / run / f"{stage}.zarr", run_dir / f"{stage}.zarr", 1e-6)


@pytest.mark.slow
def test_a_job_skips_complete_runs_and_stages(packed):
    workdir, _ = packed
    results = workdir / "results" / "tiny"
    before = stamps(results)
    shutil.rmtree(results / RUNS[1] / "summaries.zarr")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pmpipe.job.pipeline",
            *(str(results / run / "config.json") for run in RUNS),
        ],
        capture_output=True,
        text=True,
        cwd=workdir,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"[pmpipe run {RUNS[0]}] complete already" in out.stderr
    assert f"[pmpipe run {RUNS[1]}] summaries done" in out.stderr
    after = stamps(results)
    assert {key for key in after if before.get(key) != after[key]} == {(RUNS[1], "summaries")}


@pytest.mark.slow
def test_a_packed_job_derives_each_run_once(tmp_path, monkeypatch):
    """The growth and distance tables and the linear P(k) are computed once per run of a
    job (pmpipe.run.derive.setup), not once per stage; the lightcone's planes twice: by the
    check of the run file the job loads, and by the run's setup."""
    from collections import Counter

    from pmpipe.job import pipeline
    from pmpipe.physics.theory import cosmology
    from pmpipe.run import derive, validation

    (tmp_path / "tiny.yaml").write_text(TINY)
    camp = campaign.load(tmp_path / "tiny.yaml")
    paths = campaign.write_run_files(camp, tmp_path / "results")
    calls: Counter = Counter()

    def counted(module, name):
        real = getattr(module, name)

        def wrapper(*args, **kwargs):
            calls[name] += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(module, name, wrapper)

    counted(cosmology, "growth_table")
    counted(validation, "planes")
    counted(derive, "linear_power")
    outcomes = pipeline.run_all(paths)
    assert [o.error for o in outcomes] == [None, None]
    assert [o.stages for o in outcomes] == [stages.STAGES] * 2
    assert calls == {"growth_table": 2, "planes": 4, "linear_power": 2}, calls


AMPLITUDES = """\
name: amp
seed: 3
base:
  power: {kind: camb}
  box: {box_size: 64.0, particles: 16}
  parallel: {pdims: [1, 2], halo_cells: 4}
  nbody: {steps: 2}
design: {kind: grid, parameters: {A_s: [1.9e-9, 2.1e-9, 2.3e-9]}}
execution: {platform: cpu, devices_per_node: 2, cpus_per_task: 1, device_memory_gb: 2}
"""


@pytest.mark.slow
def test_a_packed_job_makes_the_next_runs_linear_power_while_a_run_evolves(tmp_path, monkeypatch):
    """Three CAMB cosmologies, two realisations each, in one job on 8 cores (2 spare): the
    first run's table is made before it starts, the next ones' while runs evolve, on the job's
    CPU threads, two at a time (CAMB's calls taking turns); each distinct table once, shared by
    both realisations (recorded in the job's JSON); no run's setup calls CAMB again."""
    import json
    import threading

    from pmpipe.job import pipeline
    from pmpipe.physics.theory import boltzmann
    from pmpipe.runtime import openmp

    monkeypatch.setattr(openmp, "usable_cores", lambda: 8)
    monkeypatch.setenv(openmp.THREADS_VARIABLE, "2")  # this machine's, not 8 cores' team
    (tmp_path / "amp.yaml").write_text(AMPLITUDES + "realisations: 2\n")
    paths = campaign.write_run_files(campaign.load(tmp_path / "amp.yaml"), tmp_path / "results")
    threads = []
    real = boltzmann.camb_power

    def counted(spec):
        threads.append(threading.current_thread().name)
        return real(spec)

    monkeypatch.setattr(boltzmann, "camb_power", counted)
    report = tmp_path / "job.json"
    outcomes = pipeline.run_all(paths, report)
    assert [o.error for o in outcomes] == [None] * 6
    assert len(threads) == 3 and all(name.startswith("linear-power") for name in threads)
    assert len(set(threads)) == 2  # two tables at once
    ahead = json.loads(report.read_text())["linear_power_ahead"]
    assert [a["run"] for a in ahead] == [p.parent.name for p in paths]
    for record in ahead:  # the second realisation's table is the first's
        shared = record["run"].endswith("-r1")
        assert (record["seconds"] == 0.0) if shared else (record["seconds"] > 0)
        assert record["waited_s"] >= 0


@pytest.mark.slow
def test_a_packed_job_of_class_runs_makes_their_tables_in_processes_of_their_own(tmp_path):
    """Two runs with power.kind class as a job runs them (`python -m pmpipe.job.pipeline`):
    their tables come from CLASS in spawned processes (classy holds Python's lock while it
    computes), are cached, and record CLASS; the job set OMP_NUM_THREADS
    (pmpipe.runtime.openmp). CLASS with massive neutrinos: tests/test_class_power.py."""
    import json
    import os

    import zarr

    from pmpipe.runtime import openmp

    text = AMPLITUDES.replace("kind: camb", "kind: class").replace(", 2.3e-9]", "]")
    (tmp_path / "nu.yaml").write_text(text.replace("name: amp", "name: nu"))
    paths = campaign.write_run_files(campaign.load(tmp_path / "nu.yaml"), tmp_path / "results")
    report = tmp_path / "job.json"
    command = [sys.executable, "-m", "pmpipe.job.pipeline", "--report", str(report)]
    environ = {k: v for k, v in os.environ.items() if k != openmp.THREADS_VARIABLE}
    subprocess.run([*command, *map(str, paths)], check=True, cwd=tmp_path, env=environ, timeout=600)
    record = json.loads(report.read_text())
    ahead = record["linear_power_ahead"]
    assert [a["run"] for a in ahead] == ["nu-p0000-r0", "nu-p0001-r0"]
    # the job's OpenMP libraries leave cores to the CLASS process and the store writers
    assert record["omp_num_threads"] == str(openmp.threads_for(openmp.usable_cores()))
    assert len(list((tmp_path / "results" / ".power_cache").glob("*.npz"))) == 2
    amplitudes = []
    for path in paths:
        source = zarr.open_group(path.parent / "ic.zarr", mode="r").attrs["linear_power"]
        assert source["code"] == "class"
        amplitudes.append(source["inputs"]["cosmology"]["A_s"])
    assert amplitudes == [1.9e-9, 2.1e-9]
