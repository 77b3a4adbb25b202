"""Running one stage of a run in this process: JAX started for the run, its config loaded and
its setup derived, the stage given its inputs and a progress line; the command line of
``python -m pmpipe.stages.<stage>``. Importing it starts no JAX (job submission pickles
:func:`run_stage`)."""

from __future__ import annotations

import argparse
import contextlib
import math
import signal
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from pmpipe.physics.theory.power_table import BOLTZMANN_KINDS
from pmpipe.run import validation
from pmpipe.runtime import log
from pmpipe.stages import suppressed
from pmpipe.stages.inputs import Inputs
from pmpipe.stages.progress import Progress

if TYPE_CHECKING:
    from pmpipe.storage.checkpoint import Preempted

LOG = log.get(__name__)


def start(config_paths) -> tuple[str, int]:
    """Start JAX in this process for the runs of ``config_paths`` (one launch serves them all).

    Under srun or mpiexec with several processes, joins them first (parallel.start_processes);
    on CPU each process's share of the run's px * py devices comes from XLA_FLAGS (set here
    when absent, before JAX starts its backend). The device count comes from the first file's
    pdims (the file is validated and checked first: a bad one stops the launch). Compiled
    programs go to and
    come from the persistent compilation cache that JAX_COMPILATION_CACHE_DIR names (the
    workflow sets it), else the one of the results folder (results/.jax_cache for
    results/<campaign>/<run>/config.json). Returns (launcher, processes).
    """
    import jax

    from pmpipe.runtime import openmp, parallel

    openmp.leave_spare_cores()  # before healpy and CAMB load
    pdims = validation.read_run_file(config_paths[0]).config.parallel.pdims
    parallel.use_compilation_cache(
        Path(config_paths[0]).absolute().parent.parent.parent / ".jax_cache"
    )
    launched = parallel.start_processes(math.prod(pdims))
    log.configure(jax.process_index(), stamped=True)
    return launched


def setup(run_file, config_path: str | Path, mesh, stages):
    """The run's setup (:func:`pmpipe.run.derive.setup`) for the stages named ``stages`` (the
    baryons' S(k, z) only when one of them reads it) on ``mesh``, its Boltzmann table and
    S(k, z) from the cache of its results folder (pmpipe.storage.power_cache), made there on a
    miss; the table by process 0 first when there are several, the others then read it (its
    failure is every process's)."""
    from functools import partial

    import jax

    from pmpipe.run import derive
    from pmpipe.runtime import parallel
    from pmpipe.storage import power_cache

    folder = power_cache.folder_of(config_path)
    tables = partial(power_cache.linear_table, folder=folder)
    if run_file.config.power.kind in BOLTZMANN_KINDS and jax.process_count() > 1:
        failure = None
        if jax.process_index() == 0:
            try:
                tables(derive.boltzmann_inputs(run_file.config))
            except Exception as err:  # noqa: BLE001  every process must learn it, below
                failure = err
        if parallel.largest(failure is not None):  # every process passes here
            raise failure or RuntimeError("process 0 could not make the run's linear P(k) table")
    feedback = partial(power_cache.suppressions, folder=folder) if suppressed(stages) else None
    return derive.setup(run_file, mesh, tables, feedback)


def load(config_path: str | Path):
    """The validated run file (config.RunFile); float64 runs switch JAX to 64-bit."""
    import jax

    run_file = validation.load_run_file(config_path)
    if run_file.config.nbody.dtype == "float64":
        jax.config.update("jax_enable_x64", True)
    return run_file


@contextlib.contextmanager
def writing(run_dir: str | Path):
    """The run's writer lock (pmpipe.storage.run_lock), taken by process 0 and kept while the
    block writes the run's stores; on every process RunLocked when another writer holds it."""
    import jax

    from pmpipe.runtime import parallel
    from pmpipe.storage import run_lock

    path, refused = None, None
    if jax.process_index() == 0:
        try:
            path = run_lock.acquire(run_dir)
        except run_lock.RunLocked as err:
            refused = err
    if parallel.largest(refused is not None):
        if path is not None:
            run_lock.release(path)
        raise refused or run_lock.RunLocked(f"{run_dir} is being written by another writer")
    with run_lock.kept(path) if path is not None else contextlib.nullcontext():
        yield


def run_stage(stage: str, config_path: str | Path, run: Callable[..., Path]) -> Path:
    """Run one stage, named ``stage``, of the run described by config_path with the stage's
    function ``run`` (``run(setup, inputs, progress)``, :mod:`pmpipe.stages.registry`),
    reading the earlier stages' stores; returns the path of its store."""
    import jax

    from pmpipe.runtime import parallel

    launcher, processes = start([config_path])
    run_file = load(config_path)
    progress = Progress(stage, run_file.run_id)
    if processes > 1:
        progress(
            f"process {jax.process_index()} of {processes} ({launcher}): "
            f"{jax.local_device_count()} local of {jax.device_count()} devices",
            every_process=True,
        )
    mesh = parallel.make_mesh(run_file.config.parallel.pdims)
    run_setup = setup(run_file, config_path, mesh, (stage,))
    with writing(Path(config_path).parent):
        path = run(run_setup, Inputs(Path(config_path).parent, run_setup), progress)
    progress(f"wrote {path}")
    return path


def run_checked(stage: str, config_path: str | Path, run: Callable[..., Path]) -> int:
    """:func:`run_stage` for command lines: bad input or missing inputs print one message
    naming the file and field and give exit status 2; a store that could not be written (a
    full disk, say; it is left without completion marker) prints one and gives 1."""
    from pmpipe.physics.evolution import particle_mesh
    from pmpipe.physics.mesh import painting
    from pmpipe.run import config
    from pmpipe.storage import checkpoint, disk, run_lock, store, writes

    try:
        run_stage(stage, config_path, run)
    except (
        config.ConfigError,
        store.IncompleteStoreError,
        painting.HaloError,
        particle_mesh.NumericalError,
        ValueError,
    ) as err:
        LOG.error("error: %s", err)
        return 2
    except (writes.StoreWriteError, run_lock.RunLocked, OSError) as err:
        problem = disk.failure(err)  # a full or read-only disk: the user's to fix
        LOG.error("error: %s", problem or err)
        return 1 if problem is None else 2
    except checkpoint.Preempted as err:
        LOG.error("%s", stopped(err))
        return checkpoint.PREEMPTED_EXIT
    return 0


def stopped(err: Preempted) -> str:
    """What a command line says when a signal stopped it: the error and, after SLURM's signal
    ahead of the time limit (SIGUSR2), the job's own requeue. Process 0 asks for it while the
    others wait: a process that ended first would end the srun step, and with it the job, as
    failed before the requeue. Once SLURM took the requeue, every process logs the text and
    waits for SLURM to end it (slurm_job.await_requeued_end)."""
    import jax

    from pmpipe.runtime import parallel, slurm_job

    text = f"preempted: {err}"
    if err.signum == signal.SIGUSR2:
        requeued = slurm_job.requeue_this_job() if jax.process_index() == 0 else None
        if requeued:
            text += f"; {requeued[1]}"
        if parallel.largest(int(bool(requeued and requeued[0]))):  # every process learns it
            LOG.error("%s; waiting for SLURM to end the job", text)
            slurm_job.await_requeued_end()
    return text


def main(stage: str, run: Callable[..., Path], argv=None) -> int:
    """``python -m pmpipe.stages.<stage> CONFIG``: the stage's function ``run`` on the run."""
    parser = argparse.ArgumentParser(
        prog=f"python -m pmpipe.stages.{stage}",
        description=f"run the {stage} stage of one simulation",
    )
    parser.add_argument(
        "config", help="the run's config.json (results/<campaign>/<run_id>/config.json)"
    )
    log.configure(stamped=True)
    return run_checked(stage, parser.parse_args(argv).config, run)
