"""Campaigns: expansion of a design into runs (stable ids, derived seeds), their config.json
files, size estimates, Snakemake resources, the plan table and the manifest.

Run ids are ``<campaign>-<point>-r<realisation>`` (``-paired`` for the partner with inverted
phases); points are ``fiducial``, ``<param>-minus`` / ``<param>-plus`` (derivatives),
``p0000``, ``p0001``... (grid, Latin hypercube, Sobol) or the user's names (list). Seeds are
``fold_in(key(campaign seed), i)`` as a 32-bit integer, with i the point's position times the
realisations plus the realisation, or the realisation alone when seeds are common (always for
derivatives), so that the fiducial and its ∓ points share their white noise.
"""

from __future__ import annotations

import csv
import dataclasses
import itertools
import json
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np

from pmpipe import config


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """One run of a campaign."""

    run_id: str
    index: int
    point: str
    realisation: int
    paired: bool
    parameters: dict
    seed: int
    run: config.Run


def design_points(camp: config.Campaign) -> list[tuple[str, dict[str, float]]]:
    """(label, cosmology parameters) of each design point, in a fixed order."""
    design, fiducial = camp.design, camp.base.cosmology
    if design.kind == "fiducial":
        return [("fiducial", {})]
    if design.kind == "list":
        return [(p.name, dict(p.parameters)) for p in design.points]
    if design.kind == "derivatives":
        points = [("fiducial", {name: getattr(fiducial, name) for name in design.parameters})]
        for name, step in design.parameters.items():
            centre = getattr(fiducial, name)
            points += [(f"{name}-minus", {name: round(centre - step, 12)}),
                       (f"{name}-plus", {name: round(centre + step, 12)})]
        return points
    names = list(design.parameters)
    if design.kind == "grid":
        values = itertools.product(*(design.parameters[n] for n in names))
    else:
        from scipy.stats import qmc

        engine = (qmc.LatinHypercube if design.kind == "latin_hypercube" else qmc.Sobol)(
            d=len(names), scramble=True, seed=camp.seed)
        low, high = (np.array([design.parameters[n][i] for n in names]) for i in (0, 1))
        values = qmc.scale(engine.random(design.samples), low, high)
    return [(f"p{i:04d}", {n: float(v) for n, v in zip(names, row)}) for i, row in enumerate(values)]


def derive_seed(campaign_seed: int, index: int) -> int:
    """32-bit seed of run position index: fold_in(key(campaign_seed), index)."""
    import jax

    key = jax.random.fold_in(jax.random.key(campaign_seed), index)
    return int(jax.random.bits(key, dtype=np.uint32))


def expand(camp: config.Campaign, source: str = "campaign") -> list[RunSpec]:
    """Every run of the campaign, in design order; raises ConfigError naming source (the
    campaign file) when a point's parameters make an invalid run."""
    common = camp.common_seeds or camp.design.kind == "derivatives"
    specs = []
    base = camp.base.model_dump()
    for p, (label, params) in enumerate(design_points(camp)):
        data = json.loads(json.dumps(base))
        data["cosmology"].update(params)
        try:
            run = config.Run.model_validate(data)
        except config.ValidationError as err:
            raise config.ConfigError(config.format_errors(
                f"{source}: design point {label} {params}", err)) from None
        for r in range(camp.realisations):
            seed = derive_seed(camp.seed, r if common else p * camp.realisations + r)
            for paired in (False, True) if camp.paired else (False,):
                run_id = f"{camp.name}-{label}-r{r}" + ("-paired" if paired else "")
                ic = run.ic.model_copy(update={"seed": seed, "paired": paired})
                specs.append(RunSpec(run_id, len(specs), label, r, paired, params, seed,
                                     run.model_copy(update={"ic": ic})))
    ids = [s.run_id for s in specs]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise config.ConfigError(f"{source}: duplicate run ids {', '.join(duplicates)}")
    return specs


def run_file(camp: config.Campaign, spec: RunSpec) -> config.RunFile:
    """The config.json content of a run."""
    return config.RunFile.build(camp.name, spec.run_id, spec.index, spec.parameters, spec.run)


def write_run_files(camp: config.Campaign, results: str | Path) -> list[Path]:
    """Write results/<campaign>/<run_id>/config.json for every run, leaving files whose content
    is unchanged untouched (Snakemake compares mtimes); returns the paths."""
    paths = []
    for spec in expand(camp):
        path = Path(results) / camp.name / spec.run_id / "config.json"
        text = run_file(camp, spec).to_json()
        if not path.exists() or path.read_text() != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        paths.append(path)
    return paths


# Size and time model. Memory: the particle state (displacement, momentum, acceleration and the
# donated copies of one step: 6 arrays of N^3 x 3 floats), the force mesh (density, its
# transform, the potential and three force components: ~6 real (BN)^3 fields), one mesh per
# snapshot, all split over the devices, plus the fixed cost of a JAX process (0.6 GB on CPU as
# measured by `pmpipe bench`, docs/performance.md; 0.5 GB assumed per GPU process).
# Time: 2.2e-7 s per force-mesh cell and step per device-core on 2 CPU cores (128^3, 10 steps:
# 3.7 s, docs/performance.md), GPUs assumed 50x faster per device, plus ~10 s of start-up and
# compilation per stage process.
PROCESS_OVERHEAD_BYTES = {"cpu": 0.6e9, "gpu": 0.5e9}
SECONDS_PER_CELL_STEP = {"cpu": 2.2e-7, "gpu": 4.4e-9}
STARTUP_SECONDS = 10.0


@dataclasses.dataclass(frozen=True)
class Estimate:
    """Devices, nodes, memory per device (bytes) and runtime per stage (s) of one run."""

    devices: int
    nodes: int
    memory_per_device: float
    runtime: dict


def estimate(run: config.Run, execution: config.Execution) -> Estimate:
    """Size and runtime estimate of a run (see the constants above)."""
    px, py = run.parallel.pdims
    devices = px * py
    nodes = 1 if execution.platform == "cpu" else math.ceil(devices / execution.devices_per_node)
    itemsize = 8 if run.nbody.dtype == "float64" else 4
    n, cells = run.box.particles, (run.box.particles * run.box.oversample) ** 3
    halo = 1 + 2 * run.parallel.halo_cells * (px > 1) / max(1, n * run.box.oversample // px)
    snapshots = len(set(run.nbody.snapshots) | {run.nbody.a_final})
    field_bytes = itemsize * (6 * 3 * n**3 + (6 * halo + snapshots) * cells)
    memory = field_bytes / devices + PROCESS_OVERHEAD_BYTES[execution.platform]
    steps = run.nbody.steps if isinstance(run.nbody.steps, int) else len(run.nbody.steps) - 1
    steps += len(run.nbody.snapshots)
    per_cell = SECONDS_PER_CELL_STEP[execution.platform] / devices
    runtime = {"ic": STARTUP_SECONDS + 3 * per_cell * n**3,
               "nbody": STARTUP_SECONDS + (steps + 1) * per_cell * cells,
               "summaries": STARTUP_SECONDS + snapshots * per_cell * cells}
    return Estimate(devices, nodes, memory, runtime)


def check_fits(camp: config.Campaign) -> None:
    """Raise ConfigError naming the first run whose memory estimate exceeds the device memory."""
    limit = camp.execution.device_memory_gb * 1e9
    for spec in expand(camp):
        need = estimate(spec.run, camp.execution).memory_per_device
        if need > limit:
            raise config.ConfigError(
                f"run {spec.run_id} needs about {need / 1e9:.2f} GB per device but "
                f"execution.device_memory_gb = {camp.execution.device_memory_gb}; use more devices "
                "(base.parallel.pdims) or fewer particles (base.box.particles)")


def resources(run: config.Run, stage: str, execution: config.Execution) -> dict:
    """Snakemake resources of a stage (SLURM executor plugin names; runtime in minutes)."""
    est = estimate(run, execution)
    gpu = execution.platform == "gpu"
    tasks = min(est.devices, execution.devices_per_node) if gpu else 1
    return {
        "gpu": tasks if gpu else 0,
        "nodes": est.nodes,
        "tasks_per_node": tasks,
        "cpus_per_task": execution.cpus_per_task,
        "mem_mb": max(1000, math.ceil(est.memory_per_device * (tasks if gpu else 1) / 1e6)),
        "runtime": max(1, math.ceil(est.runtime[stage] * execution.runtime_safety / 60)),
    }


def plan_table(camp: config.Campaign) -> str:
    """Plain-text table of the runs: id, parameters, seed, devices, nodes, memory per device,
    nbody runtime; checks first that every run fits."""
    check_fits(camp)
    specs = expand(camp)
    names = sorted({p for s in specs for p in s.parameters})
    header = ["run_id", *names, "seed", "devices", "nodes", "GB/device", "nbody min"]
    rows, total = [], 0.0
    for spec in specs:
        est = estimate(spec.run, camp.execution)
        total += est.runtime["nbody"]
        rows.append([spec.run_id, *(f"{spec.parameters[n]:.5g}" if n in spec.parameters else "-"
                                    for n in names), str(spec.seed), str(est.devices),
                     str(est.nodes), f"{est.memory_per_device / 1e9:.2f}",
                     f"{est.runtime['nbody'] / 60:.1f}"])
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in [header, *rows]]
    lines.append(f"{len(specs)} runs, nbody {total / 60:.1f} min in all (estimate, before the "
                 f"safety factor {camp.execution.runtime_safety})")
    return "\n".join(lines)


def write_manifest(camp: config.Campaign, path: str | Path, status: Callable[[Path], str],
                   results: str | Path = "results") -> None:
    """manifest.csv: one row per run with its design, seed, folder, config hash and status."""
    specs = expand(camp)
    names = sorted({p for s in specs for p in s.parameters})
    with open(path, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["run_id", "index", "point", "realisation", "paired", "seed", *names,
                         "run_dir", "config_hash", "status"])
        for spec in specs:
            run_dir = Path(results) / camp.name / spec.run_id
            writer.writerow([spec.run_id, spec.index, spec.point, spec.realisation, spec.paired,
                             spec.seed, *(spec.parameters.get(n, "") for n in names), run_dir,
                             config.config_hash(spec.run), status(run_dir)])


def campaign_schema() -> dict:
    """JSON schema (draft 2020-12) of campaign files."""
    return {"$schema": "https://json-schema.org/draft/2020-12/schema",
            **config.Campaign.model_json_schema()}


def write_schema(path: str | Path) -> None:
    """Write the campaign schema as JSON (indent 2, sorted keys)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(campaign_schema(), indent=2, sort_keys=True) + "\n")
