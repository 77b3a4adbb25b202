"""The GPU tier (``pytest -m gpu``): the quick start on the GPU, one GPU against the CPU from the
same config, the device peak against the plan's estimate, and ``pmpipe doctor --check``. Each
runs pmpipe in a process of its own that sees the GPU (the test session itself is on 8 CPU
devices); without an NVIDIA GPU every test is skipped with that reason."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import yaml
import zarr
from conftest import REPO, run_snakemake

from pmpipe.campaigns import campaign, resources

QUICKSTART = REPO / "config" / "quickstart.yaml"


def _gpus() -> list[str]:
    """The lines of ``nvidia-smi -L`` naming a GPU (none where there is no NVIDIA driver)."""
    if shutil.which("nvidia-smi") is None:
        return []
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60)
    return [line for line in out.stdout.splitlines() if line.startswith("GPU ")]


pytestmark = [
    pytest.mark.gpu,
    pytest.mark.slow,  # minutes on a GPU: not in the fast tier
    pytest.mark.skipif(not _gpus(), reason="no NVIDIA GPU: nvidia-smi lists none on this machine"),
]


def _env(platform: str) -> dict:
    """The environment of a pmpipe process on ``platform`` (cuda or cpu): the device peak is
    the true one (no preallocation); on the GPU, XLA's host-device flags are dropped."""
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "XLA_FLAGS")}
    env.update(JAX_PLATFORMS=platform, XLA_PYTHON_CLIENT_PREALLOCATE="false")
    if platform == "cpu":
        env["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "")
    return env


def _quickstart(folder, platform="gpu", **outputs) -> campaign.Campaign:
    """The quick-start campaign file on ``platform`` in ``folder`` (its outputs updated)."""
    data = yaml.safe_load(QUICKSTART.read_text())
    data["execution"].update(platform=platform, device_memory_gb=16)
    data["base"]["outputs"].update(outputs)
    (folder / "quickstart.yaml").write_text(yaml.safe_dump(data))
    return campaign.load(folder / "quickstart.yaml")


def _job(configs, report, platform) -> dict:
    """Run the configs as one packed job on ``platform``; its job record."""
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pmpipe.job.pipeline",
            "--report",
            str(report),
            *map(str, configs),
        ],
        capture_output=True,
        text=True,
        env=_env(platform),
        cwd=REPO,
        timeout=900,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads(report.read_text())


@pytest.fixture(scope="module")
def paired(tmp_path_factory):
    """The quick start's first run (final particles kept) on the GPU and on the CPU: each
    platform's run folder and job record."""
    runs = {}
    for platform, env in (("gpu", "cuda"), ("cpu", "cpu")):
        folder = tmp_path_factory.mktemp(platform)
        camp = _quickstart(folder, particles=True)
        config = campaign.write_run_files(camp, folder / "results")[0]
        runs[platform] = config.parent, _job([config], folder / "job.json", env), camp
    return runs


def test_the_quick_start_runs_on_the_gpu(tmp_path):
    _quickstart(tmp_path)
    run_snakemake(
        tmp_path,
        "--profile",
        str(REPO / "profiles/local"),
        "--config",
        "campaign=quickstart.yaml",
        env=_env("cuda"),
    )
    results = tmp_path / "results" / "quickstart"
    jobs = [json.loads(p.read_text()) for p in (results / "benchmarks").glob("*.json")]
    assert jobs and {job["platform"] for job in jobs} == {"gpu"}
    assert all(run["error"] is None for job in jobs for run in job["runs"])
    summaries = zarr.open_group(results / "summaries.zarr", mode="r")
    assert summaries["pk"].shape[0] == len(campaign.load(tmp_path / "quickstart.yaml").runs)


def test_one_gpu_reproduces_the_cpu(paired):
    (gpu, gpu_job, _), (cpu, cpu_job, _) = paired["gpu"], paired["cpu"]
    assert (gpu_job["platform"], cpu_job["platform"]) == ("gpu", "cpu")
    pk_gpu = zarr.open_group(gpu / "summaries.zarr", mode="r")["pk"][:]
    pk_cpu = zarr.open_group(cpu / "summaries.zarr", mode="r")["pk"][:]
    assert np.all(np.isfinite(pk_cpu)) and np.abs(pk_cpu).max() > 0
    assert np.max(np.abs(pk_gpu - pk_cpu) / np.abs(pk_cpu)) <= 1e-4
    # float32 on two backends: particles agree to 1e-3 of their rms displacement
    d_gpu = zarr.open_group(gpu / "nbody.zarr", mode="r")["displacement"][:].astype(np.float64)
    d_cpu = zarr.open_group(cpu / "nbody.zarr", mode="r")["displacement"][:].astype(np.float64)
    rms = np.sqrt(np.mean(d_cpu**2))
    assert rms > 0
    assert np.sqrt(np.mean((d_gpu - d_cpu) ** 2)) <= 1e-3 * rms


def test_the_device_peak_stays_within_the_plans_estimate(paired):
    _, job, camp = paired["gpu"]
    peak = job["peak_device_mb"] * 1e6
    estimate = resources.estimate(camp.runs[0].run, camp.execution).memory_per_device_bytes
    assert 0 < peak <= estimate, (peak, estimate)


def test_doctor_check_passes_on_the_gpu():
    out = subprocess.run(
        [sys.executable, "-m", "pmpipe.cli", "doctor", "--check"],
        capture_output=True,
        text=True,
        env=_env("cuda"),
        cwd=REPO,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "backend gpu" in out.stdout, out.stdout[-3000:]
