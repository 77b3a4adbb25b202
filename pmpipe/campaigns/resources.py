"""What the runs of a campaign need and where they run: the execution section, the size and
time model of a run (memory per device, runtime per stage, disk per store, scaled to a
calibration record), and the resources of a stage and of a job that packs several runs."""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import Field, PrivateAttr, model_validator

from pmpipe.physics.evolution import sky
from pmpipe.run import config, draws, validation
from pmpipe.run import ghost_cells as halos
from pmpipe.runtime.memory import MEMORY_FRACTION_VARIABLE, XLA_DEFAULT_FRACTION
from pmpipe.stages import STAGES

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
    overlap: bool = Field(
        False,
        description="compute each run's lensing and summaries (host statistics, sky analyses, "
        "the writes of their stores) while the next run of its job makes its ICs and N-body, "
        "in jobs of one process whose runs have one device each (others run one after the "
        "other); `pmpipe plan` then counts two runs' memory on the device",
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
        overhead = PROCESS_OVERHEAD_BYTES["cpu"]
        if self.platform == "cpu" and record["peak_rss_bytes"] <= overhead:
            raise ValueError(
                f"execution.calibration {self.calibration}: its peak_rss_bytes "
                f"({record['peak_rss_bytes'] / 1e9:.2f} GB) is not above the process overhead "
                f"of the memory model ({overhead / 1e9:.1f} GB), so it measures none of the "
                "run's memory; calibrate with a larger run (more --particles)"
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
# Runs with massive neutrinos hold more: the ICs' scale-dependent growth and their 1LPT velocity
# field per particle, the neutrinos' response factor and its table index per force-mesh cell.
# Peak RSS with Σm_ν = 0.1 eV over the same massless run (2LPT + 10 steps, CPU): +45 MB (96³,
# B = 1), +88 MB (128³, B = 1), +158 MB (96³, B = 2); 5 more words of each kind give +35, +84
# and +159 MB.
NEUTRINO_PARTICLE_WORDS = 5
NEUTRINO_MESH_WORDS = 5
# Full-sky shells: each device keeps its share of the shells sampled so far, one word per ray
# of the HEALPix ray grid for each (padded) plane, split over the devices
# (`lightcone.ray_spec`), and while it samples a shell 6 more words per ray it samples
# (directions, cell coordinates along each box axis: the memory analysis of the compiled
# shell program, `lightcone._shell`, at ray grids of 64 to 256 nside on CPU): every ray of the
# grid, or its share where it samples the gathered density (sky.shell_gathers), which then
# holds up to 1.5 words per force-mesh cell (the density whole and half-gathered: the same
# analysis on 8 CPU devices, 1.0 at 32^3 and 1.36-1.47 at 64^3).
SHELL_RAY_WORDS = 6
SHELL_GATHER_CELL_WORDS = 1.5
# Full-sky ray tracing (lensing.method raytrace or both) runs in the lensing stage's process, on
# the host: per ray of its grid (sky.traced_rays_nside) 290 and 250 bytes for one source (the
# rays' float32 state, their float64 positions, the fields at the rays, the analysis: peak RSS
# of `pmpipe bench raytrace --nside 512` and `--nside 1024`, 20 shells, less the shells'
# complex128 coefficients and the process; 2 cores), 24 more per further source (the sums of
# A and of the deflection). Time per ray and shell 4.2e-7 and 5.7e-7 s, per ray and source for
# the analysis 2.0e-6 and 3.2e-6 s, on 2 cores (ducc0's syntheses and the geometry are
# threaded): growing with the band limit as nside^0.44 and nside^0.68, which the model
# extrapolates from nside 1024.
RAYTRACE_RAY_BYTES = 300
RAYTRACE_SOURCE_RAY_BYTES = 24
RAYTRACE_SECONDS_PER_RAY_SHELL = (5.7e-7, 0.44)  # at nside 1024, and the power of nside
RAYTRACE_SECONDS_PER_RAY_SOURCE = (3.2e-6, 0.68)
RAYTRACE_MEASURED_CORES = 2
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
BARYON_TABLE_SECONDS = 6.0  # CAMB's S(k, z) of one log_T_AGN: 2-6 s on the 2-core CPU
MIN_RUNTIME_MINUTES = 10  # least wall time asked for: queue start, imports, compilation, file
# system latency vary by site and are not in the model


def memory_fraction(execution: Execution, environ=None) -> tuple[float, str]:
    """The share of a device's memory a run may use, and where it comes from: on gpu the
    MEMORY_FRACTION_VARIABLE of ``environ`` (default os.environ: where the campaign is planned,
    as jobs inherit it) or XLA's default; on cpu 1. ValueError naming the variable when its
    value is not a number in (0, 1]."""
    if execution.platform != "gpu":
        return 1.0, "a CPU process"
    env = os.environ if environ is None else environ
    text = env.get(MEMORY_FRACTION_VARIABLE)
    if text is None:
        return XLA_DEFAULT_FRACTION, f"XLA's default; {MEMORY_FRACTION_VARIABLE} unset"
    try:
        fraction = float(text)
    except ValueError:
        fraction = -1.0
    if not 0 < fraction <= 1:
        raise ValueError(f"{MEMORY_FRACTION_VARIABLE}={text!r}: must be a number in (0, 1]")
    return fraction, f"{MEMORY_FRACTION_VARIABLE}={text}"


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
    mesh_n = run.force_cells()
    if sky.shell_gathers(mesh_n, rays, devices):
        return (padded + SHELL_RAY_WORDS) * rays / share + SHELL_GATHER_CELL_WORDS * mesh_n**3
    return padded * rays / share + SHELL_RAY_WORDS * rays


def full_sky_raytrace(run: config.Run, planes: int, cores: int) -> tuple[float, float]:
    """Host bytes and seconds of a run's full-sky ray tracing on ``cores`` cores (0, 0 without
    it): the rays' and the shells' memory, the tracing through ``planes`` shells (in every
    pass over them) and the analysis of every source (of every draw)."""
    lens = run.lensing
    if lens is None or lens.full_sky is None or lens.method == "born" or planes == 0:
        return 0.0, 0.0
    nside = lens.full_sky.nside
    rays = sky.healpix_pixels(sky.traced_rays_nside(nside))
    sources = len(lens.source_labels()) * draws.maps_per_source(run)
    ell_max = sky.healpix_ell_max(nside)
    shells = planes * np.dtype(np.complex128).itemsize * (ell_max + 1) * (ell_max + 2) / 2
    memory = rays * (RAYTRACE_RAY_BYTES + (sources - 1) * RAYTRACE_SOURCE_RAY_BYTES) + shells

    def per_ray(constant):
        at_1024, power = constant
        return at_1024 * (nside / 1024) ** power

    seconds = rays * (
        planes * draws.plane_passes(run) * per_ray(RAYTRACE_SECONDS_PER_RAY_SHELL)
        + sources * per_ray(RAYTRACE_SECONDS_PER_RAY_SOURCE)
    )
    return memory, seconds * RAYTRACE_MEASURED_CORES / cores


def halo_padding(run: config.Run) -> float:
    """Padded / unpadded size of a device's force-mesh block (halos on the split axes)."""
    mesh_n, halo = run.box.particles * run.box.oversample, halos.cells(run)
    return math.prod(1 + 2 * halo / (mesh_n // p) if p > 1 else 1 for p in run.parallel.pdims)


def overlaps(run: config.Run, execution: Execution) -> bool:
    """Whether the run's tail may overlap the next run of its job (execution.overlap, on one
    device; pmpipe.job.pipeline)."""
    return execution.overlap and math.prod(run.parallel.pdims) == 1


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
    model = _model(measured, execution.model_copy(update={"overlap": False}), 1.0, 1.0)
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
    massive = run.cosmology.m_nu > 0
    particle_words = PARTICLE_WORDS + (NEUTRINO_PARTICLE_WORDS if massive else 0)
    mesh_words = MESH_WORDS + (NEUTRINO_MESH_WORDS if massive else 0)
    field_bytes = itemsize * (
        particle_words * particles
        + plane_cells
        + (mesh_words * halo_padding(run) + snapshots) * cells
    )
    shells = itemsize * _shell_words(run, planes, devices) * (1 if gpu else devices)
    memory = (
        memory_factor * (field_bytes / (devices if gpu else 1) + shells)
        + PROCESS_OVERHEAD_BYTES[execution.platform]
    )
    traced_bytes, traced_seconds = full_sky_raytrace(run, planes, execution.cpus_per_task)
    memory = max(memory, traced_bytes + PROCESS_OVERHEAD_BYTES[execution.platform])
    if overlaps(run, execution):  # a run's tail beside the next run: two runs at most
        memory = 2 * memory - PROCESS_OVERHEAD_BYTES[execution.platform]
    steps = validation.step_count(run)
    speed = (devices * GPU_SPEEDUP if gpu else 1.0) / time_factor
    step = (SECONDS_PER_PARTICLE_STEP * particles + SECONDS_PER_CELL_STEP * cells) / speed
    ic = IC_STEPS * (SECONDS_PER_PARTICLE_STEP + SECONDS_PER_CELL_STEP) * particles / speed
    paint = SECONDS_PER_PARTICLE_STEP * particles / speed  # a plane costs about one paint
    passes = draws.plane_passes(run)  # over the planes, with S(k, z) each when baryons
    tables = passes * BARYON_TABLE_SECONDS if run.baryons is not None else 0.0
    runtime = {
        "ic": STARTUP_SECONDS + ic,
        "nbody": STARTUP_SECONDS + (steps + 1) * step + planes * paint,  # + forces at a_init
        "lensing": STARTUP_SECONDS
        + passes * planes * SECONDS_PER_CELL_STEP * cells / speed
        + traced_seconds
        + tables,
        "summaries": STARTUP_SECONDS
        + (snapshots + 1) * SECONDS_PER_CELL_STEP * cells / speed
        + tables,
    }
    return Estimate(devices, nodes, memory, runtime, step)


def array_bytes(run: config.Run) -> dict[tuple[str, str], float]:
    """Bytes of each large array of a run's stores, by (stage, array), as ``run.outputs``
    keeps them (large float arrays are stored uncompressed; bit rounding and the small arrays
    are not counted). Full-sky shells and κ maps come with their harmonic coefficients
    (complex64); the lensing maps of every draw."""
    out, itemsize = run.outputs, 8 if run.nbody.dtype == "float64" else 4
    n, m = run.box.particles, run.box.particles * run.box.oversample
    sizes = {("ic", "linear_density"): n**3 * (out.ic != "none")}
    sizes["ic", "displacement, momentum"] = 6 * n**3 * (out.ic == "all")
    snapshots = len(set(run.nbody.snapshots) | {run.nbody.a_final})
    factor = run.density_factor()
    sizes["nbody", "density"] = 0 if factor is None else snapshots * (m // factor) ** 3
    sizes["nbody", "displacement, momentum"] = 6 * n**3 * out.particles
    sizes = {key: itemsize * size for key, size in sizes.items()}
    if run.lightcone is not None and out.lightcone:
        planes = len(validation.planes(run))
        full = run.lensing.full_sky if run.lensing else None
        shells, alm = 0, 0
        if full is not None:
            ell_max = sky.healpix_ell_max(full.nside)
            shells, alm = sky.healpix_pixels(full.nside), (ell_max + 1) * (ell_max + 2) // 2
        alm_bytes = np.dtype(np.complex64).itemsize * alm
        sizes["nbody", "lightcone_density"] = planes * itemsize * m**2
        sizes["nbody", "lightcone_healpix(_alm)"] = planes * (itemsize * shells + alm_bytes)
        if run.lensing is not None:
            sources = len(run.lensing.source_labels()) * draws.maps_per_source(run)
            flat = run.lensing.flat_sky.pixels**2 if run.lensing.flat_sky else 0
            sizes["lensing", "flat-sky maps"] = sources * 3 * itemsize * flat
            sizes["lensing", "full-sky maps"] = sources * (3 * itemsize * shells + alm_bytes)
    return {key: float(size) for key, size in sizes.items() if size}


def disk_bytes(run: config.Run) -> dict[str, float]:
    """Bytes each stage store of a run takes on disk (:func:`array_bytes` summed by stage):
    every stage of the run, lensing with a lensing section, summaries counted as 0."""
    per_stage = {stage: 0.0 for stage in ("ic", "nbody", "lensing", "summaries")}
    for (stage, _), size in array_bytes(run).items():
        per_stage[stage] += size
    return {s: b for s, b in per_stage.items() if s != "lensing" or run.lensing is not None}


def resources(run: config.Run, stage: str, execution: Execution) -> dict:
    """Resources of a stage: ``gpu`` per node, ``nodes``, ``tasks_per_node`` (processes per
    node, each holding an equal share of its node's devices: Execution.node_layout),
    ``cpus_per_task``, ``mem_mb`` per node,
    ``runtime`` in minutes with the safety factor (at least MIN_RUNTIME_MINUTES), and
    ``devices`` (px py). pmpipe.cluster.launch turns them into the SLURM plugin's.

    Every stage asks for the run's peak memory (that of the nbody stage, or of full-sky ray
    tracing in the lensing stage where that is larger; the ICs' peak is part of the
    calibration); runtimes differ per stage.
    """
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}; stages are {', '.join(STAGES)}")
    return _stage_resources(estimate(run, execution), stage, execution)


def _stage_resources(est: Estimate, stage: str, execution: Execution) -> dict:
    """:func:`resources` of a stage of the run of estimate ``est``."""
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
    :func:`resources`). Each run is estimated once."""
    per_stage = []
    for run in runs:
        est = estimate(run, execution)
        per_stage += [
            (est.runtime_s[stage], _stage_resources(est, stage, execution))
            for stage in STAGES
            if stage != "lensing" or run.lensing
        ]
    work = sum(seconds - STARTUP_SECONDS for seconds, _ in per_stage)
    first = per_stage[0][1]
    return {
        **first,
        "mem_mb": max(r["mem_mb"] for _, r in per_stage),
        "runtime": max(
            MIN_RUNTIME_MINUTES, math.ceil((STARTUP_SECONDS + work) * execution.runtime_safety / 60)
        ),
    }
