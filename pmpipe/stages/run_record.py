"""The record of a run's last computation, ``<run folder>/outcome.json``: whether it finished
or failed (the stage and the error's first line), when, in how many seconds, and the bytes
of the stores it made. Written by the job that ran it (pmpipe.stages.pipeline), read by
``pmpipe status`` and the campaign's collection; the stores' completion markers stay the
truth of what is complete."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

from pmpipe.runtime import slurm_job
from pmpipe.storage import store

OUTCOME = "outcome.json"
STATES = ("done", "failed")


def write(
    run_dir: str | Path,
    error: str | None,
    stage: str | None,
    seconds: float,
    store_bytes: int,
) -> Path:
    """Write the run's record (replacing the file at once, never half written): 'failed' in
    ``stage`` with ``error``, else 'done'; the run's ``seconds`` and the ``store_bytes`` its
    stages wrote. Returns the path."""
    path = Path(run_dir) / OUTCOME
    record = {
        "state": STATES[error is not None],
        "stage": stage,
        "error": error,
        "seconds": seconds,
        "bytes": store_bytes,
        "finished": store.now(),
        "host": socket.gethostname(),
        "slurm_job": slurm_job.this_job(),
    }
    partial = path.with_name(f".{OUTCOME}.{os.getpid()}")
    partial.write_text(json.dumps(record, indent=1) + "\n")
    os.replace(partial, path)
    return path


def read(run_dir: str | Path) -> dict | None:
    """The run's record, or None when it has none (or it does not parse)."""
    try:
        with open(os.path.join(run_dir, OUTCOME)) as fh:  # a string path: read for every run
            record = json.load(fh)
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and record.get("state") in STATES else None
