"""The host side of a SLURM job whose pmpipe runs in an Apptainer image, which has no SLURM
client (``squeue``, ``scontrol``):

    python -m pmpipe.runtime.host_requeue -- [srun ...] apptainer exec ... python -m pmpipe.job.pipeline ...

runs the command with the job's end time in SLURM_JOB_END_TIME (Apptainer passes the
variable in; SLURM sets it in newer versions, else squeue's time left gives it here), so that
pmpipe in the image stops ahead of the time limit (``--stop-ahead``, pmpipe.runtime.slurm_job).
SIGTERM, SIGUSR2 and SIGINT that reach this process are passed to the command. pmpipe in the
image, stopped by SIGUSR2 with its checkpoint written, asks for the job's requeue in a file
of the working directory (slurm_job.REQUEUE_FILE_VARIABLE) instead of running scontrol;
this process then requeues the job with the host's ``scontrol`` and waits for SLURM to end
it, as pmpipe does where it has a SLURM client. Its exit status is the command's."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from pmpipe.runtime import log, slurm_job

LOG = log.get(__name__)
FORWARDED = (signal.SIGTERM, signal.SIGUSR2, signal.SIGINT)


def job_environment(environ=None, now: float | None = None) -> dict[str, str]:
    """The environment for the command: ``environ`` (default os.environ) with
    SLURM_JOB_END_TIME (Unix seconds) added inside a SLURM job with a time limit where SLURM
    did not set it."""
    env = dict(os.environ if environ is None else environ)
    if env.get(slurm_job.END_TIME_VARIABLE, "").isdigit():  # SLURM's own
        return env
    left = slurm_job.time_left(env)
    if left is not None:
        env[slurm_job.END_TIME_VARIABLE] = str(int(time.time() if now is None else now) + left)
    return env


def run(command: list[str], environ=None) -> int:
    """Run ``command`` as the module's docstring says; returns its exit status (128 + the
    signal's number when a signal ended it)."""
    asked = Path.cwd() / f".pmpipe-requeue-{os.getpid()}"  # the cwd is bound into the image
    env = job_environment(environ)
    env[slurm_job.REQUEUE_FILE_VARIABLE] = str(asked)
    child: list[subprocess.Popen] = []
    pending: list[int] = []

    def forward(signum, _frame):
        if child:
            child[0].send_signal(signum)
        else:
            pending.append(signum)

    for forwarded in FORWARDED:
        signal.signal(forwarded, forward)
    child.append(subprocess.Popen(command, env=env))
    for early in pending:  # arrived before the command started
        child[0].send_signal(early)
    status = child[0].wait()
    status = 128 - status if status < 0 else status
    if not asked.exists():
        return status
    asked.unlink()
    requeued = slurm_job.requeue_this_job(environ)
    if requeued is None:
        return status
    LOG.error("[pmpipe] %s", requeued[1])
    if requeued[0]:
        for forwarded in FORWARDED:
            signal.signal(forwarded, signal.SIG_DFL)  # SLURM's SIGTERM now ends this process
        slurm_job.await_requeued_end()
    return status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pmpipe.runtime.host_requeue",
        description="run a SLURM job's command in an image: pass the job's end time in, "
        "requeue the job when the command stopped for a checkpoint",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS ...]")
    command = parser.parse_args(argv).command
    command = command[1:] if command[:1] == ["--"] else command
    if not command:
        parser.error("give the command after --")
    log.configure(stamped=True)
    return run(command)


if __name__ == "__main__":
    sys.exit(main())
