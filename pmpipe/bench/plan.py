"""``pmpipe bench plan``: how long Snakemake takes to plan a campaign, and that planning writes
nothing.

In a fresh working directory, for the campaign file (optionally with its sampled design, Latin
hypercube or Sobol, resized to ``samples`` points) and the repository's Snakefile with
``--profile profiles/local`` by default, runs ``snakemake --list-rules`` (the parse: the
Snakefile and pmpipe's plan, no DAG) and then ``snakemake -n`` (the parse, the DAG of every
job and the listing of the jobs), and reports as JSON: the wall time of each, pmpipe's share
of the parse (the planning line the Snakefile logs), runs and jobs, and the files both left
under results/ (none: planning only reads). Then it times the bookkeeping commands a user of a
large campaign runs often: ``pmpipe plan``, and ``pmpipe status`` of the prepared campaign,
all runs pending and then all done (:func:`bench_bookkeeping`).
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

import yaml

from pmpipe.bench import campaign_timing as bench_campaign
from pmpipe.run import config

PLANNED = re.compile(r"campaign (\S+) planned in ([\d.]+) s: (\d+) runs, jobs to run: (\d+)")


def resized(
    campaign_file: Path, samples: int | None, folder: Path, particles: int | None = None
) -> Path:
    """The campaign file, or a copy in folder whose sampled design (Latin hypercube or Sobol)
    has ``samples`` points and whose runs have ``particles`` per side, where given."""
    if samples is None and particles is None:
        return campaign_file
    data = config.read_mapping(campaign_file)
    if samples is not None:
        if (data.get("design") or {}).get("kind") not in ("latin_hypercube", "sobol"):
            raise config.ConfigError(
                f"{campaign_file}: --samples resizes a latin_hypercube or sobol design"
            )
        data["design"]["samples"] = samples
    if particles is not None:
        data.setdefault("base", {}).setdefault("box", {})["particles"] = particles
    path = folder / f"{campaign_file.stem}-{samples}-{particles}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def timed_pmpipe(workdir: Path, *args: str) -> float:
    """Wall seconds of ``python -m pmpipe.cli ARGS`` in workdir (start-up included);
    CampaignFailed when it fails."""
    start = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-m", "pmpipe.cli", *args], cwd=workdir, capture_output=True, text=True
    )
    if out.returncode:
        raise bench_campaign.CampaignFailed(
            f"pmpipe {args[0]} exited {out.returncode}:\n{out.stderr[-3000:]}"
        )
    return time.perf_counter() - start


def bench_bookkeeping(campaign_file: Path, workdir: Path) -> dict:
    """Wall seconds of ``pmpipe plan`` of the campaign, then of ``pmpipe status`` of its
    results folder with every run prepared and pending, then with every run done: each store
    of each run given root metadata with its completion marker (no arrays: status reads no
    more) and the run its done record with the stores' fingerprints, as a job writes it
    (pmpipe.storage.run_record)."""
    from pmpipe.campaigns import campaign
    from pmpipe.stages import run_stages, store_path
    from pmpipe.storage import integrity, run_record, store

    plan_s = timed_pmpipe(workdir, "plan", str(campaign_file), "--results", "results")
    camp = campaign.load(campaign_file)
    campaign.write_run_files(camp, workdir / "results")
    folder = str(Path("results") / camp.name)
    pending_s = timed_pmpipe(workdir, "status", folder)
    metadata = json.dumps(
        {"zarr_format": 3, "node_type": "group", "attributes": {store.COMPLETE: {}}}
    )
    for spec in camp.runs:
        run_dir = workdir / folder / spec.run_id
        for stage in run_stages(spec.run):
            path = store_path(run_dir, stage)
            path.mkdir()
            (path / integrity.METADATA).write_text(metadata)
        prints = {s: run_record.fingerprint(store_path(run_dir, s)) for s in run_stages(spec.run)}
        run_record.write(run_dir, None, None, 60.0, 0, prints)
    done_s = timed_pmpipe(workdir, "status", folder)
    report = json.loads(
        subprocess.run(
            [sys.executable, "-m", "pmpipe.cli", "status", folder, "--json"],
            cwd=workdir,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    if report["done"] != len(camp.runs):
        raise bench_campaign.CampaignFailed(f"status counts {report['done']} runs done")
    return {"pmpipe_plan_s": plan_s, "status_pending_s": pending_s, "status_done_s": done_s}


def bench_plan(
    campaign_file: str | Path,
    profile: str | Path = "profiles/local",
    samples: int | None = None,
    snakefile: str | Path | None = None,
    particles: int | None = None,
) -> dict:
    """Plan the campaign with ``snakemake -n`` in a fresh folder; returns the record."""
    snakefile = Path(snakefile) if snakefile else bench_campaign.default_snakefile()
    with tempfile.TemporaryDirectory(prefix="pmpipe-bench-plan-") as tmp:
        workdir = Path(tmp)
        path = resized(Path(campaign_file).absolute(), samples, workdir, particles)
        seconds = {}
        for name, option in (("parse_s", "--list-rules"), ("dry_run_s", "-n")):
            seconds[name], out = bench_campaign.run_snakemake(
                path, Path(profile).absolute(), workdir, snakefile, None, (option,)
            )
            if out.returncode:
                raise bench_campaign.CampaignFailed(
                    f"snakemake {option} exited {out.returncode}:\n{out.stderr[-3000:]}"
                )
        found = PLANNED.search(out.stderr)
        if found is None:
            raise bench_campaign.CampaignFailed(f"no planning line in:\n{out.stderr[-3000:]}")
        results = workdir / "results"
        written = sorted(str(p.relative_to(workdir)) for p in results.rglob("*"))
        seconds |= bench_bookkeeping(path, workdir)
    return {
        "benchmark": "plan",
        "campaign": found.group(1),
        "runs": int(found.group(3)),
        "jobs": int(found.group(4)),
        **seconds,
        "planning_s": float(found.group(2)),
        "written_under_results": written,
        "python": platform.python_version(),
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "cpu_count": os.cpu_count(),
    }
