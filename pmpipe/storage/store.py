"""Zarr v3 stores of the stages: layout, labelled arrays, provenance and the completion marker.

Every array carries ``dimension_names`` plus ``units`` and ``long_name`` attributes, and every
dimension that has coordinates has a 1-D array of the same name, so ``xarray.open_zarr(path)``
reads a store as a labelled Dataset.

Shards, chunks and codecs (pmpipe.storage.encoding): every array of one or more dimensions is
sharded, a shard being one file written whole by one process; a sharded JAX array's shards
tile its device blocks, so each process writes only the shards inside its own blocks (one
writer per shard). Every chunk ends in a CRC-32C that zarr checks whenever it reads it.

Writes are asynchronous: :func:`write_blocks` and :func:`write_array` copy each block to the
host and hand its zarr write to a small pool of threads (:data:`pmpipe.storage.writes.WRITE_THREADS`), at most
:data:`pmpipe.storage.writes.MAX_PENDING_BYTES` of copied blocks waiting at a time, and return. :func:`pmpipe.storage.writes.flush` waits
for a store's writes and raises the first failure.

A store is complete only once :func:`mark_complete` has run; it waits for the store's pending
writes (and writes no marker when one failed), records what the store holds in its manifest
(every shard file's size and CRC-32, pmpipe.storage.integrity), and the marker is its last write. Every
reader goes through :func:`open_complete`, which refuses a store without the marker or whose
shards are not all there with their recorded sizes, so nothing half-written or damaged is
ever consumed; :func:`verify` checks the checksums too. Layout and names: docs/outputs.md.
"""

from __future__ import annotations

import datetime
import math
import os
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import zarr

from pmpipe.runtime import log
from pmpipe.storage import encoding, integrity, shards, writes

if TYPE_CHECKING:
    import jax
    from jax.sharding import Mesh

LOG = log.get(__name__)


COMPLETE = integrity.COMPLETE


class IncompleteStoreError(RuntimeError):
    """A store that is missing, lacks its completion marker, or belongs to another config."""


def now() -> str:
    """Current UTC time, ISO 8601 with seconds."""
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def _writer() -> bool:
    """Whether this process writes metadata and replicated data (process 0 of the run)."""
    import jax

    return jax.process_index() == 0


def create(path: str | Path, attrs: dict, keepbits: int | None = None) -> zarr.Group:
    """A new, empty store at path with root attributes attrs; an older store there is removed
    (after its pending writes, if any, are done). Process 0 creates it; the others open it
    once it exists.

    keepbits: None stores floating-point data exactly. An integer k keeps k mantissa bits of
    every large floating-point array of the store (bit rounding, relative error at most
    2**-(k+1); float32 has 23, float64 52), which zstd then compresses: lossy, smaller on disk.
    Small arrays (coordinates, summaries) stay exact. The codecs are in each array's metadata
    (``array.metadata.codecs``)."""
    from pmpipe.runtime import parallel

    path = Path(path)
    if keepbits is not None and not (isinstance(keepbits, int) and 0 <= keepbits <= 52):
        raise ValueError(f"keepbits must be an integer from 0 to 52 or None, not {keepbits!r}")
    writes.wait(
        writes.key_of_path(path)
    )  # an older store's writes are done; their errors don't matter
    state = writes.store_state(writes.key_of_path(path))
    state.keepbits, state.ledger = keepbits, integrity.ChunkLedger(path.resolve())
    state.spans, state.sizes = [], []
    if _writer():
        remove(path)
        group = zarr.open_group(path, mode="w", zarr_format=3, attributes=attrs)
    parallel.barrier(f"create {path}")
    return group if _writer() else zarr.open_group(path, mode="r+")


class Labels(NamedTuple):
    """What an array's values are: its dimension names, units and long name."""

    dims: tuple[str, ...]
    units: str
    long_name: str


def create_array(
    group: zarr.Group,
    name: str,
    shape: tuple[int, ...],
    dtype,
    labels: Labels,
    shards: tuple[int, ...] | None = None,
    **attrs,
) -> zarr.Array:
    """An empty labelled array (:class:`Labels`). shards (the pieces
    written at once, one file each) default: at most encoding.MAX_SHARD_BYTES along the
    leading axes (encoding.leading_shards); pass encoding.block_shards of a sharded array (with
    1 for stacked leading axes) for arrays written block by block. Each shard is cut into
    chunks (encoding.inner_chunks); a 0-d array is one chunk. Codecs: encoding.codecs with the
    store's keepbits. Text (numpy 'U' dtypes) is stored as variable-length UTF-8
    strings."""
    from pmpipe.runtime import parallel

    dims, units, long_name = labels
    if len(dims) != len(shape):
        raise ValueError(f"{name}: {len(dims)} dimension names for a {len(shape)}-d array")
    dtype = str if np.dtype(dtype).kind == "U" else np.dtype(dtype)
    itemsize = np.dtype(object).itemsize if dtype is str else dtype.itemsize
    if shards is None:
        shards = encoding.leading_shards(shape, itemsize)
    shards = tuple(max(1, int(c)) for c in shards)
    layout = {"shards": shards, "chunks": encoding.inner_chunks(shards, itemsize)} if shape else {}
    array = None
    encoding.quiet_zarr()
    if _writer():
        array = group.create_array(
            name,
            shape=tuple(shape),
            dtype=dtype,
            dimension_names=dims,
            attributes={"units": units, "long_name": long_name, **attrs},
            **layout,
            **encoding.codecs(
                dtype,
                math.prod(shape) * itemsize,
                writes.store_state(writes.store_key(group)).keepbits,
            ),
        )
    parallel.barrier(f"create_array {name}")
    if array is None:  # the other processes open what process 0 created
        array = zarr.open_array(group.store, path=_child(group, name), mode="r+")
    # every chunk is written, fill values only or not: no scan for them, and the manifest
    # (pmpipe.storage.integrity) can demand every shard
    return array.with_config({"write_empty_chunks": True})


def _child(group: zarr.Group, name: str) -> str:
    """Store path of a group's child array."""
    return f"{group.path}/{name}".lstrip("/")


def write_blocks(array: zarr.Array, data, leading: tuple[int, ...] = ()) -> None:
    """Write data into array[leading + ...]: a sharded JAX array block by block (only the
    blocks this process holds, one replica each), or a numpy array at once by process 0.

    Returns once the blocks are copied to the host: their shards are written by the writer
    threads (:func:`pmpipe.storage.writes.flush` and :func:`mark_complete` wait for them). A
    block that is not made of whole shards of array is written at once instead, after the
    store's pending writes (two threads writing parts of one shard would lose data)."""
    import jax

    leading = tuple(leading)
    if isinstance(data, jax.Array) and not data.is_fully_replicated:
        shards = [s for s in data.addressable_shards if s.replica_id == 0]
        for shard in shards:  # start every device-to-host copy before waiting for the first
            shard.data.copy_to_host_async()
        for shard in shards:
            nbytes = math.prod(shard.data.shape) * np.dtype(shard.data.dtype).itemsize
            writes.reserve(nbytes)
            start = [sl.indices(n)[0] for sl, n in zip(shard.index, data.shape)]
            writes.put(array, leading + tuple(start), np.asarray(shard.data), nbytes)
    elif _writer():
        if isinstance(data, jax.Array):
            host = np.asarray(data)  # immutable: no copy needed
        else:
            host = np.array(data, copy=True)  # the caller may change its array after we return
        writes.reserve(host.nbytes)
        writes.put(array, leading + (0,) * host.ndim, host, host.nbytes)


def write_array(
    group: zarr.Group, name: str, data, dims: tuple[str, ...], units: str, long_name: str, **attrs
) -> zarr.Array:
    """Write a numpy array, or a sharded JAX array in shards that tile its device blocks
    (encoding.block_shards); the shards are written in the background (:func:`write_blocks`)."""
    array = create_array(
        group,
        name,
        data.shape,
        data.dtype,
        Labels(dims, units, long_name),
        encoding.block_shards(data),
        **attrs,
    )
    write_blocks(array, data)
    return array


def write_coordinate(
    group: zarr.Group, name: str, values, units: str, long_name: str
) -> zarr.Array:
    """A 1-D coordinate array named like its dimension."""
    return write_array(group, name, np.asarray(values), (name,), units, long_name)


def mark_complete(group: zarr.Group) -> None:
    """Once every process has written its blocks, process 0 consolidates the metadata, writes
    the manifest of every shard (pmpipe.storage.integrity) and the end time, then the marker, with
    the manifest's checksum: the last act.

    Waits for this process's pending writes first and checksums the shards it wrote. When
    one of them failed (on any process), no marker is written and writes.StoreWriteError is raised
    (naming the array on the process where it failed)."""
    import jax

    from pmpipe.runtime import parallel

    key = writes.store_key(group)
    errors = writes.wait(key)
    ledger = writes.store_state(key).ledger
    records: dict = {}
    if not errors and ledger is not None:
        try:
            records = ledger.finished()
            if not _writer():
                integrity.write_part(ledger.root, jax.process_index(), records)
        except OSError as err:
            errors.append(("(shard checksums)", err))
    failed = bool(parallel.largest(bool(errors)))  # every process learns whether any failed
    writes.raise_failed(key, errors)
    if failed:
        raise writes.StoreWriteError(f"another process failed to write its blocks of {key}")
    parallel.barrier("blocks written")
    if not _writer():
        parallel.barrier("marker written")
        if not is_complete(ledger.root if ledger is not None else key):
            raise writes.StoreWriteError(f"process 0 failed to complete {key}")
        return
    try:
        encoding.quiet_zarr()
        zarr.consolidate_metadata(group.store)
        finished = now()
        marker: dict[str, str | int] = {"finished": finished, COMPLETE: finished}
        if ledger is not None:
            marker[integrity.MANIFEST_CRC] = integrity.write_manifest(
                zarr.open_group(group.store, mode="r"),
                ledger.root,
                jax.process_count(),
                records,
                marker,
            )
        # one write of zarr.json: attrs.update would write it once per key, and a reader
        # between those writes would find a marker without the manifest's checksum
        zarr.open_group(group.store, mode="r+").update_attributes(marker)
    except (OSError, RuntimeError) as err:
        raise writes.StoreWriteError(
            f"completing {key} failed: {type(err).__name__}: {err}"
        ) from err
    finally:
        parallel.barrier("marker written")


def remove(path: str | Path) -> None:
    """Remove the folder at path (a store, or a folder of them), if there is one, so that no
    reader finds part of it: it is renamed to a hidden sibling in one step, then deleted."""
    path = Path(path)
    hidden = path.with_name(f".{path.name}.removed-{os.getpid()}-{time.monotonic_ns()}")
    try:
        path.rename(hidden)
    except FileNotFoundError:
        return
    shutil.rmtree(hidden, ignore_errors=True)
    if hidden.exists():
        LOG.warning(
            "%s (what was %s) could not be deleted entirely: remove it by hand", hidden, path
        )


def is_complete(path: str | Path) -> bool:
    """True when path is a zarr group whose completion marker is written and whose shard
    files are all there with the sizes its manifest records."""
    return not problems(path)


def problems(
    path: str | Path, checksums: bool = False, config_hash: str | None = None
) -> list[str]:
    """Why the store at path is not a complete, intact, current store (empty when it is):
    missing, no completion marker, shard files that differ from its manifest (sizes; with
    ``checksums`` every shard's CRC-32 too), or, given ``config_hash``, made from another
    configuration (stale)."""
    path = Path(path)
    attrs = integrity.root_attributes(path)
    if attrs is None:
        return ["does not exist" if not path.exists() else "is not a zarr store"]
    if COMPLETE not in attrs:
        damaged = attrs.get(DAMAGED)
        return [
            f"was found damaged ({damaged})"
            if damaged
            else "has no completion marker (it was not finished)"
        ]
    try:
        found = integrity.problems(path, attrs, checksums)
    except (FileNotFoundError, zarr.errors.GroupNotFoundError):  # removed while it was read
        return ["does not exist"]
    if config_hash is not None and attrs.get("config_hash") != config_hash:
        found.append(
            f"is stale: made from config {attrs.get('config_hash')}, the run's is {config_hash}"
        )
    elif config_hash is not None:
        found += _stale_layout(attrs) + _stale_upstream(path, attrs.get("upstream", {}))
    return found


def _stale_layout(attrs: dict) -> list[str]:
    """The store's layout, when older than the one this pmpipe writes for its stage."""
    from pmpipe.storage import provenance

    stage = attrs.get("stage")
    if stage is None or attrs.get("layout", 1) == provenance.layout(stage):
        return []
    written, current = attrs.get("layout", 1), provenance.layout(stage)
    return [f"is stale: a {stage} store of layout {written}, this pmpipe writes {current}"]


def manifest_checksum(path: str | Path) -> int | None:
    """The CRC-32 of the manifest a store's completion marker vouches for, or None for a
    store that is missing or has no marker."""
    attrs = integrity.root_attributes(Path(path)) or {}
    return attrs.get(integrity.MANIFEST_CRC) if COMPLETE in attrs else None


def _stale_upstream(path: Path, upstream: dict) -> list[str]:
    """The stores of the run a store was made from (provenance 'upstream', beside it) that
    have been made again since; one that is gone or unfinished now is left to its stage."""
    found = []
    for name, crc in sorted(upstream.items()):
        now = manifest_checksum(path.parent / name)
        if now is not None and now != crc:
            found.append(f"is stale: made from another {name} (that store was made again since)")
    return found


DAMAGED = integrity.DAMAGED


def has_marker(path: str | Path) -> bool:
    """Whether the store at path carries a completion marker (intact or not)."""
    return COMPLETE in (integrity.root_attributes(Path(path)) or {})


def stores_under(path: str | Path) -> list[Path]:
    """The zarr stores (folders named *.zarr) at or under path, outermost only, sorted."""
    path = Path(path)
    if path.suffix == ".zarr" or not path.is_dir():
        return [path]
    found = []
    for root, folders, _ in os.walk(path):
        stores = sorted(f for f in folders if f.endswith(".zarr"))
        found += [Path(root) / f for f in stores]
        folders[:] = sorted(f for f in folders if not f.endswith(".zarr") and not f.startswith("."))
    return sorted(found)


def invalidate(path: str | Path, reasons: list[str]) -> None:
    """Take the completion marker off a damaged store, recording why, so that it is made
    again (the workflow removes stores without a marker before it plans)."""
    group = zarr.open_group(Path(path), mode="r+")
    attrs = dict(group.attrs)
    attrs.pop(COMPLETE, None)
    group.attrs.put(attrs | {DAMAGED: "; ".join(reasons)})


def open_complete(path: str | Path, config_hash: str | None = None) -> zarr.Group:
    """Open a complete store for reading; refuse a missing, incomplete or damaged one
    (:func:`problems`: every shard present with its recorded size), or one made from another
    configuration than config_hash."""
    path = Path(path)
    found = problems(path, config_hash=config_hash)
    if found:
        raise IncompleteStoreError(
            f"{path} {'; '.join(found)}; run the stage that produces it again"
        )
    return zarr.open_group(path, mode="r")


def read_sharded(array: zarr.Array, mesh: Mesh, leading: tuple[int, ...] = ()) -> jax.Array:
    """array[leading] (an (X, Y, ...) block) as a JAX array sharded over mesh, each device
    reading only its own block."""
    import jax

    from pmpipe.runtime import parallel

    shape = tuple(array.shape[len(leading) :])
    return jax.make_array_from_callback(
        shape,
        parallel.field_sharding(mesh),
        lambda index: shards.read(array, tuple(leading) + tuple(index)),
    )


def describe(path: str | Path, config_hash: str | None = None) -> str:
    """A human summary of a store: state (complete, INCOMPLETE, DAMAGED or STALE against
    ``config_hash``, its shards' sizes checked against the manifest), provenance and every
    array with its labels."""
    path = Path(path)
    try:
        group = zarr.open_group(path, mode="r")
    except (FileNotFoundError, zarr.errors.GroupNotFoundError) as err:
        raise IncompleteStoreError(f"{path} is not a zarr store ({err})") from None
    attrs = dict(group.attrs)
    found = problems(path, config_hash=config_hash)
    if not found:
        state = f"complete ({attrs[COMPLETE]})"
    elif COMPLETE not in attrs:
        state = f"INCOMPLETE: {found[0]}"
    else:
        state = (
            ("STALE" if found[-1].startswith("is stale") else "DAMAGED") + ": " + "; ".join(found)
        )
    lines = [f"{path}: {attrs.get('stage', '?')} store, {state}"]
    for key in (
        "campaign",
        "run_id",
        "config_hash",
        "pmpipe_version",
        "git_commit",
        "jax_version",
        "device_kind",
        "device_count",
        "pdims",
        "slurm_job_id",
        "started",
        "finished",
    ):
        if key in attrs:
            lines.append(f"  {key}: {attrs[key]}")
    lines.append("  arrays:")
    for name, array in sorted(group.arrays()):
        dims = ", ".join(array.metadata.dimension_names or ())
        shape = " x ".join(str(s) for s in array.shape)
        a = array.attrs
        text = f"    {name} ({dims}) [{shape}] {array.dtype} [{a.get('units', '?')}] {a.get('long_name', '')}"
        if array.ndim == 1 and array.metadata.dimension_names == (name,) and array.shape[0]:
            values = array[:]
            text += f"  = {values[0]} .. {values[-1]}" if array.shape[0] > 1 else f"  = {values[0]}"
        lines.append(text)
    return "\n".join(lines)
