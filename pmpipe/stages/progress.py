"""Progress lines of a stage and the seconds it spends in each phase of the physics."""

from __future__ import annotations

import contextlib
import time

from pmpipe.runtime import compilation, log

LOG = log.get(__name__)


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
