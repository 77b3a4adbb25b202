"""Preemption on a real SLURM (tests/slurm_cluster.py). A packed job of 2-process srun steps,
through `snakemake --profile profiles/slurm`, and a job array element, through `pmpipe
submit`, are each stopped twice during the N-body of their second run: by SIGUSR2 (what SLURM
sends ahead of the time limit) and by `scontrol requeue` (what a preemption does), in both
orders. Each time the job is requeued, resumes from the N-body's checkpoint, and in the end
completes; the run finished before the first stop is not recomputed."""

import contextlib
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml
import zarr
from conftest import COLLECT, REPO, RUN_FIGURES, job_env
from test_slurm import STATUS_CHECKS, slurm_env

from pmpipe import stages
from pmpipe.run import validation
from pmpipe.storage import checkpoint, store

pytestmark = pytest.mark.slow

CAMPAIGN = {
    "name": "preempt",
    "seed": 5,
    "base": {
        "box": {"box_size": 128.0, "particles": 32, "oversample": 2},
        # the test stops the second run within about 30 steps of a checkpoint (0.2 s polls
        # and scancel on an idle fast core): 120 steps leave it evolving at both stops
        "nbody": {"steps": 120},
        "parallel": {"pdims": [1, 2], "halo_cells": 16},
        "checkpoints": {"every_steps": 10},
    },
    "design": {"kind": "fiducial"},
    "realisations": 2,
    "execution": {
        "platform": "cpu",
        "devices_per_node": 2,
        "processes_per_node": 2,
        "cpus_per_task": 1,
        "device_memory_gb": 2,
        "runs_per_job": 2,
    },
}
SECOND = "preempt-fiducial-r1"


def _finished(run_dir):
    return {
        s: store.is_complete(stages.store_path(run_dir, s))
        and zarr.open_group(stages.store_path(run_dir, s), mode="r").attrs["finished"]
        for s in ("ic", "nbody", "summaries")
    }


def _running_job():
    """The id of the one running job (an array element as <array>_<index>)."""
    out = subprocess.run(
        ["squeue", "-h", "-t", "RUNNING", "-o", "%i"], capture_output=True, text=True, check=True
    )
    ids = out.stdout.split()
    assert len(ids) == 1, ids
    return ids[0]


def _release_when_requeued(job, timeout=300):
    """Once ``job``'s first run is closed in the accounting (a REQUEUED record) and the job is
    pending again, make it eligible 2 s later: SLURM holds a requeued job for about two minutes
    (its begin time), time this test need not spend. The 2 s are needed: the node revoked the
    old run's credential, and it refuses a credential made in the same second (1 s clock), so
    a job started at once fails ("Job credential revoked") instead of running again."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        records = subprocess.run(
            ["sacct", "-n", "-X", "--duplicates", "-j", job, "-o", "State"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.split()
        state = subprocess.run(
            ["squeue", "-h", "-j", job, "-o", "%T %r"], capture_output=True, text=True, check=False
        ).stdout.split()
        if "REQUEUED" in records and state == ["PENDING", "BeginTime"]:
            time.sleep(2)
            subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], check=True)
            return
        time.sleep(0.5)
    raise AssertionError(f"job {job} was not requeued within {timeout} s")


def _checkpoint_step(results) -> int:
    """The step of the second run's newest complete checkpoint (0: none yet), found as the run
    finds the checkpoint it resumes from (pmpipe.storage.checkpoint.newest)."""
    run_dir = results / SECOND
    config_path = run_dir / "config.json"
    if not config_path.exists():
        return 0
    found = checkpoint.newest(run_dir, validation.load_run_file(config_path).config_hash)
    return 0 if found is None else int(found.name.removeprefix("nbody-step").removesuffix(".zarr"))


def _checkpoint_after(results, process, after=0, timeout=600):
    """Wait for a complete checkpoint of the second run after step ``after``; its step."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        step = _checkpoint_step(results)
        if step > after:
            return step
        assert process.poll() is None, process.communicate()[0][-3000:]
        time.sleep(0.2)
    raise AssertionError(f"the second run wrote no checkpoint after step {after}")


def _stop_twice(results, process, first, then):
    """Stop the job running the second run's N-body by ``first`` at its first checkpoint and,
    once it resumed and wrote a later one, by ``then`` (each a function of the job id); each
    time the job is requeued and released. Returns the first run's finished stages (done
    before the first stop) and the job."""
    _checkpoint_after(results, process)
    done = _finished(results / "preempt-fiducial-r0")
    assert all(done.values()), done
    job = _running_job()
    first(job)
    _release_when_requeued(job)  # the job has ended: its last checkpoint is the stop's
    _checkpoint_after(results, process, after=_checkpoint_step(results))  # resumed
    assert _running_job() == job
    then(job)
    _release_when_requeued(job)
    return done, job


def _usr2(job):
    subprocess.run(["scancel", "--signal=USR2", job], check=True)  # SLURM, ahead of the limit


def _requeue(job):
    subprocess.run(["scontrol", "requeue", job], check=True)  # a preemption, an administrator


@contextlib.contextmanager
def _started(cmd, workdir):
    """The command running in the background; killed with its jobs if the test fails."""
    process = subprocess.Popen(
        cmd,
        cwd=workdir,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env=job_env(slurm_env()),
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            subprocess.run(["scancel", "--user", os.environ.get("USER", "root")], check=False)
            process.communicate()


def _assert_resumed_and_complete(results, first_before, log_text, job):
    assert "resumed after step" in log_text, log_text[-3000:]
    assert _finished(results / "preempt-fiducial-r0") == first_before  # not recomputed
    assert all(_finished(results / SECOND).values())
    assert not (results / SECOND / checkpoint.FOLDER).exists()
    end = time.monotonic() + 60  # the accounting may close the last run after the job ended
    while True:
        states = subprocess.run(
            ["sacct", "-n", "-X", "--duplicates", "-j", job, "-o", "State"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        if states[-1:] not in (["RUNNING"], ["COMPLETING"]) or time.monotonic() > end:
            break
        time.sleep(0.5)
    assert states.count("REQUEUED") == 2 and states[-1] == "COMPLETED", states  # one job, 3 runs


def test_snakemake_job_signalled_then_requeued_resumes_each_time(slurm, tmp_path):
    (tmp_path / "preempt.yaml").write_text(yaml.safe_dump(CAMPAIGN))
    cmd = [
        sys.executable,
        str(REPO / "tests" / "slurm_snakemake.py"),  # status every 2 s
        "-s",
        str(REPO / "Snakefile"),
        "-d",
        str(tmp_path),
        "--profile",
        str(REPO / "profiles/slurm"),
        "--configfile",
        str(REPO / "profiles/slurm/site.yaml"),
        "--config",
        "campaign=preempt.yaml",
        *STATUS_CHECKS,
        "--omit-from",  # the runs' stores are what the test reads
        COLLECT,
        RUN_FIGURES,
    ]
    results = tmp_path / "results" / "preempt"
    with _started(cmd, tmp_path) as process:
        first, job = _stop_twice(results, process, _usr2, _requeue)
        out, _ = process.communicate(timeout=900)
    assert process.returncode == 0, out[-5000:]
    log = (results / "logs" / "job0000.log").read_text()  # the job's last run
    _assert_resumed_and_complete(results, first, log, job)


def test_submitted_array_element_requeued_then_signalled_resumes_each_time(slurm, tmp_path):
    (tmp_path / "preempt.yaml").write_text(yaml.safe_dump(CAMPAIGN))
    cmd = [
        sys.executable,
        "-m",
        "pmpipe.cli",
        "submit",
        "preempt.yaml",
        "--wait",
        "--site",
        str(REPO / "profiles/slurm/site.yaml"),
    ]
    results = tmp_path / "results" / "preempt"
    with _started(cmd, tmp_path) as process:
        first, job = _stop_twice(results, process, _requeue, _usr2)
        out, _ = process.communicate(timeout=900)
    assert process.returncode == 0, out[-5000:]
    logs = "".join(p.read_text() for p in (results / "logs" / "submitit").glob("*.out"))
    _assert_resumed_and_complete(results, first, logs, job)


SIGNALLED_BY_ITSELF = """
import signal, time
from pmpipe.runtime import slurm_job
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2})  # kept pending for sigtimedwait
start = time.monotonic()
delay = slurm_job.signal_before_time_limit(50)
got = signal.sigtimedwait({signal.SIGUSR2}, 45)
print(delay, got and got.si_signo, time.monotonic() - start)
"""


def test_a_batch_step_process_signals_itself_ahead_of_the_time_limit(slurm, tmp_path):
    """What a single-process Snakemake job does (its stage runs in the batch step, which
    SLURM's --signal does not reach): SIGUSR2 from itself 50 s before its 1-minute limit."""
    (tmp_path / "self.py").write_text(SIGNALLED_BY_ITSELF)
    out = tmp_path / "self.out"
    subprocess.run(
        [
            "sbatch",
            "--time=1",
            f"--output={out}",
            f"--wrap={sys.executable} {tmp_path / 'self.py'}",
        ],
        cwd=tmp_path,
        env=slurm_env(),
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    end = time.monotonic() + 90  # sbatch --wait would see the end up to 30 s late
    while time.monotonic() < end and len(out.read_text().split() if out.exists() else ()) < 3:
        time.sleep(0.5)
    delay, signo, waited = out.read_text().split()[-3:]
    assert int(signo) == signal.SIGUSR2, out.read_text()
    assert 0 <= float(delay) <= 10 and float(waited) < float(delay) + 5, out.read_text()
