"""`pmpipe doctor`: the JSON report has every field, in one process, under mpiexec and under
srun; its warnings name the settings known to break runs."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

from pmpipe.diagnostics import doctor

CPU = {
    "backend": "cpu",
    "local_devices": [{"id": 0, "kind": "cpu", "platform": "cpu"}],
    "cuda_plugin": None,
}


def _doctor(*launcher, args=("--json",), python=(sys.executable, "-m", "pmpipe.cli", "doctor")):
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # one device a process
    out = subprocess.run(
        [*launcher, *python, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def _reports_per_rank(tmp_path, *launcher):
    """The JSON reports of the processes a launcher starts, each written to a file named by its
    rank: a pipe shared by the processes interleaves their lines (srun), and MPICH's `-l` labels
    chunks rather than lines."""
    write = 'exec "$1" -m pmpipe.cli doctor --json > "$0/${SLURM_PROCID:-$PMI_RANK}.json"'
    _doctor(*launcher, "sh", "-c", write, str(tmp_path), sys.executable, python=(), args=())
    return [json.loads(path.read_text()) for path in sorted(tmp_path.glob("*.json"))]


def test_one_process_reports_every_field_and_a_table():
    report = json.loads(_doctor())
    assert set(report) == set(doctor.FIELDS)
    assert report["jax"]["backend"] == "cpu" and len(report["jax"]["local_devices"]) == 1
    assert report["processes"] == {
        "launcher": "single",
        "count": 1,
        "local_device_ids": None,
        "gpu_platform": False,
    }  # no GPU plugin here: gloo on CPU
    assert report["jaxdecomp"]["version"] and report["jaxdecomp"]["backend"] == "jax"
    assert report["container"]["inside"] is False and report["warnings"] == []
    assert Path(report["pmpipe"]["package"]) == Path(doctor.__file__).resolve().parents[1]
    table = _doctor(args=())
    for name in ("jax", "devices", "processes", "jaxdecomp", "nccl", "mpi", "container"):
        assert any(line.startswith(name) for line in table.splitlines()), (name, table)
    assert table.rstrip().endswith("no warnings")


@pytest.mark.slow
def test_two_processes_under_mpiexec_each_report_the_launch(tmp_path):
    assert shutil.which("mpiexec"), "mpiexec missing: pip install mpich mpi4py (the [test] extra)"
    reports = _reports_per_rank(tmp_path, shutil.which("mpiexec"), "-n", "2")
    assert sorted(
        (r["processes"]["launcher"], r["processes"]["count"], r["processes"]["local_device_ids"])
        for r in reports
    ) == [("mpi", 2, [0]), ("mpi", 2, [1])]  # MPICH's local ranks
    assert all("Version" in r["mpi"]["version"] for r in reports), reports[0]["mpi"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "binding, ids",
    [((), [[0], [1]]), (("--gres=gpu:2",), [[0], [1]]), (("--gpus-per-task=1",), [[0], [0]])],
    ids=["no-gpus", "gres", "gpus-per-task"],
)
def test_two_processes_under_srun_report_the_job_and_step(slurm, tmp_path, binding, ids):
    """With the test cluster's 2 (fake) GPUs given to both tasks or one to each, every process
    names the GPU it drives among those it sees."""
    reports = _reports_per_rank(tmp_path, "srun", "-n", "2", "-p", "pmpipe", "-t", "5", *binding)
    assert sorted(r["processes"]["local_device_ids"] for r in reports) == ids
    assert all(
        r["processes"]["launcher"] == "slurm" and r["processes"]["count"] == 2 for r in reports
    )
    assert all(r["slurm"]["job"] and r["slurm"]["step"] is not None for r in reports)
    assert all(r["warnings"] == [] for r in reports), reports[0]["warnings"]


def _facts(jax=CPU, processes=1, driver=None):
    return {
        "jax": jax,
        "processes": {"launcher": "slurm", "count": processes},
        "cuda_driver": driver,
    }


def test_warnings_name_the_setting_to_change():
    assert doctor.warnings(_facts(), {}) == []
    (cleaned,) = doctor.warnings(_facts(), {"SLURM_JOB_ID": "7"})  # SLURM_* dropped but the id
    assert "SLURM job 7" in cleaned and "SLURM_PROCID" in cleaned
    assert doctor.warnings(_facts(), {"SLURM_JOB_ID": "7", "SLURM_PROCID": "0"}) == []
    gpus = {
        "backend": "gpu",
        "cuda_plugin": "jax-cuda12-plugin 0.6.0",
        "local_devices": [{"id": i, "kind": "H100", "platform": "gpu"} for i in range(4)],
    }
    shared = {"SLURM_JOB_ID": "7", "SLURM_PROCID": "1", "SLURM_NTASKS_PER_NODE": "4"}
    (prealloc,) = doctor.warnings(_facts(gpus, 4, "550.54.15"), shared)
    assert "XLA_PYTHON_CLIENT_PREALLOCATE=false" in prealloc and "--gpus-per-task=1" in prealloc
    assert (
        doctor.warnings(
            _facts(gpus, 4, "550.54.15"), shared | {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
        )
        == []
    )
    (old,) = doctor.warnings(_facts(gpus, 1, "470.82.01"), {})
    assert "470.82.01" in old and "525.60.13" in old and "CUDA 12" in old
    assert "use a node with a newer one" in old
    cuda13 = gpus | {"cuda_plugin": "jax-cuda13-plugin 0.10.2"}
    (older,) = doctor.warnings(_facts(cuda13, 1, "570.86.10"), {})
    assert "580.65.6" in older and "-r requirements/gpu-cuda12.txt" in older
    flags = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
    assert doctor.warnings(_facts(CPU, 1), flags) == []
    (devices,) = doctor.warnings(_facts(CPU, 2), flags)
    assert "xla_force_host_platform_device_count" in devices and "unset it" in devices


def test_the_check_imports_every_module_and_catches_a_wrong_fft(monkeypatch):
    from pmpipe.physics.mesh import fft

    assert doctor.self_check() == []
    right = fft.r2c
    monkeypatch.setattr(fft, "r2c", lambda field, mesh: right(field, mesh) * 1.001)
    problems = doctor.self_check()
    assert len(problems) == 1 and problems[0].startswith(
        "FFT on the local devices differs from numpy's"
    )


def _without_cuda_jax():
    from pmpipe.runtime import backend

    if any("cuda" in p for p in backend.installed_plugins()):
        pytest.skip("this machine has JAX for NVIDIA GPUs: JAX_PLATFORMS=cuda would start")


def test_a_backend_jax_cannot_start_is_diagnosed_without_a_traceback(tmp_path):
    """JAX_PLATFORMS=cuda with JAX for the CPU only: doctor reports it with the fix and exits
    2; a stage exits 2 with the same one message; PMPIPE_DEBUG=1 shows the traceback."""
    _without_cuda_jax()
    from pmpipe.campaigns import campaign

    env = {**os.environ, "JAX_PLATFORMS": "cuda"}
    env.pop("XLA_FLAGS", None)
    command = [sys.executable, "-m", "pmpipe.cli"]

    def run(*args, **extra):
        return subprocess.run(
            [*command, *args], capture_output=True, text=True, env={**env, **extra}, timeout=300
        )

    report = run("doctor")
    assert report.returncode == 2 and "Traceback" not in report.stderr
    assert "backend None" in report.stdout
    for text in ("JAX_PLATFORMS='cuda'", "requirements/gpu-cuda13.txt", "export JAX_PLATFORMS=cpu"):
        assert text in report.stdout, report.stdout  # the table's warnings
    path = tmp_path / "c.yaml"
    path.write_text(json.dumps({"name": "nogpu", "base": {"box": {"particles": 16}}}))
    cfg = campaign.write_run_files(campaign.load(path), tmp_path / "results")[0]
    stage = run("run", "ic", str(cfg))
    assert stage.returncode == 2 and "Traceback" not in stage.stderr, stage.stderr[-2000:]
    assert stage.stderr.count("error: JAX could not start the backend") == 1
    assert "Traceback" in run("run", "ic", str(cfg), PMPIPE_DEBUG="1").stderr


def test_the_diagnosis_names_what_is_installed_and_the_fix():
    from pmpipe.runtime import backend

    cpu_only = backend.diagnosis("cuda", "", "0.10.2", [])
    assert "no device plugin" in cpu_only and backend.GPU_LOCK in cpu_only
    no_gpu = backend.diagnosis(
        "cuda", "no CUDA devices found", "0.10.2", ["jax-cuda13-plugin 0.10.2"]
    )
    assert "(no CUDA devices found)" in no_gpu and "jax-cuda13-plugin 0.10.2" in no_gpu
    assert "nvidia-smi" in no_gpu and backend.GPU_LOCK not in no_gpu
    assert backend.failure(ValueError("not JAX's")) is None  # other errors stay as they are


def test_each_driver_is_told_the_lock_of_the_newest_cuda_it_runs():
    assert doctor.lock_for_driver((580, 65, 6)) == "requirements/gpu-cuda13.txt"
    assert doctor.lock_for_driver((570, 86, 10)) == "requirements/gpu-cuda12.txt"
    assert doctor.lock_for_driver((525, 60, 13)) == "requirements/gpu-cuda12.txt"
    assert doctor.lock_for_driver((525, 60, 12)) is None and doctor.lock_for_driver(None) is None
    for major in doctor.MIN_DRIVER:
        assert (REPO / f"requirements/gpu-cuda{major}.txt").is_file()


@pytest.mark.slow
def test_doctor_distributed_under_mpiexec_checks_the_collectives_of_every_process():
    """3 processes (2 under srun: the next test)."""
    processes = 3
    assert shutil.which("mpiexec"), "mpiexec missing: pip install mpich mpi4py (the [test] extra)"
    out = _doctor(shutil.which("mpiexec"), "-n", str(processes), args=("--distributed",))
    assert f"{processes} processes (mpi), {processes} devices" in out
    ranks = [line for line in out.splitlines() if line.startswith("rank ")]
    assert [line.split()[1] for line in ranks] == [str(r) for r in range(processes)]
    assert all("gloo" in line and "memory fraction n/a" in line for line in ranks)
    assert "all-to-all: ok; psum: ok" in out and out.count("GB/s per device") == 3
    assert "no disagreement between the processes" in out


@pytest.mark.slow
def test_srun_doctor_distributed_passes_in_the_slurm_cluster(slurm):
    out = _doctor("srun", "-n", "2", "-p", "pmpipe", "-t", "5", args=("--distributed",))
    assert "2 processes (slurm), 2 devices" in out and "all-to-all: ok; psum: ok" in out
    assert "no disagreement between the processes" in out


def test_processes_that_differ_are_named_with_their_ranks():
    from pmpipe.diagnostics import distributed_check

    same = {"pmpipe": "0.1.0", "jax": "0.10.2", "platform": "gpu", "device_kind": "H100"}
    same |= {"local_devices": 4, "fraction": "0.75, preallocate false"}
    every = [
        {**same, "rank": 0, "transport": "NCCL 2.27.3 (/a/libnccl.so.2)"},
        {**same, "rank": 1, "transport": "NCCL 2.27.3 (/b/libnccl.so.2)"},
        {**same, "rank": 2, "transport": "NCCL 2.21.5 (/c/libnccl.so.2)", "local_devices": 2},
    ]
    assert distributed_check.disagreements(every) == [
        "local_devices: 4 on ranks [0, 1]; 2 on ranks [2]",
        "transport: NCCL 2.27.3 on ranks [0, 1]; NCCL 2.21.5 on ranks [2]",
    ]
    assert distributed_check.disagreements(every[:2]) == []
    assert distributed_check.memory_fraction("gpu", {}) == "0.75, preallocate true"
    assert distributed_check.nccl_loaded("/nonexistent/maps") is None
