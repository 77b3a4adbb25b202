"""Each job's part of its campaign's summaries, ``<campaign>/parts/<job>.zarr``: the summaries
stores of the job's complete runs stacked along ``run``, with each run's config hash and the
:func:`pmpipe.storage.run_record.fingerprint` of each of its stores when they were read. Process 0
of a job writes its part once the job's runs are done (pmpipe.job.pipeline), keeping the
rows of its earlier part that are still current, so that the campaign's collection reads one
store per job instead of one per run. A part is written under a name of its own, then put in
place of the earlier one by a rename; a reader takes it whole into memory and uses it only
when it was not replaced meanwhile, and a row only while its run's stores keep the recorded
fingerprints, the run's config hash is the campaign's and the part has the summaries layout
this pmpipe writes (else the collection reads that run's own store)."""

from __future__ import annotations

import os
import shutil
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from pmpipe import stages
from pmpipe.run import config, validation
from pmpipe.runtime import log
from pmpipe.stages import status
from pmpipe.storage import encoding, provenance, run_record, store

LOG = log.get(__name__)
PARTS = "parts"
BOOKKEEPING = ("run", "config_hash", "fingerprint")  # a part's arrays that are not summaries


@dataclass(frozen=True)
class Part:
    """A part read into memory: each array (run first) with its dimension names and
    attributes; the stages whose stores each row's fingerprints are of."""

    arrays: dict[str, np.ndarray]
    labels: dict[str, tuple[tuple[str, ...], dict]]
    stages: tuple[str, ...]

    def __getitem__(self, name: str) -> np.ndarray:
        return self.arrays[name]


@dataclass(frozen=True)
class Row:
    """A run's row in a part."""

    part: Part
    index: int


def job_part(campaign_dir: str | Path, job: str) -> Path:
    """Where the job's part of the campaign's summaries is."""
    return Path(campaign_dir) / PARTS / f"{job}.zarr"


def fingerprints(run_dir: str | Path, names: tuple[str, ...]) -> list[list[int]]:
    """The fingerprint of each of the run's stores of stages ``names``; [0, 0, 0] for a store
    without root metadata."""
    return [run_record.fingerprint(stages.store_path(run_dir, s)) or [0, 0, 0] for s in names]


def labels(source) -> dict[str, tuple[tuple[str, ...], dict, tuple[int, ...], np.dtype]]:
    """Each summary array of one run, by name: dimension names, attributes, shape and type, as
    a run's summaries store (a zarr group) or a :class:`Row`'s part (without its run axis)
    holds it."""
    if isinstance(source, Row):
        return {
            name: (dims[1:], attrs, source.part[name].shape[1:], source.part[name].dtype)
            if dims[:1] == ("run",)
            else (dims, attrs, source.part[name].shape, source.part[name].dtype)
            for name, (dims, attrs) in source.part.labels.items()
            if name not in BOOKKEEPING
        }
    return {
        name: (
            tuple(source[name].metadata.dimension_names),
            dict(source[name].attrs),
            source[name].shape,
            source[name].dtype,
        )
        for name in source.array_keys()
    }


def axis(source, name: str) -> np.ndarray:
    """The axis ``name`` (a 1-D array named like its dimension) of a run's summaries store or
    of a :class:`Row`'s part."""
    return np.asarray(source.part[name] if isinstance(source, Row) else source[name][...])


def stacked(name: str, sources: list, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """The array ``name`` (of ``shape`` and ``dtype`` for one run) of each run stacked along a
    first axis, each run read from its source: a :class:`Row` (its part in memory), a run's
    summaries store, or None (filled with NaN; 0 for an integer or boolean array)."""
    fill = np.nan if dtype.kind in "fc" else 0
    out = np.full((len(sources), *shape), fill, dtype)
    rows: dict[int, list[tuple[int, Row]]] = defaultdict(list)
    for i, source in enumerate(sources):
        if isinstance(source, Row):
            rows[id(source.part)].append((i, source))
        elif source is not None:
            out[i] = source[name][...]
    for found in rows.values():
        data = found[0][1].part[name]
        out[[i for i, _ in found]] = data[[row.index for _, row in found]]
    return out


def summary_arrays(sources: list) -> dict[str, tuple[np.ndarray, tuple[str, ...], dict]]:
    """Each summary array of the runs of ``sources`` (at least one not None), by name: (data,
    dimension names, attributes), an axis (a 1-D array named like its dimension) as one run
    has it, every other array stacked along ``run`` (:func:`stacked`)."""
    first = next(s for s in sources if s is not None)
    return {
        name: (axis(first, name), dims, attrs)
        if dims == (name,)
        else (stacked(name, sources, shape, dtype), ("run", *dims), attrs)
        for name, (dims, attrs, shape, dtype) in sorted(labels(first).items())
    }


def write_statistics(out, sources: list, labelled_by: str) -> None:
    """Write into the store ``out`` the runs' summary arrays (:func:`summary_arrays`), each
    array stacked along ``run`` naming ``labelled_by``: the arrays of dims (run) that label
    it."""
    for name, (data, dims, attrs) in summary_arrays(sources).items():
        if dims == (name,):
            store.write_coordinate(out, name, data, attrs["units"], attrs["long_name"])
            continue
        extra = {k: v for k, v in attrs.items() if k not in ("units", "long_name", "coordinates")}
        store.write_array(
            out,
            name,
            data,
            dims,
            attrs["units"],
            attrs["long_name"],
            coordinates=labelled_by,
            **extra,
        )


def read_part(path: str | Path) -> Part | None:
    """The complete part at ``path`` in memory, or None when there is none, it has another
    summaries layout than this pmpipe writes, it does not read, or it was replaced while it
    was read."""
    before = run_record.fingerprint(path)
    try:
        group: Any = zarr.open_group(Path(path), mode="r")
        attrs = dict(group.attrs)
        if store.COMPLETE not in attrs or attrs.get("layout") != provenance.layout("summaries"):
            return None
        arrays = dict(group.arrays())
        part = Part(
            {n: np.asarray(a[...]) for n, a in arrays.items()},
            {n: (tuple(a.metadata.dimension_names), dict(a.attrs)) for n, a in arrays.items()},
            tuple(attrs["stages"]),
        )
    except (OSError, KeyError, ValueError, TypeError, RuntimeError):  # zarr's, a codec's
        return None
    return part if before is not None and run_record.fingerprint(path) == before else None


def current_rows(path: str | Path, campaign_dir: str | Path, hashes: dict | None = None) -> dict:
    """The rows of the part at ``path`` (:func:`read_part`) that still hold their run's
    summaries, by run id: the run's stores unwritten since (same fingerprints) and, with
    ``hashes`` (run id -> config hash), the run's config hash the one given."""
    part = read_part(path)
    if part is None:
        return {}
    rows = {}
    for i, run in enumerate(str(r) for r in part["run"]):
        if hashes is not None and hashes.get(run) != part["config_hash"][i]:
            continue
        if fingerprints(Path(campaign_dir) / run, part.stages) == part["fingerprint"][i].tolist():
            rows[run] = Row(part, i)
    return rows


def write_part(path: str | Path, run_dirs: list[Path]) -> Path | None:
    """Write the part at ``path`` from the runs of ``run_dirs`` whose summaries are complete and
    current, and the rows of the earlier part there still current for other runs; returns the
    path, or None when there is no run to write. One process writes it (no other process of
    the job takes part)."""
    path = Path(path)
    campaign_dir = path.parent.parent
    sources: dict[str, Any] = {}
    hashes: dict[str, str] = {}
    prints: dict[str, list] = {}
    names: tuple[str, ...] = ()
    for run, row in current_rows(path, campaign_dir).items():
        sources[run], names = row, row.part.stages
        hashes[run] = str(row.part["config_hash"][row.index])
        prints[run] = row.part["fingerprint"][row.index].tolist()
    for run_dir in run_dirs:
        try:
            run_file = validation.read_run_file(run_dir / "config.json")
        except (OSError, config.ConfigError, ValueError):
            continue
        run_stages = stages.run_stages(run_file.config)
        taken = fingerprints(run_dir, run_stages)  # before the check: a later write shows
        summaries = stages.store_path(run_dir, "summaries")
        if "summaries" in run_stages and status.is_current(summaries, run_file.config_hash):
            sources[run_dir.name] = zarr.open_group(summaries, mode="r")
            hashes[run_dir.name], prints[run_dir.name] = run_file.config_hash, taken
            names = run_stages
    if not sources:
        return None
    runs = sorted(r for r in sources if len(prints[r]) == len(names))
    _write_new(path, names, runs, [sources[r] for r in runs], hashes, prints)
    return path


def _write_new(path: Path, names, runs: list[str], sources: list, hashes, prints) -> None:
    """Write the part under a name of its own, mark it complete, then rename it to ``path``
    (the earlier part moved aside first, then deleted)."""
    unique = f"{os.getpid()}-{time.monotonic_ns()}"
    writing = path.with_name(f".{path.name}.{unique}")
    group: Any = zarr.open_group(
        writing,
        mode="w",
        zarr_format=3,
        attributes={
            "format": provenance.FORMAT,
            "stage": "summary_part",
            "layout": provenance.layout("summaries"),
            "stages": list(names),
            "started": store.now(),
        },
    )
    run_axis = ("run",)
    arrays: dict[str, Any] = {
        "run": (np.array(runs), run_axis, {"long_name": "run id"}),
        "config_hash": (np.array([hashes[r] for r in runs]), run_axis, {}),
        "fingerprint": (
            np.array([prints[r] for r in runs], np.int64),
            ("run", "stage", "stat"),
            {"long_name": "mtime (ns), size, inode of each stage's store's root metadata"},
        ),
    }
    for name, (data, dims, attrs) in (arrays | summary_arrays(sources)).items():
        array = group.create_array(
            name,
            shape=data.shape,
            dtype=str if data.dtype.kind == "U" else data.dtype,
            dimension_names=dims,
            attributes=attrs,
        )
        array[...] = data
    group.update_attributes({store.COMPLETE: store.now()})
    encoding.quiet_zarr()
    zarr.consolidate_metadata(writing)  # a reader opens every array in one read
    earlier = path.with_name(f".{path.name}.old-{unique}")
    if path.exists():
        os.replace(path, earlier)
    os.replace(writing, path)
    shutil.rmtree(earlier, ignore_errors=True)


def write_part_or_warn(path: str | Path, run_dirs: list[Path]) -> None:
    """:func:`write_part`; a part that cannot be written is logged, not fatal (the collection
    reads the runs' own stores instead)."""
    try:
        written = write_part(path, run_dirs)
    except Exception as err:  # noqa: BLE001  the part saves the collection reads; the runs are done
        LOG.warning(
            "[pmpipe] the job's part of the campaign summaries, %s, not written: %s", path, err
        )
        return
    if written is not None:
        LOG.info("[pmpipe] the job's part of the campaign summaries: %s", written)
