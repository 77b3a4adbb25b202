"""The SLURM job this process runs in: its id, its time left, a signal ahead of its time limit
and its requeue (``scontrol`` and ``squeue`` of the job's own SLURM)."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time


def this_job(environ=None) -> str | None:
    """The id of the SLURM job this process runs in (<array>_<index> for an array element),
    or None outside a SLURM job."""
    environ = os.environ if environ is None else environ
    if environ.get("SLURM_ARRAY_JOB_ID") and environ.get("SLURM_ARRAY_TASK_ID"):
        return f"{environ['SLURM_ARRAY_JOB_ID']}_{environ['SLURM_ARRAY_TASK_ID']}"
    return environ.get("SLURM_JOB_ID") or None


END_TIME_VARIABLE = "SLURM_JOB_END_TIME"  # the job's end, Unix seconds: SLURM's, or host_requeue's
PREEMPTED_EXIT = 3  # exit status of a process that a signal stopped, its checkpoint written
# Set by pmpipe.runtime.host_requeue for a command in an image without a SLURM client: the
# file in which the command's process 0 asks the host side to requeue the job.
REQUEUE_FILE_VARIABLE = "PMPIPE_REQUEUE_FILE"

# The longest a process waits for SLURM to end its requeued job (SIGTERM to every process of
# the job at once, SIGKILL after the cluster's KillWait, 30 s by default).
REQUEUE_END_S = 300.0


def requeue_this_job(environ=None) -> tuple[bool, str] | None:
    """``scontrol requeue`` of the SLURM job this process runs in: whether SLURM took it and
    what happened, or None outside a SLURM job. Without scontrol, the job's host side is asked
    to requeue it where there is one (REQUEUE_FILE_VARIABLE)."""
    job = this_job(environ)
    if not job:
        return None
    try:
        done = subprocess.run(
            ["scontrol", "requeue", job], capture_output=True, text=True, check=False
        )
    except OSError as err:  # no SLURM client here, e.g. in an image without the site's binds
        if _ask_host_side(job, environ):
            return False, (
                f"SLURM job {job}: no scontrol here ({err.strerror}); its host side "
                "(pmpipe.runtime.host_requeue) requeues it"
            )
        return False, f"SLURM job {job} could not be requeued: scontrol: {err.strerror}"
    if done.returncode:
        return False, f"SLURM job {job} could not be requeued: {done.stderr.strip()}"
    return True, f"SLURM job {job} requeued: it resumes from the checkpoint when it starts again"


def _ask_host_side(job: str, environ=None) -> bool:
    """Ask the host side of the job (pmpipe.runtime.host_requeue) to requeue it: write the
    job's id to the file that REQUEUE_FILE_VARIABLE names. Whether it was asked."""
    path = (os.environ if environ is None else environ).get(REQUEUE_FILE_VARIABLE)
    if not path:
        return False
    try:
        with open(path, "w") as fh:
            fh.write(job + "\n")
    except OSError:
        return False
    return True


def await_requeued_end(seconds: float = REQUEUE_END_S) -> None:
    """Wait, after this job was requeued, for SLURM to end this process (its SIGTERM, with the
    default action, ends it): a job whose processes all exit first is recorded as failed (or
    completed) in the accounting before the requeue, and the Snakemake SLURM executor reports
    that record. Returns after ``seconds`` if no signal came."""
    time.sleep(seconds)


def slurm_seconds(text: str) -> int | None:
    """Seconds of a SLURM duration as squeue prints it ([days-]hours:minutes:seconds,
    minutes:seconds); None for UNLIMITED, NOT_SET, INVALID or anything else."""
    days, _, clock = text.strip().rpartition("-")
    parts = clock.split(":")
    if (
        not (days == "" or days.isdigit())
        or not 2 <= len(parts) <= 3
        or not all(p.isdigit() for p in parts)
    ):
        return None
    seconds = 0
    for part in parts:
        seconds = 60 * seconds + int(part)
    return seconds + 86400 * int(days or 0)


def time_left(environ=None, now: float | None = None) -> int | None:
    """Seconds until the time limit of the SLURM job this process runs in: from
    SLURM_JOB_END_TIME (Unix seconds; ``now`` default time.time()) where it is set (by SLURM, or
    by pmpipe.runtime.host_requeue for a process in an image), else squeue's %L; None outside
    a job, without a limit, or when squeue does not answer."""
    environ = os.environ if environ is None else environ
    job = this_job(environ)
    if not job:
        return None
    end = environ.get(END_TIME_VARIABLE, "")
    if end.isdigit() and int(end) > 0:
        return max(0, int(end) - int(time.time() if now is None else now))
    try:
        done = subprocess.run(
            ["squeue", "-h", "-j", job, "-o", "%L"],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return slurm_seconds(done.stdout) if done.returncode == 0 else None


def signal_before_time_limit(lead_s: int, environ=None) -> float | None:
    """Inside a SLURM job, send this process SIGUSR2 ``lead_s`` seconds before the job's time
    limit, as ``sbatch --signal=USR2@lead_s`` does for the job's steps: a stage run in the
    batch step (a single-process Snakemake job) is not one of them. Returns the seconds until
    the signal, or None (no job, no limit, lead_s 0)."""
    left = time_left(environ) if lead_s > 0 else None
    if left is None:
        return None
    delay = max(0.0, float(left - lead_s))
    timer = threading.Timer(delay, os.kill, (os.getpid(), signal.SIGUSR2))
    timer.daemon = True
    timer.start()
    return delay
