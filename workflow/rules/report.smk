# The campaign store, manifest and report figures: light work (small stores, matplotlib), so on
# a cluster they run in the Snakemake process itself rather than as SLURM jobs. The figures of
# the runs of a group (as packed into jobs) that the report samples (at most 12 runs of a
# campaign) are drawn by one process (pmpipe.results.report), those of
# the campaign by another.
localrules:
    collect,
    campaign_figures,


rule collect:
    input:
        summaries=expand(f"{RUN}/summaries.zarr", run=PLAN.run_ids),
    output:
        store=directory(PLAN.campaign_dir / "summaries.zarr"),
        manifest=PLAN.campaign_dir / "manifest.csv",
    log:
        PLAN.campaign_dir / "logs/collect.log",
    benchmark:
        PLAN.campaign_dir / "benchmarks/collect.tsv"
    params:
        campaign=PLAN.campaign_file,
        results=RESULTS,
    shell:
        "python -m pmpipe.cli collect {params.campaign:q} --results {params.results:q} > {log:q} 2>&1"


FIGURES_OF = {}  # run id -> its figures (None: the campaign's)
for figure in FIGURES:
    FIGURES_OF.setdefault(figure.run, []).append(figure)

for group, group_runs in PLAN.groups.items():
    run_ids = [run for run in group_runs if run in FIGURES_OF]  # the report's sample of runs
    if not run_ids:
        continue

    rule:
        name:
            f"figures_{group}"
        input:
            [f"{PLAN.campaign_dir}/{run}/{stage}.zarr" for run in run_ids for stage in FIGURE_STORES],
        output:
            [report(f.path, caption=f"../report/{f.name}.rst", category=f.category,
                    subcategory=f.run) for run in run_ids for f in FIGURES_OF.get(run, [])],
        log:
            PLAN.campaign_dir / f"logs/figures_{group}.log",
        params:
            campaign_dir=PLAN.campaign_dir,
        localrule: True
        shell:
            "python -m pmpipe.results.report {params.campaign_dir:q} {output:q} > {log:q} 2>&1"


rule campaign_figures:
    input:
        PLAN.campaign_dir / "summaries.zarr",
    output:
        [report(f.path, caption=f"../report/{f.name}.rst", category=f.category)
         for f in FIGURES_OF.get(None, [])],
    log:
        PLAN.campaign_dir / "logs/campaign_figures.log",
    params:
        campaign_dir=PLAN.campaign_dir,
    shell:
        "python -m pmpipe.results.report {params.campaign_dir:q} {output:q} > {log:q} 2>&1"
