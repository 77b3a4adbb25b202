"""``pmpipe bench plan``: how long Snakemake takes to plan a campaign, and that planning writes
nothing.

In a fresh working directory, for the campaign file (optionally with its sampled design, Latin
hypercube or Sobol, resized to ``samples`` points) and the repository's Snakefile with
``--profile profiles/local`` by default, runs ``snakemake --list-rules`` (the parse: the
Snakefile and pmpipe's plan, no DAG) and then ``snakemake -n`` (the parse, the DAG of every
job and the listing of the jobs), and reports as JSON: the wall time of each, pmpipe's share
of the parse (the planning line the Snakefile logs), runs and jobs, and the files both left
under results/ (none: planning only reads).
"""

from __future__ import annotations

import os
import platform
import re
import tempfile
from pathlib import Path

import yaml

from pmpipe.bench import campaign as bench_campaign
from pmpipe.run import config

PLANNED = re.compile(r"campaign (\S+) planned in ([\d.]+) s: (\d+) runs, jobs to run: (\d+)")


def resized(campaign_file: Path, samples: int | None, folder: Path) -> Path:
    """The campaign file, or a copy in folder whose sampled design has ``samples`` points."""
    if samples is None:
        return campaign_file
    data = config.read_mapping(campaign_file)
    if (data.get("design") or {}).get("kind") not in ("latin_hypercube", "sobol"):
        raise config.ConfigError(
            f"{campaign_file}: --samples resizes a latin_hypercube or sobol design"
        )
    data["design"]["samples"] = samples
    path = folder / f"{campaign_file.stem}-{samples}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def bench_plan(
    campaign_file: str | Path,
    profile: str | Path = "profiles/local",
    samples: int | None = None,
    snakefile: str | Path | None = None,
) -> dict:
    """Plan the campaign with ``snakemake -n`` in a fresh folder; returns the record."""
    snakefile = Path(snakefile) if snakefile else bench_campaign.default_snakefile()
    with tempfile.TemporaryDirectory(prefix="pmpipe-bench-plan-") as tmp:
        workdir = Path(tmp)
        path = resized(Path(campaign_file).absolute(), samples, workdir)
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
