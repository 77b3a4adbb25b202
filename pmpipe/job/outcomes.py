"""What became of the runs of a job: each stage computed (:class:`StageRecord`, with the
helpers that fill it), each run's :class:`Outcome`, and the halo shortfalls a job does not
repeat (:class:`HaloShortfalls`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from pmpipe.run import config, ghost_cells
from pmpipe.stages import runner, status


def directory_bytes(path: Path) -> int:
    """Bytes of the files under path."""
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def compile_counts(counts) -> dict:
    """A record's XLA programs (pmpipe.runtime.compilation's counts) as JSON data."""
    return {
        "programs": counts.programs,
        "compiled": counts.compiled,
        "cache_hits": counts.hits,
        "seconds": counts.seconds,
    }


@dataclasses.dataclass(frozen=True)
class StageRecord:
    """One stage computed in this process: wall seconds, seconds per physics phase
    (Progress.physics), XLA programs it compiled or loaded from the persistent cache
    on its thread (pmpipe.runtime.compilation), array bytes this process wrote into the run's
    stores (its own and checkpoints) with the seconds during which some of those writes were
    under way (writes.written_since),
    bytes of its store on disk, and its
    ``timeline``: when it started and ended, ran each physics phase and each of those writes
    (Unix seconds: ``{"start", "end", "phases": [[phase, start, end]], "writes":
    [[start, end]]}``)."""

    stage: str
    seconds: float
    physics: dict
    compilation: dict
    write: dict
    store_bytes: int
    timeline: dict


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What happened to one run of a job: the stages computed (with their records), those
    found complete, and the error (one line, None when the run succeeded) with the stage it
    happened in."""

    config_path: Path
    run_id: str
    computed: tuple[StageRecord, ...]
    skipped: tuple[str, ...]
    seconds: float
    error: str | None = None
    failed_stage: str | None = None

    @property
    def stages(self) -> tuple[str, ...]:
        return tuple(r.stage for r in self.computed)


NOT_RUN = "HaloError: not run: "  # the error of a run that HaloShortfalls.repeated fails


class HaloShortfalls:
    """The runs of a job whose particles needed more halo than given, by size (particles,
    oversampling, box, a_final, halo, device mesh): a later run of that size fails at once with
    their reason instead of evolving to about the same step (a job's runs share the halo)."""

    def __init__(self) -> None:
        self.by_size: dict[tuple, str] = {}

    @staticmethod
    def _size(run: config.Run) -> tuple:
        box, par = run.box, run.parallel
        return (
            box.particles,
            box.oversample,
            box.box_size,
            run.nbody.a_final,
            ghost_cells.cells(run),
            par.pdims,
        )

    def seen(self, outcome: Outcome) -> Outcome:
        """Record the outcome's halo shortfall, if it is one; returns the outcome."""
        error = outcome.error
        if error is not None and error.startswith("HaloError") and not error.startswith(NOT_RUN):
            reason = f"run {outcome.run_id} of this job, of the same size, failed: {outcome.error}"
            self.by_size[self._size(runner.load(outcome.config_path).config)] = reason
        return outcome

    def repeated(self, path: Path) -> Outcome | None:
        """The failed outcome of the run at ``path`` when a run of its size fell short and its
        N-body is still to be computed."""
        if not self.by_size:
            return None
        try:
            run_file = runner.load(path)
            reason = self.by_size.get(self._size(run_file.config))
            todo = status.pending_stages(run_file.config, run_file.config_hash, path.parent)
        except Exception:  # noqa: BLE001  the run's own setup reports a bad config
            return None
        if reason is None or "nbody" not in todo:
            return None
        return Outcome(path, run_file.run_id, (), (), 0.0, f"{NOT_RUN}{reason}", "nbody")
