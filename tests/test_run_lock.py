"""One writer per run: the run's lock file names its holder, is taken over once the holder is
gone (a dead process on this host, a silent one elsewhere), and two `pmpipe run all` of one
run never leave a complete store without its arrays."""

import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest
import zarr
from conftest import job_env

from pmpipe import stages
from pmpipe.run import config
from pmpipe.storage import run_lock, store


def _lock_of(run_dir, **holder) -> None:
    """A lock file in run_dir held by ``holder`` (fields of run_lock.Holder over this process)."""
    me = run_lock.this_process()
    fields = {**me.__dict__, **holder}
    (run_dir / run_lock.LOCK).write_text(json.dumps(fields))


def _dead_pid() -> int:
    done = subprocess.run(["sh", "-c", "echo $$"], capture_output=True, text=True, check=True)
    return int(done.stdout)


def test_a_held_lock_names_its_holder_and_is_released(tmp_path):
    path = run_lock.acquire(tmp_path)
    held = json.loads(path.read_text())
    assert held["pid"] == os.getpid() and held["host"] == socket.gethostname()
    with pytest.raises(run_lock.RunLocked, match=f"being written by process {os.getpid()} on "):
        run_lock.acquire(tmp_path)
    run_lock.release(path)
    assert not path.exists()
    run_lock.release(run_lock.acquire(tmp_path))


@pytest.mark.parametrize(
    "holder",
    [
        {"pid": "dead"},  # its process ended
        {"start": -1},  # this pid, but another process (the pid was reused)
        {"host": "elsewhere", "old": True},  # another host, silent for longer than allowed
    ],
    ids=["dead-process", "reused-pid", "silent-host"],
)
def test_a_stale_lock_is_taken_over(tmp_path, holder, capfd):
    old = holder.pop("old", False)
    if holder.get("pid") == "dead":
        holder["pid"] = _dead_pid()
    _lock_of(tmp_path, **holder)
    if old:
        past = time.time() - run_lock.STALE_AFTER_S - 10
        os.utime(tmp_path / run_lock.LOCK, (past, past))
    path = run_lock.acquire(tmp_path)
    assert json.loads(path.read_text())["pid"] == os.getpid()
    assert "took over the lock of process" in capfd.readouterr().err
    assert not (tmp_path / (run_lock.LOCK + ".break")).exists()


def test_a_live_holder_elsewhere_is_waited_for_then_refused(tmp_path):
    _lock_of(tmp_path, host="elsewhere", pid=1)
    start = time.monotonic()
    with pytest.raises(run_lock.RunLocked, match="process 1 on elsewhere"):
        run_lock.acquire(tmp_path, wait_s=1.5)
    assert time.monotonic() - start >= 1.4


def test_a_waiting_writer_gets_the_lock_once_it_is_released(tmp_path):
    path = run_lock.acquire(tmp_path)
    threading.Timer(0.5, run_lock.release, (path,)).start()
    run_lock.release(run_lock.acquire(tmp_path, wait_s=10))


def test_the_holder_keeps_its_lock_fresh(tmp_path, monkeypatch):
    monkeypatch.setattr(run_lock, "HEARTBEAT_S", 0.1)
    path = run_lock.acquire(tmp_path)
    past = time.time() - 1000
    os.utime(path, (past, past))
    with run_lock.kept(path):
        time.sleep(0.5)
        assert time.time() - path.stat().st_mtime < 5
    assert not path.exists()


@pytest.mark.slow
def test_concurrent_writers_of_one_run_never_leave_a_complete_but_empty_store(tmp_path):
    """Three `pmpipe run all` of one run at once: each exits 0 (it wrote the run, or found it
    done) or names the writer that holds it; every store is complete with its arrays."""
    run = config.Run.model_validate(
        {
            "box": {"particles": 16, "box_size": 64.0},
            "nbody": {"steps": 2},
            "outputs": {"ic": "all"},
        }
    )
    path = tmp_path / "run" / "config.json"
    path.parent.mkdir()
    path.write_text(config.RunFile.build("lock", "run", 0, {}, run).to_json())
    env = job_env()
    writers = [
        subprocess.Popen(
            [sys.executable, "-m", "pmpipe.cli", "run", "all", str(path)],
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    results = [(w.wait(timeout=600), w.stderr.read()) for w in writers]
    assert any(code == 0 for code, _ in results), results
    for code, err in results:
        assert code == 0 or "is being written by process" in err, err[-2000:]
    for stage in ("ic", "nbody", "summaries"):
        found = stages.store_path(path.parent, stage)
        assert store.problems(found, checksums=True) == [], stage
        group = zarr.open_group(found, mode="r")
        assert group.attrs["config_hash"] and list(group.array_keys()), stage
    assert "linear_density" in zarr.open_group(path.parent / "ic.zarr", mode="r")
    assert not (path.parent / run_lock.LOCK).exists()
