"""How far a campaign is: each run done, running, failed or pending, from what its results
folder holds (``pmpipe status results/<campaign>``).

A run is done when every stage store carries its completion marker; running while a live
process holds its lock (pmpipe.storage.run_lock); failed when its last computation failed
(its outcome.json, pmpipe.stages.run_record); else pending. The run ids and stages come from
the campaign's run index (pmpipe.orchestration.run_index), so no campaign file is expanded: a few file
system calls per run.
"""

from __future__ import annotations

import contextlib
import datetime
import os
from pathlib import Path

from pmpipe import stages
from pmpipe.orchestration import run_index
from pmpipe.stages import run_record, status
from pmpipe.storage import integrity, run_lock, store

STATES = ("done", "running", "failed", "pending")


def run_state(run_dir: str | Path, run_stages, record: dict | None) -> str:
    """One of STATES for the run in ``run_dir`` whose outcome record is ``record``."""
    if all_marked(run_dir, run_stages, record):
        return "done"
    if run_lock.is_held(Path(run_dir)):
        return "running"
    if record is not None and record["state"] == "failed":
        return "failed"
    return "pending"


# the folder name of each stage's store in a run folder
STORE_NAMES = {stage: stages.store_path(Path(), stage).name for stage in stages.STAGES}


def all_marked(run_dir: str | Path, run_stages, record: dict | None) -> bool:
    """Whether every stage store of the run carries its completion marker. A store whose
    metadata was last written before a 'done' outcome record (which its job writes after the
    markers) is not read again: a file's time is enough, unless the store was written since
    or within the same tick of the file system's clock (a verification that found it
    damaged, a run started again). Paths as strings: this runs for every run of a campaign."""
    since = None
    if record is not None and record["state"] == "done":
        with contextlib.suppress(OSError):
            since = os.stat(os.path.join(run_dir, run_record.OUTCOME)).st_mtime_ns
    for stage in run_stages:
        path = os.path.join(run_dir, STORE_NAMES[stage])
        try:
            written = os.stat(os.path.join(path, integrity.METADATA)).st_mtime_ns
        except OSError:
            return False
        if (since is None or written >= since) and not store.has_marker(path):
            return False
    return True


def manifest_status(run_dir: str | Path) -> str:
    """The manifest's status of a run: 'complete', 'running', 'failed in <stage>: <error>',
    else how far it got ('<last complete stage> done' or 'planned';
    pmpipe.stages.status.run_status)."""
    progress = status.run_status(run_dir)
    if progress == "complete":
        return progress
    if run_lock.is_held(run_dir):
        return "running"
    record = run_record.read(run_dir)
    if record is not None and record["state"] == "failed":
        return f"failed in {record['stage']}: {record['error']}"
    return progress


def _seconds(iso: str) -> float:
    return datetime.datetime.fromisoformat(iso).timestamp()


def campaign_status(campaign_dir: str | Path) -> dict:
    """The campaign's state as JSON data: runs per state; throughput (runs an hour, from the
    first computed run's start to the last one's end, and of one job: an hour over the mean
    seconds of a run); hours left at that throughput for the runs pending or running (None
    before two runs are done); bytes of the stores the done runs made; each failed run with its job,
    stage and error."""
    index = run_index.read(campaign_dir)
    counts = dict.fromkeys(STATES, 0)
    failed, finished, seconds, written = [], [], [], 0
    for job, run_ids in index["jobs"].items():
        for run_id in run_ids:
            run_dir = os.path.join(campaign_dir, run_id)
            record = run_record.read(run_dir)
            state = run_state(run_dir, index["stages"], record)
            counts[state] += 1
            if state == "failed" and record is not None:
                failed.append({"run_id": run_id, "job": job, **_failure(record)})
            if state == "done" and record is not None and record["state"] == "done":
                finished.append(_seconds(record["finished"]))
                seconds.append(record["seconds"])
                written += record["bytes"]
    runs = sum(counts.values())
    rate = per_job = hours_left = None
    if len(finished) >= 2:
        span = max(finished) - min(f - s for f, s in zip(finished, seconds))
        rate = 3600.0 * len(finished) / span
        per_job = 3600.0 * len(seconds) / sum(seconds)
        hours_left = (counts["pending"] + counts["running"]) / rate
    return {
        "campaign": index["campaign"],
        "folder": os.fspath(campaign_dir),
        "runs": runs,
        **counts,
        "runs_per_hour": rate,
        "runs_per_hour_per_job": per_job,
        "hours_left": hours_left,
        "bytes_written": written,
        "failures": failed,
    }


def _failure(record: dict) -> dict:
    return {"stage": record["stage"], "error": record["error"], "when": record["finished"]}


def status_text(report: dict) -> str:
    """:func:`campaign_status` for the terminal: the counts, throughput and time left, bytes
    written, then a line per failed run with its job's log where the workflow wrote one."""
    lines = [
        f"campaign {report['campaign']} ({report['folder']}): {report['runs']} runs: "
        + ", ".join(f"{report[s]} {s}" for s in STATES)
    ]
    if report["runs_per_hour"] is None:
        lines.append("throughput: known once two runs are done here")
    else:
        todo = report["pending"] + report["running"]
        lines.append(
            f"throughput: {_rate(report['runs_per_hour'])} runs an hour "
            f"({_rate(report['runs_per_hour_per_job'])} an hour in one job); "
            + (
                f"about {_hours(report['hours_left'])} left for the {todo} runs pending or running"
                if todo
                else "no run pending or running"
            )
        )
    lines.append(f"written: {report['bytes_written'] / 1e9:.3g} GB by the runs done")
    for f in report["failures"]:
        log = Path(report["folder"]) / "logs" / f"{f['job']}.log"
        where = f"log {log}" if log.exists() else f"job {f['job']}"
        lines.append(
            f"failed: {f['run_id']} in stage {f['stage']} at {f['when']}: {f['error']} ({where})"
        )
    return "\n".join(lines)


def _hours(hours: float) -> str:
    if hours < 1:
        return f"{hours * 60:.0f} min"
    return f"{hours:.1f} h" if hours < 48 else f"{hours / 24:.1f} days"


def _rate(runs_per_hour: float) -> str:
    return f"{runs_per_hour:,.0f}" if runs_per_hour >= 10 else f"{runs_per_hour:.2g}"
