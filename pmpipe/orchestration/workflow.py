"""What the Snakefile needs from pmpipe: the validated campaign, its runs, their config.json
files, per-rule resources, and the removal of stores left without a completion marker.

The Snakemake config holds the key ``campaign``: the campaign file (default
config/quickstart.yaml), e.g. ``snakemake --config campaign=config/examples/grid.yaml``; the
slurm profiles add ``site`` (profiles/slurm/site.yaml, pmpipe.orchestration.site), which turns the resources
into the SLURM plugin's and multi-process stages into srun steps.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import shutil
from pathlib import Path

from pmpipe import config, log, stages
from pmpipe.orchestration import campaign as campaigns
from pmpipe.orchestration import launch, site
from pmpipe.stages import runner
from pmpipe.storage import store

LOG = log.get(__name__)


DEFAULT_CAMPAIGN = Path("config/quickstart.yaml")
RESULTS = Path("results")


@dataclasses.dataclass(frozen=True)
class Job:
    """One Snakemake job: the runs of a group (campaign.job_groups) whose stores are not all
    complete, run in one process; the stores it makes, (run id, stage) from each run's first
    incomplete stage on; its resources (SLURM plugin names with a site); the seconds
    before its time limit at which it stops itself (launch.stop_ahead; 0: never); and the
    wrapper its pmpipe runs in (launch.wrapper_command: the site's environment variables and
    image; empty: the job's own Python)."""

    name: str
    run_ids: tuple[str, ...]
    stores: tuple[tuple[str, str], ...]
    resources: dict
    stop_ahead: int = 0
    wrapper: str = ""


@dataclasses.dataclass(frozen=True)
class Plan:
    """A campaign ready for Snakemake: its file and data (for schema validation), folder,
    run ids, the stages every run goes through, what their stores keep (config.Outputs), the
    run ids of every group (campaign.job_groups) and the jobs that make the missing stores."""

    campaign_file: Path
    campaign_data: dict
    campaign_dir: Path
    run_ids: tuple[str, ...]
    stages: tuple[str, ...]
    outputs: config.Outputs
    groups: dict[str, tuple[str, ...]]
    jobs: tuple[Job, ...]


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


def snakemake_locked(snakemake_dir: Path) -> bool:
    """True when another Snakemake instance holds locks in this working directory."""
    return any((snakemake_dir / "locks").glob("*.lock"))


def prune_incomplete(run_dir: Path) -> list[tuple[Path, list[str]]]:
    """Remove the stage stores of a run that lack their completion marker or whose chunks
    differ from their manifest (store.problems); returns them with what was wrong."""
    removed = []
    for stage in stages.STAGES:
        path = stages.store_path(run_dir, stage)
        found = store.problems(path) if path.exists() else []
        if found:
            shutil.rmtree(path)
            removed.append((path, found))
    return removed


def prepare(
    snakemake_config: dict,
    locked: bool = False,
    prune: bool = True,
    results: Path = RESULTS,
    environ=None,
) -> Plan:
    """Validate the campaign (ConfigError naming file and field), check that every run fits
    its devices, write the runs' config.json files (only those that changed) and, unless
    another Snakemake holds the directory, remove incomplete or damaged stores so they are
    recomputed.

    Runs are packed into jobs of execution.runs_per_job by their position in the design; a job
    holds the runs of its group that are not complete, so a finished run is never redone."""
    path = campaign_file(snakemake_config)
    camp = campaigns.load(path)
    campaigns.check_fits(camp)
    specs = list(camp.runs)
    campaigns.write_run_files(camp, results)
    campaign_dir = results / camp.name
    if prune and not locked:
        for spec in specs:
            for removed, why in prune_incomplete(campaign_dir / spec.run_id):
                LOG.warning(
                    "pmpipe: removed %s: it %s, so it is recomputed", removed, "; ".join(why)
                )
    run_stages = stages.run_stages(camp.base)  # the design varies cosmology only
    slurm_site = site_settings(snakemake_config, os.environ if environ is None else environ)
    jobs, groups = [], campaigns.job_groups(specs, camp.execution.job_size())
    for name, group in groups.items():
        todo = {
            s.run_id: runner.pending_stages(
                s.run, config.config_hash(s.run), campaign_dir / s.run_id
            )
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
                    launch.stop_ahead(resources, slurm_site),
                    shlex.join(launch.wrapper_command(slurm_site, bool(resources.get("gres")))),
                )
            )
    return Plan(
        path,
        config.read_mapping(path),
        campaign_dir,
        tuple(s.run_id for s in specs),
        run_stages,
        camp.base.outputs,
        {name: tuple(s.run_id for s in group) for name, group in groups.items()},
        tuple(jobs),
    )
