# Campaign-level results and figures: light work (small stores, matplotlib), so on a cluster
# they run in the Snakemake process itself rather than as SLURM jobs.
localrules:
    collect,
    run_figures,
    campaign_figures,
    lensing_figures,
    peak_figures,


rule collect:
    input:
        configs=expand(f"{RUN}/config.json", run=PLAN.run_ids),
        summaries=expand(f"{RUN}/summaries.zarr", run=PLAN.run_ids),
    output:
        store=directory(PLAN.campaign_dir / "summaries.zarr"),
        manifest=PLAN.campaign_dir / "manifest.csv",
    log:
        PLAN.campaign_dir / "logs/collect.log",
    benchmark:
        PLAN.campaign_dir / "benchmarks/collect.tsv"
    shell:
        f"pmpipe collect {PLAN.campaign_file} --results {RESULTS} > {{log}} 2>&1"


rule run_figures:
    input:
        summaries=f"{RUN}/summaries.zarr",
        nbody=f"{RUN}/nbody.zarr",
    output:
        pk=report(PLAN.campaign_dir / "report/{run}/pk.png",
                  caption="../report/pk.rst", category="Power spectra", subcategory="{run}"),
        slice=report(PLAN.campaign_dir / "report/{run}/slice.png",
                     caption="../report/slice.rst", category="Density slices", subcategory="{run}"),
    log:
        f"{RUN}/logs/figures.log",
    benchmark:
        f"{RUN}/benchmarks/figures.tsv"
    shell:
        "python -m pmpipe.report run {input.summaries} {input.nbody} {output.pk} {output.slice} > {log} 2>&1"


rule campaign_figures:
    input:
        PLAN.campaign_dir / "summaries.zarr",
    output:
        report(PLAN.campaign_dir / "report/pk_ratio.png",
               caption="../report/pk_ratio.rst", category="Campaign"),
    log:
        PLAN.campaign_dir / "logs/campaign_figures.log",
    shell:
        "python -m pmpipe.report campaign {input} {output} > {log} 2>&1"


rule lensing_figures:
    input:
        summaries=f"{RUN}/summaries.zarr",
        lensing=f"{RUN}/lensing.zarr",
    output:
        kappa=report(PLAN.campaign_dir / "report/{run}/kappa.png",
                     caption="../report/kappa.rst", category="Convergence maps", subcategory="{run}"),
        cl=report(PLAN.campaign_dir / "report/{run}/cl.png",
                  caption="../report/cl.rst", category="Convergence C_ell", subcategory="{run}"),
    log:
        f"{RUN}/logs/lensing_figures.log",
    shell:
        "python -m pmpipe.report lensing {input.summaries} {input.lensing} {output.kappa} {output.cl} > {log} 2>&1"


rule peak_figures:
    input:
        PLAN.campaign_dir / "summaries.zarr",
    output:
        report(PLAN.campaign_dir / "report/peaks.png",
               caption="../report/peaks.rst", category="Campaign"),
    log:
        PLAN.campaign_dir / "logs/peak_figures.log",
    shell:
        "python -m pmpipe.report peaks {input} {output} > {log} 2>&1"
