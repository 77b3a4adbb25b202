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
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
from pydantic import (
    AfterValidator,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from pmpipe import config, validation
from pmpipe.orchestration import decomposition, seeds
from pmpipe.physics import sky
from pmpipe.stages import STAGES

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
DESIGN_KINDS = ("fiducial", "grid", "latin_hypercube", "sobol", "derivatives", "list")
DESIGN_PARAMETERS = tuple(config.Cosmology.model_fields)  # design parameters are cosmology fields
ParameterName = Literal[DESIGN_PARAMETERS]  # type: ignore[valid-type]


def _not_empty(parameters: dict) -> dict:
    if not parameters:
        raise ValueError(
            f"empty design: name at least one cosmology parameter ({', '.join(DESIGN_PARAMETERS)})"
        )
    return parameters


def _increasing(bounds: tuple[float, float]) -> tuple[float, float]:
    if not bounds[0] < bounds[1]:
        raise ValueError("parameter range inverted or empty: give [low, high] with low < high")
    return bounds


def _positive_step(step: float) -> float:
    if not step > 0:
        raise ValueError("the derivative step must be > 0")
    return step


Values = Annotated[list[float], Field(min_length=1)]
Range = Annotated[tuple[float, float], AfterValidator(_increasing)]
Step = Annotated[float, AfterValidator(_positive_step)]


class FiducialDesign(config.StrictModel):
    """One point: the base configuration."""

    kind: Literal["fiducial"]


class GridDesign(config.StrictModel):
    """Cartesian product of parameter values."""

    kind: Literal["grid"]
    parameters: Annotated[dict[ParameterName, Values], AfterValidator(_not_empty)] = Field(
        description="values of each cosmology parameter (its units); every combination is a "
        "design point, the last parameter varying fastest"
    )


class SampledDesign(config.StrictModel):
    """Quasi-random samples (scipy.stats.qmc, scrambled, seeded by the campaign seed) in a box
    of parameter ranges."""

    kind: Literal["latin_hypercube", "sobol"]
    parameters: Annotated[dict[ParameterName, Range], AfterValidator(_not_empty)] = Field(
        description="[low, high] range of each cosmology parameter (its units)"
    )
    samples: int = Field(ge=1, description="number of design points (a power of 2 for sobol)")

    @field_validator("samples")
    @classmethod
    def _sobol_power_of_two(cls, samples: int, info: ValidationInfo) -> int:
        if info.data.get("kind") == "sobol" and samples & (samples - 1):
            low = 1 << (samples.bit_length() - 1)
            raise ValueError(
                f"Sobol samples must be a power of 2 for the sequence's balance "
                f"properties: use {low} or {2 * low}, or kind latin_hypercube"
            )
        return samples


class DerivativesDesign(config.StrictModel):
    """Fiducial point plus, for each parameter, a minus and a plus point (central differences);
    all points share the fiducial seeds."""

    kind: Literal["derivatives"]
    parameters: Annotated[dict[ParameterName, Step], AfterValidator(_not_empty)] = Field(
        description="step of each cosmology parameter (its units): points at fiducial - step "
        "and fiducial + step"
    )


class Point(config.StrictModel):
    """A named design point."""

    name: str = Field(pattern=NAME_PATTERN, description="point label used in the run id")
    parameters: dict[ParameterName, float] = Field(
        default_factory=dict,
        description="cosmology parameters of the point (their units); "
        "the others come from base.cosmology",
    )


class ListDesign(config.StrictModel):
    """Explicit, named points."""

    kind: Literal["list"]
    points: list[Point] = Field(
        min_length=1, description="the design points, each with a unique name"
    )

    @field_validator("points")
    @classmethod
    def _unique(cls, points: list[Point]) -> list[Point]:
        names = [p.name for p in points]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(
                f"duplicate point name(s) {', '.join(duplicates)} would give "
                "duplicate run ids; every point needs its own name"
            )
        return points


# Runs per job by platform. One process compiles once for all its runs, so larger groups
# amortise start-up and compilation (about 10 s a process on 2 CPU cores); smaller groups lose
# less work to a failed job and let a campaign spread over more nodes. A 256^3 run takes
# seconds on a GPU, so 16 of them still make a job of minutes; on CPU 8 runs of 64^3 do.
RUNS_PER_JOB = {"cpu": 8, "gpu": 16}


# What a calibration record (`pmpipe bench nbody --json`) must hold: the configuration measured
# and its step time and peak memory (device_peak_bytes on gpu, peak_rss_bytes on cpu).
CALIBRATION_FIELDS = (
    "platform",
    "particles",
    "oversample",
    "pdims",
    "halo",
    "steps",
    "step_s",
    "peak_rss_bytes",
)


class Execution(config.StrictModel):
    """Where and how the runs execute; used for resources and `pmpipe plan`."""

    platform: Literal["cpu", "gpu"] = Field("cpu", description="devices the stages run on")
    device_memory_gb: float = Field(
        16.0,
        gt=0,
        description="memory of one device in GB (1e9 bytes); on cpu the memory one "
        "process may use, all its XLA host devices together",
    )
    devices_per_node: int = Field(
        1, ge=1, description="GPUs per node; on cpu the XLA host devices one process may use"
    )
    processes_per_node: int | None = Field(
        None,
        ge=1,
        description="processes (srun tasks) per node, each holding an equal share of "
        "the node's devices: on gpu one per GPU by default, or 1 for "
        "one process that drives every GPU of its node; on cpu 1 by "
        "default (one process holds every host device)",
    )
    cpus_per_task: int = Field(2, ge=1, description="CPU cores per process")
    runtime_safety: float = Field(
        3.0, ge=1, description="factor applied to the runtime estimate in resource requests"
    )
    runs_per_job: int | None = Field(
        None,
        ge=1,
        description="runs packed into one job and one process, every stage of each "
        "(default: 8 on cpu, 16 on gpu); runs are grouped by their "
        "position in the design",
    )
    calibration: Path | None = Field(
        None,
        description="a `pmpipe bench nbody --json` record measured on this platform: the "
        "runtime and memory model is scaled to its step time and peak memory "
        "(device memory on gpu, the process's on cpu)",
    )
    _calibration_record: dict | None = PrivateAttr(None)

    @model_validator(mode="after")
    def _read_calibration(self):
        if self.calibration is None:
            return self
        record = config.read_mapping(self.calibration)
        measured = (
            "gpu" if record.get("platform") in ("gpu", "cuda", "rocm") else record.get("platform")
        )
        if measured != self.platform:
            raise ValueError(
                f"execution.calibration {self.calibration} was measured on "
                f"{record.get('platform')}, execution.platform is {self.platform}"
            )
        needed = CALIBRATION_FIELDS + (("device_peak_bytes",) if self.platform == "gpu" else ())
        missing = [k for k in needed if record.get(k) is None]
        if missing:
            raise ValueError(
                f"execution.calibration {self.calibration}: the record lacks "
                f"{', '.join(missing)}; write it with `pmpipe bench nbody --json` "
                f"on the {self.platform} platform"
            )
        self._calibration_record = record
        return self

    @property
    def calibration_record(self) -> dict | None:
        """The bench record of ``calibration``, validated (None without one)."""
        return self._calibration_record

    def node_layout(self, devices: int) -> tuple[int, int]:
        """(processes per node, devices per process) of a run on ``devices`` devices; raises
        ValueError when the processes cannot hold equal shares of a node's devices."""
        gpu = self.platform == "gpu"
        on_node = min(devices, self.devices_per_node) if gpu else devices
        processes = min(on_node, self.processes_per_node or (on_node if gpu else 1))
        if on_node % processes:
            raise ValueError(
                f"execution.processes_per_node = {self.processes_per_node} with {on_node} "
                f"devices on a node: each process holds an equal share of its node's devices; "
                f"choose a divisor of {on_node}"
            )
        return processes, on_node // processes

    def job_size(self) -> int:
        """Runs per job: runs_per_job, else the platform's default (RUNS_PER_JOB)."""
        return self.runs_per_job or RUNS_PER_JOB[self.platform]


class Decomposition(config.StrictModel):
    """base.parallel.pdims chosen for a device count by measurement (pmpipe.orchestration.decomposition)."""

    devices: int = Field(ge=1, description="devices of every run, px * py")
    file: Path | None = Field(
        None,
        description="decomposition file kept with the site settings (e.g. "
        "profiles/<site>/decompositions.yaml), written by `pmpipe tune`; "
        "without one, or without a sweep of these devices, pdims are guessed",
    )


class Campaign(config.StrictModel):
    """A suite of runs: a base configuration, a design that varies cosmology parameters,
    realisations (seeds) per point, and the execution platform."""

    name: str = Field(
        pattern=NAME_PATTERN,
        description="campaign name: results/<name>/, run ids <name>-<point>-r<i>",
    )
    seed: int = Field(
        0, ge=0, description="campaign seed; run seeds derive from it and the run's position"
    )
    base: config.Run = Field(
        default_factory=config.Run,
        description="configuration shared by every run; "
        "base.ic.seed stays unset (seeds are derived)",
    )
    design: FiducialDesign | GridDesign | SampledDesign | DerivativesDesign | ListDesign = Field(
        default_factory=lambda: FiducialDesign(kind="fiducial"),
        discriminator="kind",
        description="how the runs vary: fiducial, grid, latin_hypercube, sobol, derivatives, list",
    )
    realisations: int = Field(
        1, ge=1, description="seeds (independent white-noise fields) per design point"
    )
    common_seeds: bool = Field(
        False,
        description="every design point uses the same realisation seeds (always so for derivatives)",
    )
    paired: bool = Field(
        False, description="each realisation also runs with inverted phases (Angulo & Pontzen 2016)"
    )
    execution: Execution = Field(default_factory=Execution)
    decomposition: Decomposition | None = Field(
        None,
        description="choose base.parallel.pdims for this many devices from recorded "
        "sweeps (pmpipe tune) instead of giving them",
    )
    _pdims_source: str = PrivateAttr("given")
    _runs: tuple[RunSpec, ...] = PrivateAttr(())

    @property
    def runs(self) -> tuple[RunSpec, ...]:
        """Every run of the campaign in design order (:func:`expand`), expanded once when the
        campaign is validated."""
        return self._runs

    @property
    def pdims_source(self) -> str:
        """How base.parallel.pdims were chosen: 'given', or pmpipe.orchestration.decomposition.choose's
        'recorded', 'nearest' or 'guessed'."""
        return self._pdims_source

    @model_validator(mode="before")
    @classmethod
    def _auto_pdims(cls, data):
        """base.parallel.pdims 'auto' is left out of the base run, to be chosen (_choose_pdims)."""
        base = data.get("base") if isinstance(data, dict) else None
        parallel = base.get("parallel") if isinstance(base, dict) else None
        if (
            not isinstance(base, dict)
            or not isinstance(parallel, dict)
            or parallel.get("pdims") != "auto"
        ):
            return data
        if not data.get("decomposition"):
            raise ValueError(
                "base.parallel.pdims 'auto' needs a decomposition section: devices "
                "(and file, the sweeps recorded by `pmpipe tune`)"
            )
        rest = {k: v for k, v in parallel.items() if k != "pdims"}
        return {**data, "base": {**base, "parallel": rest}}

    @field_validator("base")
    @classmethod
    def _simulable(cls, base: config.Run) -> config.Run:
        validation.check_run(base)
        return base

    @model_validator(mode="after")
    def _consistent(self, info: ValidationInfo):
        if self.decomposition is not None:
            self._choose_pdims()
        if self.base.ic.seed != 0:
            raise ValueError(
                "base.ic.seed must not be set: run seeds derive from the campaign "
                "seed and the run's position; change 'seed' instead"
            )
        if self.base.ic.paired:
            raise ValueError("base.ic.paired must not be set: use 'paired: true' at the top level")
        devices = self.base.parallel.pdims[0] * self.base.parallel.pdims[1]
        if self.execution.platform == "cpu" and devices > self.execution.devices_per_node:
            raise ValueError(
                f"base.parallel.pdims needs {devices} devices but execution.devices_per_node = "
                f"{self.execution.devices_per_node} on cpu (one process); raise devices_per_node "
                "or use fewer devices"
            )
        self.execution.node_layout(devices)
        self._runs = tuple(expand(self, (info.context or {}).get("source", "campaign")))
        return self

    def _choose_pdims(self) -> None:
        if "pdims" in self.base.parallel.model_fields_set:
            raise ValueError(
                "base.parallel.pdims are given and so is a decomposition section: "
                "set base.parallel.pdims to 'auto' or remove the section"
            )
        box, par = self.base.box, self.base.parallel
        chosen = config.section(self.decomposition, "decomposition")
        pdims, source = decomposition.choose(
            chosen.devices, box.particles, box.oversample, par.halo_cells, chosen.file
        )
        base = self.base.model_dump()
        base["parallel"]["pdims"] = pdims
        object.__setattr__(self, "base", self._simulable(config.Run.model_validate(base)))
        self._pdims_source = source


def load(path: str | Path) -> Campaign:
    """Read and validate a campaign file (YAML or JSON), every expanded run included."""
    return config.validate(Campaign, config.read_mapping(path), path, {"design": DESIGN_KINDS})


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """One run of a campaign: id, position in the expansion, design point label, realisation,
    whether it is the phase-inverted partner, design parameters, white-noise seed (32-bit) and
    the resolved run (parameters, ic.seed and ic.paired applied)."""

    run_id: str
    index: int
    point: str
    realisation: int
    paired: bool
    parameters: dict[str, float]
    seed: int
    run: config.Run


def design_points(camp: Campaign) -> list[tuple[str, dict[str, float]]]:
    """(label, cosmology parameters) of each design point, in a fixed order."""
    design = camp.design
    if design.kind == "fiducial":
        return [("fiducial", {})]
    if design.kind == "list":
        return [(p.name, dict(p.parameters)) for p in design.points]
    if design.kind == "derivatives":
        fiducial = {name: getattr(camp.base.cosmology, name) for name in design.parameters}
        points = [("fiducial", fiducial)]
        for name, step in design.parameters.items():  # rounded: 0.3111 - 0.01 = 0.3011, not ...0001
            points += [
                (f"{name}-{side}", {**fiducial, name: round(fiducial[name] + sign * step, 12)})
                for side, sign in (("minus", -1), ("plus", 1))
            ]
        return points
    names = list(design.parameters)
    if design.kind == "grid":
        values = itertools.product(*(design.parameters[n] for n in names))
    else:
        from scipy.stats import qmc

        # a Generator (not an int) gives the same stream through scipy's `seed` and `rng` keywords
        engine = (qmc.LatinHypercube if design.kind == "latin_hypercube" else qmc.Sobol)(
            d=len(names), scramble=True, seed=np.random.default_rng(camp.seed)
        )
        low, high = (np.array([design.parameters[n][i] for n in names]) for i in (0, 1))
        values = qmc.scale(engine.random(design.samples), low, high)
    return [
        (f"p{i:04d}", {n: float(v) for n, v in zip(names, row)}) for i, row in enumerate(values)
    ]


def _point_run(base: dict, label: str, parameters: dict[str, float], source: str) -> config.Run:
    """The base run with a design point's cosmology, checked; ConfigError naming the point
    otherwise."""
    values = ", ".join(f"{k} = {v:.6g}" for k, v in parameters.items())
    where = f"{source}: design point {label} (design parameters {values})"
    try:
        run = config.Run.model_validate({**base, "cosmology": {**base["cosmology"], **parameters}})
    except ValidationError as err:
        raise config.ConfigError(config.format_errors(where, err)) from None
    return validation.checked(run, where)


def expand(camp: Campaign, source: str = "campaign") -> list[RunSpec]:
    """Every run of the campaign, in design order; raises ConfigError naming source (the
    campaign file) when a point's parameters make an invalid run. A validated campaign holds
    them (:attr:`Campaign.runs`)."""
    common = camp.common_seeds or camp.design.kind == "derivatives"
    base = camp.base.model_dump()
    specs: list[RunSpec] = []
    for p, (label, parameters) in enumerate(design_points(camp)):
        run = _point_run(base, label, parameters, source)
        for r in range(camp.realisations):
            seed = seeds.derive_seed(camp.seed, r if common else p * camp.realisations + r)
            for paired in (False, True) if camp.paired else (False,):
                run_id = f"{camp.name}-{label}-r{r}" + ("-paired" if paired else "")
                ic = run.ic.model_copy(update={"seed": seed, "paired": paired})
                specs.append(
                    RunSpec(
                        run_id,
                        len(specs),
                        label,
                        r,
                        paired,
                        parameters,
                        seed,
                        run.model_copy(update={"ic": ic}),
                    )
                )
    ids = [s.run_id for s in specs]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise config.ConfigError(f"{source}: duplicate run ids {', '.join(duplicates)}")
    return specs


def run_file(camp: Campaign, spec: RunSpec) -> config.RunFile:
    """The config.json content of a run."""
    return config.RunFile.build(camp.name, spec.run_id, spec.index, spec.parameters, spec.run)


def write_run_files(camp: Campaign, results_dir: str | Path) -> list[Path]:
    """Write results_dir/<campaign>/<run_id>/config.json for every run, leaving files whose
    content is unchanged untouched (Snakemake compares mtimes); returns the paths."""
    paths = []
    for spec in camp.runs:
        path = Path(results_dir) / camp.name / spec.run_id / "config.json"
        text = run_file(camp, spec).to_json()
        if not path.exists() or path.read_text() != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        paths.append(path)
    return paths


# Size and time model, fitted to `pmpipe bench nbody` on the 2-core CPU of docs/performance.md
# (float32, 2LPT + 10 PM steps in one process).
# Memory: peak RSS 0.67 GB (64³, B = 1), 0.78 GB (64³, B = 2), 1.17 GB (128³, B = 1) solve
# RSS = fixed + a N³ + b (BN)³ with fixed ≈ 0.60 GB, a ≈ 53 and b ≈ 15 floats: besides the
# state (displacement, momentum, acceleration: 9 floats per particle) a particle carries its ICs
# as generated and copied and its CIC corner weights and indices; a force-mesh cell its density,
# transform, potential, three force components and their halo-padded blocks. Rounded up to 64
# and 16 floats (the fit is then 2-9 % above every measurement), halo padding applied to the
# mesh part, plus one mesh per kept snapshot. The fixed cost per process is measured on CPU and
# assumed for a GPU process (CUDA context, compiled programs).
PARTICLE_WORDS = 64
MESH_WORDS = 16
# Full-sky shells: each device keeps its share of the shells sampled so far, one word per ray
# of the HEALPix ray grid for each (padded) plane, split over the devices
# (`lightcone.ray_spec`), and while it samples a shell 9 more words per ray of the whole grid
# (directions, cell coordinates, interpolation weights: the memory analysis of the compiled
# shell program, `lightcone._shell`, at ray grids of 64 to 256 nside on CPU).
SHELL_RAY_WORDS = 9
PROCESS_OVERHEAD_BYTES = {"cpu": 0.6e9, "gpu": 0.5e9}
# Time: step_s 0.034 (64³, B = 1) and 0.103 (64³, B = 2) give 9.2e-8 s per particle and 3.8e-8 s
# per force-mesh cell; 128³ (0.321 s) runs 18 % slower than that fit, hence 1.2e-7 and 4e-8.
# The ICs (growth tables, 2LPT, first forces: run_s - 10 step_s) take 3.3 (64³) and 1.5 (128³)
# of this model's steps on the particle grid: 4. A CPU process gets no faster with more XLA host
# devices (they share its cores); GPUs are assumed 50x faster than the 2 cores and to scale
# perfectly over devices.
# Every stage process pays ~10 s for Python and JAX start-up and compilation.
SECONDS_PER_PARTICLE_STEP = 1.2e-7
SECONDS_PER_CELL_STEP = 4e-8
IC_STEPS = 4
GPU_SPEEDUP = 50.0
STARTUP_SECONDS = 10.0
MIN_RUNTIME_MINUTES = 10  # least wall time asked for: queue start, imports, compilation, file
# system latency vary by site and are not in the model


@dataclasses.dataclass(frozen=True)
class Estimate:
    """Size and duration of one run: devices (px py), nodes, memory per device in bytes (on cpu
    the one process holding all its devices) and runtime per stage in seconds (before
    Execution.runtime_safety)."""

    devices: int
    nodes: int
    memory_per_device_bytes: float
    runtime_s: dict[str, float]
    step_s: float  # one PM step


def _shell_words(run: config.Run, planes: int, devices: int) -> float:
    """Words one device holds for the full-sky shells of a run (0 without them)."""
    full = run.lensing.full_sky if run.lensing is not None else None
    if full is None or planes == 0:
        return 0
    rays = sky.healpix_pixels(sky.rays_nside(full.nside))
    padded = sky.PLANE_BUCKET * math.ceil(planes / sky.PLANE_BUCKET)
    share = devices if rays % devices == 0 else 1  # lightcone.ray_spec
    return padded * rays / share + SHELL_RAY_WORDS * rays


def _halo_padding(run: config.Run) -> float:
    """Padded / unpadded size of a device's force-mesh block (halos on the split axes)."""
    mesh_n, halo = run.box.particles * run.box.oversample, run.parallel.halo_cells
    return math.prod(1 + 2 * halo / (mesh_n // p) if p > 1 else 1 for p in run.parallel.pdims)


def estimate(run: config.Run, execution: Execution) -> Estimate:
    """Devices, nodes, peak memory, stage runtimes and the time of one PM step of a run (model
    and constants above, scaled to execution.calibration where one is given:
    :func:`calibration_factors`)."""
    return _model(run, execution, *calibration_factors(execution))


def calibration_factors(execution: Execution) -> tuple[float, float]:
    """(time, memory): the step time and the memory beyond the process overhead that
    execution.calibration measured, over what the model gives for its configuration; (1, 1)
    without a calibration. Device memory on gpu (the CUDA context is the overhead), the
    process's peak on cpu."""
    record = execution.calibration_record
    if record is None:
        return 1.0, 1.0
    measured = config.Run.model_validate(
        {
            "box": {
                "particles": record["particles"],
                "oversample": record["oversample"],
                "box_size": record.get("box_size", 256.0),
            },
            "parallel": {"pdims": record["pdims"], "halo_cells": record["halo"]},
            "nbody": {"steps": record["steps"]},
        }
    )
    model = _model(measured, execution, 1.0, 1.0)
    overhead = PROCESS_OVERHEAD_BYTES[execution.platform]
    gpu = execution.platform == "gpu"
    peak = record["device_peak_bytes"] if gpu else record["peak_rss_bytes"] - overhead
    return (record["step_s"] / model.step_s, peak / (model.memory_per_device_bytes - overhead))


def _model(
    run: config.Run, execution: Execution, time_factor: float, memory_factor: float
) -> Estimate:
    """:func:`estimate` with the runtime beyond start-up times ``time_factor`` and the memory
    beyond the process overhead times ``memory_factor``."""
    px, py = run.parallel.pdims
    devices, gpu = px * py, execution.platform == "gpu"
    nodes = math.ceil(devices / execution.devices_per_node) if gpu else 1
    itemsize = 8 if run.nbody.dtype == "float64" else 4
    particles, cells = run.box.particles**3, (run.box.particles * run.box.oversample) ** 3
    snapshots = len(set(run.nbody.snapshots) | {run.nbody.a_final})
    planes = len(validation.planes(run)) if run.lightcone is not None else 0
    plane_cells = planes * (run.box.particles * run.box.oversample) ** 2
    field_bytes = itemsize * (
        PARTICLE_WORDS * particles
        + plane_cells
        + (MESH_WORDS * _halo_padding(run) + snapshots) * cells
    )
    shells = itemsize * _shell_words(run, planes, devices) * (1 if gpu else devices)
    memory = (
        memory_factor * (field_bytes / (devices if gpu else 1) + shells)
        + PROCESS_OVERHEAD_BYTES[execution.platform]
    )
    steps = validation.step_count(run)
    speed = (devices * GPU_SPEEDUP if gpu else 1.0) / time_factor
    step = (SECONDS_PER_PARTICLE_STEP * particles + SECONDS_PER_CELL_STEP * cells) / speed
    ic = IC_STEPS * (SECONDS_PER_PARTICLE_STEP + SECONDS_PER_CELL_STEP) * particles / speed
    paint = SECONDS_PER_PARTICLE_STEP * particles / speed  # a plane costs about one paint
    runtime = {
        "ic": STARTUP_SECONDS + ic,
        "nbody": STARTUP_SECONDS + (steps + 1) * step + planes * paint,  # + forces at a_init
        "lensing": STARTUP_SECONDS + planes * SECONDS_PER_CELL_STEP * cells / speed,
        "summaries": STARTUP_SECONDS + (snapshots + 1) * SECONDS_PER_CELL_STEP * cells / speed,
    }
    return Estimate(devices, nodes, memory, runtime, step)


def disk_bytes(run: config.Run) -> dict[str, float]:
    """Bytes each stage store of a run takes on disk, by what ``run.outputs`` keeps (large
    float arrays are stored uncompressed; bit rounding and the small arrays are not counted).
    Full-sky shells and κ maps come with their harmonic coefficients (complex64)."""
    out, itemsize = run.outputs, 8 if run.nbody.dtype == "float64" else 4
    n, m = run.box.particles, run.box.particles * run.box.oversample
    ic = {"all": 7, "linear": 1, "none": 0}[out.ic] * n**3
    snapshots = len(set(run.nbody.snapshots) | {run.nbody.a_final})
    if out.density == "full":
        density = m**3
    elif out.density == "none":
        density = 0
    else:
        density = (m // out.density) ** 3
    nbody = snapshots * density + (6 * n**3 if out.particles else 0)
    sizes = {"ic": itemsize * ic, "nbody": itemsize * nbody, "lensing": 0.0, "summaries": 0.0}
    if run.lightcone is not None and out.lightcone:
        planes = len(validation.planes(run))
        full = run.lensing.full_sky if run.lensing else None
        shells, alm = 0, 0
        if full is not None:
            ell_max = sky.healpix_ell_max(full.nside)
            shells, alm = sky.healpix_pixels(full.nside), (ell_max + 1) * (ell_max + 2) // 2
        alm_bytes = np.dtype(np.complex64).itemsize * alm
        sizes["nbody"] += planes * (itemsize * (m**2 + shells) + alm_bytes)
        if run.lensing is not None:
            sources = len(run.lensing.source_labels())
            flat = run.lensing.flat_sky.pixels**2 if run.lensing.flat_sky else 0
            sizes["lensing"] = sources * (3 * itemsize * (flat + shells) + alm_bytes)
    return {
        stage: float(size)
        for stage, size in sizes.items()
        if stage != "lensing" or run.lensing is not None
    }


def check_fits(camp: Campaign) -> None:
    """Raise ConfigError naming the first run whose memory estimate exceeds the device memory."""
    hint = (
        "use more devices (base.parallel.pdims) or fewer particles (base.box.particles)"
        if camp.execution.platform == "gpu"
        else "on cpu all devices share one process: use fewer particles (base.box.particles) or "
        "raise execution.device_memory_gb if the machine has that memory"
    )
    for spec in camp.runs:
        need = estimate(spec.run, camp.execution).memory_per_device_bytes
        if need > camp.execution.device_memory_gb * 1e9:
            raise config.ConfigError(
                f"run {spec.run_id} needs about {need / 1e9:.2f} GB per device but "
                f"execution.device_memory_gb = {camp.execution.device_memory_gb}; {hint}"
            )


def resources(spec_or_run: RunSpec | config.Run, stage: str, execution: Execution) -> dict:
    """Resources of a stage: ``gpu`` per node, ``nodes``, ``tasks_per_node`` (processes per
    node, each holding an equal share of its node's devices: Execution.node_layout),
    ``cpus_per_task``, ``mem_mb`` per node,
    ``runtime`` in minutes with the safety factor (at least MIN_RUNTIME_MINUTES), and
    ``devices`` (px py). pmpipe.orchestration.launch turns them into the SLURM plugin's.

    Every stage asks for the run's peak memory (that of the nbody stage; the ICs' peak is part
    of the calibration); runtimes differ per stage.
    """
    run = spec_or_run.run if isinstance(spec_or_run, RunSpec) else spec_or_run
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}; stages are {', '.join(STAGES)}")
    est = estimate(run, execution)
    gpu = execution.platform == "gpu"
    tasks, per_process = execution.node_layout(est.devices)
    if gpu:
        memory = est.memory_per_device_bytes * tasks * per_process
    else:  # the fields split over the processes; each process has its own overhead
        memory = est.memory_per_device_bytes + (tasks - 1) * PROCESS_OVERHEAD_BYTES["cpu"]
    return {
        "gpu": tasks * per_process if gpu else 0,
        "nodes": est.nodes,
        "tasks_per_node": tasks,
        "cpus_per_task": execution.cpus_per_task,
        "mem_mb": max(1000, math.ceil(memory / 1e6)),
        "runtime": max(
            MIN_RUNTIME_MINUTES, math.ceil(est.runtime_s[stage] * execution.runtime_safety / 60)
        ),
        "devices": est.devices,
    }


def job_resources(runs: list[config.Run], execution: Execution) -> dict:
    """Resources of a job that runs every stage of ``runs`` in one process: the largest
    memory of its stages, and one start-up plus every run's stage runtimes (same keys as
    :func:`resources`)."""
    per_stage = [
        (run, stage, resources(run, stage, execution))
        for run in runs
        for stage in STAGES
        if stage != "lensing" or run.lensing
    ]
    work = sum(
        estimate(run, execution).runtime_s[stage] - STARTUP_SECONDS for run, stage, _ in per_stage
    )
    first = per_stage[0][2]
    return {
        **first,
        "mem_mb": max(r["mem_mb"] for _, _, r in per_stage),
        "runtime": max(
            MIN_RUNTIME_MINUTES, math.ceil((STARTUP_SECONDS + work) * execution.runtime_safety / 60)
        ),
    }


def job_groups(specs: Sequence[RunSpec], size: int) -> dict[str, list[RunSpec]]:
    """Runs packed into jobs of ``size`` by their position in the design: ``job0000`` holds
    runs 0 .. size - 1, and so on. Runs added at the end of a design join the last group or
    new ones; no earlier run changes group."""
    groups: dict[str, list[RunSpec]] = {}
    for spec in specs:
        groups.setdefault(f"job{spec.index // size:04d}", []).append(spec)
    return groups


def parameter_names(specs: list[RunSpec]) -> list[str]:
    """Design parameter names in order of first appearance."""
    return list(dict.fromkeys(name for spec in specs for name in spec.parameters))


def plan_table(camp: Campaign) -> str:
    """Plain-text table of the runs: id, parameters, seed, devices, nodes, memory per device,
    nbody runtime; checks first that every run fits."""
    check_fits(camp)
    specs = list(camp.runs)
    names = parameter_names(specs)
    header = ["run_id", *names, "seed", "devices", "nodes", "GB/device", "nbody min", "disk GB"]
    rows, total, disk = [], 0.0, 0.0
    for spec in specs:
        est = estimate(spec.run, camp.execution)
        run_disk = sum(disk_bytes(spec.run).values())
        total += est.runtime_s["nbody"]
        disk += run_disk
        rows.append(
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
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in [header, *rows]]
    if camp.execution.calibration is not None:
        time, memory = calibration_factors(camp.execution)
        lines.append(
            f"model calibrated by {camp.execution.calibration}: runtime x{time:.3g}, "
            f"memory beyond the process overhead x{memory:.3g}"
        )
    per_stage = {stage: f"{b / 1e9:.3f}" for stage, b in disk_bytes(specs[0].run).items()}
    lines.append(
        f"{len(specs)} runs, nbody {total / 60:.1f} min in all (estimate, before the "
        f"safety factor {camp.execution.runtime_safety}); disk {disk / 1e9:.2f} GB in "
        f"all, per run in GB: " + ", ".join(f"{k} {v}" for k, v in per_stage.items())
    )
    return "\n".join(lines)


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


def manifest_rows(
    camp: Campaign, results_dir: str | Path, status: Callable[[Path], str]
) -> list[dict]:
    """One row per run: id, index, point, realisation, paired, seed, each design parameter
    (empty where a point does not set it), run folder, config hash and status(run folder)."""
    specs = list(camp.runs)
    names = parameter_names(specs)
    rows = []
    for spec in specs:
        run_dir = Path(results_dir) / camp.name / spec.run_id
        rows.append(
            {
                "run_id": spec.run_id,
                "index": spec.index,
                "point": spec.point,
                "realisation": spec.realisation,
                "paired": spec.paired,
                "seed": spec.seed,
                **{n: spec.parameters.get(n, "") for n in names},
                "run_dir": run_dir,
                "config_hash": config.config_hash(spec.run),
                "status": status(run_dir),
            }
        )
    return rows


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


def campaign_schema() -> dict:
    """JSON schema (draft 2020-12) of campaign files."""
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        **Campaign.model_json_schema(),
    }


def write_schema(path: str | Path) -> None:
    """Write the campaign schema as JSON (indent 2, sorted keys, trailing newline)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(campaign_schema(), indent=2, sort_keys=True) + "\n")
