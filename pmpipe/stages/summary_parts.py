"""Each job's part of its campaign's summaries, ``<campaign>/parts/<job>.zarr``: the summaries
stores of the job's complete runs stacked along ``run``, with each run's config hash and the
:func:`pmpipe.stages.run_record.fingerprint` of each of its stores when they were read. A job
writes its part when its runs are done (pmpipe.stages.pipeline), keeping the rows of its earlier
part that are still current, so that the campaign's collection reads one store per job instead
of one per run; a row whose run's stores were written since is not used (the collection reads
that run's own store instead)."""

from __future__ import annotations

import os
import shutil
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from pmpipe import stages
from pmpipe.run import config, validation
from pmpipe.runtime import log
from pmpipe.stages import run_record, status
from pmpipe.storage import provenance, store

LOG = log.get(__name__)
PARTS = "parts"
BOOKKEEPING = ("config_hash", "fingerprint")  # a part's arrays that are not statistics


@dataclass(frozen=True)
class Row:
    """A run's row in a part: the part's store and the row's index."""

    part: Any  # zarr.Group
    index: int


def part_path(campaign_dir: str | Path, job: str) -> Path:
    """Where the job's part is."""
    return Path(campaign_dir) / PARTS / f"{job}.zarr"


def fingerprints(run_dir: str | Path, names: tuple[str, ...]) -> list[list[int]]:
    """The fingerprint of each of the run's stores of stages ``names``; [0, 0, 0] for a store
    without root metadata."""
    return [run_record.fingerprint(stages.store_path(run_dir, s)) or [0, 0, 0] for s in names]


def layout(group: Any) -> tuple[list[str], list[str]]:
    """The coordinates (1-D arrays named like their dimension) and the statistics (the other
    arrays) of a run's summaries store or of a part (without its run and bookkeeping arrays),
    each sorted."""
    names = sorted(n for n in group.array_keys() if n not in ("run", *BOOKKEEPING))
    coordinates = [n for n in names if tuple(group[n].metadata.dimension_names) == (n,)]
    return coordinates, [n for n in names if n not in coordinates]


def stacked(name: str, sources: list, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """The array ``name`` (of ``shape`` and ``dtype`` for one run) of each run stacked along a
    first axis, each run read from its source: a :class:`Row` (one read of the part's array
    for all its rows), a run's summaries store, or None (filled with NaN; 0 for an integer or
    boolean array)."""
    fill = np.nan if dtype.kind in "fc" else 0
    out = np.full((len(sources), *shape), fill, dtype)
    rows: dict[int, list[tuple[int, Row]]] = defaultdict(list)
    for i, source in enumerate(sources):
        if isinstance(source, Row):
            rows[id(source.part)].append((i, source))
        elif source is not None:
            out[i] = source[name][...]
    for found in rows.values():
        data = found[0][1].part[name][:]
        out[[i for i, _ in found]] = data[[row.index for _, row in found]]
    return out


def write_statistics(out: Any, sources: list, coordinates: str) -> None:
    """Write into ``out`` the coordinates of the runs' summaries and each statistic stacked
    along ``run`` from ``sources`` (:func:`stacked`; at least one not None), each statistic
    naming ``coordinates`` (the arrays of dims (run) that label it)."""
    found = next(s for s in sources if s is not None)
    first, lead = (found.part, 1) if isinstance(found, Row) else (found, 0)
    names, statistics = layout(first)
    for name in names:
        source = first[name]
        store.write_coordinate(
            out, name, source[:], source.attrs["units"], source.attrs["long_name"]
        )
    for name in statistics:
        source = first[name]
        labels = ("units", "long_name", "coordinates")
        extra = {k: v for k, v in source.attrs.items() if k not in labels}
        store.write_array(
            out,
            name,
            stacked(name, sources, source.shape[lead:], source.dtype),
            ("run", *source.metadata.dimension_names[lead:]),
            source.attrs["units"],
            source.attrs["long_name"],
            coordinates=coordinates,
            **extra,
        )


def current_rows(path: str | Path, campaign_dir: str | Path, hashes: dict | None = None) -> dict:
    """The rows of the part at ``path`` that still hold their run's summaries, by run id: the
    part complete and intact, the run's stores unwritten since (same fingerprints) and, with
    ``hashes`` (run id -> config hash), the run's config hash the one given."""
    if not store.is_complete(path) or store.problems(path):
        return {}
    part: Any = zarr.open_group(Path(path), mode="r")
    names = tuple(part.attrs["stages"])
    runs, recorded = part["run"][:], part["config_hash"][:]
    prints = part["fingerprint"][:].tolist()
    rows = {}
    for i, run in enumerate(str(r) for r in runs):
        if hashes is not None and hashes.get(run) != recorded[i]:
            continue
        if fingerprints(Path(campaign_dir) / run, names) == prints[i]:
            rows[run] = Row(part, i)
    return rows


def write_part(path: str | Path, run_dirs: list[Path]) -> Path | None:
    """Write (every process of the job together, process 0 writing) the part at ``path`` from the runs of ``run_dirs`` whose summaries are complete and
    current, and the rows of the earlier part there still current for other runs; replaces
    the earlier part at once. Returns the path, or None when there is no run to write."""
    from pmpipe.runtime import parallel

    path = Path(path)
    campaign_dir = path.parent.parent
    sources: dict[str, Any] = {}
    hashes: dict[str, str] = {}
    if path.exists():
        for run, row in current_rows(path, campaign_dir).items():
            sources[run] = row
            hashes[run] = str(row.part["config_hash"][row.index])
    names: tuple[str, ...] = ()
    for run_dir in run_dirs:
        try:
            run_file = validation.load_run_file(run_dir / "config.json")
        except (OSError, config.ConfigError, ValueError):
            continue
        summaries = stages.store_path(run_dir, "summaries")
        if not status.is_current(summaries, run_file.config_hash):
            continue
        sources[run_dir.name] = zarr.open_group(summaries, mode="r")
        hashes[run_dir.name] = run_file.config_hash
        names = stages.run_stages(run_file.config)
    if not sources:
        return None
    if not names:  # only rows of the earlier part
        names = tuple(next(iter(sources.values())).part.attrs["stages"])
    runs = sorted(sources)
    written = path.with_name(f".{path.name}.writing")  # the same on every process
    out: Any = store.create(
        written,
        {
            "format": provenance.FORMAT,
            "stage": "summary_part",
            "stages": list(names),
            "started": store.now(),
        },
    )
    store.write_coordinate(out, "run", np.array(runs), "1", "run id")
    store.write_array(
        out,
        "config_hash",
        np.array([hashes[r] for r in runs]),
        ("run",),
        "1",
        "config hash of the run",
    )
    store.write_array(
        out,
        "fingerprint",
        np.array([fingerprints(campaign_dir / r, names) for r in runs], np.int64),
        ("run", "stage", "stat"),
        "1",
        "mtime (ns), size and inode of the root metadata of each stage's store when read",
    )
    write_statistics(out, [sources[r] for r in runs], "config_hash")
    store.mark_complete(out)
    parallel.barrier("part complete")  # every process has checked it before it moves
    if _writer():
        earlier = path.with_name(f".{path.name}.old")
        if path.exists():
            os.replace(path, earlier)
        os.replace(written, path)
        shutil.rmtree(earlier, ignore_errors=True)
    return path


def _writer() -> bool:
    import jax

    return jax.process_index() == 0


def write_part_or_warn(path: str | Path, run_dirs: list[Path]) -> None:
    """:func:`write_part`, every process of the job together; a part that cannot be written is
    logged, not fatal (the collection reads the runs' own stores instead)."""
    try:
        written = write_part(path, run_dirs)
    except Exception as err:  # noqa: BLE001  the part saves the collection reads; the runs are done
        LOG.warning(
            "[pmpipe] the job's part of the campaign summaries, %s, not written: %s", path, err
        )
        return
    if written is not None:
        LOG.info("[pmpipe] the job's part of the campaign summaries: %s", written)
