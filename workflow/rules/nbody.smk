rule nbody:
    input:
        config=f"{RUN}/config.json",
        ic=f"{RUN}/ic.zarr",
    output:
        directory(f"{RUN}/nbody.zarr"),
    log:
        f"{RUN}/logs/nbody.log",
    benchmark:
        f"{RUN}/benchmarks/nbody.tsv"
    threads: lambda wc: PLAN.resources[wc.run, "nbody"]["cpus_per_task"]
    resources:
        **stage_resources("nbody"),
    shell:
        "{resources.mpi} python -m pmpipe.stages.nbody {input.config} > {log} 2>&1"
