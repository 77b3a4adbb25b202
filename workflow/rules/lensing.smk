rule lensing:
    input:
        config=f"{RUN}/config.json",
        nbody=f"{RUN}/nbody.zarr",
    output:
        directory(f"{RUN}/lensing.zarr"),
    log:
        f"{RUN}/logs/lensing.log",
    benchmark:
        f"{RUN}/benchmarks/lensing.tsv"
    threads: lambda wc: PLAN.resources[wc.run, "lensing"]["cpus_per_task"]
    resources:
        **stage_resources("lensing"),
    shell:
        "{resources.mpi} python -m pmpipe.stages.lensing {input.config} > {log} 2>&1"
