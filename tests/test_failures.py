"""User-facing failures end in one message that names the cause and the fix, exit status 2,
no traceback: a results folder on a read-only or full file system, a GPU campaign on a
machine without GPUs, a missing file."""

import dataclasses
import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, TINY, mount_tmpfs, run_snakemake

from pmpipe.campaigns import campaign
from pmpipe.cluster import workflow
from pmpipe.run import config
from pmpipe.storage import disk


def assert_one_message(out: subprocess.CompletedProcess, *phrases: str) -> None:
    """Exit status 2, an 'error:' paragraph with ``phrases``, no traceback or frames."""
    assert out.returncode == 2, (out.stdout[-2000:], out.stderr[-2000:])
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, out.stderr
    for phrase in phrases:
        assert phrase in errors[0], errors[0]
    assert "Traceback" not in out.stderr and 'File "' not in out.stderr, out.stderr


def tiny_workdir(tmp_path: Path, results_size: str, read_only: bool = False, text=TINY) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    (work / "tiny.yaml").write_text(text)
    mount_tmpfs(work / "results", results_size, read_only)
    return work


def _dry_run_then_run(work: Path) -> subprocess.CompletedProcess:
    """``snakemake -n`` plans the campaign whatever the results folder (checked: it lists the
    jobs and writes nothing); returns the run that follows, with the folder then unmounted."""
    try:
        planned = run_snakemake(
            work, "-n", "--config", "campaign=tiny.yaml", check=False, share_programs=False
        )
        assert planned.returncode == 0, planned.stderr[-3000:]
        assert "prepare" in planned.stdout and "runs_job0000" in planned.stdout, planned.stdout
        assert not any((work / "results").iterdir())
        out = run_snakemake(
            work, "-c1", "--config", "campaign=tiny.yaml", check=False, share_programs=False
        )
        assert not any((work / "results").iterdir())  # stopped before any job: nothing written
        return out
    finally:
        subprocess.run(["umount", str(work / "results")], check=False)


def test_a_read_only_results_folder_stops_the_run_before_any_job(tmp_path):
    out = _dry_run_then_run(tiny_workdir(tmp_path, "1m", read_only=True))
    assert_one_message(out, "results/tiny: cannot write", "read-only", "writable")


def test_a_results_folder_without_room_stops_the_run_before_any_job(tmp_path):
    out = _dry_run_then_run(tiny_workdir(tmp_path, "16k"))
    assert_one_message(out, "results/tiny: the 8 stores to make need about", "GB free")


def test_the_room_check_of_a_run_names_what_it_would_write(tmp_path, monkeypatch):
    """check_room_or_exit: nothing to make, nothing checked; stores to make that do not fit end
    in one error naming them, exit status 2."""
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY)
    plan = workflow.prepare({"campaign": str(path)}, tmp_path / "results")
    assert plan.plan_file is not None and plan.needed_bytes > 0
    workflow.check_room_or_exit(plan)  # this disk holds them
    too_big = dataclasses.replace(plan, needed_bytes=1e18)
    said: list[str] = []
    monkeypatch.setattr(workflow.LOG, "error", lambda text, *args: said.append(text % args))
    with pytest.raises(SystemExit) as stop:
        workflow.check_room_or_exit(too_big)
    assert stop.value.code == 2
    assert len(said) == 1 and "the 8 stores to make need about 1e+09 GB" in said[0], said
    workflow.check_room_or_exit(dataclasses.replace(too_big, plan_file=None))
    assert not (tmp_path / "results").exists()


def test_a_gpu_campaign_on_a_machine_without_gpus_is_refused_under_the_local_profile(tmp_path):
    gpu = TINY.replace("platform: cpu", "platform: gpu")
    path = tmp_path / "tiny.yaml"
    path.write_text(gpu)
    with pytest.raises(config.ConfigError, match="execution.platform = gpu, but this machine"):
        workflow.check_local_devices(campaign.load(path), path, [], 16)
    workflow.check_local_devices(campaign.load(path), path, ["/dev/nvidia0"], 16)


def test_more_cpu_devices_than_cores_are_warned_about(tmp_path, capsys):
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY)  # 2 devices per run
    workflow.check_local_devices(campaign.load(path), path, [], 2)
    assert "warning" not in capsys.readouterr().err
    workflow.check_local_devices(campaign.load(path), path, [], 1)
    assert "runs of 2 CPU devices (base.parallel.pdims) on a machine of 1 cores" in (
        capsys.readouterr().err
    )


@pytest.mark.parametrize(
    "command",
    [["plan", "missing.yaml"], ["run", "all", "missing/config.json"], ["show", "missing.zarr"]],
    ids=["plan", "run", "show"],
)
def test_a_missing_file_is_one_message(tmp_path, command):
    out = subprocess.run(
        [sys.executable, "-m", "pmpipe.cli", *command],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
    )
    errors = [line for line in out.stderr.splitlines() if "error:" in line]
    assert out.returncode == 2 and len(errors) == 1, out.stderr
    assert "missing" in errors[0] and "Traceback" not in out.stderr


@pytest.mark.parametrize(
    ("code", "said"),
    [(errno.EROFS, "the file system is read-only"), (errno.ENOSPC, "the file system is full")],
)
def test_a_write_to_a_full_or_read_only_file_system_is_described(code, said):
    from pmpipe.storage import writes

    refused = OSError(code, "as the OS says", "results/x/nbody.zarr/zarr.json")
    message = disk.failure(refused)
    assert "results/x/nbody.zarr/zarr.json" in message and f": {said}: free space" in message
    assert "complete stores are kept" in message
    try:  # a store write that failed because of it
        raise writes.StoreWriteError("writing array 'density' failed") from refused
    except writes.StoreWriteError as err:
        assert disk.failure(err).startswith(f"writing array 'density' failed: {said}")
    assert disk.failure(OSError(errno.ENOENT, "no such file")) is None
    assert disk.failure(OSError(errno.EACCES, "cannot read")) is None
    assert disk.failure(ValueError("not a disk")) is None


def test_a_job_whose_backend_cannot_start_is_one_message(tmp_path):
    from pmpipe.runtime import backend

    if any("cuda" in plugin for plugin in backend.installed_plugins()):
        pytest.skip("JAX's CUDA plugin is installed here: the backend may start")
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY)
    config_json = campaign.write_run_files(campaign.load(path), tmp_path / "results")[0]
    out = subprocess.run(
        [sys.executable, "-m", "pmpipe.job.pipeline", str(config_json)],
        env={**os.environ, "JAX_PLATFORMS": "cuda"},
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
    )
    assert out.returncode == 2, out.stderr[-2000:]
    errors = [line for line in out.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "JAX_PLATFORMS='cuda'" in errors[0]
    assert "export JAX_PLATFORMS=cpu" in errors[0] and "Traceback" not in out.stderr


def test_a_gpu_campaign_under_the_local_profile_without_gpus_stops_snakemake(tmp_path):
    from pmpipe.runtime import backend

    if backend.gpu_device_files():
        pytest.skip("this machine has a GPU: the campaign may run here")
    work = tmp_path / "work"
    work.mkdir()
    (work / "tiny.yaml").write_text(TINY.replace("platform: cpu", "platform: gpu"))
    out = run_snakemake(
        work,
        "-n",
        "--profile",
        str(REPO / "profiles" / "local"),
        "--config",
        "campaign=tiny.yaml",
        check=False,
        share_programs=False,
    )
    assert_one_message(out, "execution.platform = gpu, but this machine has no GPU", "slurm")
