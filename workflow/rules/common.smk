# Plans the campaign: validates it (pmpipe's pydantic models) and finds the jobs that make its
# missing, incomplete, damaged or outdated stores. Planning writes nothing: the `prepare` rule
# writes the runs' config.json files before the jobs run (docs/workflow.md).
import time

PLANNING_STARTED = time.perf_counter()  # pmpipe's share of Snakemake's parse, logged below

from pmpipe.results import report as pmreport
from pmpipe.cluster import workflow as pmw
from pmpipe.runtime import compilation_cache, log

# Snakemake's own process starts no JAX: it validates and expands the campaign on the host.
# Compiled XLA programs are shared by every job process of every campaign (docs/workflow.md)
compilation_cache.share(pmw.RESULTS / ".jax_cache")
log.configure()  # pmpipe's warnings (stores made again, and why) on stderr
PLAN = pmw.prepare_or_exit(config)  # an error: one line, exit status 2

RESULTS = pmw.RESULTS
RUN = str(PLAN.campaign_dir / "{run}")


wildcard_constraints:
    run="|".join(PLAN.run_ids),


# every figure of the report (pmpipe.results.report.figures) and the run stores they are drawn from
FIGURES = pmreport.figures(PLAN.campaign_dir, PLAN.run_ids, "lensing" in PLAN.stages, PLAN.outputs)
FIGURE_STORES = sorted({pmreport.RUN_FIGURES[f.name][0] for f in FIGURES if f.run})
pmw.LOG.info("pmpipe: campaign %s planned in %.2f s: %d runs, jobs to run: %d",
             PLAN.campaign_dir.name, time.perf_counter() - PLANNING_STARTED, len(PLAN.run_ids),
             len(PLAN.jobs))
