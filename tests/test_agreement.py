"""The processes of a job agree on each step of a run through jax.distributed's key-value
store (pmpipe.runtime.agreement): a failure on one process is every process's failure of that
run and the job goes on; a partner that cannot arrive stops the job within the timeout."""

import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import job_env
from test_multiprocess import RUN  # 16^3 on (1, 2) devices, lensing and summaries

from pmpipe.run import config
from pmpipe.runtime import agreement
from pmpipe.storage import run_record, store

REPO = Path(__file__).resolve().parents[1]

STAGES = ("ic", "nbody", "lensing", "summaries")


def test_one_process_agrees_with_itself():
    assert agreement.agree("0/run/ic", None) == {}
    assert agreement.agree("0/run/nbody", "ValueError: bad") == {0: "ValueError: bad"}


def test_the_agreed_line_names_the_process_that_failed_alone():
    assert agreement.one_line({0: "HaloError: x"}, 1) == "HaloError: x"
    assert agreement.one_line({0: "HaloError: x", 1: "HaloError: x"}, 2) == "HaloError: x"
    assert agreement.one_line({1: "OSError: disk"}, 2) == "process 1: OSError: disk"
    assert agreement.one_line({0: "a", 2: "b"}, 4) == "process 0 (and 1 other process): a"


AGREE = textwrap.dedent(
    """
    import json, sys, time
    import jax
    from pmpipe.runtime import agreement
    port, me, role = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    jax.distributed.initialize(f"localhost:{port}", num_processes=2, process_id=me)
    jax.devices()  # the backends of both processes start together, as in a job
    if role == "absent":
        time.sleep(60)  # inside a collective, say: never arrives
    failure = "OSError: disk full" if role == "fail" else None
    try:
        print(json.dumps(agreement.agree("0/run/ic", failure, timeout_s=float(sys.argv[4]))))
    except agreement.PartnerLost as err:
        print(json.dumps({"lost": str(err), "missing": err.missing}))
    sys.stdout.flush()
    """
)


def _agree_pair(roles, timeout_s):
    """Two processes joined by jax.distributed, each agreeing at one point in its role; their
    JSON answers and the seconds until the first answered."""
    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", AGREE, str(port), str(i), role, str(timeout_s)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
            start_new_session=True,
        )
        for i, role in enumerate(roles)
    ]
    start, answers = time.monotonic(), []
    try:
        for proc, role in zip(procs, roles):
            if role != "absent":
                answers.append(json.loads(proc.stdout.readline()))
        return answers, time.monotonic() - start
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def test_two_processes_agree_on_the_failure_of_one():
    answers, _ = _agree_pair(["ok", "fail"], timeout_s=60)
    assert answers == [{"1": "OSError: disk full"}] * 2


def test_a_process_whose_partner_never_arrives_learns_it_within_the_timeout():
    answers, seconds = _agree_pair(["fail", "absent"], timeout_s=3)
    assert answers[0]["missing"] == [1]
    assert "process 1 did not reach the end of step 0/run/ic within 3 s" in answers[0]["lost"]
    assert seconds < 45  # JAX's start-up in both processes, then 3 s


def _write_runs(results: Path, count: int) -> list[Path]:
    run = config.Run.model_validate(RUN)
    paths = []
    for i in range(count):
        run_dir = results / "agree" / f"r{i}"
        run_dir.mkdir(parents=True)
        path = run_dir / "config.json"
        path.write_text(config.RunFile.build("agree", run_dir.name, i, {}, run).to_json())
        paths.append(path)
    return paths


def _packed_job(paths, process, when, targets, *extra, timeout=600):
    env = job_env()  # each process its share
    cmd = [
        shutil.which("mpiexec"),
        "-n",
        "2",
        sys.executable,
        str(REPO / "tests" / "inject_failure.py"),
    ]
    cmd += [str(process), when, ",".join(targets), "--", *extra, *map(str, paths)]
    start = time.monotonic()
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    return out, time.monotonic() - start


@pytest.mark.slow
def test_a_failure_on_one_process_of_a_packed_job_is_recorded_and_the_other_runs_complete(
    tmp_path,
):
    """mpiexec -n 2; process 1 fails after ic of r0, after nbody of r1 and after summaries of
    r2 (each time once the other process no longer needs it in that stage): each of those runs
    fails in that stage with process 1's reason, r3 after them completes, the job ends with 1."""
    assert shutil.which("mpiexec"), "mpiexec missing: pip install mpich mpi4py (the [test] extra)"
    paths = _write_runs(tmp_path, 4)
    failing = {"r0": "ic", "r1": "nbody", "r2": "summaries"}
    out, _ = _packed_job(paths, 1, "after", [f"{r}:{s}" for r, s in failing.items()])
    assert out.returncode == 1, out.stderr[-4000:]
    assert "3 of 4 runs failed: r0, r1, r2" in out.stderr, out.stderr[-4000:]
    for path in paths:
        record = run_record.read(path.parent)
        run = path.parent.name
        if run in failing:
            assert record["state"] == "failed" and record["stage"] == failing[run], record
            assert record["error"] == (
                f"process 1: RuntimeError: injected failure after stage {failing[run]}"
            )
            later = STAGES[STAGES.index(failing[run]) + 1 :]
            assert not any(store.is_complete(path.parent / f"{s}.zarr") for s in later), run
        else:
            assert record["state"] == "done", record
            assert all(store.is_complete(path.parent / f"{s}.zarr") for s in STAGES), run


@pytest.mark.slow
def test_a_process_failing_inside_a_stage_stops_the_job_in_bounded_time_with_the_reason(
    tmp_path,
):
    """mpiexec -n 2; process 1 fails instead of computing the N-body of r1, while process 0
    waits for it inside the N-body's collectives: the job ends within the partner timeout
    and the launcher's or the heartbeat's reaction, r1's outcome names the failure and why
    the job stopped, r0 is complete and r2 is left for the next job."""
    paths = _write_runs(tmp_path, 3)
    out, seconds = _packed_job(paths, 1, "before", ["r1:nbody"], "--partner-timeout", "10")
    assert out.returncode != 0, out.stderr[-4000:]
    record = run_record.read(paths[1].parent)
    assert record["state"] == "failed" and record["stage"] == "nbody", (record, out.stderr[-4000:])
    assert record["error"].startswith(
        "process 1: RuntimeError: injected failure before stage nbody; "
        "process 0 did not reach the end of step 1/r1/nbody within 10 s"
    ), record["error"]
    assert "the job stops" in out.stderr
    assert run_record.read(paths[0].parent)["state"] == "done"
    assert run_record.read(paths[2].parent) is None
    assert seconds < 240, seconds
