"""What a complete store holds, recorded when it is written and checked before it is used.

Every process records the files of the chunk grid it writes (:class:`ChunkLedger`): for each
shard (:func:`shard_shape`; zarr v3's chunk keys name shard files) its size in bytes and its
CRC-32 (zlib), read back once the shard's last write is done. When the
store is marked complete, process 0 merges the records of every process into
``pmpipe_manifest.json`` at the store's root (:func:`write_manifest`): every array with its
shape, dtype and chunks, and every metadata document a reader depends on (each array's and
group's zarr.json by size and CRC-32; the root's zarr.json, with its attributes and the
consolidated metadata, as canonical JSON without the marker's own attributes). The completion
marker is written after it, with the manifest's own CRC-32, so a store's marker vouches for
the manifest and the manifest for every byte a reader uses.

:func:`problems` compares a store with its manifest: quickly (the metadata documents; every
shard file present, with its size: a deleted or truncated shard, which zarr would read back as
fill values without a word) or in full (every shard's CRC-32 too: a changed byte). Inside the
shards, zarr's own CRC-32C of every chunk catches a changed byte whenever a chunk is read.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import zlib
from pathlib import Path

import numpy as np

MANIFEST = "pmpipe_manifest.json"
MANIFEST_CRC = "manifest_crc32"  # root attribute written with the completion marker
COMPLETE = "pmpipe_complete"  # root attribute written last: completion time (UTC, ISO 8601)
DAMAGED = "pmpipe_damaged"  # root attribute of a store whose verification failed: what failed
# root attributes the manifest cannot cover: its own checksum, and what verify adds
UNCOVERED_ATTRS = frozenset({MANIFEST_CRC, DAMAGED})
METADATA = "zarr.json"
READ_BYTES = 2**24  # shard files are checksummed in pieces of this size


def file_crc32(path: Path) -> tuple[int, int]:
    """(size in bytes, CRC-32) of a file."""
    crc, size = 0, 0
    with open(path, "rb") as f:
        while piece := f.read(READ_BYTES):
            crc = zlib.crc32(piece, crc)
            size += len(piece)
    return size, crc


def shard_shape(array) -> tuple[int, ...]:
    """The shape of the pieces of a zarr array stored one per file: its shards, or its chunks
    when it is not sharded (zarr v3's chunk grid)."""
    return array.shards or array.chunks


def chunk_coordinates(
    selection: tuple[slice, ...], chunks: tuple[int, ...], shape: tuple[int, ...]
):
    """The coordinates in the chunk grid ``chunks`` (a shard shape) of every piece a write of
    ``selection`` (slices) touches, and whether it covers exactly one whole piece."""
    ranges, whole = [], True
    for sl, c, n in zip(selection, chunks, shape):
        start, stop, _ = sl.indices(n)
        first, last = start // c, max(start, stop - 1) // c
        ranges.append(range(first, last + 1))
        whole &= first == last and start == first * c and stop == min(n, (first + 1) * c)
    coordinates: list[tuple[int, ...]] = [()]
    for r in ranges:
        coordinates = [c + (i,) for c in coordinates for i in r]
    return coordinates, whole and len(coordinates) == 1


@dataclasses.dataclass
class ChunkLedger:
    """The shard files this process wrote into one store: (array path, chunk key) → (size,
    CRC-32), or None while the shard may still be written again."""

    root: Path
    chunks: dict = dataclasses.field(default_factory=dict)
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)

    def wrote(self, array, selection: tuple[slice, ...]) -> None:
        """Record a finished write of ``selection`` into zarr ``array``: a write of one whole
        shard is checksummed now (in the writer thread); others once the store is complete."""
        coordinates, whole = chunk_coordinates(selection, shard_shape(array), array.shape)
        for coords in coordinates:
            key = (array.path, array.metadata.encode_chunk_key(coords))
            record = file_crc32(self.root / key[0] / key[1]) if whole else None
            with self.lock:
                self.chunks[key] = record

    def record(self, array, path: Path, record: tuple[int, int]) -> None:
        """Record the shard file ``path`` of zarr ``array`` (in this store's folder), written
        whole, with its (size, CRC-32)."""
        folder = Path(array.store_path.store.root) / array.path
        with self.lock:
            self.chunks[array.path, Path(path).relative_to(folder).as_posix()] = record

    def finished(self) -> dict[str, dict[str, list[int]]]:
        """Every recorded shard checksummed: {array path: {chunk key: [size, crc]}}."""
        out: dict[str, dict[str, list[int]]] = {}
        for (name, key), record in sorted(self.chunks.items()):
            if record is None:
                record = file_crc32(self.root / name / key)
            out.setdefault(name, {})[key] = list(record)
        return out


def part_path(root: Path, process: int) -> Path:
    """Where process ``process`` leaves its shard records for process 0."""
    return Path(root) / f".pmpipe_chunks.{process}.json"


def write_part(root: Path, process: int, chunks: dict) -> None:
    part_path(root, process).write_text(json.dumps(chunks))


def write_manifest(  # parameters: the store, its processes' chunk records and its marker
    group, root: Path, processes: int, own: dict, marker: dict
) -> int:
    """Process 0: merge every process's shard records (its own ``own``, the others' part
    files) with the shape and dtype of every array of ``group`` and the checksums of its
    metadata (the root's as it will be once the ``marker`` attributes are added) into the
    manifest; returns the manifest's CRC-32."""
    root = Path(root)
    chunks = {name: dict(keys) for name, keys in own.items()}
    for process in range(1, processes):
        part = part_path(root, process)
        for name, keys in json.loads(part.read_text()).items():
            chunks.setdefault(name, {}).update(keys)
        part.unlink()
    arrays = {}
    for path, array in _arrays(group):
        written = chunks.get(path, {})
        expected = expected_chunk_count(array.shape, shard_shape(array))
        if len(written) != expected:
            raise RuntimeError(
                f"array {path} of {root}: {len(written)} of its {expected} shards were written"
            )
        arrays[path] = {"shape": list(array.shape), "dtype": str(array.dtype), "chunks": written}
    manifest = {
        "format": 2,
        "checksum": "crc32",
        "arrays": arrays,
        "root_metadata_crc32": root_metadata_crc(root, marker),
        "metadata": {
            str(p.relative_to(root)): list(file_crc32(p))
            for p in sorted(root.rglob(METADATA))
            if p.parent != root
        },
    }
    text = json.dumps(manifest, sort_keys=True)
    (root / MANIFEST).write_text(text)
    return zlib.crc32(text.encode())


def root_metadata_crc(root: Path, marker: dict | None = None) -> int:
    """CRC-32 of the store's root metadata (its zarr.json: attributes, with ``marker`` added,
    and the consolidated metadata of every array) as canonical JSON, without the attributes
    the manifest cannot cover (UNCOVERED_ATTRS)."""
    meta = json.loads((Path(root) / METADATA).read_text())
    attrs = meta.get("attributes", {}) | (marker or {})
    attrs = {k: v for k, v in attrs.items() if k not in UNCOVERED_ATTRS}
    return zlib.crc32(json.dumps({**meta, "attributes": attrs}, sort_keys=True).encode())


def root_attributes(path: Path) -> dict | None:
    """The attributes of the zarr v3 group at path, read from its zarr.json as zarr reads
    them; None when there is no readable group there."""
    try:
        meta = json.loads((Path(path) / METADATA).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict) or meta.get("node_type") != "group":
        return None
    attrs = meta.get("attributes") or {}
    return dict(attrs) if isinstance(attrs, dict) else None


def _arrays(group, prefix: str = ""):
    """(store path, array) of every array under a zarr group."""
    for name, member in sorted(group.members()):
        path = f"{prefix}{name}"
        if hasattr(member, "chunks"):
            yield path, member
        else:
            yield from _arrays(member, path + "/")


def problems(path: Path, attrs: dict, checksums: bool = False, limit: int = 5) -> list[str]:
    """What is wrong with a complete store at path (root attributes attrs) against its
    manifest: missing manifest, arrays of another shape or dtype, shard files missing or of
    another size, and with ``checksums`` another CRC-32; at most ``limit`` problems."""
    import zarr

    path = Path(path)
    manifest_path = path / MANIFEST
    if not manifest_path.is_file():
        return [f"has no {MANIFEST} (what a complete store holds); recompute it"]
    text = manifest_path.read_bytes()
    if attrs.get(MANIFEST_CRC) != zlib.crc32(text):
        return [f"{MANIFEST} does not match the checksum its completion marker recorded"]
    manifest = json.loads(text)
    found = _metadata_problems(path, manifest)
    if found:
        return found[:limit]
    # format 2 on, every array's zarr.json matched its checksum above: its shape and dtype too
    group = zarr.open_group(path, mode="r") if manifest.get("format", 1) < 2 else None
    for name, entry in manifest["arrays"].items():
        if group is not None:
            try:
                array = group[name]
            except KeyError:
                found.append(f"array {name} is missing")
                continue
            if list(array.shape) != entry["shape"] or str(array.dtype) != entry["dtype"]:
                found.append(
                    f"array {name} is {array.dtype} {list(array.shape)}, "
                    f"not {entry['dtype']} {entry['shape']}"
                )
        for key, (size, crc) in entry["chunks"].items():
            chunk = path / name / key
            try:
                actual = os.stat(chunk).st_size
            except FileNotFoundError:
                found.append(f"shard {name}/{key} is missing")
            else:
                if actual != size:
                    found.append(f"shard {name}/{key} has {actual} bytes, not {size}")
                elif checksums and file_crc32(chunk)[1] != crc:
                    found.append(f"shard {name}/{key} does not match its CRC-32")
            if len(found) >= limit:
                return found
    return found


def _metadata_problems(path: Path, manifest: dict) -> list[str]:
    """Metadata documents that differ from the manifest's record of them (manifests of
    format 2 on: the root's metadata and every array's and group's zarr.json)."""
    if manifest.get("format", 1) < 2:
        return []
    found = []
    try:
        if root_metadata_crc(path) != manifest["root_metadata_crc32"]:
            found.append(f"the root {METADATA} (attributes, consolidated metadata) was changed")
    except (OSError, ValueError):
        found.append(f"the root {METADATA} cannot be read")
    for name, record in manifest["metadata"].items():
        try:
            if list(file_crc32(path / name)) != record:
                found.append(f"{name} was changed")
        except FileNotFoundError:
            found.append(f"{name} is missing")
    return found


def expected_chunk_count(shape, chunks) -> int:
    """How many pieces of shape ``chunks`` (chunks or shards) tile an array of shape."""
    return int(np.prod([-(-n // c) for n, c in zip(shape, chunks)], dtype=np.int64))
