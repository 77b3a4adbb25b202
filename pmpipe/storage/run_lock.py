"""One writer per run: a lock file in the run folder while a process writes the run's stores.

The lock is a file created with O_EXCL (atomic on local file systems, NFS v3+, Lustre and
GPFS, unlike flock, which is per node or off on many parallel file system mounts). It holds
its holder: host, pid, the process's start time, SLURM job id and the time it was taken. A
thread of the holder touches it every HEARTBEAT_S seconds. A lock is stale, and taken over,
when its holder is gone: on this host, its process no longer runs (or is another process of
the same pid); on another host, the lock was not touched for STALE_AFTER_S seconds. Taking a
stale lock over is itself guarded by an O_EXCL file, so two processes never both take it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import socket
import threading
import time
from pathlib import Path

from pmpipe.runtime import log, slurm_job

LOG = log.get(__name__)

LOCK = ".pmpipe-writer.lock"
HEARTBEAT_S = 30.0
STALE_AFTER_S = 180.0  # six missed heartbeats: clocks of nodes may differ by a little


class RunLocked(RuntimeError):
    """Another process writes this run; the message names it and the lock file."""


@dataclasses.dataclass(frozen=True)
class Holder:
    """Who holds a lock: host, pid, the process's start (clock ticks since boot, Linux), SLURM
    job id (or None) and the time it took the lock (seconds since the epoch)."""

    host: str
    pid: int
    start: int | None
    slurm_job: str | None
    since: float

    def describe(self) -> str:
        job = f", SLURM job {self.slurm_job}" if self.slurm_job else ""
        taken = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since))
        return f"process {self.pid} on {self.host}{job}, since {taken}"


def _process_start(pid: int) -> int | None:
    """Start time of process pid in clock ticks since boot (/proc/<pid>/stat field 22), or
    None where /proc does not tell (no such process, another OS)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def this_process() -> Holder:
    pid = os.getpid()
    return Holder(socket.gethostname(), pid, _process_start(pid), slurm_job.this_job(), time.time())


def _read(path: Path) -> tuple[Holder | None, float | None]:
    """The holder in the lock file and the file's age in seconds; (None, None) when it is gone,
    (None, age) when it cannot be parsed (being written, or damaged)."""
    try:
        age = time.time() - path.stat().st_mtime
        return Holder(**json.loads(path.read_text())), age
    except FileNotFoundError:
        return None, None
    except (OSError, ValueError, TypeError):
        return None, age


def gone(holder: Holder | None, age: float) -> bool:
    """Whether the holder of a lock of that age (seconds since its last heartbeat) no longer
    runs: on this host its process is gone or is another one; elsewhere, its heartbeat stopped."""
    if holder is not None and holder.host == socket.gethostname():
        start = _process_start(holder.pid)
        return start is None or (holder.start is not None and start != holder.start)
    return age > STALE_AFTER_S


def is_held(run_dir: str | Path) -> bool:
    """Whether a process that still runs holds the run's lock (a lock being written or
    unreadable counts while it is fresh)."""
    holder, age = _read(Path(run_dir) / LOCK)
    return age is not None and not gone(holder, age)


def _create(path: Path, holder: Holder) -> bool:
    """Create the lock file holding ``holder``; False when it exists."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as fh:
        json.dump(dataclasses.asdict(holder), fh)
    return True


def _break_stale(path: Path, seen: Holder | None) -> None:
    """Remove the lock at path if it still holds ``seen`` (the stale holder), under a guard
    file so that only one process breaks it; a guard left by a process that died is removed
    once it is older than STALE_AFTER_S."""
    guard = path.with_name(path.name + ".break")
    if not _create(guard, this_process()):
        with contextlib.suppress(OSError):
            if time.time() - guard.stat().st_mtime > STALE_AFTER_S:
                guard.unlink()
        return
    try:
        now, _ = _read(path)
        if now == seen:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            LOG.warning(
                "%s: took over the lock of %s, which is gone",
                path.parent,
                seen.describe() if seen else "an unknown writer",
            )
    finally:
        guard.unlink()


def acquire(run_dir: str | Path, wait_s: float = 0.0) -> Path:
    """Take the run's lock, waiting up to ``wait_s`` seconds for its holder to finish (a stale
    lock is taken over at once); RunLocked naming the holder when it is still held."""
    path = Path(run_dir) / LOCK
    deadline = time.monotonic() + wait_s
    while True:
        if _create(path, this_process()):
            return path
        holder, age = _read(path)
        if age is not None and gone(holder, age):
            _break_stale(path, holder)
            continue
        if time.monotonic() >= deadline:
            who = holder.describe() if holder else "a process whose lock cannot be read"
            raise RunLocked(
                f"{Path(run_dir)} is being written by {who} (lock {path}); wait for it to "
                f"finish, or remove {path} if that process is gone"
            )
        time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))


def release(path: Path) -> None:
    """Remove the lock if this process holds it."""
    holder, _ = _read(path)
    if holder is not None and (holder.host, holder.pid) == (socket.gethostname(), os.getpid()):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


@contextlib.contextmanager
def kept(path: Path):
    """For the duration of the block, a thread touches the lock at ``path`` (taken with
    :func:`acquire`) every HEARTBEAT_S seconds; then it is released."""
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(HEARTBEAT_S):
            with contextlib.suppress(OSError):
                os.utime(path)

    thread = threading.Thread(target=beat, name="pmpipe-run-lock", daemon=True)
    thread.start()
    try:
        yield path
    finally:
        stop.set()
        thread.join()
        release(path)
