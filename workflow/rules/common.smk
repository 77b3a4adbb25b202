# Loads and validates the campaign (pmpipe's pydantic models, then the generated JSON schema),
# writes each run's config.json when it changed, and removes stores left without their
# completion marker so that they are recomputed (docs/workflow.md).
from pathlib import Path

from snakemake.utils import validate

from pmpipe import parallel
from pmpipe import workflow as pmw

# compiled XLA programs shared by every stage process of every campaign (docs/workflow.md)
parallel.use_compilation_cache(pmw.RESULTS / ".jax_cache")
PLAN = pmw.prepare(config, locked=pmw.snakemake_locked(Path(".snakemake")),
                   prune=workflow.is_main_process)
validate(PLAN.campaign_data, str(Path(workflow.basedir) / "workflow/schemas/campaign.schema.json"),
         set_default=False)  # pmpipe fills defaults; snakemake would descend into null sections

RESULTS = pmw.RESULTS
RUN = str(PLAN.campaign_dir / "{run}")


wildcard_constraints:
    run="|".join(PLAN.run_ids),


def report_figures():
    figures = ("pk", "slice") + (("kappa", "cl") if "lensing" in PLAN.stages else ())
    campaign = ("pk_ratio", "peaks") if "lensing" in PLAN.stages else ("pk_ratio",)
    return expand(str(PLAN.campaign_dir / "report/{run}/{figure}.png"),
                  run=PLAN.run_ids, figure=figures) + [
        str(PLAN.campaign_dir / f"report/{name}.png") for name in campaign]
