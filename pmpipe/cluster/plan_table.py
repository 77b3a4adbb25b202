"""``pmpipe plan``'s lines about a campaign: the table of its runs' sizes, its jobs and SLURM
arrays, its halo, how its decomposition was chosen and its Boltzmann tables."""

from __future__ import annotations

import math
from pathlib import Path

from pmpipe import stages
from pmpipe.campaigns import decomposition, resources
from pmpipe.campaigns.campaign import Campaign, check_fits, job_groups
from pmpipe.campaigns.resources import (
    GPU_SPEEDUP,
    array_bytes,
    calibration_factors,
    disk_bytes,
)
from pmpipe.cluster import launch
from pmpipe.cluster import site as sites
from pmpipe.physics.theory.power_table import BOLTZMANN_KINDS
from pmpipe.results.manifest import parameter_names
from pmpipe.run import config
from pmpipe.storage import store

COUNTED_RUNS = 20  # runs looked at for a complete one whose files are counted
ROWS_SHOWN = 20  # rows of a larger campaign's plan table: its first and last runs
LARGEST = 3  # arrays of a run named by size


def plan_table(camp: Campaign, rows: int | None = ROWS_SHOWN) -> str:
    """Plain-text table of the runs: id, parameters, seed, devices, nodes, memory per device,
    nbody runtime and disk (of the first and last ``rows // 2`` runs of a campaign of more
    than ``rows``; every run with None), then the campaign's totals; checks first that every
    run fits."""
    estimates = check_fits(camp)
    specs = list(camp.runs)
    names = parameter_names(specs)
    header = ["run_id", *names, "seed", "devices", "nodes", "GB/device", "nbody min", "disk GB"]
    run_disk = sum(disk_bytes(specs[0].run).values())  # the runs share their sizes
    half = len(specs) if rows is None or len(specs) <= rows else rows // 2
    shown = sorted({*range(half), *range(len(specs) - half, len(specs))})
    table = []
    for i in shown:
        spec, est = specs[i], estimates[i]
        table.append(
            [
                spec.run_id,
                *(f"{spec.parameters[n]:.5g}" if n in spec.parameters else "-" for n in names),
                str(spec.seed),
                str(est.devices),
                str(est.nodes),
                f"{est.memory_per_device_bytes / 1e9:.2f}",
                f"{est.runtime_s['nbody'] / 60:.1f}",
                f"{run_disk / 1e9:.3f}",
            ]
        )
    widths = [max(len(r[i]) for r in [header, *table]) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in [header, *table]]
    if len(table) < len(specs):
        lines.insert(1 + half, f"... {len(specs) - len(table)} runs more ...")
    if camp.execution.calibration is not None:
        time, memory = calibration_factors(camp.execution)
        lines.append(
            f"model calibrated by {camp.execution.calibration}: runtime x{time:.3g}, "
            f"memory beyond the process overhead x{memory:.3g}"
        )
    elif camp.execution.platform == "gpu":
        lines.append(
            f"GPU runtimes are a guess ({GPU_SPEEDUP:g}x the 2-core CPU model per GPU): measure "
            "them with `pmpipe bench nbody --json FILE` on a GPU and give FILE as "
            "execution.calibration"
        )
    nbody = sum(est.runtime_s["nbody"] for est in estimates)
    device_hours = sum(est.devices * sum(est.runtime_s.values()) for est in estimates) / 3600
    per_stage = {stage: f"{b / 1e9:.3f}" for stage, b in disk_bytes(specs[0].run).items()}
    lines.append(
        f"{len(specs)} runs, nbody {nbody / 60:.1f} min in all, {device_hours:.4g} "
        f"{camp.execution.platform.upper()} device-hours for every stage (estimates, before "
        f"the safety factor {camp.execution.runtime_safety}); disk {run_disk * len(specs) / 1e9:.2f} "
        f"GB in all, per run in GB: " + ", ".join(f"{k} {v}" for k, v in per_stage.items())
    )
    largest = sorted(array_bytes(specs[0].run).items(), key=lambda item: -item[1])[:LARGEST]
    lines.append(
        "largest arrays of a run in GB: "
        + ", ".join(f"{stage}.zarr {name} {size / 1e9:.3f}" for (stage, name), size in largest)
        + " (what the stores keep: base.outputs, docs/outputs.md)"
    )
    return "\n".join(lines)


def jobs_line(camp: Campaign, results_dir: str | Path, site: sites.Site | None) -> str:
    """The campaign's jobs (execution.runs_per_job; whether their runs overlap:
    execution.overlap), the SLURM arrays ``pmpipe submit`` makes
    of them (within the site's or the cluster's MaxArraySize, :func:`site.max_array_size`),
    and the files of a run, counted in the campaign's first complete run when there is one."""
    jobs = len(job_groups(camp.runs, camp.execution.job_size()))
    overlap = camp.execution.job_size() > 1 and any(
        resources.overlaps(s.run, camp.execution) for s in camp.runs
    )
    limit, source = sites.max_array_size(site, sites.scontrol_config())
    most = site.max_submit_jobs if site is not None else None
    line = (
        f"{jobs} jobs of at most {camp.execution.job_size()} runs (execution.runs_per_job"
        f"{'; each run overlapping the next on one device: execution.overlap' if overlap else ''}); "
        f"pmpipe submit: {launch.array_count(jobs, limit, most)} SLURM arrays of at most "
        f"{limit} tasks ({source})"
    )
    if most is not None and jobs > most:
        line += f", in {math.ceil(jobs / most)} waves of at most {most} tasks (max_submit_jobs)"
    for spec in camp.runs[:COUNTED_RUNS]:
        run_dir = Path(results_dir) / camp.name / spec.run_id
        run_stages = stages.run_stages(spec.run)
        if all(store.has_marker(stages.store_path(run_dir, s)) for s in run_stages):
            files = sum(1 for p in run_dir.rglob("*") if p.is_file())
            return f"{line}; {files} files a run, {files * len(camp.runs)} in all (counted in {run_dir})"
    return f"{line}; files a run: counted once a run is complete"


def halo_line(camp: Campaign) -> str:
    """The campaign's halo and what it costs, for ``pmpipe plan``."""
    par = camp.base.parallel
    how = " (auto: the design's largest linear displacement)" if camp.halo_source == "auto" else ""
    if par.pdims == (1, 1):
        return f"halo: {par.halo_cells} force-mesh cells{how}, unused on one device"
    padding = resources.halo_padding(camp.base)
    return (
        f"halo: {par.halo_cells} force-mesh cells{how}: each device's force-mesh block "
        f"{padding:.2f} x its own cells on pdims {tuple(par.pdims)}"
    )


def decomposition_line(camp: Campaign) -> str | None:
    """How the campaign's pdims were chosen, for ``pmpipe plan`` (None when they were given)."""
    if camp.decomposition is None:
        return None
    d, box = camp.decomposition, camp.base.box
    what = (
        f"decomposition: pdims {tuple(camp.base.parallel.pdims)} for {d.devices} devices at "
        f"{box.particles * box.oversample}^3 cells"
    )
    if camp.pdims_source == "guessed":
        where = (
            f"no sweep of {d.devices} devices in {d.file}"
            if d.file and d.file.exists()
            else f"no decomposition file {d.file or ''}".rstrip()
        )
        return f"{what}: guessed ({where}; measure with `pmpipe tune`)"
    table = decomposition.load(config.section(d.file, "decomposition.file"))
    sweep = min(
        (s for s in table.sweeps if s.devices == d.devices and s.pdims == camp.base.parallel.pdims),
        key=lambda s: abs(s.force_mesh - box.particles * box.oversample),
    )
    return (
        f"{what}: {camp.pdims_source} in {d.file} ({table.device_kind}, {sweep.force_mesh}^3, "
        f"{sweep.measured}: "
        + ", ".join(f"{k} {v * 1e3:.3g} ms" for k, v in sweep.step_seconds.items())
        + " a step)"
    )


def linear_power_line(camp: Campaign, results_dir: str | Path) -> str | None:
    """For a campaign with power.kind 'camb' or 'class': how many tables its runs need, how many the
    results folder's cache holds, and when the others are made; None for other campaigns."""
    from pmpipe.run import derive
    from pmpipe.storage import power_cache

    specs = [s for s in camp.runs if s.run.power.kind in BOLTZMANN_KINDS]
    if not specs:
        return None
    folder = Path(results_dir) / power_cache.FOLDER
    keys = {power_cache.key(derive.boltzmann_inputs(s.run)) for s in specs}
    cached = sum((folder / f"{key}.npz").exists() for key in keys)
    codes = " and ".join(sorted({s.run.power.kind.upper() for s in specs}))
    return (
        f"linear P(k): {len(keys)} {codes} tables for {len(specs)} runs, {cached} of them cached "
        f"in {folder}; each of the {len(keys) - cached} others takes 0.4-6 s of CPU, "
        "made while the run before it in its job evolves (a job's first run waits for its own)"
    )
