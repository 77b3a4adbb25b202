"""Peak memory of this process: resident on the host and in use on its first local device."""

from __future__ import annotations

import resource
import sys

XLA_DEFAULT_FRACTION = 0.75  # of a GPU's memory that XLA's allocator takes when not told
MEMORY_FRACTION_VARIABLE = "XLA_PYTHON_CLIENT_MEM_FRACTION"  # what tells it


def peak_rss_bytes() -> int:
    """Peak resident memory of this process so far, bytes: VmHWM on Linux (ru_maxrss there
    survives exec, so a child started from a big parent would report the parent's peak)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss is KiB on Linux
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


def device_peak_bytes() -> int | None:
    """Peak memory in use on the first local device (bytes), where the backend reports it
    (GPUs; None on CPU). Set XLA_PYTHON_CLIENT_PREALLOCATE=false for a true peak."""
    import jax

    stats = jax.local_devices()[0].memory_stats() or {}
    return stats.get("peak_bytes_in_use")


def device_bytes_limit() -> int | None:
    """Bytes XLA's allocator may use on the first local device (its memory fraction of the
    card; GPUs; None on CPU)."""
    import jax

    stats = jax.local_devices()[0].memory_stats() or {}
    return stats.get("bytes_limit")
