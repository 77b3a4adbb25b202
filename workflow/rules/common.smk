# Loads and validates the campaign (pmpipe's pydantic models, then the generated JSON schema),
# writes each run's config.json when it changed, and removes stores left without their
# completion marker so that they are recomputed (docs/workflow.md).
import time

PLANNING_STARTED = time.perf_counter()  # pmpipe's share of Snakemake's parse, logged below

from pathlib import Path

from snakemake.utils import validate

from pmpipe import compilation_cache, log
from pmpipe import report as pmreport
from pmpipe.orchestration import workflow as pmw

# Snakemake's own process starts no JAX: it validates and expands the campaign on the host.
# Compiled XLA programs are shared by every job process of every campaign (docs/workflow.md)
compilation_cache.share(pmw.RESULTS / ".jax_cache")
log.configure()  # pmpipe's warnings (stores removed to be recomputed) on stderr
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
pmw.LOG.info("pmpipe: campaign %s planned in %.2f s: %d runs, jobs to run: %d",
             PLAN.campaign_dir.name, time.perf_counter() - PLANNING_STARTED, len(PLAN.run_ids),
             len(PLAN.jobs))
