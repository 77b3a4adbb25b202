"""Campaign-level results: every run's summaries (each statistic) stacked along a ``run`` dimension
(``results/<campaign>/summaries.zarr``) and the manifest (``manifest.csv``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pmpipe import stages
from pmpipe.orchestration import campaign as campaigns
from pmpipe.orchestration import campaign_status, manifest, run_index
from pmpipe.orchestration import design as designs
from pmpipe.run import config
from pmpipe.stages import run_record, status
from pmpipe.storage import provenance, store


def collect(
    campaign_file: str | Path, results: str | Path = "results", partial: bool = False
) -> Path:
    """Write the campaign's summaries.zarr and manifest.csv from its runs' summaries stores
    (complete and made from the run's configuration as the campaign makes it); returns the
    folder. Every run must be complete, or with ``partial`` at least one: a run not complete
    then has its statistics filled (NaN, 0 for integers) and ``complete`` false, and the store
    says each run's state (done, running, failed, pending) and the error of a failed one
    (pmpipe.orchestration.campaign_status)."""
    camp = campaigns.load(campaign_file)
    specs = list(camp.runs)
    campaign_dir = Path(results) / camp.name
    paths = [stages.store_path(campaign_dir / s.run_id, "summaries") for s in specs]
    hashes = [config.config_hash(s.run) for s in specs]
    if partial:
        complete = [status.is_current(p, h) for p, h in zip(paths, hashes)]
        if not any(complete):
            raise store.IncompleteStoreError(
                f"no run of campaign {camp.name} in {campaign_dir} is complete yet: nothing "
                "to collect"
            )
    else:
        complete = [True] * len(specs)
    groups = [store.open_complete(p, h) if c else None for p, h, c in zip(paths, hashes, complete)]
    first = next(g for g in groups if g is not None)
    out = store.create(
        campaign_dir / "summaries.zarr",
        {
            "format": provenance.FORMAT,
            "stage": "collect",
            "campaign": camp.name,
            "campaign_config": camp.model_dump(mode="json"),
            "run_config_hashes": hashes,
            "complete_runs": sum(complete),
            **provenance.software(),
            "started": store.now(),
        },
    )
    store.write_coordinate(out, "run", np.array([s.run_id for s in specs]), "1", "run id")
    names = sorted(first.array_keys())
    coordinates = [n for n in names if tuple(first[n].metadata.dimension_names) == (n,)]
    for name in coordinates:
        source = first[name]
        store.write_coordinate(
            out, name, source[:], source.attrs["units"], source.attrs["long_name"]
        )
    per_run = _write_per_run(out, specs, campaign_dir)  # xarray reads them as coordinates
    per_run += _write_states(out, specs, campaign_dir, complete)
    for name in (n for n in names if n not in coordinates):  # every statistic, stacked by run
        source = first[name]
        dims = ("run",) + tuple(source.metadata.dimension_names)
        extra = {k: v for k, v in source.attrs.items() if k not in ("units", "long_name")}
        store.write_array(
            out,
            name,
            _stacked(name, groups, source),
            dims,
            source.attrs["units"],
            source.attrs["long_name"],
            coordinates=" ".join(per_run),
            **extra,
        )
    store.mark_complete(out)
    run_stages = stages.run_stages(camp.base)  # a design changes no stage
    manifest.write_manifest(
        camp,
        campaign_dir / "manifest.csv",
        lambda run_dir: campaign_status.manifest_status(run_dir, run_stages),
    )
    run_index.write(campaign_dir, camp.name, run_stages, campaigns.job_ids(camp))
    return campaign_dir


def _stacked(name: str, groups: list, source) -> np.ndarray:
    """The array ``name`` of every run's store stacked along a first axis; a run without a
    store (None) filled with NaN (0 for an integer or boolean array)."""
    fill = np.full(source.shape, np.nan if source.dtype.kind in "fc" else 0, source.dtype)
    return np.stack([fill if g is None else np.asarray(g[name][:]) for g in groups])


def _write_states(out, specs: list, campaign_dir: Path, complete: list[bool]) -> list[str]:
    """Write the arrays of dims (run) that say what was collected: ``complete``, ``state``
    (campaign_status.STATES) and ``failure`` (the stage and error of a failed run, else
    empty); their names."""
    states, failures = [], []
    for spec in specs:
        run_dir = campaign_dir / spec.run_id
        record = run_record.read(run_dir)
        state = campaign_status.run_state(run_dir, stages.run_stages(spec.run), record)
        states.append(state)
        failed = state == "failed" and record is not None
        failures.append(campaign_status.failure_text(record) if failed else "")
    store.write_array(
        out, "complete", np.array(complete), ("run",), "1", "the run's statistics are collected"
    )
    store.write_array(
        out,
        "state",
        np.array(states),
        ("run",),
        "1",
        f"the run's state when collected: {', '.join(campaign_status.STATES)}",
    )
    store.write_array(
        out,
        "failure",
        np.array(failures),
        ("run",),
        "1",
        "stage and error of the run's last computation where it failed, else empty",
    )
    return ["complete", "state", "failure"]


def _write_per_run(out, specs: list, campaign_dir: Path) -> list[str]:
    """Write the arrays of dims (run): each design parameter, the derived parameters where
    they are not design parameters (manifest.derived_parameters), seed and paired; their
    names."""
    parameters = manifest.parameter_names(specs)
    values = [manifest.derived_parameters(spec, campaign_dir / spec.run_id) for spec in specs]
    for name in parameters:
        column = [
            np.nan if found is None else found
            for found in (manifest.design_values(s, [name], v)[name] for s, v in zip(specs, values))
        ]
        store.write_array(
            out,
            name,
            np.array(column, np.float64),
            ("run",),
            "1",
            designs.describe(name),
        )
    derived = [n for n in manifest.DERIVED if n not in parameters]
    for name in derived:
        store.write_array(
            out,
            name,
            np.array([np.nan if v[name] is None else v[name] for v in values]),
            ("run",),
            "1",
            f"{name} of the run: its configuration's, else derived by the Boltzmann code "
            "(NaN: unknown)",
        )
    store.write_array(
        out,
        "seed",
        np.array([s.seed for s in specs], dtype=np.int64),
        ("run",),
        "1",
        "white-noise seed of the run",
    )
    store.write_array(
        out,
        "paired",
        np.array([s.paired for s in specs]),
        ("run",),
        "1",
        "phases inverted (partner of a pair)",
    )
    return parameters + derived + ["seed", "paired"]
