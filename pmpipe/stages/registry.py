"""The stages by name: the function that runs each, ``run(setup, inputs, progress) -> Path``
(the path of the store it wrote), and one stage of a run by its name."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from pmpipe.stages import STAGES, ic, lensing, nbody, runner, summaries
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
    path = _run_of(stage)(run_setup, inputs, progress)
    progress(f"wrote {path}")
    return path


def _run_of(stage: str) -> Callable[..., Path]:
    if stage not in RUNS:
        raise ValueError(f"unknown stage {stage!r}; the stages are {', '.join(STAGES)}")
    return RUNS[stage]


def run_stage(stage: str, config_path: str | Path) -> Path:
    """:func:`pmpipe.stages.runner.run_stage` of the stage named ``stage``."""
    return runner.run_stage(stage, config_path, _run_of(stage))


def run_checked(stage: str, config_path: str | Path) -> int:
    """:func:`pmpipe.stages.runner.run_checked` of the stage named ``stage`` (an unknown name
    is an error of the command line: exit status 2)."""
    if stage not in RUNS:
        runner.LOG.error("error: unknown stage %r; the stages are %s", stage, ", ".join(STAGES))
        return 2
    return runner.run_checked(stage, config_path, RUNS[stage])
