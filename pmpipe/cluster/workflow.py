"""What the Snakefile needs from pmpipe: the validated campaign, its runs, the jobs that make
their missing stores with per-rule resources, and the preparation that comes before them.

Planning only reads: a Snakemake parse (``-n``, ``--lint``, ``--list``, ``--report`` or a run)
writes nothing. What the jobs need written first (the runs' config.json files) is the work of
the ``prepare`` rule, ``python -m pmpipe.cluster.workflow``, whose output is a plan file
named by a hash of what is to be done: every job with a store to make depends on it, so a new
plan (other configs, other missing, incomplete or damaged stores) makes Snakemake run those
jobs, and Snakemake removes their old stores before they start.

The Snakemake config holds the key ``campaign``: the campaign file (default
config/quickstart.yaml), e.g. ``snakemake --config campaign=config/examples/grid.yaml``; the
slurm profiles add ``site`` (profiles/slurm/site.yaml, pmpipe.cluster.site), which turns the resources
into the SLURM plugin's and multi-process stages into srun steps.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import shlex
from pathlib import Path

from pmpipe import stages
from pmpipe.campaigns import campaign as campaigns
from pmpipe.campaigns import resources, run_index
from pmpipe.cluster import launch, site
from pmpipe.results import summary_parts
from pmpipe.run import config
from pmpipe.runtime import backend, log
from pmpipe.stages import inputs, status
from pmpipe.storage import disk, integrity, store

LOG = log.get(__name__)


DEFAULT_CAMPAIGN = Path("config/quickstart.yaml")
RESULTS = Path("results")
PLANS = run_index.STATE_FOLDER  # folder of a campaign's plan files, beside its runs


@dataclasses.dataclass(frozen=True)
class Job:
    """One Snakemake job: the runs of a group (campaign.job_groups) whose stores are not all
    complete, run in one process; the stores it makes, (run id, stage) from each run's first
    incomplete stage on; its resources (SLURM plugin names with a site); where it writes its
    part of the campaign's summaries (pmpipe.results.summary_parts); the seconds
    before its time limit at which it stops itself (launch.stop_ahead; 0: never); the
    wrapper its pmpipe runs in (launch.wrapper_command: the site's environment variables and
    image; empty: the job's own Python); what the whole command runs in on the host
    (launch.host_command; empty without an image); and the job command's further options,
    each followed by a space ('--overlap ' with execution.overlap)."""

    name: str
    run_ids: tuple[str, ...]
    stores: tuple[tuple[str, str], ...]
    resources: dict
    part: str
    stop_ahead: int = 0
    wrapper: str = ""
    host: str = ""
    options: str = ""


@dataclasses.dataclass(frozen=True)
class Plan:
    """A campaign ready for Snakemake: its file and folder, run ids, the stages every run goes
    through, what their stores keep (config.Outputs), the run ids of every group
    (campaign.job_groups), the jobs that make the missing stores, and the plan file the
    ``prepare`` rule writes before them (None when there is nothing to prepare), with the
    bytes the stores to make need (:func:`bytes_to_write`; checked before the workflow runs,
    :func:`check_room_or_exit`, not while planning)."""

    campaign_file: Path
    campaign_dir: Path
    run_ids: tuple[str, ...]
    stages: tuple[str, ...]
    outputs: config.Outputs
    groups: dict[str, tuple[str, ...]]
    jobs: tuple[Job, ...]
    plan_file: Path | None
    needed_bytes: float = 0.0


def campaign_file(snakemake_config: dict) -> Path:
    """The campaign file named by the Snakemake config (``campaign=<path>``)."""
    extra = sorted(set(snakemake_config) - {"campaign", "site"})
    if extra:
        raise config.ConfigError(
            f"unknown Snakemake config key(s) {', '.join(extra)}: pass the campaign file as "
            "--config campaign=<file.yaml> (and site settings under 'site')"
        )
    return Path(snakemake_config.get("campaign", DEFAULT_CAMPAIGN))


def site_settings(snakemake_config: dict, environ) -> site.Site | None:
    """The SLURM site settings: the config's ``site`` section (the slurm profile's
    site.yaml) with the PMPIPE_SLURM_* variables applied; None without a site section."""
    if "site" not in snakemake_config:
        return None
    section = snakemake_config["site"] or {}
    return site.from_mapping(section, environ, "site section of the Snakemake config")


def unwritten_configs(camp: campaigns.Campaign, results: Path) -> dict[str, str]:
    """Run id -> the state of its config.json where it is missing or differs from what the
    campaign makes of it: the new content's hash and the run folder's modification time (a
    file deleted again, or edited again, gives another state)."""
    out = {}
    for spec in camp.runs:
        folder = results / camp.name / spec.run_id
        path = folder / "config.json"
        if not path.exists():
            out[spec.run_id] = f"missing@{folder.stat().st_mtime_ns if folder.exists() else 0}"
            continue
        text = campaigns.run_file(camp, spec).to_json()
        if path.read_text() != text:
            digest = hashlib.sha256(text.encode()).hexdigest()[:16]
            out[spec.run_id] = f"{digest}@{path.stat().st_mtime_ns}"
    return out


def _report_remade(camp: campaigns.Campaign, campaign_dir: Path, made) -> list[str]:
    """Log each existing store that a job makes again, with why; returns their states
    (path and modification time) for the plan's name."""
    runs = {s.run_id: s.run for s in camp.runs}
    remade: dict[str, list[str]] = {}
    for run_id, stage in made:
        remade.setdefault(run_id, []).append(stage)
    states = []
    for run_id, stage in made:
        path = stages.store_path(campaign_dir / run_id, stage)
        if not path.exists():
            continue
        states.append(f"{path}@{path.stat().st_mtime_ns}")
        found = store.problems(path, config_hash=config.config_hash(runs[run_id]))
        found = found or inputs.left_out(stage, remade[run_id], runs[run_id])
        why = "; ".join(found) if found else "comes after a stage of its run that is made again"
        LOG.warning("pmpipe: %s %s, so it is made again", path, why)
    return states


def plan_jobs(camp: campaigns.Campaign, campaign_dir: Path, slurm_site) -> list[Job]:
    """The jobs of the groups (execution.runs_per_job, by design position) that hold runs
    whose stores are not all complete: those runs, each from the first stage it must compute
    (status.pending_stages)."""
    jobs = []
    for name, group in campaigns.job_groups(camp.runs, camp.execution.job_size()).items():
        todo = {
            s.run_id: status.pending_stages(
                s.run, config.config_hash(s.run), campaign_dir / s.run_id
            )
            if (campaign_dir / s.run_id).exists()
            else stages.run_stages(s.run)  # a run not begun: every stage
            for s in group
        }
        pending = [s for s in group if todo[s.run_id]]
        if pending:
            resources = launch.job_resources([s.run for s in pending], camp.execution, slurm_site)
            jobs.append(
                Job(
                    name,
                    tuple(s.run_id for s in pending),
                    tuple((s.run_id, stage) for s in pending for stage in todo[s.run_id]),
                    resources,
                    str(summary_parts.job_part(campaign_dir, name)),
                    launch.stop_ahead(resources, slurm_site),
                    shlex.join(launch.wrapper_command(slurm_site, bool(resources.get("gres")))),
                    shlex.join(launch.host_command(slurm_site)),
                    "--overlap " if camp.execution.overlap else "",
                )
            )
    return jobs


def prepare(snakemake_config: dict, results: Path = RESULTS, environ=None) -> Plan:
    """Plan the campaign without writing anything: validate it (ConfigError naming file and
    field), check that every run fits its devices, find the jobs that make its missing,
    incomplete, damaged or outdated stores (logged), and name the plan file that the
    ``prepare`` rule writes with the runs' config.json files before those jobs run. The
    results folder is not looked at for room: a dry run plans a campaign on a machine whose
    disk could not hold it (a login node), and the run checks it first
    (:func:`check_room_or_exit`).

    Runs are packed into jobs of execution.runs_per_job by their position in the design; a job
    holds the runs of its group that are not complete, so a finished run is never redone."""
    path = campaign_file(snakemake_config)
    camp = campaigns.load(path)
    env = os.environ if environ is None else environ
    slurm_site = site_settings(snakemake_config, env)
    campaigns.check_fits(camp, {**env, **(slurm_site.env if slurm_site is not None else {})})
    campaign_dir = results / camp.name
    jobs = plan_jobs(camp, campaign_dir, slurm_site)
    if slurm_site is None and jobs:
        check_local_devices(camp, path, backend.gpu_device_files(), os.cpu_count() or 1)
    made = [key for job in jobs for key in job.stores]
    todo = {
        "configs": unwritten_configs(camp, results),
        "stores": made,
        "existing": _report_remade(camp, campaign_dir, made),
    }
    plan_file = None
    if todo["configs"] or made:
        digest = hashlib.sha256(json.dumps(todo, sort_keys=True).encode()).hexdigest()[:16]
        plan_file = campaign_dir / PLANS / f"plan-{digest}.json"
    groups = campaigns.job_groups(camp.runs, camp.execution.job_size())
    return Plan(
        path,
        campaign_dir,
        tuple(s.run_id for s in camp.runs),
        stages.run_stages(camp.base),  # a design changes no stage
        camp.base.outputs,
        {name: tuple(s.run_id for s in group) for name, group in groups.items()},
        tuple(jobs),
        plan_file,
        bytes_to_write(camp, made),
    )


def check_local_devices(camp: campaigns.Campaign, path: Path, gpu_files, cores: int) -> None:
    """For jobs run on this machine (no SLURM site): ConfigError when the campaign asks for
    GPUs and the machine has none (``gpu_files``: its GPU device files), a warning when its
    runs ask for more CPU devices than ``cores``."""
    execution = camp.execution
    if execution.platform == "gpu" and not gpu_files:
        raise config.ConfigError(
            f"{path}: execution.platform = gpu, but this machine has no GPU (no /dev/nvidia<N> "
            "or /dev/kfd) and the profile runs the jobs here: run on GPU nodes with a SLURM "
            "profile (--profile profiles/slurm), or set execution.platform: cpu to run on "
            "this machine's CPUs"
        )
    devices = max(math.prod(spec.run.parallel.pdims) for spec in camp.runs)
    if execution.platform == "cpu" and devices > cores:
        LOG.warning(
            "warning: %s: runs of %d CPU devices (base.parallel.pdims) on a machine of %d "
            "cores: the devices share the cores, so the results are right but slower than "
            "with at most %d devices",
            path,
            devices,
            cores,
            cores,
        )


def bytes_to_write(camp: campaigns.Campaign, made) -> float:
    """Bytes of the stores ``made`` ((run id, stage) pairs), each as large as the first run's
    store of its stage (resources.disk_bytes; the runs of a campaign share their sizes, their
    cosmologies change only the number of lightcone planes a little): an estimate for the
    check of free space, made once whatever the number of runs."""
    if not made:
        return 0.0
    per_stage = resources.disk_bytes(camp.runs[0].run)
    return sum(per_stage.get(stage, 0.0) for _, stage in made)


def prepare_or_exit(snakemake_config: dict) -> Plan:
    """:func:`prepare` for the Snakefile: a configuration error, or a file that cannot be
    read, ends Snakemake with one 'error: ...' line and exit status 2 (the traceback with
    PMPIPE_DEBUG=1)."""
    try:
        return prepare(snakemake_config)
    except (config.ConfigError, OSError) as err:
        if log.debug_requested():
            raise
        LOG.error("error: %s", disk.known_failure(err) or err)
        raise SystemExit(2) from None


def check_room_or_exit(plan: Plan) -> None:
    """The Snakefile's ``onstart`` (a run, not a dry run, before any job): when the plan has
    stores to make, the results folder must be writable and its file system hold them; else
    one 'error: ...' line and exit status 2, with nothing written."""
    if plan.plan_file is None:
        return
    stores = sum(len(job.stores) for job in plan.jobs)
    what = f"the {stores} stores to make" if stores else "the runs' config.json files"
    try:
        disk.check_writable(plan.campaign_dir, plan.needed_bytes, what)
    except OSError as err:
        if log.debug_requested():
            raise
        LOG.error("error: %s", disk.known_failure(err) or err)
        raise SystemExit(2) from None


def collect_partial(plan: Plan, results: Path = RESULTS) -> None:
    """The Snakefile's ``onerror``: when jobs failed, collect the runs complete so far
    (aggregate.collect with partial), draw the design figure with each run's state
    (campaign_figures.plot_design) and say where the failures are told; nothing when the
    campaign store already holds every run (a figure failed). Whatever goes wrong here is
    logged: the workflow's own error stays the one it reports."""
    from pmpipe.results import aggregate, campaign_figures

    path = plan.campaign_dir / "summaries.zarr"
    if store.is_complete(path):
        attrs = integrity.root_attributes(path) or {}
        if attrs.get("complete_runs") == len(plan.run_ids):
            return
    design = plan.campaign_dir / "report" / "design.png"
    try:
        aggregate.collect(plan.campaign_file, results, partial=True)
        campaign_figures.plot_design(path, design)
    except Exception as err:  # noqa: BLE001  the hook must not hide the workflow's own error
        LOG.error("pmpipe: the runs complete so far were not collected: %s", err)
        return
    LOG.error(
        "pmpipe: jobs failed; the runs complete so far are in %s (variable 'complete'), %s "
        "shows where the failed runs lie in the design, and `pmpipe status %s` names each "
        "failed run and its error",
        path,
        design,
        plan.campaign_dir,
    )


def write_plan(campaign_path: Path, results: Path, plan_file: Path) -> list[Path]:
    """The ``prepare`` rule: write the runs' config.json files (those whose content changed;
    the others are left untouched), then the plan file, removing older plans; returns the
    config.json paths."""
    camp = campaigns.load(campaign_path)
    paths = campaigns.write_run_files(camp, results)
    plan_file.parent.mkdir(parents=True, exist_ok=True)
    for old in plan_file.parent.glob("plan-*.json"):
        if old != plan_file:
            old.unlink()
    plan_file.write_text(
        json.dumps({"campaign": str(campaign_path), "runs": len(paths)}, indent=2) + "\n"
    )
    return paths


def main(argv=None) -> int:
    """``python -m pmpipe.cluster.workflow CAMPAIGN --results DIR --plan FILE``."""
    parser = argparse.ArgumentParser(
        prog="python -m pmpipe.cluster.workflow",
        description="write a campaign's config.json files and the plan file of the workflow",
    )
    parser.add_argument("campaign", type=Path, help="campaign file (YAML or JSON)")
    parser.add_argument("--results", type=Path, default=RESULTS, help="results folder")
    parser.add_argument("--plan", type=Path, required=True, help="the plan file to write")
    args = parser.parse_args(argv)
    log.configure()
    try:
        paths = write_plan(args.campaign, args.results, args.plan)
    except (config.ConfigError, OSError) as err:
        LOG.error("error: %s", disk.failure(err) or err)
        return 2
    LOG.info("pmpipe: %d run files of %s in place, plan %s", len(paths), args.campaign, args.plan)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
