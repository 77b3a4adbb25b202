"""Campaign-level results: every run's summaries (each statistic) stacked along a ``run`` dimension
(``results/<campaign>/summaries.zarr``) and the manifest (``manifest.csv``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pmpipe import stages
from pmpipe.orchestration import campaign as campaigns
from pmpipe.orchestration import design as designs
from pmpipe.orchestration import manifest
from pmpipe.run import config
from pmpipe.stages import status
from pmpipe.storage import provenance, store


def collect(campaign_file: str | Path, results: str | Path = "results") -> Path:
    """Write the campaign's summaries.zarr and manifest.csv from its runs' summaries stores
    (each must be complete and made from the run's configuration as the campaign makes it);
    returns the folder."""
    camp = campaigns.load(campaign_file)
    specs = list(camp.runs)
    campaign_dir = Path(results) / camp.name
    groups = [
        store.open_complete(
            stages.store_path(campaign_dir / spec.run_id, "summaries"),
            config.config_hash(spec.run),
        )
        for spec in specs
    ]
    first = groups[0]
    started = store.now()
    out = store.create(
        campaign_dir / "summaries.zarr",
        {
            "format": provenance.FORMAT,
            "stage": "collect",
            "campaign": camp.name,
            "campaign_config": camp.model_dump(mode="json"),
            "run_config_hashes": [g.attrs["config_hash"] for g in groups],
            **provenance.software(),
            "started": started,
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
    for name in (n for n in names if n not in coordinates):  # every statistic, stacked by run
        source = first[name]
        dims = ("run",) + tuple(source.metadata.dimension_names)
        extra = {k: v for k, v in source.attrs.items() if k not in ("units", "long_name")}
        store.write_array(
            out,
            name,
            np.stack([np.asarray(g[name][:]) for g in groups]),
            dims,
            source.attrs["units"],
            source.attrs["long_name"],
            coordinates=" ".join(per_run),
            **extra,
        )
    store.mark_complete(out)
    manifest.write_manifest(camp, campaign_dir / "manifest.csv", status.run_status)
    return campaign_dir


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
