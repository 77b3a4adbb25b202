"""``python tests/slurm_snakemake.py ARGS``: ``python -m snakemake ARGS`` with the SLURM executor
plugin's job status checked at a steady interval, for the tests on the test cluster.

The plugin (snakemake-executor-plugin-slurm 2.x) adds 10 s to the interval between status
checks after every check that finds no job finished, up to 180 s, and a Snakemake that stops
waits out the interval under way. On a cluster that is this machine, a job of 40 s is then seen
finished at 68 s and a failed workflow stops 30 s after its failure is seen. Here the interval
stays at ``--seconds-between-status-checks``: only how soon Snakemake learns a job's state
changes, not what it submits nor how it reports a job's success or failure.
"""

import sys

from snakemake_executor_plugin_slurm import Executor


def _steady(self):
    return self.workflow.remote_execution_settings.seconds_between_status_checks


if not isinstance(getattr(Executor, "next_seconds_between_status_checks", None), property):
    raise TypeError(
        "snakemake_executor_plugin_slurm.Executor has no "
        "next_seconds_between_status_checks property: update tests/slurm_snakemake.py"
    )
Executor.next_seconds_between_status_checks = property(_steady, lambda self, value: None)

if __name__ == "__main__":
    from snakemake.cli import main

    sys.exit(main())
