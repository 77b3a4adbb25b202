"""Progress lines of a stage and the seconds it spends in each phase of the physics; the
progress line of a job of several runs."""

from __future__ import annotations

import contextlib
import time

from pmpipe.runtime import compilation, log

LOG = log.get(__name__)
REPORT_SECONDS = 30.0  # an evolution's progress line at most this often


class Progress:
    """Progress lines of a stage, log records '[pmpipe <stage> <run_id>] <message> (<elapsed>
    s)' (shown from one process: pmpipe.runtime.log); and the seconds the stage spent in each phase of
    the physics (``physics``: white_noise, lpt, pm_steps (the evolution with its lightcone
    capture), lensing, statistics), with when each timed block ran (``spans``: phase, start and
    end in Unix seconds)."""

    def __init__(self, stage: str, run_id: str):
        self.prefix = f"[pmpipe {stage} {run_id}]"
        self.start = time.perf_counter()
        self.physics: dict[str, float] = {}
        self.spans: list[tuple[str, float, float]] = []

    @contextlib.contextmanager
    def timed(self, phase: str):
        """Add the wall time of the block to ``physics[phase]``, less the seconds XLA spent
        compiling or loading programs for this thread inside it (counted while
        pmpipe.runtime.compilation listens, as in a job); the block waits for its own results
        (jax.block_until_ready) so that the time is the computation's."""
        start, compiling = time.perf_counter(), compilation.thread_totals().seconds
        began = time.time()
        try:
            yield
        finally:
            spent = time.perf_counter() - start - (compilation.thread_totals().seconds - compiling)
            self.physics[phase] = self.physics.get(phase, 0.0) + max(0.0, spent)
            self.spans.append((phase, began, time.time()))

    def __call__(self, message: str, every_process: bool = False) -> None:
        elapsed = time.perf_counter() - self.start
        LOG.info(
            "%s %s (%.1f s)",
            self.prefix,
            message,
            elapsed,
            extra=log.EVERY_PROCESS if every_process else None,
        )


class StepClock:
    """Progress lines of an evolution through the steps between ``bounds`` (scale factors),
    from step ``done`` on: after a step that ends REPORT_SECONDS (``interval``) or more after
    the last line (or the start), 'step i of n (a = ...), about t s left' (the line's own
    time says how long the stage has run), the time left from the steps after the first
    (which compiles) when there are any."""

    def __init__(self, progress, bounds, done: int = 0, interval=REPORT_SECONDS, clock=None):
        self.progress, self.bounds, self.done = progress, bounds, done
        self.interval, self.clock = interval, clock or time.perf_counter
        self.start = self.last = self.clock()
        self.first_done: float | None = None

    def after(self, step: int) -> None:
        """Call after step ``step`` has finished (its results on the host)."""
        now, steps = self.clock(), len(self.bounds) - 1
        if step == self.done + 1:
            self.first_done = now
        if step >= steps or now - self.last < self.interval:
            return
        if step > self.done + 1 and self.first_done is not None:
            per_step = (now - self.first_done) / (step - self.done - 1)
        else:
            per_step = (now - self.start) / (step - self.done)
        self.progress(
            f"step {step} of {steps} (a = {self.bounds[step]:.4g}), "
            f"about {per_step * (steps - step):.0f} s left"
        )
        self.last = now


def job_line(outcomes: list, total: int, log_path: str, bar: bool) -> str:
    """'<run> done in 14.4 s; 2 of 6 runs, 4 left, about 58 s more (log: <log_path>)' after the
    newest of ``outcomes``; the time left from the runs computed here after the first (which
    compiles) when there are any (complete runs and failures take no time to speak of);
    with ``bar``, a bar of the runs done before it."""
    newest, done = outcomes[-1], len(outcomes)
    state = (
        f"FAILED in {newest.failed_stage}"
        if newest.error is not None
        else f"done in {newest.seconds:.1f} s"
    )
    computed = [o for o in outcomes if o.computed and o.error is None]  # runs made here
    timed = [o.seconds for o in computed[1:]] or [o.seconds for o in computed] or [0.0]
    left = total - done
    eta = f", about {_duration(left * sum(timed) / len(timed))} more" if left else ""
    failed = sum(o.error is not None for o in outcomes)
    failures = f", {failed} failed" if failed else ""
    width = 20
    drawn = f"[{'#' * (width * done // total):<{width}}] " if bar else ""
    return (
        f"{drawn}{newest.run_id} {state}; {done} of {total} runs{failures}, {left} left{eta} "
        f"(log: {log_path})"
    )


def _duration(seconds: float) -> str:
    """'45 s', '3.2 min' or '1.5 h'."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"
