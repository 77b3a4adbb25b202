"""How a store's arrays are laid out and encoded: shards (one file each, written whole by one
process) that tile a sharded array's device blocks, the chunks inside them (what a reader reads
at a time), and the codecs of every chunk, which end in a CRC-32C (docs/outputs.md, "Shards,
chunks and codecs")."""

from __future__ import annotations

import math
import warnings

import numpy as np
import zarr

MAX_SHARD_BYTES = 512 * 2**20  # largest shard: one file, written at once by one process
MAX_CHUNK_BYTES = 64 * 2**20  # largest chunk inside a shard: what a reader reads at a time
COMPRESS_BELOW_BYTES = 2**20  # floating-point arrays up to this size are zstd-compressed
MANTISSA_BITS = {"float16": 10, "float32": 23, "float64": 52}


def codecs(dtype, nbytes: int, keepbits: int | None = None) -> dict:
    """The ``filters`` and ``compressors`` of zarr's create_array for an array of dtype and
    size nbytes: floating-point data above COMPRESS_BELOW_BYTES is stored as raw bytes (zstd
    gains little on it and writes slowly), or bit-rounded to keepbits mantissa bits and then
    zstd-compressed; everything else (small arrays, integers, booleans, text) zstd. Every
    chunk ends in its CRC-32C (zarr's crc32c codec, checked on every read)."""
    checksum = zarr.codecs.Crc32cCodec()
    kind = "U" if dtype is str else np.dtype(dtype).kind
    if kind not in "fc" or nbytes <= COMPRESS_BELOW_BYTES:
        return {"filters": None, "compressors": [zarr.codecs.ZstdCodec(), checksum]}
    bits = MANTISSA_BITS.get(np.dtype(dtype).name)
    if keepbits is None or bits is None or keepbits >= bits:
        return {"filters": None, "compressors": [checksum]}
    return {"filters": [_bitround(keepbits)], "compressors": [zarr.codecs.ZstdCodec(), checksum]}


def quiet_zarr() -> None:
    """Filter zarr-python's warnings about two things the stores use on purpose
    (docs/outputs.md): numcodecs' BitRound codec and consolidated metadata, both outside the
    zarr v3 specification. Called where they would be warned about, since a filter added
    once can be undone by another thread's warnings.catch_warnings (which is not
    thread-safe; a job whose runs overlap creates stores on two threads); adding it again
    replaces it."""
    warnings.filterwarnings("ignore", message="Numcodecs codecs are not in the Zarr version 3")
    warnings.filterwarnings("ignore", message="Consolidated metadata is currently not part")


def _bitround(keepbits: int):
    """numcodecs' BitRound as a zarr 3 array-to-array codec (zarr >= 3.1 ships it)."""
    from zarr.codecs import BitRound

    quiet_zarr()
    return BitRound(keepbits=keepbits)


def block_shards(data, max_bytes: int | None = None) -> tuple[int, ...]:
    """Shard shape for data: for a JAX array, its device block cut into shards of at most
    max_bytes (default MAX_SHARD_BYTES) that tile the block exactly (:func:`tile`), so that
    every shard lies in one block (one writer per shard); for numpy data,
    :func:`leading_shards`."""
    import jax

    max_bytes = MAX_SHARD_BYTES if max_bytes is None else max_bytes
    itemsize = np.dtype(data.dtype).itemsize
    if not isinstance(data, jax.Array):
        return leading_shards(data.shape, itemsize, max_bytes)
    return tile(data.sharding.shard_shape(data.shape), itemsize, max_bytes)


def inner_chunks(shards: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    """The chunks inside a shard: the shard cut into pieces of at most MAX_CHUNK_BYTES that
    tile it exactly (:func:`tile`)."""
    return tile(shards, itemsize, MAX_CHUNK_BYTES)


def tile(shape: tuple[int, ...], itemsize: int, max_bytes: int) -> tuple[int, ...]:
    """Pieces of at most max_bytes that tile an array of shape exactly: cut along its leading
    axis first (into the fewest equal pieces that fit), then the next axis if one index of the
    leading axis is still too large, and so on; every piece is then one contiguous piece of
    the array's memory, written without a copy."""
    piece = [max(1, n) for n in shape]
    for i in range(len(piece)):
        if math.prod(piece) * itemsize <= max_bytes:
            break
        rest = math.prod(piece[i + 1 :]) * itemsize
        piece[i] = max(
            (d for d in range(1, piece[i] + 1) if piece[i] % d == 0 and d * rest <= max_bytes),
            default=1,
        )
    return tuple(piece)


def leading_shards(
    shape: tuple[int, ...], itemsize: int, max_bytes: int | None = None
) -> tuple[int, ...]:
    """Shards of at most max_bytes (default MAX_SHARD_BYTES) of an array written at once:
    whole trailing axes, the leading axis cut (and the next ones, when one index of the
    leading axis is larger than max_bytes)."""
    max_bytes = MAX_SHARD_BYTES if max_bytes is None else max_bytes
    piece = [max(1, n) for n in shape]
    for i in range(len(piece)):
        if math.prod(piece) * itemsize <= max_bytes:
            break
        piece[i] = max(1, max_bytes // (math.prod(piece[i + 1 :]) * itemsize))
    return tuple(piece)
