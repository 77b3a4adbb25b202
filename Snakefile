# pmpipe workflow: for every run of a campaign, ic -> nbody -> lensing (when the campaign has a
# lensing section) -> summaries, runs packed into jobs (execution.runs_per_job) that run every
# stage of their runs in one process; then the campaign's summaries.zarr, manifest.csv and
# report figures.
#
#   snakemake --profile profiles/local                                  # config/quickstart.yaml
#   snakemake --profile profiles/local --config campaign=config/examples/latin_hypercube.yaml
#   snakemake --profile profiles/slurm --config campaign=config/examples/grid.yaml   # GPU nodes
#   snakemake --profile profiles/local --report results/quickstart/report.html
#
# Rules stay thin: the logic lives in the pmpipe package (pmpipe.cluster.workflow).
#
# `snakemake --lint` asks for a conda environment or container per rule; it is the one finding
# left, on purpose: every rule runs pmpipe from the environment Snakemake itself runs in (the
# Snakefile imports pmpipe), and on clusters the slurm-apptainer profile wraps the job's own
# command in `srun ... apptainer exec <image>`, which Snakemake's `container:` cannot do (it
# would wrap srun itself). tests/test_workflow.py checks that no other finding appears.
from snakemake.utils import min_version

min_version("9.0")


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/runs.smk"
include: "workflow/rules/report.smk"


# Every stage store of every run is a target, so that a deleted store is recomputed (with what
# depends on it) even though the campaign-level results are still there.
rule all:
    input:
        expand(f"{RUN}/{{stage}}.zarr", run=PLAN.run_ids, stage=PLAN.stages),
        PLAN.campaign_dir / "manifest.csv",
        PLAN.campaign_dir / "summaries.zarr",
        [f.path for f in FIGURES],
        [PLAN.plan_file] if PLAN.plan_file is not None else [],
    default_target: True


# Before the first job of a run (not a dry run, which plans whatever the disk): the results
# folder must be writable and hold the stores to make, else one error line and nothing written.
onstart:
    if workflow.is_main_process:
        pmw.check_room_or_exit(PLAN)


# When a job failed (or was killed), the runs complete so far are collected anyway: the
# campaign's summaries.zarr says which are (variable 'complete') and why the others are not;
# `pmpipe status results/<campaign>` tells the same. A run started again completes the rest.
onerror:
    pmw.collect_partial(PLAN)
