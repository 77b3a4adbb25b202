"""The stages by name: the function that runs each, ``run(setup, inputs, progress) -> Path``
(the path of the store it wrote)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from pmpipe.stages import STAGES, ic, lensing, nbody, summaries
from pmpipe.stages.inputs import Inputs
from pmpipe.stages.progress import Progress

RUNS: dict[str, Callable[..., Path]] = {
    "ic": ic.run,
    "nbody": nbody.run,
    "lensing": lensing.run,
    "summaries": summaries.run,
}
assert tuple(RUNS) == STAGES


def execute(stage: str, run_setup, inputs: Inputs, progress: Progress) -> Path:
    """Run one stage of a run (its :class:`pmpipe.run.derive.RunSetup`) with its inputs;
    returns the path of its store."""
    if stage not in RUNS:
        raise ValueError(f"unknown stage {stage!r}; the stages are {', '.join(STAGES)}")
    path = RUNS[stage](run_setup, inputs, progress)
    progress(f"wrote {path}")
    return path
