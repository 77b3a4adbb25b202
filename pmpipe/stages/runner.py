"""Running a run's stages in this process: JAX started for the run, its config loaded, each
stage given its inputs and a progress line; the command line of ``python -m
pmpipe.stages.<stage>``; and which stores of a run are complete."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import math
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING

from pmpipe import log, validation
from pmpipe.stages import STAGES, run_stages, store_path
from pmpipe.stages.inputs import Inputs

if TYPE_CHECKING:
    from pmpipe.storage.checkpoint import Preempted

LOG = log.get(__name__)


class Progress:
    """Progress lines of a stage, log records '[pmpipe <stage> <run_id>] <message> (<elapsed>
    s)' (shown from one process: pmpipe.log); and the seconds the stage spent in each phase of
    the physics (``physics``: white_noise, lpt, pm_steps (the evolution with its lightcone
    capture), lensing, statistics)."""

    def __init__(self, stage: str, run_id: str):
        self.prefix = f"[pmpipe {stage} {run_id}]"
        self.start = time.perf_counter()
        self.physics: dict[str, float] = {}

    @contextlib.contextmanager
    def timed(self, phase: str):
        """Add the wall time of the block to ``physics[phase]``, less the seconds XLA spent
        compiling or loading programs inside it (counted while pmpipe.compilation listens, as
        in a job); the block waits for its own results (jax.block_until_ready) so that the
        time is the computation's."""
        from pmpipe import compilation

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

    from pmpipe import parallel

    pdims = validation.load_run_file(config_paths[0]).config.parallel.pdims
    parallel.use_compilation_cache(
        Path(config_paths[0]).absolute().parent.parent.parent / ".jax_cache"
    )
    launched = parallel.start_processes(math.prod(pdims))
    log.configure(jax.process_index())
    return launched


def load(config_path: str | Path):
    """The validated run file (config.RunFile); float64 runs switch JAX to 64-bit."""
    import jax

    run_file = validation.load_run_file(config_path)
    if run_file.config.nbody.dtype == "float64":
        jax.config.update("jax_enable_x64", True)
    return run_file


def execute(stage: str, run_file, inputs: Inputs, progress: Progress) -> Path:
    """Run one stage of a loaded run with its inputs; returns the path of its store."""
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}; the stages are {', '.join(STAGES)}")
    module = importlib.import_module(f"pmpipe.stages.{stage}")
    path = module.run(run_file, inputs.run_dir, inputs, progress)
    progress(f"wrote {path}")
    return path


def run_stage(stage: str, config_path: str | Path) -> Path:
    """Run one stage of the run described by config_path, reading the earlier stages' stores;
    returns the path of its store."""
    import jax

    from pmpipe import parallel

    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}; the stages are {', '.join(STAGES)}")
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
    inputs = Inputs(Path(config_path).parent, run_file, mesh)
    return execute(stage, run_file, inputs, progress)


def run_checked(stage: str, config_path: str | Path) -> int:
    """:func:`run_stage` for command lines: bad input or missing inputs print one message
    naming the file and field and give exit status 2; a store that could not be written (a
    full disk, say; it is left without completion marker) prints one and gives 1."""
    from pmpipe import config
    from pmpipe.physics import nbody, painting
    from pmpipe.storage import checkpoint, store

    try:
        run_stage(stage, config_path)
    except (
        config.ConfigError,
        store.IncompleteStoreError,
        painting.HaloError,
        nbody.NumericalError,
        ValueError,
    ) as err:
        LOG.error("error: %s", err)
        return 2
    except (store.StoreWriteError, OSError) as err:
        LOG.error("error: %s", err)
        return 1
    except checkpoint.Preempted as err:
        LOG.error("%s", stopped(err))
        return checkpoint.PREEMPTED_EXIT
    return 0


def stopped(err: Preempted) -> str:
    """What a command line says when a signal stopped it: the error and, after SLURM's signal
    ahead of the time limit (SIGUSR2), the job's own requeue. Process 0 asks for it while the
    others wait: a process that ended first would end the srun step, and with it the job, as
    failed before the requeue."""
    import jax

    from pmpipe import parallel
    from pmpipe.orchestration import slurm_job

    text = f"preempted: {err}"
    if err.signum == signal.SIGUSR2:
        if jax.process_index() == 0:
            requeued = slurm_job.requeue_this_job()
            if requeued:
                text += f"; {requeued}"
        parallel.barrier("job requeued")
    return text


def main(stage: str, argv=None) -> int:
    """``python -m pmpipe.stages.<stage> CONFIG``."""
    parser = argparse.ArgumentParser(
        prog=f"python -m pmpipe.stages.{stage}",
        description=f"run the {stage} stage of one simulation",
    )
    parser.add_argument(
        "config", help="the run's config.json (results/<campaign>/<run_id>/config.json)"
    )
    log.configure()
    return run_checked(stage, parser.parse_args(argv).config)


def is_current(path: str | Path, config_hash: str) -> bool:
    """Whether the store at path is complete and was made from the config ``config_hash``."""
    from pmpipe.storage import store

    try:
        store.open_complete(path, config_hash)
    except store.IncompleteStoreError:
        return False
    return True


def pending_stages(run, config_hash: str, run_dir: str | Path) -> tuple[str, ...]:
    """The stages of ``run`` (config.Run) from the first whose store is not complete or was made
    from another config to the last: those a job must compute. Empty when the run is complete."""
    names = run_stages(run)
    for i, stage in enumerate(names):
        if not is_current(store_path(run_dir, stage), config_hash):
            return names[i:]
    return ()


def run_status(run_dir: str | Path) -> str:
    """'complete' when the store of each of the run's stages is complete, else '<last complete
    stage> done' or 'planned' (a store without its completion marker counts as absent). The
    stages come from the run's config.json (all of them when it is missing)."""
    from pmpipe.storage import store

    config_path = Path(run_dir) / "config.json"
    stages = (
        run_stages(validation.load_run_file(config_path).config) if config_path.exists() else STAGES
    )
    done = [s for s in stages if store.is_complete(store_path(run_dir, s))]
    if len(done) == len(stages):
        return "complete"
    return f"{done[-1]} done" if done else "planned"
