"""Zarr v3 stores of the stages: layout, labelled arrays, provenance and the completion marker.

Every array carries ``dimension_names`` plus ``units`` and ``long_name`` attributes, and every
dimension that has coordinates has a 1-D array of the same name, so ``xarray.open_zarr(path)``
reads a store as a labelled Dataset. Sharded JAX arrays are written block by block, each
device's block into its own chunk (one writer per chunk), and read back the same way.

A store is complete only once :func:`mark_complete` has run; it is the last write. Every reader
goes through :func:`open_complete`, which refuses a store without the marker, so nothing
half-written is ever consumed. Layout and names: docs/outputs.md.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import shutil
import subprocess
import warnings
from pathlib import Path

import jax
import numpy as np
import zarr
from jax.sharding import Mesh

from pmpipe import config, parallel

COMPLETE = "pmpipe_complete"  # root attribute written last: completion time (UTC, ISO 8601)
FORMAT = "pmpipe-store-1"     # root attribute 'format': layout version of docs/outputs.md
STAGE_STORES = {"ic": "ic.zarr", "nbody": "nbody.zarr", "summaries": "summaries.zarr"}


class IncompleteStoreError(RuntimeError):
    """A store that is missing, lacks its completion marker, or belongs to another config."""


def now() -> str:
    """Current UTC time, ISO 8601 with seconds."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _git_commit() -> str | None:
    """Commit of the pmpipe source tree (with '-dirty' when modified), None outside a checkout."""
    src = Path(__file__).resolve().parent.parent
    if not (src / ".git").exists():
        return None
    try:
        out = subprocess.run(["git", "-C", str(src), "describe", "--always", "--dirty",
                              "--abbrev=40"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def software() -> dict:
    """Versions of pmpipe (and its git commit) and of the JAX stack."""
    return {
        "pmpipe_version": _version("pmpipe"),
        "git_commit": _git_commit(),
        "jax_version": jax.__version__,
        "jaxlib_version": _version("jaxlib"),
        "jaxdecomp_version": _version("jaxdecomp"),
    }


def provenance(run_file: config.RunFile, stage: str, mesh: Mesh, started: str) -> dict:
    """Root attributes of a stage store: what made it, from which config, where and when."""
    devices = mesh.devices.reshape(-1)
    return {
        "format": FORMAT,
        "stage": stage,
        "campaign": run_file.campaign,
        "run_id": run_file.run_id,
        "config": run_file.config.model_dump(mode="json"),
        "config_hash": run_file.config_hash,
        "parameters": run_file.parameters,
        **software(),
        "device_kind": devices[0].device_kind,
        "device_count": int(devices.size),
        "process_count": jax.process_count(),
        "pdims": list(parallel.pdims_of(mesh)),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        "started": started,
    }


def _writer() -> bool:
    """Whether this process writes metadata and replicated data (process 0 of the run)."""
    return jax.process_index() == 0


def create(path: str | Path, attrs: dict) -> zarr.Group:
    """A new, empty store at path with root attributes attrs; an older store there is removed.
    Process 0 creates it; the others open it once it exists."""
    path = Path(path)
    if _writer():
        if path.exists():
            shutil.rmtree(path)
        group = zarr.open_group(path, mode="w", zarr_format=3)
        group.attrs.update(attrs)
    parallel.barrier(f"create {path}")
    return group if _writer() else zarr.open_group(path, mode="r+")


def create_array(group: zarr.Group, name: str, shape: tuple[int, ...], dtype, dims: tuple[str, ...],
                 units: str, long_name: str, chunks: tuple[int, ...] | None = None,
                 **attrs) -> zarr.Array:
    """An empty labelled array: dimension names, units and long name (chunks default: whole).
    Text (numpy 'U' dtypes) is stored as variable-length UTF-8 strings."""
    if len(dims) != len(shape):
        raise ValueError(f"{name}: {len(dims)} dimension names for a {len(shape)}-d array")
    dtype = str if np.dtype(dtype).kind == "U" else np.dtype(dtype)
    if _writer():
        group.create_array(name, shape=tuple(shape), dtype=dtype, chunks=tuple(chunks or shape),
                           dimension_names=dims,
                           attributes={"units": units, "long_name": long_name, **attrs})
    parallel.barrier(f"create_array {name}")
    return zarr.open_array(group.store, path=_child(group, name), mode="r+")


def _child(group: zarr.Group, name: str) -> str:
    """Store path of a group's child array."""
    return f"{group.path}/{name}".lstrip("/")


def write_blocks(array: zarr.Array, data, leading: tuple[int, ...] = ()) -> None:
    """Write data into array[leading + ...]: a sharded JAX array block by block (only the
    blocks this process holds, one replica each), or a numpy array at once by process 0."""
    if isinstance(data, jax.Array) and not data.is_fully_replicated:
        for shard in data.addressable_shards:
            if shard.replica_id == 0:
                array[tuple(leading) + tuple(shard.index)] = np.asarray(shard.data)
    elif _writer():
        array[tuple(leading) + (Ellipsis,)] = np.asarray(data)


def block_chunks(data) -> tuple[int, ...]:
    """Chunk shape of one device block of a sharded array (the whole array for numpy)."""
    if isinstance(data, jax.Array):
        return tuple(data.sharding.shard_shape(data.shape))
    return tuple(data.shape)


def write_array(group: zarr.Group, name: str, data, dims: tuple[str, ...], units: str,
                long_name: str, **attrs) -> zarr.Array:
    """Write a numpy array, or a sharded JAX array with one chunk per device block."""
    array = create_array(group, name, data.shape, data.dtype, dims, units, long_name,
                         block_chunks(data), **attrs)
    write_blocks(array, data)
    return array


def write_coordinate(group: zarr.Group, name: str, values, units: str, long_name: str) -> zarr.Array:
    """A 1-D coordinate array named like its dimension."""
    return write_array(group, name, np.asarray(values), (name,), units, long_name)


def mark_complete(group: zarr.Group) -> None:
    """Once every process has written its blocks, process 0 consolidates the metadata, records
    the end time, then writes the marker: the last act."""
    parallel.barrier("blocks written")
    if not _writer():
        parallel.barrier("marker written")
        return
    with warnings.catch_warnings():  # consolidated metadata is a zarr-python v3 extension
        warnings.simplefilter("ignore")
        zarr.consolidate_metadata(group.store)
    finished = now()
    zarr.open_group(group.store, mode="r+").attrs.update({"finished": finished, COMPLETE: finished})
    parallel.barrier("marker written")


def is_complete(path: str | Path) -> bool:
    """True when path is a zarr group whose completion marker is written."""
    try:
        return COMPLETE in zarr.open_group(Path(path), mode="r").attrs
    except (FileNotFoundError, zarr.errors.GroupNotFoundError, ValueError):
        return False


def open_complete(path: str | Path, config_hash: str | None = None) -> zarr.Group:
    """Open a complete store for reading; refuse a missing or incomplete one, or one made from
    another configuration than config_hash."""
    path = Path(path)
    if not is_complete(path):
        state = "has no completion marker (it was not finished)" if path.exists() else "does not exist"
        raise IncompleteStoreError(f"{path} {state}; run the stage that produces it first")
    group = zarr.open_group(path, mode="r")
    if config_hash is not None and group.attrs.get("config_hash") != config_hash:
        raise IncompleteStoreError(
            f"{path} was made from config {group.attrs.get('config_hash')}, not {config_hash}; "
            "rerun the stage that produces it with the current config.json")
    return group


def read_sharded(array: zarr.Array, mesh: Mesh, leading: tuple[int, ...] = ()) -> jax.Array:
    """array[leading] (an (X, Y, ...) block) as a JAX array sharded over mesh, each device
    reading only its own block."""
    shape = tuple(array.shape[len(leading):])
    return jax.make_array_from_callback(shape, parallel.field_sharding(mesh),
                                        lambda index: array[tuple(leading) + tuple(index)])


def describe(path: str | Path) -> str:
    """A human summary of a store: state, provenance and every array with its labels."""
    path = Path(path)
    try:
        group = zarr.open_group(path, mode="r")
    except (FileNotFoundError, zarr.errors.GroupNotFoundError) as err:
        raise IncompleteStoreError(f"{path} is not a zarr store ({err})") from None
    attrs = dict(group.attrs)
    state = f"complete ({attrs[COMPLETE]})" if COMPLETE in attrs else "INCOMPLETE (no completion marker)"
    lines = [f"{path}: {attrs.get('stage', '?')} store, {state}"]
    for key in ("campaign", "run_id", "config_hash", "pmpipe_version", "git_commit", "jax_version",
                "device_kind", "device_count", "pdims", "slurm_job_id", "started", "finished"):
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
