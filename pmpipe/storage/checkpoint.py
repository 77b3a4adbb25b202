"""Checkpoints of the N-body: when to write one, writing, finding and reading them.

A checkpoint is a store (pmpipe.storage.store: each process writes its own blocks, complete only once
its marker is written, with the manifest of its shards) at
``<run>/checkpoints/nbody-step<k>.zarr``: the :class:`pmpipe.physics.evolution.particle_mesh.State` after step k
(particles, the snapshots and lightcone maps captured so far, the halo needed, trouble), with
the step, its a and the run's config hash. Once a checkpoint is complete, all but it and the
one before it (KEEP) are removed; a run starts from the newest complete checkpoint whose config
hash is its own and whose every shard and metadata document matches its manifest's checksums
(a damaged one is reported and removed, so the run resumes from the one before, or from the
start; one of another config is reported and left alone). :class:`Schedule` says when to write one: every few steps,
every few minutes, and at once after SIGTERM or SIGUSR2, which SLURM and submitit send before
they stop or requeue a job.
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import time
from pathlib import Path

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding

from pmpipe.physics.evolution import lightcone
from pmpipe.physics.evolution.particle_mesh import State
from pmpipe.runtime import log, parallel, slurm_job
from pmpipe.runtime.parallel import FIELD_SPEC
from pmpipe.storage import encoding, provenance, store

LOG = log.get(__name__)

FOLDER = "checkpoints"
STAGE = "nbody-checkpoint"
SIGNALS = (signal.SIGTERM, signal.SIGUSR2)
KEEP = 2  # complete checkpoints kept: the newest, and the one before should it be damaged
PREEMPTED_EXIT = (
    slurm_job.PREEMPTED_EXIT
)  # a stage or job that a signal stopped, its checkpoint written


class Preempted(RuntimeError):
    """A signal (``signum``) asked the run to stop; its checkpoint is written."""

    def __init__(self, message: str, signum: int | None = None):
        super().__init__(message)
        self.signum = signum


def path_for(run_dir: str | Path, step: int) -> Path:
    return Path(run_dir) / FOLDER / f"nbody-step{step:05d}.zarr"


@dataclasses.dataclass
class Schedule:
    """When to write a checkpoint: after every ``every_steps``-th step, after the first step
    that ends ``every_minutes`` after the last checkpoint, and after the step during which a
    signal of SIGNALS arrived (:meth:`listening`).

    ``received`` is what this process caught (the largest signal number: SIGTERM over SIGUSR2);
    ``signalled`` what every process agreed on at the last :meth:`stop_requested`. A signal that
    arrives while the processes exchange what they caught stays in ``received`` for the next
    exchange."""

    every_steps: int | None = None
    every_minutes: float | None = None
    last: float = dataclasses.field(default_factory=time.monotonic)
    received: int | None = None
    signalled: int | None = None

    @contextlib.contextmanager
    def listening(self, raise_after: bool = True):
        """Inside: SIGNALS are caught (remembered, the work goes on to the end of its step).
        On leaving, the handlers before are back; when the block ended normally and
        ``raise_after`` is set, a signal that any process caught and nothing acted on raises
        :class:`Preempted` on every process (the processes agree, as in
        :meth:`stop_requested`)."""
        before = {sig: signal.signal(sig, self._caught) for sig in SIGNALS}
        try:
            yield self
        finally:  # a signal from here on reaches the handlers before
            for sig, handler in before.items():
                signal.signal(sig, handler)
        if raise_after and self.stop_requested():
            raise Preempted(
                f"{signal.Signals(self.signalled).name} arrived after the last step; "
                "the N-body is done, the run's next stages are not",
                self.signalled,
            )

    def _caught(self, signum, frame) -> None:
        self.received = max(self.received or 0, signum)

    def stop_requested(self) -> bool:
        """Whether a signal arrived on any process (collective: every process calls it at the
        same point). All processes agree, on the signal too (``signalled`` becomes the largest
        number any process had caught when they exchanged)."""
        mine = self.received or 0  # read once: the handler may run during the exchange
        self.signalled = parallel.largest(mine) or None
        return self.signalled is not None

    def due(self, step: int) -> bool:
        """Whether a checkpoint is due after ``step`` by steps or minutes (the same answer on
        every process: process 0's clock decides)."""
        by_steps = self.every_steps is not None and step % self.every_steps == 0
        by_time = (
            self.every_minutes is not None
            and time.monotonic() - self.last >= 60 * self.every_minutes
        )
        if jax.process_count() > 1 and self.every_minutes is not None:
            from jax.experimental import multihost_utils

            by_time = bool(multihost_utils.broadcast_one_to_all(np.int32(by_time)))
        return by_steps or by_time

    def written(self) -> None:
        self.last = time.monotonic()


def write(run_dir: str | Path, run_file, mesh: Mesh, state: State, step: int, a: float) -> Path:
    """Write the state after ``step`` (ending at scale factor a) as a complete checkpoint
    store, then remove the older checkpoints of the run; returns its path."""
    path = path_for(run_dir, step)
    group = store.create(
        path,
        provenance.provenance(run_file, STAGE, mesh, store.now())
        | {
            "step": int(step),
            "a": float(a),
            "needed_halo_cells": int(parallel.to_host(state.needed)),
            "trouble": [int(t) for t in parallel.to_host(state.trouble)],
        },
    )
    for name in ("disp", "mom"):
        field = getattr(state, name)
        store.write_array(
            group,
            name,
            field,
            ("qx", "qy", "qz", "component"),
            "Mpc/h",
            f"particle {'displacement' if name == 'disp' else 'momentum'}",
        )
    stacks = {"snaps": state.snaps}
    if state.maps is not None:
        stacks["flat"] = state.maps[0]
        if state.maps[1] is not None:
            store.write_array(
                group,
                "shells",
                state.maps[1],
                ("plane", "ray"),
                "Mpc/h",
                "lightcone shells sampled so far",
            )
    for name, stack in stacks.items():
        if stack.shape[0] == 0:
            continue
        array = store.create_array(
            group,
            name,
            stack.shape,
            stack.dtype,
            store.Labels(
                ("slot",) + tuple(f"axis{i}" for i in range(1, stack.ndim)),
                "1",
                f"{name} captured so far",
            ),
            (1,) + encoding.block_shards(stack[0]),
        )
        for i in range(stack.shape[0]):
            store.write_blocks(array, stack[i], (i,))
    store.mark_complete(group)
    if jax.process_index() == 0:
        kept = [path]
        for other in sorted((Path(run_dir) / FOLDER).glob("nbody-step*.zarr"), reverse=True):
            if other == path:
                continue
            if len(kept) < KEEP and other < path and store.is_complete(other):
                kept.append(other)
            else:
                store.remove(other)
    parallel.barrier(f"checkpoint {step} written")
    return path


def newest(run_dir: str | Path, config_hash: str) -> Path | None:
    """The newest complete, intact checkpoint of the run made from ``config_hash``, or None.

    Process 0 checks each candidate, newest first, against its manifest with every shard's
    checksum (a flipped byte, an edited zarr.json): a damaged one is reported (logging) and
    removed, one of another config reported and passed over, an unfinished one passed over.
    Every process gets process 0's answer (collective)."""
    found = 0  # the step of the checkpoint + 1; 0: none
    if jax.process_index() == 0:
        for path in sorted((Path(run_dir) / FOLDER).glob("nbody-step*.zarr"), reverse=True):
            if not store.has_marker(path):
                continue
            problems = store.problems(path, checksums=True, config_hash=config_hash)
            if not problems:
                found = _step_of(path) + 1
                break
            if problems[-1].startswith("is stale"):
                LOG.warning("%s %s: not resumed from", path, problems[-1])
                continue
            LOG.warning("%s is damaged (%s): removed, not resumed from", path, "; ".join(problems))
            store.remove(path)
    found = parallel.largest(found)
    return path_for(run_dir, found - 1) if found else None


def _step_of(path: Path) -> int:
    return int(path.name.removeprefix("nbody-step").removesuffix(".zarr"))


def read(path: str | Path, mesh: Mesh, like: State) -> tuple[State, int]:
    """The state of a checkpoint, laid out like ``like`` (the state a fresh start makes, or
    its shapes), and the step it ends."""
    group = store.open_complete(path)

    def read_as(name, spec):
        array = group[name]
        return jax.make_array_from_callback(
            array.shape, NamedSharding(mesh, spec), lambda index: array[index]
        )

    def stack(name, template):
        return template if template.shape[0] == 0 else read_as(name, jax.P(None, *FIELD_SPEC))

    maps = None
    if like.maps is not None:
        maps = (
            stack("flat", like.maps[0]),
            None
            if like.maps[1] is None
            else read_as("shells", jax.P(None, *lightcone.ray_spec(like.maps[1].shape[1], mesh))),
        )
    attrs = group.attrs
    state = State(
        store.read_sharded(group["disp"], mesh),
        store.read_sharded(group["mom"], mesh),
        stack("snaps", like.snaps),
        maps,
        np.int32(attrs["needed_halo_cells"]),
        np.asarray(attrs["trouble"], np.int32),
    )
    return state, int(attrs["step"])


def remove(run_dir: str | Path) -> None:
    """Remove every checkpoint of the run (process 0)."""
    if jax.process_index() == 0:
        store.remove(Path(run_dir) / FOLDER)
