"""Whether results can be written: a folder's file system writable and with room for what a
campaign will write, checked before any work starts; and the message of a write that failed
for want of either."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

GB = 1e9
FULL_OR_READ_ONLY = {
    errno.EROFS: "the file system is read-only",
    errno.ENOSPC: "the file system is full",
    errno.EDQUOT: "the disk quota is exhausted",
    errno.EACCES: "permission denied",
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
    """The message of an OSError of a full, read-only or forbidden file system (naming the
    file and the fix), else None."""
    if isinstance(error, DiskError):
        return str(error)
    if not isinstance(error, OSError) or error.errno not in FULL_OR_READ_ONLY:
        return None
    where = f"{error.filename}: " if error.filename else ""
    return (
        f"{where}{FULL_OR_READ_ONLY[error.errno]}: the results could not be written; free "
        "space or choose a writable folder, then run again (complete stores are kept)"
    )
