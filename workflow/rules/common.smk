# Loads and validates the campaign (pmpipe's pydantic models, then the generated JSON schema),
# writes each run's config.json when it changed, and removes stores left without their
# completion marker so that they are recomputed (docs/workflow.md).
from pathlib import Path

from snakemake.utils import validate

from pmpipe import parallel
from pmpipe import report as pmreport
from pmpipe import workflow as pmw

# Snakemake's own process computes seeds and geometry with JAX on the CPU: on a GPU machine it
# must not take the GPUs' memory from the jobs it starts
parallel.use_host_only()
# compiled XLA programs shared by every job process of every campaign (docs/workflow.md)
parallel.use_compilation_cache(pmw.RESULTS / ".jax_cache")
PLAN = pmw.prepare(config, locked=pmw.snakemake_locked(Path(".snakemake")),
                   prune=workflow.is_main_process)
validate(PLAN.campaign_data, str(Path(workflow.basedir) / "workflow/schemas/campaign.schema.json"),
         set_default=False)  # pmpipe fills defaults; snakemake would descend into null sections

RESULTS = pmw.RESULTS
RUN = str(PLAN.campaign_dir / "{run}")


wildcard_constraints:
    run="|".join(PLAN.run_ids),


# every figure of the report (pmpipe.report.figures) and the run stores they are drawn from
FIGURES = pmreport.figures(PLAN.campaign_dir, PLAN.run_ids, "lensing" in PLAN.stages, PLAN.outputs)
FIGURE_STORES = sorted({pmreport.RUN_FIGURES[f.name][0] for f in FIGURES if f.run})
