"""SLURM jobs of pmpipe stages.

Pure builders: the geometry of a stage's job from pmpipe's resources and the site
(:func:`slurm_job`), the srun line of a multi-process stage (:func:`srun_command`), the
Snakemake SLURM plugin's resources (:func:`snakemake_resources`), and the sbatch script that
submitit submits (:func:`submitit_parameters`, :func:`sbatch_script`).

Submission with submitit: one stage of one run (:func:`submit_stage`, nodes x tasks_per_node
processes), or a campaign as job arrays (:func:`split_arrays`), each element running every
stage of a group of runs in one process (:func:`submit_campaign`). An element that is started again skips the runs
and stages already complete.
"""

from __future__ import annotations

import dataclasses
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from pmpipe import stages
from pmpipe.campaigns import campaign as campaigns
from pmpipe.campaigns import resources
from pmpipe.cluster.site import Site
from pmpipe.run import config
from pmpipe.storage import store

SRUN_OPTIONS = ("--kill-on-bad-exit=1",)  # one failed process ends the step, no hang


@dataclasses.dataclass(frozen=True)
class SlurmJob:
    """One SLURM job: ``nodes`` x ``tasks_per_node`` processes (one per GPU on gpu), memory
    ``mem_mb`` per node, wall time ``time_min`` minutes, and where it goes."""

    name: str
    nodes: int
    tasks_per_node: int
    cpus_per_task: int
    gpus_per_node: int
    mem_mb: int
    time_min: int
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    extra: tuple[str, ...] = ()
    signal_seconds: int = 300

    @property
    def tasks(self) -> int:
        return self.nodes * self.tasks_per_node


def site_execution(execution: resources.Execution, site: Site | None) -> resources.Execution:
    """The campaign's execution section with the site's GPUs per node (gpu platform only)."""
    if site is not None and site.gpus_per_node and execution.platform == "gpu":
        return execution.model_copy(update={"devices_per_node": site.gpus_per_node})
    return execution


def slurm_job(name: str, resources: dict, site: Site | None) -> SlurmJob:
    """The job of a stage from pmpipe's resources (resources.resources) and the site."""
    site = site or Site()
    return SlurmJob(
        name=name,
        nodes=resources["nodes"],
        tasks_per_node=resources["tasks_per_node"],
        cpus_per_task=resources["cpus_per_task"],
        gpus_per_node=resources["gpu"],
        mem_mb=resources["mem_mb"],
        time_min=resources["runtime"],
        partition=site.partition,
        account=site.account,
        qos=site.qos,
        constraint=site.constraint,
        extra=tuple(site.extra),
        signal_seconds=signal_lead(site.signal_seconds, resources["runtime"]),
    )


def signal_lead(seconds: int, time_min: int) -> int:
    """How long before the time limit SLURM signals a job: the site's ``seconds``, at most a
    quarter of the job's time (a signal at its start would requeue it before any step)."""
    return max(1, min(seconds, time_min * 60 // 4))


def srun_command(job: SlurmJob, launcher: str = "srun") -> list[str]:
    """The launcher with the job's full geometry: inside a Snakemake job step no SLURM_*
    variable is left to inherit it from."""
    gpus = [f"--gres=gpu:{job.gpus_per_node}"] if job.gpus_per_node else []
    return [
        *shlex.split(launcher),
        f"--nodes={job.nodes}",
        f"--ntasks-per-node={job.tasks_per_node}",
        f"--cpus-per-task={job.cpus_per_task}",
        *gpus,
        *SRUN_OPTIONS,
    ]


def wrapper_command(site: Site | None, gpus: bool) -> list[str]:
    """What a job's ``python -m pmpipe...`` runs in, after the launcher: ``env NAME=value ...``
    for the site's environment variables, then ``apptainer exec [--nv] <options> <image>``
    (--nv for a job with GPUs) with a site image; nothing without either."""
    if site is None:
        return []
    env = ["env", *(f"{name}={value}" for name, value in site.env.items())] if site.env else []
    if site.image is None:
        return env
    return [
        *env,
        *shlex.split(site.apptainer),
        "exec",
        *(["--nv"] if gpus else []),
        *site.apptainer_options,
        site.image,
    ]


def host_command(site: Site | None) -> list[str]:
    """What a Snakemake job's command runs in on the host, before the launcher: with a site
    image, pmpipe.runtime.host_requeue (the job's end time passed into the image, the job
    requeued from the host when pmpipe in the image stopped for a checkpoint); else nothing."""
    if site is None or site.image is None:
        return []
    return ["python", "-m", "pmpipe.runtime.host_requeue", "--"]


def job_python(job: SlurmJob, site: Site | None) -> str | None:
    """The Python a submitit job runs: the image's (``[env ...] apptainer exec ... <image>
    python``) with a site image, this process's interpreter behind the site's ``env ...``
    without one, else None (submitit's default, this process's interpreter)."""
    wrapper = wrapper_command(site, job.gpus_per_node > 0)
    if not wrapper:
        return None
    image = site is not None and site.image is not None
    return shlex.join([*wrapper, "python" if image else sys.executable])


def snakemake_resources(job: SlurmJob, launcher: str = "srun") -> dict:
    """Resources by the Snakemake SLURM plugin's names. GPUs go as ``gres`` (per node: the
    plugin's ``gpu`` becomes ``--gpus``, a total per job); ``mpi`` is the srun line a rule puts
    in front of its command, empty for one process (run directly in the batch step: the
    plugin takes no srun line of one task). ``slurm_extra``: the site's options, then
    --signal=USR2@s, which SLURM sends to the job's steps (the srun of a multi-process
    stage) ahead of the time limit."""
    res = {
        "nodes": job.nodes,
        "tasks_per_node": job.tasks_per_node,
        "cpus_per_task": job.cpus_per_task,
        "mem_mb": job.mem_mb,
        "runtime": job.time_min,
        "gres": f"gpu:{job.gpus_per_node}" if job.gpus_per_node else "",
        "mpi": shlex.join(srun_command(job, launcher)) if job.tasks > 1 else "",
        "slurm_extra": shlex.join([*job.extra, f"--signal=USR2@{job.signal_seconds}"]),
    }
    for key, value in (
        ("slurm_partition", job.partition),
        ("slurm_account", job.account),
        ("qos", job.qos),
        ("constraint", job.constraint),
    ):
        if value:
            res[key] = value
    return res


def workflow_resources(res: dict, name: str, site: Site | None) -> dict:
    """Snakemake resources from pmpipe's (resources.resources or resources.job_resources): those
    for local execution, where a job is one process with all its devices and ``mpi`` is empty;
    the SLURM plugin's (:func:`snakemake_resources`) when a site is given."""
    if site is None:
        return {**{k: v for k, v in res.items() if k != "devices"}, "mpi": ""}
    return snakemake_resources(slurm_job(name, res, site), site.launcher)


def job_resources(
    runs: list[config.Run], execution: resources.Execution, site: Site | None
) -> dict:
    """Snakemake resources of a job that runs every stage of ``runs`` in one process."""
    return workflow_resources(
        resources.job_resources(runs, site_execution(execution, site)), "runs", site
    )


def stop_ahead(res: dict, site: Site | None) -> int:
    """``--stop-ahead`` of a job rule's command (Snakemake resources ``res``): the signal lead
    of a single-process SLURM job, whose stage runs in the batch step that SLURM's --signal
    does not reach; 0 for local jobs and for srun steps, which SLURM signals itself."""
    if site is None or res["nodes"] * res["tasks_per_node"] > 1:
        return 0
    return signal_lead(site.signal_seconds, res["runtime"])


def _sbatch_extra(extra: tuple[str, ...]) -> dict:
    """``--key=value`` / ``--flag`` options as submitit's additional_parameters."""
    out = {}
    for option in extra:
        key, sep, value = option.removeprefix("--").partition("=")
        if not option.startswith("--") or not key:
            raise config.ConfigError(
                f"site extra option {option!r}: write sbatch options as --key=value or --flag"
            )
        out[key.replace("-", "_")] = value if sep else True
    return out


def submitit_parameters(job: SlurmJob) -> dict:
    """submitit SlurmExecutor parameters of a job (names of submitit's update_parameters)."""
    params = {
        "job_name": job.name,
        "nodes": job.nodes,
        "ntasks_per_node": job.tasks_per_node,
        "cpus_per_task": job.cpus_per_task,
        "mem": f"{job.mem_mb}M",
        "time": job.time_min,
        "stderr_to_stdout": True,
        "srun_args": list(SRUN_OPTIONS),
        "signal_delay_s": job.signal_seconds,
    }
    if job.gpus_per_node:
        params["gpus_per_node"] = job.gpus_per_node
    for key in ("partition", "account", "qos", "constraint"):
        if getattr(job, key):
            params[key] = getattr(job, key)
    if job.extra:
        params["additional_parameters"] = _sbatch_extra(job.extra)
    return params


def sbatch_script(
    job: SlurmJob,
    folder: str | Path,
    python: str = "python",
    array_size: int | None = None,
    array_parallelism: int | None = None,
) -> str:
    """The sbatch script submitit writes for this job (its own builder, with the same
    parameters), logs in ``folder``; ``array_size`` elements for a job array."""
    from submitit.slurm import slurm

    params = submitit_parameters(job)
    if array_size is not None:
        params["map_count"] = array_size
        params["array_parallelism"] = array_parallelism or array_size
    command = f"{python} -u -m submitit.core._submit {shlex.quote(str(folder))}"
    return slurm._make_sbatch_string(command=command, folder=folder, **params)


def _executor(folder: Path, job: SlurmJob, site: Site | None, array_parallelism: int | None = None):
    import submitit

    executor = submitit.SlurmExecutor(folder=folder, python=job_python(job, site))
    params = submitit_parameters(job)
    if array_parallelism is not None:
        params["array_parallelism"] = array_parallelism
    executor.update_parameters(**params)
    return executor


def campaign_job(
    camp: campaigns.Campaign, spec: campaigns.RunSpec, site: Site | None, stage: str
) -> SlurmJob:
    """The job of one stage of a run."""
    res = resources.resources(spec.run, stage, site_execution(camp.execution, site))
    return slurm_job(f"pmpipe-{stage}-{spec.run_id}", res, site)


def array_job(
    camp: campaigns.Campaign, groups: list[list[campaigns.RunSpec]], site: Site | None
) -> SlurmJob:
    """The job of each element of a campaign's array, one element per group of runs that
    run in one process (sized for the largest group: a design changes no size)."""
    largest = max(groups, key=len)
    res = resources.job_resources([s.run for s in largest], site_execution(camp.execution, site))
    return slurm_job(f"pmpipe-{camp.name}", res, site)


class RunsJob:
    """What a submitit job calls: ``function(*args)`` (a stage of a run, or a group of runs),
    checkpointable. When SLURM's signal ahead of the time limit (SIGUSR2) stops the N-body at
    its checkpoint, submitit's handler resubmits the same call and requeues the job; after a
    SIGTERM (a preemption, ``scontrol requeue``, ``scancel``) SLURM ends the job itself, which
    this waits for (at most TERM_WAIT_SECONDS) instead of recording a failure; so it does when
    that SIGTERM, sent because the handler's own ``scontrol requeue`` was accepted, ends the
    ``scontrol`` before it returns. A requeued job resumes from the checkpoint and skips what is
    complete."""

    TERM_WAIT_SECONDS = 600

    def __init__(self, function):
        self.function = function

    def __call__(self, *args):
        from pmpipe.storage import checkpoint

        try:
            return self.function(*args)
        except checkpoint.Preempted as err:
            handler = signal.getsignal(signal.SIGUSR2)
            if err.signum == signal.SIGUSR2 and callable(handler):
                try:
                    handler(signal.SIGUSR2, None)  # submitit's: checkpoint (below), requeue, exit
                except subprocess.CalledProcessError as requeue:
                    if requeue.returncode != -signal.SIGTERM:
                        raise
                    time.sleep(self.TERM_WAIT_SECONDS)  # requeued: SLURM is ending the job
            elif err.signum == signal.SIGTERM:
                time.sleep(self.TERM_WAIT_SECONDS)
            raise

    def checkpoint(self, *args):
        import submitit

        return submitit.helpers.DelayedSubmission(self, *args)


def submit_stage(
    camp: campaigns.Campaign,
    spec: campaigns.RunSpec,
    stage: str,
    results: Path,
    folder: Path,
    site: Site | None,
):
    """Submit one stage of one run (its inputs must be complete); returns the submitit job."""
    run_dir = results / camp.name / spec.run_id
    names = stages.run_stages(spec.run)
    if stage not in names:
        raise config.ConfigError(
            f"stage {stage!r} is not one of this run's stages: {', '.join(names)}"
        )
    for earlier in names[: names.index(stage)]:
        if not store.is_complete(stages.store_path(run_dir, earlier)):
            raise store.IncompleteStoreError(
                f"{stages.store_path(run_dir, earlier)} is missing or incomplete: run the "
                f"{earlier} stage before {stage}"
            )
    executor = _executor(folder, campaign_job(camp, spec, site, stage), site)
    from pmpipe.stages import registry  # the stages import JAX: only when a stage is submitted

    return executor.submit(RunsJob(registry.run_stage), stage, str(run_dir / "config.json"))


def split_arrays(groups: list, max_array_size: int, max_submit_jobs: int | None) -> list[list]:
    """The groups of runs (one array task each) as job arrays of at most ``max_array_size``
    tasks, in order; with ``max_submit_jobs``, only the first arrays of at most that many
    tasks in all (the next wave is submitted when they are done)."""
    wave = groups if max_submit_jobs is None else groups[:max_submit_jobs]
    return [wave[i : i + max_array_size] for i in range(0, len(wave), max_array_size)]


def array_count(tasks: int, max_array_size: int, max_submit_jobs: int | None) -> int:
    """The job arrays :func:`split_arrays` makes of ``tasks``, over all its waves."""
    wave = tasks if max_submit_jobs is None else max_submit_jobs
    full, rest = divmod(tasks, wave)
    return full * -(-wave // max_array_size) + -(-rest // max_array_size)


def parallel_share(max_parallel: int, arrays: int) -> int:
    """Tasks of each of ``arrays`` arrays that may run at once, so that together they run at
    most ``max_parallel`` (at least one each)."""
    return max(1, max_parallel // max(arrays, 1))


def submit_campaign(
    camp: campaigns.Campaign,
    groups: list[list[campaigns.RunSpec]],
    results: Path,
    folder: Path,
    site: Site | None,
    max_parallel: int,
):
    """Submit the groups of runs as one job array (at most ``max_parallel`` elements at a
    time); each element runs every stage of its runs in one process. Returns the submitit
    jobs, in the order of ``groups``. Each element writes its job's part of the campaign's
    summaries (pmpipe.results.summary_parts)."""
    from pmpipe.job import pipeline
    from pmpipe.results import summary_parts

    executor = _executor(
        folder, array_job(camp, groups, site), site, array_parallelism=max_parallel
    )
    paths = [
        [str(results / camp.name / spec.run_id / "config.json") for spec in group]
        for group in groups
    ]
    size = camp.execution.job_size()
    parts = [
        str(summary_parts.job_part(results / camp.name, campaigns.job_name(g[0], size)))
        for g in groups
    ]
    overlap = [camp.execution.overlap] * len(groups)
    return executor.map_array(RunsJob(pipeline.run_job), paths, parts, overlap)
