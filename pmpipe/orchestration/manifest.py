"""Tables of a campaign's runs: ``pmpipe plan``'s table of sizes and how its decomposition
was chosen, and manifest.csv, one row per run (per run and draw with lensing.draws) with its
status."""

from __future__ import annotations

import csv
import math
from collections.abc import Callable
from pathlib import Path

from pmpipe import stages
from pmpipe.orchestration import decomposition, launch, resources
from pmpipe.orchestration import design as designs
from pmpipe.orchestration import site as sites
from pmpipe.orchestration.campaign import Campaign, RunSpec, check_fits, job_groups
from pmpipe.orchestration.resources import GPU_SPEEDUP, calibration_factors, disk_bytes
from pmpipe.physics import background
from pmpipe.physics.power_table import BOLTZMANN_KINDS
from pmpipe.run import config
from pmpipe.run import draws as nuisance_draws
from pmpipe.storage import integrity, store

DERIVED = ("sigma8", "A_s", "S8", "sigma8_cb", "Omega_cb")  # columns of every run, given or derived


def parameter_names(specs: list[RunSpec]) -> list[str]:
    """Design parameter names in order of first appearance."""
    return list(dict.fromkeys(name for spec in specs for name in spec.parameters))


COUNTED_RUNS = 20  # runs looked at for a complete one whose files are counted
ROWS_SHOWN = 20  # rows of a larger campaign's plan table: its first and last runs


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
    return "\n".join(lines)


def jobs_line(camp: Campaign, results_dir: str | Path, site: sites.Site | None) -> str:
    """The campaign's jobs (execution.runs_per_job), the SLURM arrays ``pmpipe submit`` makes
    of them (within the site's or the cluster's MaxArraySize, :func:`site.max_array_size`),
    and the files of a run, counted in the campaign's first complete run when there is one."""
    jobs = len(job_groups(camp.runs, camp.execution.job_size()))
    limit, source = sites.max_array_size(site, sites.scontrol_config())
    most = site.max_submit_jobs if site is not None else None
    line = (
        f"{jobs} jobs of at most {camp.execution.job_size()} runs (execution.runs_per_job); "
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


def derived_parameters(spec: RunSpec, run_dir: Path) -> dict[str, float | None]:
    """σ8, A_s, S8 = σ8 (Ω_m / 0.3)^½, σ8 of CDM + baryons and Ω_cb of a run: as its
    configuration gives them, else as its complete ic store records them (the Boltzmann code's
    derived normalisation, docs/outputs.md); None where neither says (A_s of an Eisenstein-Hu
    run, σ8 of a tabulated P(k), or a run not made yet). Without massive neutrinos σ8_cb is σ8
    and Ω_cb is Ω_m."""
    cosmo = spec.run.cosmology
    sigma8, A_s = cosmo.sigma8, cosmo.A_s
    sigma8_cb = sigma8 if cosmo.m_nu == 0 else None
    if spec.run.power.kind == "table":  # the table as it is: cosmology.sigma8 does not apply
        sigma8 = sigma8_cb = None
    elif spec.run.power.kind in BOLTZMANN_KINDS and None in (sigma8, A_s, sigma8_cb):
        ic = Path(run_dir) / "ic.zarr"
        attrs = integrity.root_attributes(ic) if store.has_marker(ic) else None
        if attrs and attrs.get("config_hash") == config.config_hash(spec.run):
            source = attrs.get("linear_power") or {}
            sigma8, A_s = source.get("sigma8", sigma8), source.get("A_s", A_s)
            sigma8_cb = source.get("sigma8_cb", sigma8_cb)
    S8 = None if sigma8 is None else sigma8 * math.sqrt(cosmo.Omega_m / 0.3)
    return {
        "sigma8": sigma8,
        "A_s": A_s,
        "S8": S8,
        "sigma8_cb": sigma8_cb,
        "Omega_cb": float(background.omega_cb(cosmo)),
    }


def design_values(spec: RunSpec, names: list[str], derived: dict) -> dict[str, float | None]:
    """Each design parameter of ``names`` for the run: the point's own value, else the run's
    (:func:`pmpipe.orchestration.design.run_value`), else the ``derived`` one
    (:func:`derived_parameters`); None where none is known."""
    values = {}
    for name in names:
        value = spec.parameters.get(name, designs.run_value(spec.run, name))
        values[name] = derived.get(name) if value is None else value
    return values


def draw_columns(spec: RunSpec) -> list[dict]:
    """The columns of each draw of the run's lensing.draws: its index ``draw`` and the values
    of every drawn parameter (pmpipe.run.draws.filled_points; empty where unknown); [{}] for
    a run without draws."""
    lens = spec.run.lensing
    if lens is None or lens.draws is None:
        return [{}]
    return [
        {"draw": d, **{n: "" if v is None else v for n, v in values.items()}}
        for d, values in enumerate(nuisance_draws.filled_points(spec.run))
    ]


def manifest_rows(
    camp: Campaign, results_dir: str | Path, status: Callable[[Path], str]
) -> list[dict]:
    """One row per run (with lensing.draws, per run and draw): id, the draw's index and drawn
    values (:func:`draw_columns`), index, point,
    realisation, paired, seed, each design parameter (:func:`design_values`; empty where
    unknown), the columns of DERIVED (:func:`derived_parameters`, empty where unknown), run
    folder, config hash and status(run folder)."""
    specs = list(camp.runs)
    names = parameter_names(specs)
    draws = {spec.run_id: draw_columns(spec) for spec in specs}
    drawn = list(dict.fromkeys(name for rows in draws.values() for row in rows for name in row))
    rows = []
    for spec in specs:
        run_dir = Path(results_dir) / camp.name / spec.run_id
        derived = derived_parameters(spec, run_dir)
        run_columns = {
            "index": spec.index,
            "point": spec.point,
            "realisation": spec.realisation,
            "paired": spec.paired,
            "seed": spec.seed,
            **{n: "" if v is None else v for n, v in design_values(spec, names, derived).items()},
            **{n: "" if v is None else v for n, v in derived.items()},
            "run_dir": run_dir,
            "config_hash": config.config_hash(spec.run),
            "status": status(run_dir),
        }
        for draw in draws[spec.run_id]:
            rows.append(
                {"run_id": spec.run_id, **{n: draw.get(n, "") for n in drawn}, **run_columns}
            )
    return rows


def recorded_seeds(path: Path) -> dict[str, int]:
    """{run id: seed} of a manifest.csv (rows without a run id or an integer seed skipped)."""
    with path.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    return {
        row["run_id"]: int(row["seed"])
        for row in rows
        if row.get("run_id") and (row.get("seed") or "").isdigit()
    }


def seed_collisions(camp: Campaign, results_dir: str | Path) -> dict[str, int]:
    """{campaign: runs} of the other campaigns in ``results_dir`` (their manifest.csv) whose
    runs have the seed of one of ``camp``'s runs."""
    mine = {spec.seed for spec in camp.runs}
    found = {}
    for path in sorted(Path(results_dir).glob("*/manifest.csv")):
        if path.parent.name != camp.name:
            shared = [run for run, seed in recorded_seeds(path).items() if seed in mine]
            if shared:
                found[path.parent.name] = len(shared)
    return found


def write_manifest(camp: Campaign, path: str | Path, status: Callable[[Path], str]) -> None:
    """Write manifest.csv at path = <results>/<campaign>/manifest.csv, next to the run folders."""
    path = Path(path)
    if path.parent.name != camp.name:
        raise ValueError(
            f"the manifest of campaign {camp.name} belongs in <results>/{camp.name}/, "
            f"next to its run folders, not in {path.parent}"
        )
    rows = manifest_rows(camp, path.parent.parent, status)
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
