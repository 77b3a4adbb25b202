"""`pmpipe bench scaling`: strong and weak scaling of one PM step and its parts over device
counts, in one process or several (mpiexec, srun).

Strong scaling keeps the particle grid, N³, and splits it over more devices; weak scaling keeps
the cells per device, growing the grid to about N (D / D₀)^(1/3) per side on D devices (D₀ the
fewest measured), rounded to a size the decomposition splits. Each device count is measured as
slabs (D, 1) and, where the count has one, as the most square pencil. A row holds the seconds
of one step and of its parts (:func:`pmpipe.bench.pm_core.step_parts`), the bytes its collectives
move per device (read off the compiled step and from :mod:`pmpipe.bench.collectives`' model), its
parallel efficiency against the row of the fewest devices, and for strong scaling how far one
step's particles are from those of that row. With several processes, each device count takes
the same number of devices from every process.
"""

from __future__ import annotations

import math
import os
import platform
import time
from pathlib import Path

import jax
import numpy as np

from pmpipe.bench import collectives, pm_core, trace
from pmpipe.campaigns import decomposition, step_timing
from pmpipe.physics.mesh.domain import Grid
from pmpipe.runtime import log, parallel

LOG = log.get(__name__)

SCALINGS = ("strong", "weak")
DECOMPOSITIONS = ("slab", "pencil")
PARTS = ("step_s", "paint_s", "read_s", "fft_s", "c2r_s", "fft_floor_s")


def decompositions_of(
    devices: int, particles: int, oversample: int, halo: int, kinds=DECOMPOSITIONS
) -> dict[str, tuple[int, int]]:
    """The decompositions measured on ``devices``: {'single': (1, 1)} on one device, else the
    slab (devices, 1) and the most square pencil (both axes split) among ``kinds``, those that
    split the grid and hold the halo (:func:`pmpipe.campaigns.decomposition.candidates`)."""
    if devices == 1:
        return {"single": (1, 1)}
    options = decomposition.candidates(devices, particles, oversample, halo)
    out = {}
    if "slab" in kinds and (devices, 1) in options:
        out["slab"] = (devices, 1)
    pencils = [p for p in options if p[0] > 1 and p[1] > 1]
    if "pencil" in kinds and pencils:
        out["pencil"] = min(pencils, key=lambda p: (abs(p[0] - p[1]), p))
    return out


def weak_particles(particles: int, fewest: int, devices: int, pdims: tuple[int, int]) -> int:
    """Particles per side on ``devices`` that keep the particles per device of ``particles``³
    on ``fewest`` devices, rounded to a multiple of 2, px and py."""
    step = math.lcm(2, *pdims)
    return max(step, round(particles * (devices / fewest) ** (1 / 3) / step) * step)


def _measure(
    particles: int, pdims: tuple[int, int], oversample: int, halo: int, repeat: int
) -> tuple[dict, tuple[np.ndarray, ...]]:
    """One row (without efficiency) and one step's particles (disp, mom) on the host."""
    devices = pdims[0] * pdims[1]
    mesh = parallel.make_mesh(pdims, parallel.spread_devices(devices))
    grid = Grid(mesh, particles, oversample, step_timing.BOX_SIZE, halo)
    omega_m = step_timing.COSMOLOGY.Omega_m
    disp, mom = step_timing.lpt_particles(particles, mesh)
    program = step_timing.pm_step.lower(disp, mom, omega_m, grid=grid).compile()
    moved = collectives.bytes_by_kind(collectives.program_text(program))
    after = tuple(
        parallel.to_host(x).astype(np.float64)
        for x in step_timing.pm_step(disp, mom, omega_m, grid=grid)
    )
    row = {
        "devices": devices,
        "pdims": list(pdims),
        "particles": particles,
        "force_mesh": grid.force_cells,
        "cells_per_device": grid.force_cells**3 // devices,
        **pm_core.step_parts(disp, mom, grid, omega_m, repeat),
        "bytes_model": collectives.bytes_per_step(grid.force_cells, pdims, halo),
        "bytes_compiled": moved,
        "result": {
            "disp_rms": float(np.sqrt(np.mean(after[0] ** 2))),
            "mom_rms": float(np.sqrt(np.mean(after[1] ** 2))),
        },
    }
    return row, after


def _difference(after, reference) -> float:
    """Largest difference of one step's (disp, mom) to the reference's, relative to the
    reference's largest value, over both."""
    return max(float(np.abs(a - r).max() / np.abs(r).max()) for a, r in zip(after, reference))


def _series(rows: list[dict], kind: str) -> list[dict]:
    """The rows of one decomposition by device count, starting from the row of the fewest
    devices (the single device, or a slab where that count has no pencil)."""
    fewest = min(r["devices"] for r in rows)
    first = [r for r in rows if r["devices"] == fewest]
    base = next((r for r in first if r["decomposition"] == kind), first[0])
    return sorted(
        {id(r): r for r in [base, *(r for r in rows if r["decomposition"] == kind)]}.values(),
        key=lambda r: r["devices"],
    )


def _efficiency(rows: list[dict], scaling: str) -> None:
    """Add speedup (strong) and parallel efficiency to each row against the first row of its
    decomposition's series (:func:`_series`)."""
    for row in rows:
        base = _series(rows, row["decomposition"])[0]
        if scaling == "strong":
            row["speedup"] = base["step_s"] / row["step_s"]
            row["efficiency"] = row["speedup"] * base["devices"] / row["devices"]
        else:  # time per cell of a device
            row["efficiency"] = (base["step_s"] / base["cells_per_device"]) / (
                row["step_s"] / row["cells_per_device"]
            )


def plan(
    particles: int,
    devices: list[int],
    oversample: int,
    halo: int,
    scalings=SCALINGS,
    kinds=DECOMPOSITIONS,
) -> list[tuple[str, str, int, tuple[int, int]]]:
    """(scaling, decomposition, particles, pdims) of every row, in order; ValueError naming the
    option when a device count has no decomposition (before anything is measured)."""
    rows = []
    for scaling in scalings:
        for count in sorted(devices):
            found = decompositions_of(count, particles, oversample, halo, kinds)
            if not found:
                raise ValueError(
                    f"--devices {count}: no {' or '.join(kinds)} decomposition of "
                    f"{count} devices splits --particles {particles} with --halo {halo} "
                    f"(each block must be at least --halo cells wide)"
                )
            for kind, pdims in found.items():
                n = particles
                if scaling == "weak":
                    n = weak_particles(particles, min(devices), count, pdims)
                    if pdims not in decomposition.candidates(count, n, oversample, halo):
                        continue
                rows.append((scaling, kind, n, pdims))
    return rows


def run(
    particles: int,
    devices: list[int],
    oversample: int = 1,
    halo: int = 4,
    repeat: int = 3,
    scalings=SCALINGS,
    kinds=DECOMPOSITIONS,
) -> dict:
    """Measure every row of :func:`plan`; returns the JSON-ready record."""
    rows = plan(particles, devices, oversample, halo, scalings, kinds)
    record = {
        "benchmark": "scaling",
        "particles": particles,
        "oversample": oversample,
        "halo": halo,
        "repeat": repeat,
        "devices": sorted(devices),
        "processes": jax.process_count(),
        "launcher": parallel.launcher_processes()[0],
        "device_kind": jax.devices()[0].device_kind,
        "platform": jax.default_backend(),
        "jax": jax.__version__,
        "python": platform.python_version(),
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "cpu_count": os.cpu_count(),
    }
    reference = None
    for scaling in scalings:
        measured = []
        for _, kind, n, pdims in (r for r in rows if r[0] == scaling):
            LOG.info(
                "%s scaling: %s %s, %d^3 particles", scaling, kind, decomposition.label(pdims), n
            )
            row, after = _measure(n, pdims, oversample, halo, repeat)
            row["decomposition"] = kind
            if scaling == "strong":
                reference = after if reference is None else reference
                row["result"]["max_rel_diff"] = _difference(after, reference)
            measured.append(row)
        _efficiency(measured, scaling)
        record[scaling] = measured
    return record


def traced_steps(record: dict, folder: str | Path, steps: int = 3) -> dict:
    """A JAX profiler trace (Perfetto) of ``steps`` PM steps of the strong row with the most
    devices (the first of them) in ``folder`` (``process-<i>`` below it for each process of
    several), and its summary by category (:func:`pmpipe.bench.trace.summarise`) with the wall
    seconds per step."""
    rows = record.get("strong") or record["weak"]
    row = max(rows, key=lambda r: r["devices"])
    pdims, n = tuple(row["pdims"]), row["particles"]
    mesh = parallel.make_mesh(pdims, parallel.spread_devices(row["devices"]))
    grid = Grid(mesh, n, record["oversample"], step_timing.BOX_SIZE, record["halo"])
    disp, mom = step_timing.lpt_particles(n, mesh)
    omega_m = step_timing.COSMOLOGY.Omega_m
    program = step_timing.pm_step.lower(disp, mom, omega_m, grid=grid).compile()
    jax.block_until_ready(program(disp, mom, omega_m))
    folder = Path(folder)
    if jax.process_count() > 1:
        folder = folder / f"process-{jax.process_index()}"
    with jax.profiler.trace(str(folder), create_perfetto_trace=True):
        start = time.perf_counter()
        for _ in range(steps):
            disp, mom = program(disp, mom, omega_m)
        jax.block_until_ready((disp, mom))
        wall = (time.perf_counter() - start) / steps
    local = sum(d.process_index == jax.process_index() for d in mesh.devices.flat)
    path = trace.perfetto_file(folder)
    return {
        "path": str(path),
        "devices": row["devices"],
        "pdims": list(pdims),
        "particles": n,
        "steps": steps,
        "wall_s_per_step": wall,
        **trace.summarise(path, collectives.program_text(program), steps, local),
    }


def table(record: dict) -> str:
    """The record's rows as a text table: milliseconds of a step and its parts, efficiency and
    the MB each device hands to collectives in a step (model)."""
    head = (
        f"{'scaling':8} {'devices':>7} {'pdims':>5} {'N':>4} {'step ms':>8} {'paint':>7} "
        f"{'read':>7} {'fft4':>7} {'eff':>5} {'MB/step':>8} {'max diff':>9}"
    )
    lines = [head]
    for scaling in SCALINGS:
        for row in record.get(scaling, []):
            moved = (row["bytes_model"]["fft"] + row["bytes_model"]["halo"]) / 1e6
            diff = row["result"].get("max_rel_diff")
            lines.append(
                f"{scaling:8} {row['devices']:>7} {decomposition.label(row['pdims']):>5} "
                f"{row['particles']:>4} {row['step_s'] * 1e3:>8.2f} {row['paint_s'] * 1e3:>7.2f} "
                f"{row['read_s'] * 1e3:>7.2f} {row['fft_floor_s'] * 1e3:>7.2f} "
                f"{row['efficiency']:>5.2f} {moved:>8.2f} "
                f"{'' if diff is None else f'{diff:.1e}':>9}"
            )
    return "\n".join(lines)


def trace_table(summary: dict) -> str:
    """A trace summary as text: milliseconds per step and device in each category."""
    wall = summary["wall_s_per_step"]
    lines = [
        (
            f"trace of {summary['steps']} steps, {summary['particles']}^3 on "
            f"{decomposition.label(summary['pdims'])}: {wall * 1e3:.2f} ms a step (wall)"
        )
    ]
    for name, seconds in summary["seconds_per_step"].items():
        lines.append(f"  {name:15} {seconds * 1e3:8.3f} ms  {seconds / wall:6.1%}")
    counts = ", ".join(f"{v:g} {k}" for k, v in summary["collectives_per_step"].items())
    lines.append(f"  collectives a step and device: {counts or 'none'}")
    return "\n".join(lines)


def plot(record: dict, out_path: str | Path) -> None:
    """Seconds of one step and parallel efficiency against devices, a line per scaling and
    decomposition (PNG)."""
    from pmpipe.results import report

    fig, (time_ax, eff_ax) = report.pyplot().subplots(1, 2, figsize=(10, 4))
    for scaling, style in zip(SCALINGS, ("-", "--")):
        rows = record.get(scaling, [])
        for kind, marker in zip(DECOMPOSITIONS, ("o", "s")):
            if not any(r["decomposition"] == kind for r in rows):
                continue
            series = _series(rows, kind)
            x = [r["devices"] for r in series]
            label = f"{scaling}, {kind}"
            time_ax.plot(x, [r["step_s"] * 1e3 for r in series], style, marker=marker, label=label)
            eff_ax.plot(x, [r["efficiency"] for r in series], style, marker=marker, label=label)
    for ax in (time_ax, eff_ax):
        ax.set_xscale("log", base=2)
        ax.set_xticks(record["devices"], [str(d) for d in record["devices"]])
        ax.set_xlabel("devices")
        ax.legend()
    time_ax.set_yscale("log")
    time_ax.set_ylabel("one PM step (ms)")
    eff_ax.set_ylabel("parallel efficiency")
    eff_ax.axhline(1.0, color="grey", lw=0.5)
    fig.suptitle(
        f"{record['particles']}^3 particles, {record['device_kind']}, "
        f"processes: {record['processes']}"
    )
    report.save_figure(fig, out_path)
