"""A campaign's collected results in the forms training code reads: an xarray Dataset whose
``run`` dimension is indexed by the design parameters (:func:`open_campaign`), and one table
with a row per run (per run and draw with lensing.draws) and a column per parameter and per
element of every statistic (:func:`campaign_table`), written as Parquet or npz
(:func:`export`).

Both read the campaign's summaries.zarr (pmpipe.results.aggregate), complete or
partial: its ``complete`` column says which rows hold statistics.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from pmpipe.campaigns import design
from pmpipe.run import config
from pmpipe.storage import store

FORMATS = ("parquet", "npz")
DRAW = "draw"  # the dimension of a run's draws of nuisances (lensing.draws)
PAIRS = {"source": "source2"}  # dimensions of a symmetric pair: one column per unordered pair


def summaries_path(campaign_dir: str | Path) -> Path:
    """The campaign store of a campaign's results folder; IncompleteStoreError naming it when
    it is not there or not complete."""
    path = Path(campaign_dir) / "summaries.zarr"
    if not store.is_complete(path):
        raise store.IncompleteStoreError(
            f"{path} is missing or incomplete: collect the campaign first (the workflow's "
            "collect rule, or pmpipe collect [--partial])"
        )
    return path


def design_parameters(ds) -> list[str]:
    """The design parameters of a campaign Dataset: its (run) arrays whose long name says so."""
    return [
        name
        for name in ds.variables
        if ds[name].dims == ("run",) and design.holds_design_parameter(ds[name].attrs)
    ]


def open_campaign(campaign_dir: str | Path):
    """The campaign's summaries.zarr as an xarray Dataset whose ``run`` dimension is indexed by
    the design parameters (a pandas MultiIndex: ``ds.sel(Omega_m=0.3)`` selects a point's
    runs); the run ids are the coordinate ``run_id``. A design without parameters keeps the
    run ids as the index."""
    import pandas as pd
    import xarray as xr

    ds = xr.open_zarr(summaries_path(campaign_dir))
    params = design_parameters(ds)
    if not params:
        return ds
    index = pd.MultiIndex.from_arrays([ds[p].values for p in params], names=params)
    ds = ds.assign_coords(run_id=("run", ds["run"].values)).drop_vars(["run", *params])
    return ds.assign_coords(xr.Coordinates.from_pandas_multiindex(index, "run"))


def _label(value) -> str:
    return f"{value:.6g}" if isinstance(value, float | np.floating) else str(value)


def flat_columns(name: str, values: np.ndarray, dims: tuple[str, ...], coords: dict) -> dict:
    """The columns of one statistic: ``values`` of dims ``dims`` (row dims first, already
    reduced to the table's rows: shape (rows, ...)) flattened over the other dims, one column
    per element, named ``name[dim=value, ...]`` by the dims' coordinates (the index where a dim
    has none); of a pair of dims (PAIRS), only the elements with the first index at most the
    second. A statistic without other dims is the column ``name``."""
    rest = dims[1:]
    if not rest:
        return {name: values}
    labels = [coords.get(d, np.arange(values.shape[1 + i])) for i, d in enumerate(rest)]
    columns = {}
    for where in np.ndindex(*values.shape[1:]):
        position = dict(zip(rest, where))
        if any(
            d in position and p in position and position[d] > position[p] for d, p in PAIRS.items()
        ):
            continue
        key = ", ".join(f"{d}={_label(labels[i][j])}" for i, (d, j) in enumerate(position.items()))
        if f"{name}[{key}]" in columns:
            raise ValueError(
                f"{name}: two elements are both named {name}[{key}] (coordinates equal to 6 "
                "significant digits): not exported"
            )
        columns[f"{name}[{key}]"] = values[(slice(None), *where)]
    return columns


def campaign_table(campaign_dir: str | Path) -> dict[str, np.ndarray]:
    """The campaign as one table, {column: values}: a row per run, or per run and draw when
    its statistics have a ``draw`` dimension; ``run_id`` (and ``draw``), then every (run)
    array (design and derived parameters, seed, paired, complete, state, failure), then every
    statistic flattened (:func:`flat_columns`); values as summaries.zarr holds them."""
    import zarr

    g = zarr.open_group(summaries_path(campaign_dir), mode="r")
    arrays: dict[str, Any] = dict(g.arrays())
    dims = {name: tuple(a.metadata.dimension_names) for name, a in arrays.items()}
    coords = {name: a[:] for name, a in arrays.items() if dims[name] == (name,)}
    runs = coords.pop("run")
    drawn = [n for n in arrays if DRAW in dims[n] and dims[n] != (DRAW,)]
    draws = arrays[drawn[0]].shape[dims[drawn[0]].index(DRAW)] if drawn else 1
    coords.pop(DRAW, None)
    table = {"run_id": np.repeat(runs, draws)}
    if drawn:
        table[DRAW] = np.tile(np.arange(draws), len(runs))
    per_run = sorted(n for n in arrays if dims[n] == ("run",) and n != "run")
    statistics = sorted(
        n
        for n in arrays
        if n not in coords and n != "run" and n not in per_run and dims[n] != (DRAW,)
    )
    for name in per_run + statistics:
        values = np.asarray(arrays[name][:])
        if DRAW in dims[name]:  # (run, draw, ...) -> rows of (run, draw)
            axis = dims[name].index(DRAW)
            values = np.moveaxis(values, axis, 1)
            values = values.reshape(len(runs) * draws, *values.shape[2:])
            named = ("row", *(d for d in dims[name][1:] if d != DRAW))
        else:
            values = np.repeat(values, draws, axis=0)
            named = ("row", *dims[name][1:])
        table |= flat_columns(name, values, named, coords)
    return table


def export(campaign_dir: str | Path, fmt: str, out: str | Path | None = None) -> Path:
    """Write :func:`campaign_table` as ``fmt`` (FORMATS): Parquet (one table, pandas and
    pyarrow) or npz (an array per column, named as the column); default path
    ``<campaign_dir>/<campaign>.<fmt>``. Returns the path."""
    if fmt not in FORMATS:
        raise config.ConfigError(f"--format {fmt!r}: choose one of {', '.join(FORMATS)}")
    campaign_dir = Path(campaign_dir)
    path = Path(out) if out is not None else campaign_dir / f"{campaign_dir.name}.{fmt}"
    table = campaign_table(campaign_dir)
    if fmt == "npz":  # strings as fixed-width unicode: loaded without pickle
        columns: dict[str, Any] = {name: _fixed(v) for name, v in table.items()}
        np.savez(path, **columns)
        return path
    import pandas as pd

    frame = pd.DataFrame({name: _plain(v) for name, v in table.items()})
    frame.to_parquet(path, index=False)
    return path


def _plain(values: np.ndarray) -> np.ndarray:
    """Strings as Python objects (zarr's variable-width strings are not pyarrow's)."""
    return values.astype(object) if values.dtype.kind in "TUO" else values


def _fixed(values: np.ndarray) -> np.ndarray:
    if values.dtype.kind not in "TO":
        return values
    return np.array([str(v) for v in values], dtype=str)  # width of the longest
