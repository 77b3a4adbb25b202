"""The schedule of an evolution as a compiled program takes it: the step boundaries in the
particles' dtype, the snapshot slot of every boundary and the lightcone planes each step
crosses (arrays, so that runs of one size with as many steps share the program, and in a
program that runs one step per call, runs whose step counts share a bucket; the snapshot
count is static)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import jax
import numpy as np

from pmpipe.physics.evolution import sky
from pmpipe.physics.evolution.timesteps import Timeline

STEPS_BUCKET = 16  # a stepwise program's schedule holds a multiple of this many steps


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Schedule:
    """a_steps (S + 1,) boundaries in the particles' dtype; slots (S + 1,) int32 from
    :func:`snapshot_slots`; crossing (S, K) int32 from :func:`crossing_slots`; n_snapshots
    (static): the densities the program keeps."""

    a_steps: jax.Array | np.ndarray
    slots: jax.Array | np.ndarray
    crossing: jax.Array | np.ndarray
    n_snapshots: int = dataclasses.field(metadata={"static": True})

    @property
    def steps(self) -> int:
        """S, the number of steps (with :func:`build`'s padding, those past the last too)."""
        return self.a_steps.shape[0] - 1


def build(timeline: Timeline, capture, dtype, padded: bool = False) -> Schedule:
    """The schedule of ``timeline`` for particles of ``dtype``, with the crossings of
    ``capture`` (a :class:`pmpipe.physics.evolution.lightcone.Capture`, or None: no planes).
    ``padded``: for a program that runs the steps one call at a time, its arrays hold a
    multiple of STEPS_BUCKET steps, the steps past the last empty (a boundary repeated: zero
    drift and kicks, no snapshot, no crossing), so that runs whose step counts share a bucket
    share the program."""
    bounds = np.asarray(timeline.bounds, np.float64)
    slots = snapshot_slots(bounds, timeline.snapshots)
    crossing = crossing_slots(bounds, () if capture is None else capture.a)
    if padded:
        extra = -(len(bounds) - 1) % STEPS_BUCKET
        bounds = np.concatenate([bounds, np.full(extra, bounds[-1])])
        slots = np.concatenate([slots, np.full(extra, len(timeline.snapshots), np.int32)])
        crossing = np.concatenate([crossing, np.full((extra, crossing.shape[1]), -1, np.int32)])
    return Schedule(bounds.astype(dtype), slots, crossing, len(timeline.snapshots))


def snapshot_slots(a_steps, snapshots: Sequence[float]) -> np.ndarray:
    """For each boundary of a_steps (S + 1,), the index of the snapshot taken there, or
    len(snapshots) where none is (int32)."""
    slots = np.full(len(a_steps), len(snapshots), np.int32)
    for k, a in enumerate(snapshots):
        slots[np.flatnonzero(np.abs(np.asarray(a_steps) - a) < 1e-9)] = k
    return slots


def crossing_slots(a_steps, crossings) -> np.ndarray:
    """(S, K) plane indices j crossed within each step i (a_i < a_j <= a_i+1), -1 where a step
    crosses fewer than K; K is the most any step crosses, rounded up to a multiple of
    sky.PLANE_BUCKET (0 without crossings)."""
    a_steps, crossings = np.asarray(a_steps, np.float64), np.asarray(crossings, np.float64)
    step_of = np.searchsorted(a_steps, crossings, side="left") - 1
    inside = (crossings > a_steps[0]) & (crossings <= a_steps[-1])
    per_step = [np.flatnonzero(inside & (step_of == i)) for i in range(len(a_steps) - 1)]
    most = max((len(j) for j in per_step), default=0)
    width = sky.PLANE_BUCKET * math.ceil(most / sky.PLANE_BUCKET)
    table = np.full((len(per_step), width), -1, np.int32)
    for i, j in enumerate(per_step):
        table[i, : len(j)] = j
    return table
