# The preparation: the runs' config.json files and the plan file every job of this plan
# depends on (pmpipe.cluster.workflow); light work, in the Snakemake process.
if PLAN.plan_file is not None:

    rule prepare:
        output:
            PLAN.plan_file,
        log:
            PLAN.campaign_dir / "logs/prepare.log",
        params:
            campaign=PLAN.campaign_file,
            results=RESULTS,
        localrule: True
        shell:
            "python -m pmpipe.cluster.workflow {params.campaign:q} --results "
            "{params.results:q} --plan {output:q} > {log:q} 2>&1"


# One rule per job: the runs of a group (execution.runs_per_job, by design position) whose
# stores are not all complete, every stage of each, in one process (pmpipe.job.pipeline).
# Its outputs are the stores it makes: each run's from its first incomplete stage on, or from an
# earlier one whose store leaves out what a later one reads (pmpipe.stages.status; the
# complete ones before it are read, not redone); a finished run belongs to no job. Its input is
# the plan file, in the main Snakemake process only: a SLURM job's own Snakemake, which runs
# the job alone after the preparation, would plan another file (the config.json files are
# written by then). The job's log is its stderr; on stdout (the terminal of a local run) it
# writes a line per finished run with the runs and time left.
for job in PLAN.jobs:

    rule:
        name:
            f"runs_{job.name}"
        input:
            PLAN.plan_file if workflow.is_main_process else [],
        output:
            [directory(f"{PLAN.campaign_dir}/{run}/{stage}.zarr") for run, stage in job.stores],
        log:
            PLAN.campaign_dir / f"logs/{job.name}.log",
        benchmark:
            PLAN.campaign_dir / f"benchmarks/{job.name}.tsv"
        params:
            configs=[f"{PLAN.campaign_dir}/{run}/config.json" for run in job.run_ids],
            report=PLAN.campaign_dir / f"benchmarks/{job.name}.json",  # pmpipe bench campaign reads it
            stop_ahead=job.stop_ahead,  # a single-process SLURM job signals itself (launch.stop_ahead)
            wrapper=job.wrapper,  # env ... apptainer exec ... <image> by the site (launch.wrapper_command)
            host=job.host,  # with an image: python -m pmpipe.runtime.host_requeue -- (launch.host_command)
            part=job.part,  # the job's part of the campaign summaries (pmpipe.results.summary_parts)
            options=job.options,  # '--overlap ' with execution.overlap, else empty
        threads: job.resources["cpus_per_task"]
        resources:
            **job.resources,
        shell:
            "{params.host} {resources.mpi} {params.wrapper} python -m pmpipe.job.pipeline --report "
            "{params.report:q} --stop-ahead {params.stop_ahead} --progress {log:q} --part {params.part:q} "
            "{params.options}{params.configs:q} "
            "2> {log:q}"
