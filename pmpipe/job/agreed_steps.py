"""The steps of a run in a job of several processes, agreed: after a run's setup and each of
its stages the processes compare, through pmpipe.runtime.agreement, whether it failed on any
of them, so that every process records the same failure and they go on to the next run
together, or, when some cannot arrive, the job stops with the reason."""

from __future__ import annotations

import traceback

from pmpipe.job.outcomes import Outcome
from pmpipe.runtime import log

LOG = log.get(__name__)


class StepFailed(Exception):
    """A step of a run (its setup or a stage) failed on one or more processes of the job; the
    message is the agreed line (agreement.one_line)."""


class StepLost(Exception):
    """Some processes did not reach the agreement of a step (agreement.PartnerLost); the
    message says so, after this process's own failure, if it had one."""


class JobStopped(Exception):
    """The processes of the job could not agree on a step of a run (StepLost):
    ``outcome`` is the run's failure as this process saw it; the job stops."""

    def __init__(self, outcome: Outcome) -> None:
        super().__init__(outcome.error)
        self.outcome = outcome


def error_line(err: BaseException) -> str:
    """An exception as one line: its type and the first line of its message."""
    return f"{type(err).__name__}: {err}".splitlines()[0] if str(err) else type(err).__name__


def agreed_step(index: int, run_id: str, stage: str, step, timeout_s: float):
    """``step()`` (``stage`` of run ``run_id``, the ``index``-th run of the job: 'setup' or a
    stage) on every process, then their agreement on it (pmpipe.runtime.agreement, at point
    ``<index>/<run_id>/<stage>``): its value when it succeeded everywhere, else StepFailed with
    the agreed line on every process (a failing process logs its traceback first); StepLost
    when the others do not arrive within ``timeout_s``; preemption
    (checkpoint.Preempted) goes up at once."""
    import jax

    from pmpipe.runtime import agreement
    from pmpipe.storage import checkpoint

    value, failure = None, None
    try:
        value = step()
    except checkpoint.Preempted:
        raise
    except Exception as err:  # noqa: BLE001  one run's failure must not stop the other runs of the job
        failure = error_line(err)
        where = f" on process {jax.process_index()}" if jax.process_count() > 1 else ""
        LOG.error(
            "[pmpipe run %s] %s failed%s; traceback:\n%s",
            run_id,
            stage,
            where,
            traceback.format_exc(),
            extra=log.EVERY_PROCESS,
        )
    try:
        failures = agreement.agree(f"{index}/{run_id}/{stage}", failure, timeout_s)
    except agreement.PartnerLost as lost:
        mine = f"process {jax.process_index()}: {failure}; " if failure is not None else ""
        raise StepLost(f"{mine}{lost}") from lost
    if failures:
        raise StepFailed(agreement.one_line(failures, jax.process_count()))
    return value
