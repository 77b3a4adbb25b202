rule ic:
    input:
        config=f"{RUN}/config.json",
    output:
        directory(f"{RUN}/ic.zarr"),
    log:
        f"{RUN}/logs/ic.log",
    benchmark:
        f"{RUN}/benchmarks/ic.tsv"
    threads: lambda wc: PLAN.resources[wc.run, "ic"]["cpus_per_task"]
    resources:
        **stage_resources("ic"),
    shell:
        "{resources.mpi} python -m pmpipe.stages.ic {input.config} > {log} 2>&1"
