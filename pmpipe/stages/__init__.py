"""The stages of one run: ``ic`` -> ``nbody`` -> ``lensing`` -> ``summaries`` (``lensing`` only
for runs with a ``lensing`` section).

Each stage reads the run's ``config.json`` and the stores of the stages before it from the run
directory (the folder of config.json), and writes its own store there:

    python -m pmpipe.stages.nbody results/<campaign>/<run_id>/config.json

or ``pmpipe run nbody <config.json>``. Progress goes to stderr.
"""

from __future__ import annotations

from pathlib import Path

STAGES = ("ic", "nbody", "lensing", "summaries")
SUPPRESSED = ("lensing", "summaries")  # the stages that read the baryons' S(k, z)


def run_stages(run) -> tuple[str, ...]:
    """The stages a run (config.Run) goes through."""
    return tuple(s for s in STAGES if s != "lensing" or run.lensing is not None)


def suppressed(stages) -> bool:
    """Whether any of ``stages`` (names) reads the baryons' S(k, z): its setup needs them."""
    return any(stage in SUPPRESSED for stage in stages)


def store_path(run_dir: str | Path, stage: str) -> Path:
    """Path of a stage's store in a run directory."""
    return Path(run_dir) / f"{stage}.zarr"
