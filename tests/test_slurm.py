"""pmpipe on a real SLURM (tests/slurm_cluster.py): `pmpipe submit` through submitit (one
stage; a campaign as a job array) equal to local results, a second submit that leaves out the
runs still queued, and a failing job that fails the workflow naming its log. The quick start
through `snakemake --profile profiles/slurm-apptainer` with multi-process srun steps:
tests/test_containers.py; profiles/slurm's packed job of srun steps, preempted and requeued:
tests/test_preemption.py."""

import os
import subprocess
import sys

import pytest
import yaml
import zarr
from conftest import REPO, TINY, job_env, run_snakemake, same_store

from pmpipe import stages
from pmpipe.campaigns import campaign
from pmpipe.results import summary_parts
from pmpipe.stages import registry

pytestmark = pytest.mark.slow

STATUS_CHECKS = (
    "--slurm-init-seconds-before-status-checks",
    "2",
    "--seconds-between-status-checks",
    "2",
)


def slurm_env(**extra):
    env = {  # the session's compiled programs (JAX_COMPILATION_CACHE_DIR) kept
        k: v for k, v in os.environ.items() if not k.startswith(("PMPIPE_", "SLURM_"))
    }
    return {**env, "PMPIPE_SLURM_PARTITION": "pmpipe", **extra}


def snakemake_slurm(workdir, campaign_file, check=True, timeout=1200):
    return run_snakemake(
        workdir,
        "--profile",
        str(REPO / "profiles/slurm"),
        "--configfile",
        str(REPO / "profiles/slurm/site.yaml"),
        "--config",
        f"campaign={campaign_file}",
        *STATUS_CHECKS,
        check=check,
        env=slurm_env(),
        timeout=timeout,
        main=REPO / "tests" / "slurm_snakemake.py",  # status every 2 s
        share_programs=False,
    )  # each campaign compiles its own programs


def job_count():
    out = subprocess.run(
        ["sacct", "-n", "-X", "-P", "-S", "2000-01-01", "-o", "JobID"],
        capture_output=True,
        text=True,
        check=True,
    )
    return len(out.stdout.split())


def two_processes_per_run(text: str) -> str:
    """A campaign file with each run on 2 devices in 2 processes of one node (cpu)."""
    data = yaml.safe_load(text)
    data["base"].setdefault("parallel", {})["pdims"] = [1, 2]
    data["execution"].update(devices_per_node=2, processes_per_node=2, cpus_per_task=1)
    return yaml.safe_dump(data)


def _submit(workdir, *args, wait=True, **env):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pmpipe.cli",
            "submit",
            "tiny.yaml",
            *(["--wait"] if wait else []),
            "--site",
            str(REPO / "profiles/slurm/site.yaml"),
            *args,
        ],
        capture_output=True,
        text=True,
        cwd=workdir,
        timeout=900,
        env=job_env(slurm_env(**env)),
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out.stdout + out.stderr


def test_submit_one_stage_then_the_campaign_as_a_job_array(slurm, tiny_local, tmp_path):
    """On the cluster's 2 (fake) GPUs: gpu platform, one process per GPU."""
    data = yaml.safe_load(TINY)
    data["execution"] = {"platform": "gpu", "devices_per_node": 2, "cpus_per_task": 1}
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(data))
    first = "tiny-fiducial-r0"
    out = _submit(tmp_path, "--run", first, "--stage", "ic")
    assert f"{first}: SLURM job" in out
    results, local = tmp_path / "results" / "tiny", tiny_local / "results" / "tiny"
    same_store(local / first / "ic.zarr", results / first / "ic.zarr")
    assert zarr.open_group(results / first / "ic.zarr", mode="r").attrs["process_count"] == 2
    assert not (results / first / "nbody.zarr").exists()

    out = _submit(tmp_path, "--max-parallel", "2")
    array_ids = {
        line.split("SLURM job ")[1].split(",")[0].split("_")[0]
        for line in out.splitlines()
        if "SLURM job" in line
    }
    assert len(array_ids) == 1, out  # both runs in one array
    for run in ("tiny-fiducial-r0", "tiny-fiducial-r1"):
        for stage in stages.STAGES:
            same_store(local / run / f"{stage}.zarr", results / run / f"{stage}.zarr")
    same_store(local / "summaries.zarr", results / "summaries.zarr")
    parts = [summary_parts.current_rows(p, results) for p in (results / "parts").iterdir()]
    assert sorted(r for rows in parts for r in rows) == ["tiny-fiducial-r0", "tiny-fiducial-r1"]


def test_failing_job_fails_the_workflow_naming_its_log(slurm, tmp_path):
    (tmp_path / "tiny.yaml").write_text(
        two_processes_per_run(TINY.replace("realisations: 2", "realisations: 1"))
    )
    camp = campaign.load(tmp_path / "tiny.yaml")
    campaign.write_run_files(camp, tmp_path / "results")
    run_dir = tmp_path / "results" / "tiny" / "tiny-fiducial-r0"
    registry.run_stage("ic", run_dir / "config.json")
    # damage the input of the nbody stage: its displacement chunks keep their sizes (the store
    # still looks complete when the workflow plans) but no longer decode
    chunks = [
        p
        for p in (run_dir / "ic.zarr" / "displacement").rglob("*")
        if p.is_file() and p.name != "zarr.json"
    ]
    assert chunks
    for chunk in chunks:
        chunk.write_bytes(b"x" * chunk.stat().st_size)
    out = snakemake_slurm(tmp_path, "tiny.yaml", check=False, timeout=600)  # never hangs
    assert out.returncode != 0
    text = out.stdout + out.stderr
    block = text[text.index("Error in rule runs_job0000:") :][:3000]
    block = block[: block.index("Logfile")] if "Logfile" in block else block
    assert "SLURM-job" in block and "'FAILED'" in block, block
    log = tmp_path / "results" / "tiny" / "logs" / "job0000.log"
    assert f"log: {log.relative_to(tmp_path)}" in block, block
    assert ".snakemake/slurm_logs/rule_runs_job0000/" in block, block
    assert "[pmpipe run tiny-fiducial-r0] FAILED in stage nbody" in log.read_text()


def test_a_second_submit_leaves_out_the_runs_of_jobs_still_queued(slurm, tmp_path):
    data = yaml.safe_load(TINY)
    data["execution"] = {**data.get("execution", {}), "runs_per_job": 1}  # an array of 2 tasks
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(data))
    first = _submit(tmp_path, wait=False, PMPIPE_SLURM_EXTRA="--hold")  # its tasks wait
    (array,) = {
        line.split("SLURM job ")[1].split(",")[0].split("_")[0]
        for line in first.splitlines()
        if "SLURM job " in line
    }
    env = slurm_env()
    try:
        again = _submit(tmp_path, wait=False)
        assert "2 run(s) are in SLURM jobs still queued or running" in again
        assert "SLURM job " not in again  # nothing submitted twice
    finally:
        subprocess.run(["scancel", array], check=True, env=env)
