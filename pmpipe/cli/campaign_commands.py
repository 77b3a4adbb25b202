"""Commands on campaigns: ``pmpipe plan``, ``tune``, ``schema``, ``collect`` and ``submit``."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from pmpipe.runtime import log

LOG = log.get(__name__)
SCHEMA_PATH = Path("workflow/schemas/campaign.schema.json")


def plan(args) -> int:
    """``pmpipe plan CAMPAIGN``: the table of runs and the warnings on resolution."""
    from pmpipe.campaigns import campaign
    from pmpipe.cluster import plan_table

    camp = campaign.load(args.campaign)
    print(plan_table.plan_table(camp, None if args.all_runs else plan_table.ROWS_SHOWN))
    print(plan_table.jobs_line(camp, args.results, _plan_site(args)))
    print(plan_table.halo_line(camp))
    if camp.decomposition is not None:
        print(plan_table.decomposition_line(camp))
    linear = plan_table.linear_power_line(camp, args.results)
    if linear is not None:
        print(linear)
    # per field: the warning of the run that resolves least, and the runs it concerns
    worst: dict[str, tuple[float, str]] = {}
    runs: dict[str, list[str]] = {}
    seen: dict[str, dict] = {}
    lensing_runs = [spec for spec in camp.runs if spec.run.lensing is not None]
    for spec in lensing_runs:  # the maps' resolution needs the run's setup
        key = json.dumps(
            {k: v for k, v in spec.run.model_dump(mode="json").items() if k != "ic"}, sort_keys=True
        )  # seeds change no range: one check per design point
        if key not in seen:
            seen[key] = _resolution_warnings(camp, spec, args.results)
        for field, (resolved, text) in seen[key].items():
            runs.setdefault(field, []).append(spec.run_id)
            if field not in worst or resolved < worst[field][0]:
                worst[field] = (resolved, text)
    for field, (_, text) in worst.items():
        LOG.warning("warning: %s [%d of the runs]", text, len(runs[field]))
    _seed_warnings(camp, args.campaign, args.results)
    return 0


def _resolution_warnings(camp, spec, results: Path) -> dict:
    """map_warnings.resolution_warnings of a run's setup, with the CAMB tables of the results
    folder's cache (those made are left there)."""
    from functools import partial

    from pmpipe.campaigns import campaign
    from pmpipe.run import derive
    from pmpipe.stages import map_warnings
    from pmpipe.storage import power_cache

    tables = partial(power_cache.linear_table, folder=results / power_cache.FOLDER)
    return map_warnings.resolution_warnings(
        derive.planning_setup(campaign.run_file(camp, spec), tables)
    )


def _plan_site(args):
    """The SLURM site settings of --site (PMPIPE_SITE and PMPIPE_SLURM_* variables win)."""
    import os

    from pmpipe.cluster import site

    return site.load_site(args.site, os.environ)


def _seed_warnings(camp, source, results) -> None:
    """A seed derived from the name, to pin; seeds shared with other campaigns in ``results``."""
    from pmpipe.campaigns import campaign
    from pmpipe.results import manifest

    if camp.seed is None:
        seed = campaign.campaign_seed(camp)
        LOG.warning(
            "warning: %s sets no seed: its runs derive from %d, the seed of its name, and a "
            "rename would change every run; pin it with 'seed: %d'",
            source,
            seed,
            seed,
        )
        own = Path(results) / camp.name / "manifest.csv"
        made = manifest.recorded_seeds(own) if own.is_file() else {}
        if any(made.get(spec.run_id, spec.seed) != spec.seed for spec in camp.runs):
            zero = campaign.expand(camp.model_copy(update={"seed": 0}))
            match = all(made.get(s.run_id, s.seed) == s.seed for s in zero)
            LOG.warning(
                "warning: the runs in %s were made with other seeds than %d gives them: to "
                "keep them, pin the campaign seed they were made with%s",
                own.parent,
                seed,
                " ('seed: 0' gives theirs)" if match else "",
            )
    if camp.shared_seeds:
        return
    for other, count in manifest.seed_collisions(camp, results).items():
        LOG.warning(
            "warning: %d runs of campaign %s in %s have the seeds of runs of this one: the two "
            "are not independent; change 'seed', or set 'shared_seeds: true' if that is meant",
            count,
            other,
            results,
        )


def tune(args) -> int:
    """``pmpipe tune CAMPAIGN``: time the decompositions of its devices, record the fastest."""
    from pmpipe.campaigns import campaign, decomposition, tune
    from pmpipe.cluster import plan_table
    from pmpipe.run import config, ghost_cells
    from pmpipe.runtime import parallel

    wanted = (config.read_mapping(args.campaign).get("decomposition") or {}).get("devices")
    if isinstance(wanted, int):  # host devices on CPU, before JAX starts
        parallel.request_host_devices(wanted)
    camp = campaign.load(args.campaign)
    d = camp.decomposition
    if d is None or d.file is None:
        raise config.ConfigError(
            f"{args.campaign}: tune needs decomposition.devices and "
            "decomposition.file (where the sweep is recorded)"
        )
    import jax

    box = camp.base.box
    sweep = tune.sweep(
        d.devices, box.particles, box.oversample, ghost_cells.cells(camp.base), args.repeat
    )
    decomposition.record(d.file, jax.devices()[0].device_kind, sweep)
    print(
        f"recorded in {d.file}: "
        + ", ".join(f"{k} {v * 1e3:.3g} ms" for k, v in sweep.step_seconds.items())
        + f" a step; fastest {decomposition.label(sweep.pdims)}"
    )
    print(plan_table.decomposition_line(campaign.load(args.campaign)))
    return 0


def schema(args) -> int:
    """``pmpipe schema``: write the JSON schema of campaign files."""
    from pmpipe.campaigns import campaign

    campaign.write_schema(args.output)
    print(f"wrote {args.output}")
    return 0


def collect(args) -> int:
    """``pmpipe collect CAMPAIGN``: the campaign store and manifest from its runs."""
    from pmpipe.results import aggregate

    folder = aggregate.collect(args.campaign, args.results, args.partial)
    print(f"wrote {folder / 'summaries.zarr'} and {folder / 'manifest.csv'}")
    return 0


def export(args) -> int:
    """``pmpipe export results/<campaign>``: the campaign as one table (Parquet or npz)."""
    from pmpipe.results import export as exports

    path = exports.export(args.folder, args.format, args.output)
    print(f"wrote {path}")
    return 0


def status(args) -> int:
    """``pmpipe status results/<campaign>``: runs done, running, failed and pending."""
    from pmpipe.results import campaign_status

    report = campaign_status.campaign_status(args.folder)
    print(json.dumps(report, indent=1) if args.json else campaign_status.status_text(report))
    return 0


def submit(args) -> int:
    """``pmpipe submit CAMPAIGN``: a campaign as a SLURM job array (every stage of a run in
    one job), or one stage of one run, through submitit."""
    import os

    from pmpipe.campaigns import campaign
    from pmpipe.cluster import site
    from pmpipe.results import aggregate

    camp = campaign.load(args.campaign)
    campaign.check_fits(camp)
    slurm_site = site.load_site(args.site, os.environ)
    specs = _chosen_runs(args, camp)
    folder = (args.logs or args.results / camp.name / "logs" / "submitit").absolute()
    while True:  # with --wait, the waves of site max_submit_jobs tasks one after the other
        if args.stage:
            submitted, left = _submit_stage(args, camp, specs[0], slurm_site, folder), 0
        else:
            submitted, left = _submit_array(args, camp, specs, slurm_site, folder)
        for label, job in submitted:
            print(f"{label}: SLURM job {job.job_id}, log {job.paths.stdout}")
        if not args.wait or args.dry_run:
            return 0
        if _failed(submitted):
            if not args.stage and not args.run:
                _collect_partial(args, left)
            return 1
        if not left:
            break
    if not args.stage and not args.run:
        out = aggregate.collect(args.campaign, args.results)
        print(f"wrote {out / 'summaries.zarr'} and {out / 'manifest.csv'}")
    return 0


def _collect_partial(args, left: int) -> None:
    """After failed jobs: the runs complete so far collected, and what is left said."""
    from pmpipe.results import aggregate

    out = aggregate.collect(args.campaign, args.results, partial=True)
    LOG.error(
        "error: jobs failed; the runs complete so far are in %s ('complete' says which), "
        "`pmpipe status %s` names the failed runs%s",
        out / "summaries.zarr",
        out,
        f"; {left} task(s) were not submitted: run this command again once the failures are fixed"
        if left
        else "",
    )


def _chosen_runs(args, camp) -> list:
    """The campaign's runs that --run names (every run without it), the options checked."""
    from pmpipe.run import config

    specs = list(camp.runs)
    if args.run:
        known = {s.run_id for s in specs}
        unknown = [r for r in args.run if r not in known]
        if unknown:
            raise config.ConfigError(
                f"--run {', '.join(unknown)}: not a run of {args.campaign} "
                f"(its runs: {', '.join(sorted(known))})"
            )
        specs = [s for s in specs if s.run_id in args.run]
    if args.stage and len(specs) != 1:
        raise config.ConfigError("--stage submits one stage of one run: name the run with --run")
    if args.max_parallel < 1:
        raise config.ConfigError(f"--max-parallel must be at least 1 (got {args.max_parallel})")
    return specs


def _submit_stage(args, camp, spec, slurm_site, folder: Path) -> list[tuple[str, Any]]:
    """One stage of one run as a job (its sbatch script printed with --dry-run)."""
    from pmpipe.campaigns import campaign
    from pmpipe.cluster import launch
    from pmpipe.runtime import parallel

    if args.dry_run:
        _warn_without_partition(slurm_site)
        job = launch.campaign_job(camp, spec, slurm_site, args.stage)
        python = launch.job_python(job, slurm_site) or sys.executable
        print(launch.sbatch_script(job, folder, python=python))
        return []
    campaign.write_run_files(camp, args.results)
    parallel.use_compilation_cache(args.results / ".jax_cache")  # the jobs inherit it
    job = launch.submit_stage(camp, spec, args.stage, args.results, folder, slurm_site)
    return [(spec.run_id, job)]


def _groups_to_submit(camp, specs, campaign_dir: Path, dry_run: bool) -> list[list]:
    """The runs of ``specs`` to submit, packed as the campaign packs them: those not complete
    (or made from another configuration) and in no SLURM job still queued or running
    (pmpipe.cluster.submissions; not asked with ``dry_run``). Says which are left out."""
    from pmpipe.campaigns import campaign
    from pmpipe.cluster import submissions
    from pmpipe.run import config
    from pmpipe.stages import status

    chosen = {s.run_id for s in specs}
    queued = set() if dry_run else submissions.queued_runs(campaign_dir) & chosen
    if queued:
        LOG.warning(
            "%d run(s) are in SLURM jobs still queued or running (%s): not submitted again",
            len(queued),
            ", ".join(sorted(queued)[:5]) + (" ..." if len(queued) > 5 else ""),
        )
    groups = [
        [
            s
            for s in group
            if s.run_id in chosen - queued
            and status.pending_stages(s.run, config.config_hash(s.run), campaign_dir / s.run_id)
        ]
        for group in campaign.job_groups(camp.runs, camp.execution.job_size()).values()
    ]
    groups = [g for g in groups if g]
    pending = {s.run_id for g in groups for s in g}
    complete = [s.run_id for s in specs if s.run_id not in pending | queued]
    if complete:
        shown = ", ".join(complete[:10]) + (
            f" and {len(complete) - 10} more" if complete[10:] else ""
        )
        print(f"{len(complete)} run(s) complete, not submitted: {shown}")
    return groups


def _submit_array(args, camp, specs, slurm_site, folder: Path) -> tuple[list[tuple[str, Any]], int]:
    """The chosen runs that are not complete, or whose stores were made from another
    configuration than the campaign's now, packed as the campaign packs them
    (execution.runs_per_job), as job arrays within the cluster's MaxArraySize, at most the
    site's max_submit_jobs tasks (their sbatch script printed with --dry-run). Returns the
    submitted jobs and the number of tasks left for a next wave."""
    from pmpipe.campaigns import campaign
    from pmpipe.cluster import launch, site, submissions
    from pmpipe.runtime import parallel

    campaign_dir = args.results / camp.name
    groups = _groups_to_submit(camp, specs, campaign_dir, args.dry_run)
    limit, source = site.max_array_size(slurm_site, site.scontrol_config())
    arrays = launch.split_arrays(groups, limit, slurm_site and slurm_site.max_submit_jobs)
    share = launch.parallel_share(args.max_parallel, len(arrays))
    left = len(groups) - sum(map(len, arrays))
    if groups:
        LOG.info(
            "%d runs packed into %d task(s) of at most %d runs (execution.runs_per_job): %d "
            "SLURM array(s) of at most %d tasks (%s), at most %d task(s) of each at a time "
            "(--max-parallel %d over the arrays); a task runs every stage of its runs in one "
            "process, so its --time and memory are for all of them",
            sum(map(len, groups)),
            len(groups),
            camp.execution.job_size(),
            len(arrays),
            limit,
            source,
            min(share, len(groups)),
            args.max_parallel,
        )
    if left:
        LOG.warning(
            "warning: %d task(s) not submitted now (site max_submit_jobs = %d): with --wait "
            "they go when these are done; else run the same `pmpipe submit` then (it submits "
            "only the runs not complete)",
            left,
            slurm_site.max_submit_jobs,
        )
    if args.dry_run:
        _warn_without_partition(slurm_site)
        if arrays:
            job = launch.array_job(camp, arrays[0], slurm_site)
            script = launch.sbatch_script(
                job,
                folder,
                python=launch.job_python(job, slurm_site) or sys.executable,
                array_size=len(arrays[0]),
                array_parallelism=share,
            )
            print(script)
        return [], left
    campaign.write_run_files(camp, args.results)
    parallel.use_compilation_cache(args.results / ".jax_cache")  # the jobs inherit it
    submitted = []
    for array in arrays:
        jobs = launch.submit_campaign(camp, array, args.results, folder, slurm_site, share)
        submitted += [(", ".join(s.run_id for s in g), job) for g, job in zip(array, jobs)]
        tasks = [[s.run_id for s in g] for g in array]
        submissions.record(campaign_dir, str(jobs[0].job_id).split("_")[0], tasks)
    return submitted, left


def _warn_without_partition(slurm_site) -> None:
    """A warning when the site settings name no SLURM partition."""
    if slurm_site is None or slurm_site.partition is None:
        LOG.warning(
            "warning: no SLURM partition is set (a site file's 'partition' or "
            "PMPIPE_SLURM_PARTITION): sbatch uses the cluster's default partition, which may "
            "have no GPUs or a shorter time limit"
        )


def _failed(submitted: list[tuple[str, Any]]) -> int:
    """Wait for the jobs; log each that failed with its log; returns how many failed."""
    failed = 0
    for label, job in submitted:
        try:
            job.results()  # one result per task (process)
        except Exception as err:  # noqa: BLE001  submitit raises its own errors for failed or lost jobs
            failed += 1
            LOG.error(
                "error: %s: SLURM job %s failed (%s); log: %s",
                label,
                job.job_id,
                type(err).__name__,
                job.paths.stdout,
            )
    return failed
