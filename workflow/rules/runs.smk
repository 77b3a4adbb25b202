# One rule per job: the runs of a group (execution.runs_per_job, by design position) whose
# stores are not all complete, every stage of each, in one process (pmpipe.stages.pipeline).
# Its outputs are the stores it makes: each run's from its first incomplete stage on (the
# complete ones before it are read, not redone); a finished run belongs to no job.
for job in PLAN.jobs:

    rule:
        name:
            f"runs_{job.name}"
        input:
            configs=[f"{PLAN.campaign_dir}/{run}/config.json" for run in job.run_ids],
        output:
            [directory(f"{PLAN.campaign_dir}/{run}/{stage}.zarr") for run, stage in job.stores],
        log:
            PLAN.campaign_dir / f"logs/{job.name}.log",
        benchmark:
            PLAN.campaign_dir / f"benchmarks/{job.name}.tsv"
        params:
            report=PLAN.campaign_dir / f"benchmarks/{job.name}.json",  # pmpipe bench campaign reads it
            stop_ahead=job.stop_ahead,  # a single-process SLURM job signals itself (launch.stop_ahead)
            wrapper=job.wrapper,  # env ... apptainer exec ... <image> by the site (launch.wrapper_command)
        threads: job.resources["cpus_per_task"]
        resources:
            **job.resources,
        shell:
            "{resources.mpi} {params.wrapper} python -m pmpipe.stages.pipeline --report {params.report} "
            "--stop-ahead {params.stop_ahead} "
            "{input.configs} > {log} 2>&1"
