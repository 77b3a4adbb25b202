"""Progress lines of a stage and the seconds it spends in each phase of the physics."""

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
    capture), lensing, statistics)."""

    def __init__(self, stage: str, run_id: str):
        self.prefix = f"[pmpipe {stage} {run_id}]"
        self.start = time.perf_counter()
        self.physics: dict[str, float] = {}

    @contextlib.contextmanager
    def timed(self, phase: str):
        """Add the wall time of the block to ``physics[phase]``, less the seconds XLA spent
        compiling or loading programs inside it (counted while pmpipe.runtime.compilation listens, as
        in a job); the block waits for its own results (jax.block_until_ready) so that the
        time is the computation's."""
        start, compiling = time.perf_counter(), compilation.totals().seconds
        try:
            yield
        finally:
            spent = time.perf_counter() - start - (compilation.totals().seconds - compiling)
            self.physics[phase] = self.physics.get(phase, 0.0) + max(0.0, spent)

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
