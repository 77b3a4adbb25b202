"""What a run writes: which large arrays its stores keep and when its N-body checkpoints
(sections of :class:`pmpipe.run.config.Run`)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from pmpipe.run.files import StrictModel

PREVIEW_CELLS = 128  # per side, most of the density snapshots outputs.density 'preview' keeps
# outputs of a run whose stages run one by one, each reading the stores of those before it
# (pmpipe run <stage>, the benches that time each stage): the density that the summaries
# measure P(k) from, whole
STAGES_ONE_BY_ONE = {"density": "full"}


class Outputs(StrictModel):
    """What a run's stores keep. Summaries are always written; the ICs can always be made
    again from the seed and the config. A field that is not stored still reaches the later
    stages of the run when they run in the same process (``pmpipe run all``, the workflow)."""

    particles: bool = Field(True, description="final displacement and momentum in nbody.zarr")
    density: Literal["preview", "full", "none"] | Annotated[int, Field(ge=2)] = Field(
        "preview",
        description="snapshot densities in nbody.zarr: preview (means over f^3 force-mesh "
        f"cells, f the smallest that leaves at most {PREVIEW_CELLS} per side), full (the force "
        "mesh), none, or an integer factor f >= 2 (means over f^3 cells)",
    )
    ic: Literal["all", "linear", "none"] = Field(
        "all",
        description="ic.zarr: all (linear density, displacement, momentum), linear "
        "(the linear density), none (seed and config only)",
    )
    lightcone: bool = Field(
        True,
        description="lightcone planes in nbody.zarr and convergence and shear maps in lensing.zarr",
    )
    keepbits: int | None = Field(
        None,
        ge=1,
        le=23,
        description="lossy compression of large float arrays: keep this many "
        "mantissa bits (bit rounding, then zstd); null: exact",
    )


class Checkpoints(StrictModel):
    """Checkpoints of the N-body (pmpipe.storage.checkpoint): its state, step and what it captured so
    far, written every few steps or minutes and on SIGTERM / SIGUSR2, so that a killed or
    preempted run resumes where it stopped. The steps then run one program call each."""

    every_steps: int | None = Field(None, ge=1, description="write one every this many steps")
    every_minutes: float | None = Field(
        None,
        gt=0,
        description="write one after the step that ends this many minutes after the "
        "last one (or the start)",
    )
    keep: bool = Field(False, description="keep the last checkpoint once nbody.zarr is complete")

    @model_validator(mode="after")
    def _some_schedule(self):
        if self.every_steps is None and self.every_minutes is None:
            raise ValueError(
                "checkpoints needs every_steps or every_minutes (or both); "
                "checkpoints: null turns them off"
            )
        return self
