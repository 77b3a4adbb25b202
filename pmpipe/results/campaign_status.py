"""How far a campaign is: each run done, running, failed or pending, from what its results
folder holds (``pmpipe status results/<campaign>``).

A run is done when every stage store carries its completion marker; running while a live
process holds its lock (pmpipe.storage.run_lock); failed when its last computation failed
(its outcome.json, pmpipe.storage.run_record); else pending. The run ids and stages come from
the campaign's run index (pmpipe.campaigns.run_index), so no campaign file is expanded: a few file
system calls per run.
"""

from __future__ import annotations

import datetime
import os
from pathlib import Path

from pmpipe import stages
from pmpipe.campaigns import run_index
from pmpipe.storage import run_lock, run_record, store

STATES = ("done", "running", "failed", "pending")


STOPPED = "stopped before its end (the job was killed: time limit, memory, node or preemption)"


def run_state(run_dir: str | Path, run_stages, record: dict | None) -> str:
    """One of STATES for the run in ``run_dir`` whose outcome record is ``record``: a run whose
    record says 'started' and whose lock no live process holds was stopped, and counts as
    failed (:func:`failure`)."""
    if all_marked(run_dir, run_stages, record):
        return "done"
    if run_lock.is_held(Path(run_dir)):
        return "running"
    if record is not None and record["state"] in ("failed", "started"):
        return "failed"
    return "pending"


def failure(record: dict) -> dict:
    """Stage, error and time of a failed run's record (of one stopped from outside: the
    stage unknown, the error :data:`STOPPED`)."""
    if record["state"] == "started":
        return {"stage": None, "error": STOPPED, "when": record["started"]}
    return {"stage": record["stage"], "error": record["error"], "when": record["finished"]}


# the folder name of each stage's store in a run folder
STORE_NAMES = {stage: stages.store_path(Path(), stage).name for stage in stages.STAGES}


def all_marked(run_dir: str | Path, run_stages, record: dict | None) -> bool:
    """Whether every stage store of the run carries its completion marker. A store whose root
    metadata has the fingerprint (modification time, size, inode) a 'done' record took of it
    is not read again; any other is. Paths as strings: this runs for every run of a
    campaign."""
    seen = record.get("stores", {}) if record is not None and record["state"] == "done" else {}
    for stage in run_stages:
        path = os.path.join(run_dir, STORE_NAMES[stage])
        now = run_record.fingerprint(path)
        if now is None:
            return False
        if now != seen.get(stage) and not store.has_marker(path):
            return False
    return True


def manifest_status(run_dir: str | Path, run_stages) -> str:
    """The manifest's status of a run: its :func:`run_state`, with a failed run's stage and
    error ('failed in nbody: ValueError: ...')."""
    record = run_record.read(run_dir)
    state = run_state(run_dir, run_stages, record)
    if state == "failed" and record is not None:
        return f"failed{_where(failure(record))}"
    return state


def failure_text(record: dict) -> str:
    """'<stage>: <error>' of a failed run's record (the error alone when the stage is
    unknown)."""
    return _where(failure(record)).removeprefix(" in ")


def _where(failed: dict) -> str:
    """' in <stage>: <error>' of a failure (':' alone when its stage is unknown)."""
    stage = f" in {failed['stage']}" if failed["stage"] else ""
    return f"{stage}: {failed['error']}"


def _seconds(iso: str) -> float:
    return datetime.datetime.fromisoformat(iso).timestamp()


def campaign_status(campaign_dir: str | Path) -> dict:
    """The campaign's state as JSON data: runs per state; throughput (runs an hour, from the
    first computed run's start to the last one's end, and of one job: an hour over the mean
    seconds of a run); hours left at that throughput for the runs pending or running (None
    before two runs are done); bytes of the stores the done runs' last computations made; each
    failed run with its job, SLURM job, stage and error."""
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
                failed.append(
                    {
                        "run_id": run_id,
                        "job": job,
                        "slurm_job": record["slurm_job"],
                        **failure(record),
                    }
                )
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
    lines.append(
        f"written: {report['bytes_written'] / 1e9:.3g} GB, the stores of the runs done "
        "(of each one's last computation)"
    )
    for f in report["failures"]:
        log = Path(report["folder"]) / "logs" / f"{f['job']}.log"
        where = f"log {log}" if log.exists() else f"job {f['job']}"
        if f["slurm_job"]:
            where += f", SLURM job {f['slurm_job']}"
        stage = f" in stage {f['stage']}" if f["stage"] else ""
        lines.append(f"failed: {f['run_id']}{stage} at {f['when']}: {f['error']} ({where})")
    return "\n".join(lines)


def _hours(hours: float) -> str:
    if hours < 1:
        return f"{hours * 60:.0f} min"
    return f"{hours:.1f} h" if hours < 48 else f"{hours / 24:.1f} days"


def _rate(runs_per_hour: float) -> str:
    return f"{runs_per_hour:,.0f}" if runs_per_hour >= 10 else f"{runs_per_hour:.2g}"
