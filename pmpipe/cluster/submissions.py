"""The SLURM job arrays ``pmpipe submit`` sent for a campaign,
``<results>/<campaign>/.pmpipe/submitted.json``: each array's job id and the run ids of each
of its tasks. A later ``pmpipe submit`` asks squeue which of those tasks are still pending or
running and leaves their runs out, so that a campaign submitted again while its arrays wait
does not put their runs in a second array (where squeue answers; jobs of the Snakemake
workflow are not recorded here)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

from pmpipe.campaigns import run_index
from pmpipe.runtime import log

LOG = log.get(__name__)
SUBMITTED = f"{run_index.STATE_FOLDER}/submitted.json"


def read(campaign_dir: str | Path) -> dict[str, list[list[str]]]:
    """Array job id -> the run ids of each task, as recorded (empty when none is)."""
    try:
        found = json.loads((Path(campaign_dir) / SUBMITTED).read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def write(campaign_dir: str | Path, arrays: dict[str, list[list[str]]]) -> None:
    """Replace the record at once (never half written)."""
    path = Path(campaign_dir) / SUBMITTED
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text(json.dumps(arrays, indent=1) + "\n")
    os.replace(partial, path)


def record(campaign_dir: str | Path, job_id: str, tasks: list[list[str]]) -> None:
    """Add an array (its job id; the run ids of each task, in task order)."""
    write(campaign_dir, read(campaign_dir) | {str(job_id): tasks})


def squeue_tasks(job_ids: list[str]) -> set[str] | None:
    """The tasks of the arrays ``job_ids`` that SLURM still holds (pending, running,
    completing, requeued, suspended), as '<job id>_<task>'; None where squeue is absent or
    fails (then nothing is known to be queued)."""
    if not job_ids:
        return set()
    if shutil.which("squeue") is None:
        return None
    try:
        out = subprocess.run(
            ["squeue", "--noheader", "--array", "--format=%i", f"--jobs={','.join(job_ids)}"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:  # squeue refuses job ids it no longer knows: none of them is queued
        return set() if "Invalid job id" in out.stderr else None
    return {line.strip() for line in out.stdout.splitlines() if line.strip()}


def queued_runs(campaign_dir: str | Path) -> set[str]:
    """The run ids of the recorded tasks SLURM still holds; the arrays it holds no task of
    are dropped from the record."""
    arrays = read(campaign_dir)
    held = squeue_tasks(list(arrays))
    if held is None:
        if arrays:
            LOG.warning(
                "warning: squeue did not answer: runs of earlier arrays (%s) that are still "
                "queued may be submitted again",
                ", ".join(arrays),
            )
        return set()
    runs = {
        run
        for job_id, tasks in arrays.items()
        for i, task in enumerate(tasks)
        if _task_id(job_id, i, len(tasks)) in held
        for run in task
    }
    held_jobs = {h.split("_")[0] for h in held}
    write(campaign_dir, {j: t for j, t in arrays.items() if j in held_jobs})
    return runs


def _task_id(job_id: str, task: int, tasks: int) -> str:
    """How squeue names a task: '<job id>_<task>', or the job id alone where the array had one
    task (submitit submits a single job then)."""
    return job_id if tasks == 1 else f"{job_id}_{task}"
