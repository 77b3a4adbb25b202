"""Preemption on a real SLURM (tests/slurm_cluster.py): a packed job of 2-process srun steps
signalled (SIGUSR2, as SLURM does ahead of the time limit) during the N-body of its second
run, through `snakemake --profile profiles/slurm`, and a job array element requeued by
`scontrol requeue`, through `pmpipe submit`, resume from the N-body's checkpoint and complete;
the run finished before the signal is not recomputed."""

import contextlib
import os
import signal
import subprocess
import sys
import time

import yaml
import zarr
from conftest import REPO
from test_slurm import STATUS_CHECKS, slurm_env

from pmpipe import checkpoint, stages, store

CAMPAIGN = {
    "name": "preempt", "seed": 5,
    "base": {"box": {"box_size": 128.0, "particles": 32, "oversample": 2},
             "nbody": {"steps": 40}, "parallel": {"pdims": [1, 2], "halo_cells": 16},
             "checkpoints": {"every_steps": 5}},
    "design": {"kind": "fiducial"}, "realisations": 2,
    "execution": {"platform": "cpu", "devices_per_node": 2, "processes_per_node": 2,
                  "cpus_per_task": 1, "device_memory_gb": 2, "runs_per_job": 2},
}
SECOND = "preempt-fiducial-r1"


def _finished(run_dir):
    return {s: store.is_complete(stages.store_path(run_dir, s))
            and zarr.open_group(stages.store_path(run_dir, s), mode="r").attrs["finished"]
            for s in ("ic", "nbody", "summaries")}


def _running_job():
    """The id of the one running job (an array element as <array>_<index>)."""
    out = subprocess.run(["squeue", "-h", "-t", "RUNNING", "-o", "%i"], capture_output=True,
                         text=True, check=True)
    ids = out.stdout.split()
    assert len(ids) == 1, ids
    return ids[0]


def _release_when_requeued(job, timeout=300):
    """Once ``job``'s first run is closed in the accounting (a REQUEUED record) and the job is
    pending again, make it eligible at once: SLURM holds a requeued job for about two minutes
    (its begin time), time this test need not spend."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        records = subprocess.run(["sacct", "-n", "-X", "--duplicates", "-j", job, "-o", "State"],
                                 capture_output=True, text=True, check=False).stdout.split()
        state = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T %r"], capture_output=True,
                               text=True, check=False).stdout.split()
        if "REQUEUED" in records and state == ["PENDING", "BeginTime"]:
            subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], check=True)
            return
        time.sleep(0.5)
    raise AssertionError(f"job {job} was not requeued within {timeout} s")


def _wait_for_the_second_runs_checkpoint(results, process, timeout=600):
    """Once the second run's N-body holds a checkpoint: the first run's stores (done)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if any(store.is_complete(p) for p in (results / SECOND / checkpoint.FOLDER).glob("*.zarr")):
            first = _finished(results / "preempt-fiducial-r0")
            assert all(first.values()), first
            return first
        assert process.poll() is None, process.communicate()[0][-3000:]
        time.sleep(0.2)
    raise AssertionError("the second run never wrote a checkpoint")


@contextlib.contextmanager
def _started(cmd, workdir):
    """The command running in the background; killed with its jobs if the test fails."""
    process = subprocess.Popen(cmd, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, start_new_session=True,
                               env={k: v for k, v in slurm_env().items() if k != "XLA_FLAGS"})
    try:
        yield process
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            subprocess.run(["scancel", "--user", os.environ.get("USER", "root")], check=False)
            process.communicate()


def _assert_resumed_and_complete(results, first_before, log_text):
    assert "resumed after step" in log_text, log_text[-3000:]
    assert _finished(results / "preempt-fiducial-r0") == first_before  # not recomputed
    assert all(_finished(results / SECOND).values())
    assert not (results / SECOND / checkpoint.FOLDER).exists()


def test_signal_ahead_of_the_time_limit_requeues_a_snakemake_job_that_resumes(slurm, tmp_path):
    (tmp_path / "preempt.yaml").write_text(yaml.safe_dump(CAMPAIGN))
    cmd = [sys.executable, str(REPO / "tests" / "slurm_snakemake.py"),  # status every 2 s
           "-s", str(REPO / "Snakefile"), "-d", str(tmp_path),
           "--profile", str(REPO / "profiles/slurm"), "--configfile",
           str(REPO / "profiles/slurm/site.yaml"), "--config", "campaign=preempt.yaml",
           *STATUS_CHECKS]
    results = tmp_path / "results" / "preempt"
    with _started(cmd, tmp_path) as process:
        first = _wait_for_the_second_runs_checkpoint(results, process)
        job = _running_job()
        subprocess.run(["scancel", "--signal=USR2", job], check=True)
        _release_when_requeued(job)
        out, _ = process.communicate(timeout=900)
    assert process.returncode == 0, out[-5000:]
    log = (results / "logs" / "job0000.log").read_text()  # the requeued job's
    _assert_resumed_and_complete(results, first, log)
    states = subprocess.run(["sacct", "-n", "-X", "--duplicates", "-j", job, "-o", "State"],
                            capture_output=True, text=True, check=True).stdout.split()
    assert "REQUEUED" in states and states[-1] == "COMPLETED", states  # one job, run twice


def test_scontrol_requeue_of_a_submitted_array_element_resumes(slurm, tmp_path):
    (tmp_path / "preempt.yaml").write_text(yaml.safe_dump(CAMPAIGN))
    cmd = [sys.executable, "-m", "pmpipe.cli", "submit", "preempt.yaml", "--wait",
           "--site", str(REPO / "profiles/slurm/site.yaml")]
    results = tmp_path / "results" / "preempt"
    with _started(cmd, tmp_path) as process:
        first = _wait_for_the_second_runs_checkpoint(results, process)
        job = _running_job()
        subprocess.run(["scontrol", "requeue", job], check=True)
        _release_when_requeued(job)
        out, _ = process.communicate(timeout=900)
    assert process.returncode == 0, out[-5000:]
    logs = "".join(p.read_text() for p in (results / "logs" / "submitit").glob("*.out"))
    _assert_resumed_and_complete(results, first, logs)

