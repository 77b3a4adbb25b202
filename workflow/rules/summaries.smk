rule summaries:
    input:
        config=f"{RUN}/config.json",
        nbody=f"{RUN}/nbody.zarr",
        ic=f"{RUN}/ic.zarr",
        lensing=[f"{RUN}/lensing.zarr"] if "lensing" in PLAN.stages else [],
    output:
        directory(f"{RUN}/summaries.zarr"),
    log:
        f"{RUN}/logs/summaries.log",
    benchmark:
        f"{RUN}/benchmarks/summaries.tsv"
    threads: lambda wc: PLAN.resources[wc.run, "summaries"]["cpus_per_task"]
    resources:
        **stage_resources("summaries"),
    shell:
        "{resources.mpi} python -m pmpipe.stages.summaries {input.config} > {log} 2>&1"
