"""Campaign-level results: every run's summaries (each statistic) stacked along a ``run`` dimension
(``results/<campaign>/summaries.zarr``) and the manifest (``manifest.csv``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pmpipe import stages
from pmpipe.campaigns import campaign as campaigns
from pmpipe.campaigns import design as designs
from pmpipe.campaigns import run_index
from pmpipe.results import campaign_status, manifest, summary_parts
from pmpipe.run import config
from pmpipe.runtime import log
from pmpipe.storage import provenance, run_record, store

LOG = log.get(__name__)


def collect(
    campaign_file: str | Path, results: str | Path = "results", partial: bool = False
) -> Path:
    """Write the campaign's summaries.zarr and manifest.csv from its runs' summaries (complete
    and made from the run's configuration as the campaign makes it); returns the folder. A
    run's summaries are read from a job's part (pmpipe.results.summary_parts) where a part
    holds them as they are, else from the run's own store. Every run must be complete, or
    with ``partial`` at least one: a run not complete then has its statistics filled (NaN, 0
    for integers) and ``complete`` false, and the store says each run's state (done, running,
    failed, pending) and the error of a failed one (pmpipe.results.campaign_status)."""
    camp = campaigns.load(campaign_file)
    specs = list(camp.runs)
    campaign_dir = Path(results) / camp.name
    hashes = [config.config_hash(s.run) for s in specs]
    rows: dict = {}
    wanted = {s.run_id: h for s, h in zip(specs, hashes)}
    for part in sorted((campaign_dir / summary_parts.PARTS).glob("*.zarr")):
        rows.update(summary_parts.current_rows(part, campaign_dir, wanted))
    sources = [
        rows.get(s.run_id) or _run_summaries(campaign_dir / s.run_id, h, partial)
        for s, h in zip(specs, hashes)
    ]
    complete = [s is not None for s in sources]
    if not any(complete):
        raise store.IncompleteStoreError(
            f"no run of campaign {camp.name} in {campaign_dir} is complete yet: nothing to collect"
        )
    LOG.info(
        "%d of %d runs collected: %d from their jobs' parts, %d from their own stores",
        sum(complete),
        len(specs),
        len(rows),
        sum(complete) - len(rows),
    )
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
    per_run = _write_per_run(out, specs, campaign_dir)  # xarray reads them as coordinates
    per_run += _write_states(out, specs, campaign_dir, complete)
    summary_parts.write_statistics(out, sources, " ".join(per_run))
    store.mark_complete(out)
    run_stages = stages.run_stages(camp.base)  # a design changes no stage
    manifest.write_manifest(
        camp,
        campaign_dir / "manifest.csv",
        lambda run_dir: campaign_status.manifest_status(run_dir, run_stages),
    )
    run_index.write(campaign_dir, camp.name, run_stages, campaigns.job_ids(camp))
    return campaign_dir


def _run_summaries(run_dir: Path, config_hash: str, partial: bool):
    """The run's own summaries store, opened; with ``partial``, None when it is not complete
    and current (else that is an error)."""
    try:
        return store.open_complete(stages.store_path(run_dir, "summaries"), config_hash)
    except store.IncompleteStoreError:
        if partial:
            return None
        raise


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
