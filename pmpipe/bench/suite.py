"""``pmpipe bench suite``: the measurements of docs/performance.md's device sections in one
command, each a ``pmpipe bench`` target in a process of its own (a fresh device, and a failure
or an out-of-memory ends that measurement only), on whatever devices the processes find.

In order of what a suite needs first: pmpipe's PM job against pmwd for every size and force
mesh B; a campaign with lensing through Snakemake and the packed job (``pmpipe bench
campaign``); the job against JaxPM at B = 1 (its peer runs on the particle grid) with both
accuracies against a converged reference; the largest N that fits one device at B = 1, from
the measured bytes per particle; ``pmpipe bench scaling`` over the local devices. A time budget stops the suite from starting more."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from pmpipe.runtime import log

LOG = log.get(__name__)
STEPS = 10  # PM steps of the N-body jobs, as in the tables of docs/performance.md
LARGEST_TRIES = 3  # sizes tried, downward, for the largest N that fits
LARGEST_STRIDE = 64  # the largest N is a multiple of this
CAMPAIGN_BASE = "config/examples/gpu_256.yaml"  # the campaign's runs: 256^3 with lensing


@dataclasses.dataclass(frozen=True)
class Measurement:
    """One ``pmpipe bench`` command of the suite: its name in the table and its arguments
    (``--json`` added when it runs)."""

    name: str
    argv: tuple[str, ...]


def nbody_measurements(
    sizes: list[int], oversamples: list[int], peers: list[str], pmwd: str | None
) -> list[Measurement]:
    """pmpipe's PM job against each peer, for every size and B."""
    out = []
    for peer in peers:
        for n in sizes:
            for b in oversamples:
                argv = ["nbody", "--particles", str(n), "--steps", str(STEPS)]
                argv += ["--oversample", str(b), "--compare", peer]
                if peer == "pmwd" and pmwd:
                    argv += ["--pmwd", pmwd]
                out.append(Measurement(f"nbody {n}^3 B={b} vs {peer}", tuple(argv)))
    return out


def largest_size(records: list[dict]) -> int | None:
    """The largest N (a multiple of LARGEST_STRIDE) whose B = 1 job fits the device's usable
    memory at the device bytes per particle of the largest B = 1 job measured; None without
    a device peak (CPU)."""
    fits = [
        r
        for r in records
        if r.get("oversample") == 1 and r.get("device_peak_bytes") and r.get("device_bytes_limit")
    ]
    if not fits:
        return None
    top = max(fits, key=lambda r: r["particles"])
    n = (top["device_bytes_limit"] / top["device_bytes_per_particle"]) ** (1 / 3)
    return max(LARGEST_STRIDE, int(n // LARGEST_STRIDE) * LARGEST_STRIDE)


def campaign_file(folder: Path, runs: int, repo: Path, platform: str) -> Path:
    """A campaign of ``runs`` realisations of the fiducial point of gpu_256.yaml's runs on
    ``platform`` (cpu or gpu), packed into one job, written to ``folder``."""
    data = yaml.safe_load((repo / CAMPAIGN_BASE).read_text())
    data.update(name=f"suite{runs}", design={"kind": "fiducial"}, realisations=runs)
    data["execution"].update(platform=platform, runs_per_job=runs)
    path = folder / f"suite{runs}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def scaling_measurement(devices: int, particles: int) -> Measurement:
    """``bench scaling`` over 1, 2, 4, ... up to the local devices."""
    counts = [2**i for i in range(int(math.log2(max(devices, 1))) + 1)]
    argv = ["scaling", "--particles", str(particles), "--devices", *map(str, counts)]
    return Measurement(
        f"scaling {particles}^3 on {' '.join(map(str, counts))} devices", tuple(argv)
    )


def local_gpus() -> int:
    """NVIDIA GPUs ``nvidia-smi -L`` lists (0 where there is none), without starting JAX."""
    if shutil.which("nvidia-smi") is None:
        return 0
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60)
    return sum(line.startswith("GPU ") for line in out.stdout.splitlines())


@dataclasses.dataclass(frozen=True)
class Suite:
    """What ``pmpipe bench suite`` measures (its command-line options)."""

    sizes: tuple[int, ...] = (128, 256, 512)
    oversamples: tuple[int, ...] = (1, 2)
    peers: tuple[str, ...] = ("pmwd", "jaxpm")
    campaign_runs: int = 16
    scaling_particles: int = 256
    pmwd: str | None = None


def describe(suite: Suite, devices: int) -> list[str]:
    """The suite's measurements as lines of text, in the order they run (``--dry-run``)."""
    sizes, pmwd = list(suite.sizes), suite.pmwd
    pmwd_jobs = nbody_measurements(sizes, list(suite.oversamples), ["pmwd"], pmwd)
    jaxpm_jobs = nbody_measurements(sizes, [1], ["jaxpm"], None)
    lines = [
        f"{m.name}: pmpipe bench {' '.join(m.argv)}" for m in pmwd_jobs if "pmwd" in suite.peers
    ]
    lines.append(
        f"campaign of {suite.campaign_runs} runs ({CAMPAIGN_BASE}'s 256^3 runs with lensing, "
        "fiducial point, one packed job, through Snakemake): pmpipe bench campaign"
    )
    lines += [
        f"{m.name}: pmpipe bench {' '.join(m.argv)}" for m in jaxpm_jobs if "jaxpm" in suite.peers
    ]
    lines.append(
        f"largest N that fits one device at B = 1: the multiple of {LARGEST_STRIDE} that the "
        "measured device bytes per particle predict, then up to "
        f"{LARGEST_TRIES} sizes down until one runs (pmpipe bench nbody --steps 2)"
    )
    scaling = scaling_measurement(devices, suite.scaling_particles)
    lines.append(f"{scaling.name}: pmpipe bench {' '.join(scaling.argv)}")
    return lines


def _environment() -> dict:
    """The measurements' environment: true device peaks (no preallocation)."""
    return dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false")


def measure(m: Measurement, folder: Path, timeout_s: float) -> dict:
    """Run one measurement; its entry: name, command, status (done, failed, timed out),
    seconds, and the benchmark's record or the end of its output."""
    path = folder / f"{len(list(folder.glob('*.json')))}.json"
    cmd = [sys.executable, "-m", "pmpipe.cli", "bench", *m.argv, "--json", str(path)]
    entry: dict = {
        "name": m.name,
        "command": "pmpipe bench " + " ".join([*m.argv, "--json", path.name]),
    }
    start = time.perf_counter()
    process = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_environment(),
        start_new_session=True,  # a campaign's Snakemake and jobs end with it
    )
    try:
        _, stderr = process.communicate(timeout=max(timeout_s, 1))
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        entry.update(status="stopped at the budget", seconds=time.perf_counter() - start)
        return entry
    entry["seconds"] = time.perf_counter() - start
    if process.returncode == 0 and path.exists():
        entry.update(status="done", record=json.loads(path.read_text()))
    else:
        entry.update(status="failed", returncode=process.returncode, output=stderr[-2000:])
    LOG.info("%s: %s in %.0f s", m.name, entry["status"], entry["seconds"])
    return entry


def run(suite: Suite, budget_s: float, json_path: str | Path | None, repo: Path) -> dict:
    """Every measurement of the suite that starts within ``budget_s`` seconds; the record is
    written to ``json_path`` after each one."""
    start = time.perf_counter()
    record: dict = {"benchmark": "suite", "suite": dataclasses.asdict(suite), "entries": []}
    folder = Path(tempfile.mkdtemp(prefix="pmpipe-suite-"))

    def go(m: Measurement) -> dict:
        left = budget_s - (time.perf_counter() - start)
        entry = (
            measure(m, folder, left)
            if left > 0
            else {"name": m.name, "status": "not started: the budget was spent"}
        )
        record["entries"].append(entry)
        if json_path:
            Path(json_path).write_text(json.dumps(record, indent=2) + "\n")
        return entry

    pmwd = nbody_measurements(list(suite.sizes), list(suite.oversamples), ["pmwd"], suite.pmwd)
    done = [go(m).get("record", {}) for m in pmwd if "pmwd" in suite.peers]
    platform = "gpu" if local_gpus() else "cpu"
    camp = campaign_file(folder, suite.campaign_runs, repo, platform)
    profile = str(repo / "profiles" / "local")
    go(
        Measurement(
            f"campaign of {suite.campaign_runs} runs", ("campaign", str(camp), "--profile", profile)
        )
    )
    jaxpm = nbody_measurements(list(suite.sizes), [1], ["jaxpm"], None)
    done += [go(m).get("record", {}) for m in jaxpm if "jaxpm" in suite.peers]
    n = largest_size(done)
    for _ in range(LARGEST_TRIES if n is not None else 0):
        assert n is not None
        argv = ("nbody", "--particles", str(n), "--steps", "2")
        if go(Measurement(f"largest {n}^3 B=1", argv)).get("status") != "failed":
            break
        n -= LARGEST_STRIDE
    go(scaling_measurement(max(local_gpus(), 1), suite.scaling_particles))
    record["seconds"] = time.perf_counter() - start
    if json_path:
        Path(json_path).write_text(json.dumps(record, indent=2) + "\n")
    return record


def table(record: dict) -> str:
    """The suite's entries as a Markdown table: one row per measurement with its headline
    figures."""
    rows = ["| measurement | status | s | figures |", "|---|---|---|---|"]
    for e in record["entries"]:
        rows.append(
            f"| {e['name']} | {e['status']} | {e.get('seconds', 0):.0f} | "
            f"{headline(e.get('record') or {})} |"
        )
    return "\n".join(rows)


def headline(r: dict) -> str:
    """The figures of one benchmark record that the tables of docs/performance.md show."""
    if r.get("benchmark") == "nbody":
        parts = [f"run {r['run_s']:.3g} s", f"step {r['step_s']:.3g} s"]
        if r.get("device_peak_bytes"):
            parts.append(
                f"peak {r['device_peak_bytes'] / 1e9:.3g} GB "
                f"({r['device_bytes_per_particle']:.0f} B/particle)"
            )
        for peer in ("pmwd", "jaxpm"):
            if f"vs_{peer}" in r:
                parts.append(f"{peer} run {r[peer]['run_s']:.3g} s")
                parts.append(f"ratio {r[f'vs_{peer}']['run_s_ratio']:.2f}")
        return ", ".join(parts)
    if r.get("benchmark") == "campaign":
        return (
            f"{r['runs']} runs in {r['wall_s']:.0f} s, {r['runs_per_hour']:.0f} runs/hour, "
            f"duty {100 * r['duty']:.0f} %"
        )
    return ""
