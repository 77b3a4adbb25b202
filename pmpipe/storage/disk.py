"""Whether results can be written: a folder's file system writable and with room for what a
campaign will write, checked before any work starts; and the message of a write that failed
for want of either."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

from pmpipe.runtime import backend, log

GB = 1e9
FULL_OR_READ_ONLY = {
    errno.EROFS: "the file system is read-only",
    errno.ENOSPC: "the file system is full",
    errno.EDQUOT: "the disk quota is exhausted",
}


class DiskError(OSError):
    """Results cannot be written where they go; the message names the folder and the fix."""


def existing_parent(path: Path) -> Path:
    """``path`` or its nearest ancestor that exists."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_writable(folder: Path, needed_bytes: float, what: str) -> None:
    """DiskError unless ``folder`` (made when missing) can be written and its file system has
    ``needed_bytes`` free; ``what`` names what will be written there."""
    found = existing_parent(folder)
    if not os.access(found, os.W_OK):
        reason = "the file system is read-only" if _read_only(found) else "permission denied"
        raise DiskError(
            f"{folder}: cannot write {what} there ({reason} at {found}): run from a folder you "
            "can write to, or make this one writable"
        )
    free = shutil.disk_usage(found).free
    if free < needed_bytes:
        raise DiskError(
            f"{folder}: {what} need about {needed_bytes / GB:.3g} GB but its file system has "
            f"{free / GB:.3g} GB free: free some space, or run from a folder on a larger one"
        )


def _read_only(path: Path) -> bool:
    return bool(os.statvfs(path).f_flag & os.ST_RDONLY)


def failure(error: BaseException) -> str | None:
    """The message of a write that a full or read-only file system refused (the OSError, or
    an error it caused: a store write that failed), with the fix; None for other errors."""
    if isinstance(error, DiskError):
        return str(error)
    reason: str | None = None
    cause: BaseException | None = error
    while cause is not None and reason is None:
        if isinstance(cause, OSError) and cause.errno in FULL_OR_READ_ONLY:
            reason = FULL_OR_READ_ONLY[cause.errno]
        cause = cause.__cause__
    if reason is None:
        return None
    return (
        f"{error}: {reason}: free space or choose a writable folder, then run again "
        "(complete stores are kept)"
    )


def known_failure(error: BaseException) -> str | None:
    """The one-paragraph message of an error the user fixes without a traceback: a JAX
    backend that cannot start (pmpipe.runtime.backend.failure), a full or read-only file
    system (:func:`failure`); None for other errors, and whenever PMPIPE_DEBUG asks for
    tracebacks."""
    if log.debug_requested():
        return None
    return backend.failure(error) or failure(error)
