"""The record of a run's last computation, ``<run folder>/outcome.json``: 'started' when a job
begins to compute it, then 'done' or 'failed' (the stage and the error's first line), when, in
how many seconds, the bytes of the stores it made, and for a done run the fingerprint of each
store's root metadata. Written by the job that runs it (pmpipe.job.pipeline), read by
``pmpipe status`` and the campaign's collection; the stores' completion markers stay the
truth of what is complete. A run left 'started' by a process that no longer holds its lock
was stopped from outside (a time limit, memory, a node, a preemption)."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

from pmpipe.runtime import slurm_job
from pmpipe.storage import integrity, store

OUTCOME = "outcome.json"
STATES = ("started", "done", "failed")


def fingerprint(store_path: str | Path) -> list[int] | None:
    """(modification time in ns, size, inode) of a store's root metadata file, or None when it
    has none: the same three numbers later mean the file was not written since."""
    try:
        stat = os.stat(os.path.join(store_path, integrity.METADATA))
    except OSError:
        return None
    return [stat.st_mtime_ns, stat.st_size, stat.st_ino]


def _write(run_dir: str | Path, record: dict) -> Path:
    """Replace the run's record at once (never half written)."""
    path = Path(run_dir) / OUTCOME
    partial = path.with_name(f".{OUTCOME}.{os.getpid()}")
    partial.write_text(json.dumps(record, indent=1) + "\n")
    os.replace(partial, path)
    return path


def _common() -> dict:
    return {"host": socket.gethostname(), "slurm_job": slurm_job.this_job()}


def write_started(run_dir: str | Path) -> Path:
    """Record that a job begins to compute the run."""
    return _write(run_dir, {"state": "started", "started": store.now(), **_common()})


def write(
    run_dir: str | Path,
    error: str | None,
    stage: str | None,
    seconds: float,
    store_bytes: int,
    stores: dict[str, list[int] | None] | None = None,
) -> Path:
    """Write the run's outcome: 'failed' in ``stage`` with ``error``, else 'done'; the run's
    ``seconds``, the ``store_bytes`` its stages wrote and, done, ``stores``: each stage's
    store :func:`fingerprint`. Returns the path."""
    record = {
        "state": "failed" if error is not None else "done",
        "stage": stage,
        "error": error,
        "seconds": seconds,
        "bytes": store_bytes,
        "finished": store.now(),
        "stores": stores or {},
        **_common(),
    }
    return _write(run_dir, record)


def failed_within(run_dir: str | Path, seconds: float) -> bool:
    """Whether the run's record is a failure recorded in the last ``seconds`` (by a partner
    process of the job that computed it, while this one did)."""
    import datetime

    record = read(run_dir)
    if record is None or record["state"] != "failed" or not record.get("finished"):
        return False
    age = datetime.datetime.now(datetime.UTC) - datetime.datetime.fromisoformat(record["finished"])
    return age.total_seconds() <= seconds + 1.0  # the record's time has whole seconds


def read(run_dir: str | Path) -> dict | None:
    """The run's record, or None when it has none (or it does not parse)."""
    try:
        with open(os.path.join(run_dir, OUTCOME)) as fh:  # a string path: read for every run
            record = json.load(fh)
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and record.get("state") in STATES else None
