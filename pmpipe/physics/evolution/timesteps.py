"""The N-body's time steps: the scale factors that bound them (numpy, no JAX)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Literal, get_args

import numpy as np

StepSpacing = Literal["a", "log_a", "growth"]  # what a number of N-body steps is equal in
STEP_SPACINGS: tuple[str, ...] = get_args(StepSpacing)
GROWTH_SAMPLES = 4096  # a at which D1 is tabulated to invert it for spacing 'growth'


def step_boundaries(
    a_init: float,
    a_final: float,
    steps: int | Sequence[float],
    snapshots: Sequence[float] = (),
    spacing: str = "a",
    growth: Callable | None = None,
) -> np.ndarray:
    """Scale factors bounding the steps: ``steps`` equal steps in a, ln a or the linear growth
    factor D1 (``spacing`` 'a', 'log_a' or 'growth'; ``growth``, a callable giving D1 of a
    numpy array of a, is needed for 'growth'), or an explicit increasing list from a_init to
    a_final; snapshot times not on a boundary are inserted as boundaries."""
    if not 0 < a_init < a_final:
        raise ValueError(
            f"nbody.a_final = {a_final} must be greater than ic.a_init = {a_init} (and a_init > 0)"
        )
    if spacing not in STEP_SPACINGS:
        raise ValueError(
            f"nbody.spacing must be one of {', '.join(STEP_SPACINGS)}; got {spacing!r}"
        )
    if isinstance(steps, int):
        if steps < 1:
            raise ValueError(f"nbody.steps must be >= 1, got {steps}")
        bounds = _equal_steps(a_init, a_final, steps, spacing, growth)
    else:
        bounds = np.asarray(steps, dtype=np.float64)
        if spacing != "a":
            raise ValueError(
                f"nbody.spacing = {spacing!r} applies to a number of steps; with "
                "nbody.steps as a list of scale factors leave nbody.spacing out"
            )
        if bounds.ndim != 1 or bounds.size < 2 or np.any(np.diff(bounds) <= 0):
            raise ValueError("nbody.steps as a list must be strictly increasing scale factors")
        if not (np.isclose(bounds[0], a_init) and np.isclose(bounds[-1], a_final)):
            raise ValueError(
                f"nbody.steps must run from ic.a_init = {a_init} to nbody.a_final = {a_final}"
            )
    for a in snapshots:
        if not a_init <= a <= a_final:
            raise ValueError(
                f"nbody.snapshots value {a} lies outside [a_init, a_final] = [{a_init}, {a_final}]"
            )
    wanted = np.asarray(snapshots, dtype=np.float64).reshape(-1)
    on_bound = (np.abs(bounds[:, None] - wanted[None, :]) <= 1e-9).any(axis=0)
    return np.unique(np.concatenate([bounds, wanted[~on_bound]]))


def _equal_steps(a_init: float, a_final: float, steps: int, spacing: str, growth) -> np.ndarray:
    """steps + 1 scale factors from a_init to a_final equally spaced in the spacing's variable."""
    if spacing == "a":
        return np.linspace(a_init, a_final, steps + 1)
    if spacing == "log_a":
        return np.exp(np.linspace(math.log(a_init), math.log(a_final), steps + 1))
    if growth is None:
        raise ValueError("nbody.spacing = 'growth' needs the run's growth factor")
    a = np.geomspace(a_init, a_final, GROWTH_SAMPLES)
    d1 = np.asarray(growth(a), np.float64)
    bounds = np.interp(np.linspace(d1[0], d1[-1], steps + 1), d1, a)
    bounds[[0, -1]] = a_init, a_final
    return bounds


@dataclasses.dataclass(frozen=True, eq=False)
class Timeline:
    """The times of an evolution: bounds (S + 1,) the increasing scale factors that bound its
    steps (:func:`step_boundaries`), and the snapshots, the boundaries at which it keeps the
    density (in this order)."""

    bounds: np.ndarray
    snapshots: tuple[float, ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "bounds", np.asarray(self.bounds, np.float64))
        object.__setattr__(self, "snapshots", tuple(float(a) for a in self.snapshots))


def timeline(
    a_init: float,
    a_final: float,
    steps: int | Sequence[float],
    snapshots: Sequence[float] = (),
    spacing: str = "a",
    growth: Callable | None = None,
) -> Timeline:
    """The steps from a_init to a_final (:func:`step_boundaries`) with the snapshots, sorted,
    the last boundary (a_final) always among them."""
    bounds = step_boundaries(a_init, a_final, steps, snapshots, spacing, growth)
    kept = tuple(sorted({float(a) for a in snapshots} | {float(bounds[-1])}))
    return Timeline(bounds, kept)
