"""``pmpipe bench campaign``: a campaign end to end through Snakemake, measured as a user waits
for it.

Runs ``snakemake --profile <profile>`` on the repository's Snakefile in a fresh working
directory (nothing written before, and nothing compiled unless ``programs`` names a persistent
compilation cache: the steady state of a long campaign, whose later jobs find the programs its
first compiled; the caller's XLA_FLAGS reach the jobs, less the CPU device count), from the
campaign file to the report figures, and reports as JSON: wall time, runs per hour, seconds
inside the physics (white noise, linear field and LPT, PM steps, lightcone capture, lensing,
statistics) summed over
the runs, their ratio to the wall time ("duty"), compilations and peak memory per job
process, and the bytes the stages wrote with their write throughput. The per-job figures come
from the records the jobs write (``results/<campaign>/benchmarks/<group>.json``,
pmpipe.job.pipeline). Physics seconds leave out the compilation inside each phase
(pmpipe.stages.progress.Progress.timed);
write throughput is the bytes the stages wrote over the time at least one write of the job was
under way (writes of runs that overlap count once), and ``physics_while_writing_s`` the time
during which a physics phase (its compilation included) and a write were both under way. The
record holds every run's timeline (pmpipe.bench.timeline) with those seconds per run, drawn as
timeline.png in the working directory.
"""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pmpipe.bench import timeline
from pmpipe.campaigns import campaign
from pmpipe.job import outcomes
from pmpipe.run import config
from pmpipe.runtime import backend, compilation_cache

PHASES = ("white_noise", "lpt", "pm_steps", "lensing", "statistics")


class CampaignFailed(RuntimeError):
    """Snakemake did not finish the campaign; the message ends with its output."""


def default_snakefile() -> Path:
    """The Snakefile of the checkout pmpipe is installed from."""
    return Path(__file__).resolve().parents[2] / "Snakefile"  # pmpipe/bench/campaign_timing.py


def run_snakemake(
    campaign_file: Path,
    profile: Path,
    workdir: Path,
    snakefile: Path,
    cores: int | None,
    extra: tuple[str, ...] = (),
    programs: Path | None = None,
) -> tuple[float, subprocess.CompletedProcess]:
    """Run the campaign in workdir (with ``extra`` snakemake arguments; its jobs' compiled
    programs in the persistent cache ``programs``, else in the campaign's own); returns (wall
    seconds, the finished process)."""
    cmd = [
        sys.executable,
        "-m",
        "snakemake",
        "-s",
        str(snakefile),
        "-d",
        str(workdir),
        "--profile",
        str(profile),
        "--config",
        f"campaign={campaign_file}",
    ]
    if cores is not None:
        cmd += ["--cores", str(cores)]
    cmd += list(extra)
    env = {k: v for k, v in os.environ.items() if k != compilation_cache.FOLDER_VARIABLE}
    if programs is not None:
        env[compilation_cache.FOLDER_VARIABLE] = str(programs)
    # the user's flags reach the jobs; each job asks for its own CPU devices
    flags = re.sub(rf"{backend.HOST_DEVICES_FLAG}=\S*", "", env.pop("XLA_FLAGS", "")).strip()
    if flags:
        env["XLA_FLAGS"] = flags
    start = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=workdir)
    return time.perf_counter() - start, out


def summarise(jobs: list[dict], runs: int, wall_s: float, store_bytes: int) -> dict:
    """The campaign's figures from its job records (pmpipe.job.pipeline.job_record)."""
    physics = dict.fromkeys(PHASES, 0.0)
    write_s, both_s, written = 0.0, 0.0, 0
    for job in jobs:
        stages = [stage for run in job["runs"] for stage in run["stages"]]
        for stage in stages:
            for phase, seconds in stage["physics"].items():
                physics[phase] = physics.get(phase, 0.0) + seconds
            written += stage["write"]["bytes"]
        seconds = timeline.busy(stages)  # the writes of a job's overlapping runs count once
        write_s += seconds["write_s"]
        both_s += seconds["physics_while_writing_s"]
    physics_s = sum(physics.values())
    return {
        "runs": runs,
        "wall_s": wall_s,
        "runs_per_hour": 3600.0 * runs / wall_s,
        "physics_s": physics_s,
        "physics_by_phase_s": physics,
        "duty": physics_s / wall_s,
        "jobs": len(jobs),
        "job_wall_s": [job["wall_s"] for job in jobs],
        "compilations_per_process": [job["compilation"]["compiled"] for job in jobs],
        "cache_hits_per_process": [job["compilation"]["cache_hits"] for job in jobs],
        "compile_s_per_process": [job["compilation"]["seconds"] for job in jobs],
        "peak_rss_mb_per_process": [job["peak_rss_mb"] for job in jobs],
        "peak_device_mb_per_process": [job["peak_device_mb"] for job in jobs],
        "bytes_written": store_bytes,
        "stage_bytes_written": written,
        "write_s": write_s,
        "physics_while_writing_s": both_s,
        "write_gb_per_s": written / write_s / 1e9 if write_s > 0 else None,
    }


def bench_campaign(
    campaign_file: str | Path,
    profile: str | Path = "profiles/local",
    workdir: str | Path | None = None,
    cores: int | None = None,
    snakefile: str | Path | None = None,
    programs: str | Path | None = None,
) -> dict:
    """Run the campaign through Snakemake in a fresh working directory (its jobs' compiled
    programs in the persistent cache folder ``programs`` when given) and measure it;
    CampaignFailed with the end of Snakemake's output when the campaign fails."""
    from pmpipe.runtime import parallel

    parallel.use_host_only()  # the campaign's jobs get the accelerators
    campaign_file, profile = Path(campaign_file).resolve(), Path(profile).resolve()
    camp = campaign.load(campaign_file)  # a bad file fails here, before any work
    if not profile.is_dir():
        raise config.ConfigError(f"--profile {profile}: no such Snakemake profile folder")
    snakefile = Path(snakefile).resolve() if snakefile else default_snakefile()
    if not snakefile.exists():
        raise config.ConfigError(
            f"{snakefile} does not exist: pass --snakefile (the Snakefile of a pmpipe checkout)"
        )
    workdir = Path(workdir or tempfile.mkdtemp(prefix=f"pmpipe-bench-{camp.name}-")).resolve()
    if (workdir / "results" / camp.name).exists():
        raise config.ConfigError(
            f"{workdir / 'results' / camp.name} exists: the benchmark "
            "needs a working directory without results of this campaign"
        )
    workdir.mkdir(parents=True, exist_ok=True)
    programs = Path(programs).resolve() if programs is not None else None
    wall_s, out = run_snakemake(
        campaign_file, profile, workdir, snakefile, cores, programs=programs
    )
    if out.returncode != 0:
        raise CampaignFailed(
            f"snakemake failed (exit {out.returncode}) in {workdir}:\n{out.stderr[-4000:]}"
        )
    campaign_dir = workdir / "results" / camp.name
    jobs = [json.loads(p.read_text()) for p in sorted((campaign_dir / "benchmarks").glob("*.json"))]
    runs = len(list(campaign_dir.glob("*/config.json")))
    store_bytes = sum(outcomes.directory_bytes(path) for path in campaign_dir.rglob("*.zarr"))
    first = jobs[0] if jobs else {}
    runs_timeline = timeline.runs_timeline(jobs)
    timeline.draw(runs_timeline, workdir / "timeline.png", f"{camp.name}: {runs} runs")
    return {
        "benchmark": "campaign",
        "campaign": camp.name,
        "campaign_file": str(campaign_file),
        "profile": str(profile),
        "workdir": str(workdir),
        "machine": {
            "platform": first.get("platform"),
            "device_kind": first.get("device_kind"),
            "devices": first.get("devices"),
            "cpu_count": os.cpu_count(),
            "processor": platform.processor() or platform.machine(),
            "python": platform.python_version(),
        },
        **summarise(jobs, runs, wall_s, store_bytes),
        "timeline_png": str(workdir / "timeline.png"),
        "timeline": runs_timeline,
    }
