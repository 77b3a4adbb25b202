"""Whole shards of the raw layout (docs/outputs.md, "Shards, chunks and codecs": each chunk's
bytes as they lie in memory, little-endian, then its CRC-32C; the index at the shard's end with
its own CRC-32C) written and read without zarr's codec pipeline, which copies every chunk on
its way: a shard goes from the host block to its file, and back into the block it belongs
to, with no copy in between. The files are byte for byte those zarr writes (zarr-python reads
them, and this module reads zarr's); every other array (compressed, bit-rounded, of another
byte order) and every partial shard takes zarr's path."""

from __future__ import annotations

import itertools
import math
import os
import zlib
from pathlib import Path

import google_crc32c
import numpy as np

from pmpipe.storage.integrity import shard_shape

EMPTY = 2**64 - 1  # the index's offset and length of a chunk that is not stored
INDEX_ENTRY_BYTES = 16  # offset and length, uint64 each
CRC_BYTES = 4
ALIGNMENT = 64  # bytes: XLA's CPU buffers


def chunk_shape(array) -> tuple[int, ...] | None:
    """The chunks inside the shards of zarr ``array`` when its shards are in the raw layout
    this module writes and reads (one sharding codec: bytes, little-endian, and CRC-32C for
    its chunks and for its index at the end; a numeric dtype), else None."""
    from zarr.codecs import BytesCodec, Crc32cCodec, ShardingCodec
    from zarr.codecs.sharding import ShardingCodecIndexLocation

    codecs: tuple = tuple(getattr(array.metadata, "codecs", ()))
    if len(codecs) != 1 or not isinstance(codecs[0], ShardingCodec):
        return None
    sharding = codecs[0]

    def raw(pipeline) -> bool:
        return (
            len(pipeline) == 2
            and isinstance(pipeline[0], BytesCodec)
            and getattr(pipeline[0].endian, "value", pipeline[0].endian) in ("little", None)
            and isinstance(pipeline[1], Crc32cCodec)
        )

    dtype = np.dtype(array.dtype)
    if (
        not (raw(sharding.codecs) and raw(sharding.index_codecs))
        or sharding.index_location != ShardingCodecIndexLocation.end
        or dtype.kind not in "fciu"
        or dtype.byteorder == ">"
    ):
        return None
    return tuple(sharding.chunk_shape)


def whole_shards(array, start: tuple[int, ...], shape: tuple[int, ...]):
    """The (array selection, block selection) of every shard of a block of array at start,
    or None when the block is not made of whole shards."""
    axes = []
    for s, n, c, size in zip(start, shape, shard_shape(array), array.shape):
        if s % c or (n % c and s + n != size):
            return None
        axes.append([(s + o, o, min(c, n - o)) for o in range(0, n, c)])
    return [
        (tuple(slice(a, a + m) for a, _, m in pieces), tuple(slice(o, o + m) for _, o, m in pieces))
        for pieces in itertools.product(*axes)
    ]


def local_file(
    array, selection: tuple[slice, ...], block: np.ndarray
) -> tuple[Path, tuple[int, ...]] | None:
    """The file of the shard that ``selection`` of zarr ``array`` is, with its chunks' shape,
    when that shard is stored in a folder in the raw layout and ``block`` fills it whole: what
    :func:`write` writes. None otherwise (zarr writes it)."""
    from zarr.storage import LocalStore

    chunks, store = chunk_shape(array), array.store_path.store
    shape = shard_shape(array)
    if (
        chunks is None
        or not isinstance(store, LocalStore)
        or block.shape != shape
        or block.dtype != np.dtype(array.dtype)
        or not tiles(shape, chunks)
    ):
        return None
    return _shard_file(array, selection), chunks


def _shard_file(array, selection: tuple[slice, ...]) -> Path:
    """The file of the shard at which ``selection`` of zarr ``array`` (in a LocalStore) starts."""
    coords = tuple(s.start // n for s, n in zip(selection, shard_shape(array)))
    return Path(array.store_path.store.root) / array.path / array.metadata.encode_chunk_key(coords)


def _pieces(shape: tuple[int, ...], chunks: tuple[int, ...]):
    """(grid coordinates, slices) of every chunk of a shard of ``shape``, in the order zarr
    lays them out in the file (Morton order), so that the file is byte for byte zarr's."""
    from zarr.core.indexing import morton_order_iter

    grid = tuple(n // c for n, c in zip(shape, chunks))
    for coords in morton_order_iter(grid):
        yield coords, tuple(slice(i * c, (i + 1) * c) for i, c in zip(coords, chunks))


def tiles(shape: tuple[int, ...], chunks: tuple[int, ...]) -> bool:
    """Whether chunks of shape ``chunks`` tile a shard of ``shape`` exactly."""
    return len(shape) == len(chunks) and all(n % c == 0 for n, c in zip(shape, chunks))


def _crc32c(data: np.ndarray) -> int:
    view = data.view()
    view.flags.writeable = False  # google_crc32c takes read-only buffers only
    return google_crc32c.value(view)


def write(path: Path, block: np.ndarray, chunks: tuple[int, ...]) -> tuple[int, int]:
    """Write ``block``, one whole shard whose chunks of shape ``chunks`` tile it, to the shard
    file ``path``; returns its (size in bytes, CRC-32), taken from the bytes as they are
    written (the manifest's record of the file)."""
    pieces: list = []
    grid = tuple(n // c for n, c in zip(block.shape, chunks))
    index = np.empty(grid + (2,), "<u8")
    offset = 0
    for coords, where in _pieces(block.shape, chunks):
        chunk = np.ascontiguousarray(block[where]).reshape(-1).view(np.uint8)  # a view if whole
        pieces += [chunk, np.uint32(_crc32c(chunk)).tobytes()]
        index[coords] = offset, chunk.nbytes + CRC_BYTES
        offset += chunk.nbytes + CRC_BYTES
    raw_index = index.reshape(-1).view(np.uint8)
    pieces += [raw_index, np.uint32(_crc32c(raw_index)).tobytes()]
    path.parent.mkdir(parents=True, exist_ok=True)
    crc, size = 0, 0
    with open(path, "wb", buffering=0) as file:
        for piece in pieces:
            view = memoryview(piece).cast("B")
            crc = zlib.crc32(view, crc)
            size += view.nbytes
            while view:
                view = view[file.write(view) :]
    return size, crc


def read_into(path: Path, out: np.ndarray, chunks: tuple[int, ...]) -> bool:
    """Fill ``out`` (one whole shard, C-contiguous) from the shard file ``path`` whose chunks
    of shape ``chunks`` tile it, each read straight into its place and its CRC-32C checked
    (ValueError naming the checksum when one does not match, as zarr's). False, with ``out``
    untouched, when the file holds a chunk that is not stored (zarr fills it)."""
    grid = tuple(n // c for n, c in zip(out.shape, chunks))
    index_bytes = math.prod(grid) * INDEX_ENTRY_BYTES
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        tail = np.frombuffer(
            _pread(fd, index_bytes + CRC_BYTES, size - index_bytes - CRC_BYTES), np.uint8
        )
        _check(tail[:index_bytes], tail[index_bytes:], path, "the index")
        index = tail[:index_bytes].view("<u8").reshape(grid + (2,))
        if (index[..., 0] == EMPTY).any():
            return False
        for coords, where in _pieces(out.shape, chunks):
            offset, length = (int(v) for v in index[coords])
            target = out[where]
            whole = target.flags.c_contiguous
            chunk = target if whole else np.empty(target.shape, out.dtype)
            data = chunk.reshape(-1).view(np.uint8)
            stored = bytearray(CRC_BYTES)
            if (
                length != data.nbytes + CRC_BYTES
                or os.preadv(fd, [data.data, stored], offset) != length
            ):
                raise ValueError(f"{path}: chunk {coords} is {length} bytes, not {data.nbytes}")
            _check(data, np.frombuffer(stored, np.uint8), path, f"chunk {coords}")
            if not whole:
                target[...] = chunk
        return True
    finally:
        os.close(fd)


def _aligned_empty(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """An uninitialised array whose data starts on an ALIGNMENT-byte boundary, which JAX's CPU
    devices take without a copy."""
    nbytes = math.prod(shape) * dtype.itemsize
    raw = np.empty(nbytes + ALIGNMENT, np.uint8)
    start = -raw.ctypes.data % ALIGNMENT
    return raw[start : start + nbytes].view(dtype).reshape(shape)


def _pread(fd: int, count: int, offset: int) -> bytes:
    if offset < 0:
        raise ValueError(f"a shard file of {offset + count} bytes is shorter than its index")
    data = os.pread(fd, count, offset)
    if len(data) != count:
        raise ValueError(f"a shard file ends after {len(data)} of {count} bytes")
    return data


def _check(data: np.ndarray, stored: np.ndarray, path: Path, what: str) -> None:
    computed = np.uint32(_crc32c(data)).tobytes()
    if computed != stored.tobytes():
        raise ValueError(
            f"{path}: {what}: stored and computed checksum do not match. Stored: "
            f"{stored.tobytes()!r}. Computed: {computed!r}."
        )


def read(array, selection: tuple) -> np.ndarray:
    """``array[selection]`` (ints and slices, one per leading axis at most), its whole shards
    in the raw layout read by :func:`read_into` straight into the result, the rest by zarr."""
    from zarr.storage import LocalStore

    chunks, store = chunk_shape(array), array.store_path.store
    if chunks is None or not isinstance(store, LocalStore):
        return array[selection]
    bounds = [
        s.indices(n)[:2] if isinstance(s, slice) else (s, s + 1)
        for s, n in zip(selection + (slice(None),) * (array.ndim - len(selection)), array.shape)
    ]
    start = tuple(a for a, _ in bounds)
    shape = tuple(b - a for a, b in bounds)
    pieces = whole_shards(array, start, shape)
    if not pieces or any(isinstance(s, slice) and s.step not in (None, 1) for s in selection):
        return array[selection]
    out, whole = _aligned_empty(shape, np.dtype(array.dtype)), shard_shape(array)
    for where, inside in pieces:
        target, path = out[inside], _shard_file(array, where)
        if not (
            target.shape == whole
            and target.flags.c_contiguous
            and tiles(target.shape, chunks)
            and path.is_file()
            and read_into(path, target, chunks)
        ):
            target[...] = array[where]
    drop = tuple(slice(None) if isinstance(s, slice) else 0 for s in selection)
    return out[drop]
