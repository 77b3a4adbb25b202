"""Background writes into the stores: each block copied to the host is handed to a small pool
of threads (:data:`WRITE_THREADS`), one write per whole shard, at most
:data:`MAX_PENDING_BYTES` of copies waiting at a time; a store's writes are waited for (and
the first failure raised) before its completion marker; what this process wrote into each
store, and when, is kept."""

from __future__ import annotations

import atexit
import concurrent.futures
import dataclasses
import os
import threading
import time
from pathlib import Path

import numpy as np
import zarr

from pmpipe.runtime import log
from pmpipe.storage import integrity, shards

LOG = log.get(__name__)

MAX_PENDING_BYTES = 2**30  # host copies of blocks waiting for their write, at most (but one)
WRITE_THREADS = min(4, os.cpu_count() or 1)  # threads writing shards in the background


class StoreWriteError(RuntimeError):
    """A background write into a store failed; the store gets no completion marker."""


@dataclasses.dataclass
class _StoreState:
    """A store's keepbits, its pending writes (array name, future), the shards this
    process wrote (None for a store that is not a folder), when each write ran (start and
    end, Unix seconds) and how many bytes it wrote."""

    keepbits: int | None = None
    pending: list = dataclasses.field(default_factory=list)
    ledger: integrity.ChunkLedger | None = None
    spans: list = dataclasses.field(default_factory=list)
    sizes: list = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class WriteTotals:
    """Array bytes this process wrote into a store, the seconds during which at least one
    write was under way (so bytes / seconds is the throughput of all writer threads
    together), and the writes' spans ``((start, end), ...)`` (Unix seconds, by start)."""

    bytes: int = 0
    seconds: float = 0.0
    spans: tuple = ()


_lock = threading.Lock()
_budget = threading.Condition(_lock)
_pending_bytes = 0
_states: dict[str, _StoreState] = {}
_executor: concurrent.futures.ThreadPoolExecutor | None = None


def written_since(folder, since: float) -> WriteTotals:
    """What this process wrote into the stores inside ``folder`` (a run's, checkpoints
    included) in writes begun at or after ``since`` (Unix seconds): their bytes, and the
    seconds during which at least one was under way."""
    inside = key_of_path(folder) + os.sep
    with _lock:
        found = [
            (span, size)
            for key, state in _states.items()
            if key.startswith(inside)
            for span, size in zip(state.spans, state.sizes)
            if span[0] >= since
        ]
    spans = tuple(sorted(tuple(span) for span, _ in found))
    return WriteTotals(sum(size for _, size in found), covered(spans), spans)


def covered(spans) -> float:
    """Seconds inside at least one of the ``(start, end)`` spans (their union's length)."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(spans):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def key_of_path(path) -> str:
    return str(Path(path).resolve())


def store_key(node) -> str:
    """Which store a zarr group or array belongs to (its folder, for local stores)."""
    root = getattr(node.store, "root", None)
    return key_of_path(root) if root is not None else f"store-{id(node.store)}"


def store_state(key: str) -> _StoreState:
    with _lock:
        return _states.setdefault(key, _StoreState())


def _pool() -> concurrent.futures.ThreadPoolExecutor:
    """The writer threads, started on first use with :func:`_finish_at_exit` registered."""
    global _executor
    with _lock:
        if _executor is None:
            _executor = concurrent.futures.ThreadPoolExecutor(WRITE_THREADS, "pmpipe-store")
            # threading's exit hooks run last-registered first, so this one runs before
            # concurrent.futures' own, after which zarr (asyncio.to_thread) could not write
            register = getattr(threading, "_register_atexit", atexit.register)
            register(_finish_at_exit)
        return _executor


def _finish_at_exit() -> None:
    """At interpreter exit, every pending write is done; failures go to stderr (the stores
    they belong to have no completion marker)."""
    for key in list(_states):
        for name, error in wait(key):
            LOG.error(
                "pmpipe.storage.writes: writing array %r of %s failed: %s: %s",
                name,
                key,
                type(error).__name__,
                error,
            )


def reserve(nbytes: int) -> None:
    """Wait until nbytes more host copies fit in MAX_PENDING_BYTES (a block larger than it
    waits for every other write), then count them."""
    global _pending_bytes
    with _budget:
        while _pending_bytes and _pending_bytes + nbytes > MAX_PENDING_BYTES:
            _budget.wait()
        _pending_bytes += nbytes


def _release(nbytes: int) -> None:
    global _pending_bytes
    with _budget:
        _pending_bytes -= nbytes
        _budget.notify_all()


def _write(array: zarr.Array, selection: tuple, block: np.ndarray) -> None:
    """array[selection] = block, its time and size kept in its store's state."""
    began, state = time.time(), store_state(store_key(array))
    try:
        ledger = state.ledger
        raw = shards.local_file(array, selection, block) if ledger is not None else None
        if ledger is not None and raw is not None:  # its file, checksummed as written
            ledger.record(array, raw[0], shards.write(raw[0], block, raw[1]))
        else:
            array[selection] = block
            if ledger is not None:
                ledger.wrote(array, selection)
    finally:
        with _lock:
            state.spans.append((began, time.time()))
            state.sizes.append(block.nbytes)


def put(array: zarr.Array, start: tuple[int, ...], host: np.ndarray, nbytes: int) -> None:
    """Write host (nbytes reserved) into array at start (one index per axis of array; host
    lacks the leading ones): one background write per shard when host is made of whole shards,
    else at once here after the store's pending writes."""
    block = host.reshape((1,) * (array.ndim - host.ndim) + host.shape)
    pieces = shards.whole_shards(array, start, block.shape)
    state = store_state(store_key(array))
    if pieces is None:
        try:
            for _, future in state.pending:
                concurrent.futures.wait([future])
            whole = tuple(slice(s, s + n) for s, n in zip(start, block.shape))
            _write(array, whole, block)
        finally:
            _release(nbytes)
        return
    if not pieces:  # an empty array
        _release(nbytes)
        return
    left = [len(pieces)]
    lock = threading.Lock()

    def done(_):
        with lock:
            left[0] -= 1
            last = left[0] == 0
        if last:
            _release(nbytes)

    pool = _pool()
    for i, (selection, inside) in enumerate(pieces):
        try:
            future = pool.submit(_write, array, selection, block[inside])
        except BaseException:  # the pool is shut down: count the pieces that never run as done
            for _ in range(len(pieces) - i):
                done(None)
            raise
        future.add_done_callback(done)
        state.pending.append((array.path, future))


def wait(key: str) -> list[tuple[str, BaseException]]:
    """Wait for every pending write of a store; the (array, error) of those that failed."""
    state = store_state(key)
    errors = []
    while state.pending:
        name, future = state.pending.pop(0)
        error = future.exception()
        if error is not None:
            errors.append((name, error))
    return errors


def raise_failed(key: str, errors) -> None:
    if errors:
        name, error = errors[0]
        more = f" ({len(errors) - 1} more shard writes failed)" if len(errors) > 1 else ""
        raise StoreWriteError(
            f"writing array {name!r} of {key} failed: {type(error).__name__}: {error}{more}"
        ) from error


def flush(group: zarr.Group | None = None) -> None:
    """Wait until every write of group's store (of every store when None) handed to the
    writer threads is done; StoreWriteError naming the array when one failed."""
    keys = [store_key(group)] if group is not None else list(_states)
    for key in keys:
        raise_failed(key, wait(key))
