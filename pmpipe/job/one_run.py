"""One run of a packed job (pmpipe.job.pipeline): its pending stages in order, their fields
kept on the devices from one stage to the next, each stage recorded (:class:`StageRecord`)
and agreed on by the job's processes. The run's head (:data:`HEAD`: the ICs and the N-body)
is computed in the calling thread; its tail (lensing, summaries) there too, or, given a pool
of tails, in that pool's thread while the job begins its next run: only for runs on one device
of a job of one process (two threads launching programs over several devices could queue them
in different orders on different devices, and their collectives would wait on each other)."""

from __future__ import annotations

import contextlib
import dataclasses
import time
import traceback
from concurrent.futures import Executor, Future
from functools import partial
from pathlib import Path

from pmpipe import stages
from pmpipe.job import agreed_steps
from pmpipe.job.outcomes import Outcome, StageRecord, compile_counts, directory_bytes
from pmpipe.run import derive
from pmpipe.runtime import log
from pmpipe.stages import registry, runner, status
from pmpipe.stages.inputs import Inputs
from pmpipe.stages.progress import Progress
from pmpipe.storage import run_record

LOG = log.get(__name__)

HEAD = ("ic", "nbody")  # the stages that hold the devices most; a run's tail is the rest


def compute_stage(stage: str, setup: derive.RunSetup, inputs: Inputs) -> StageRecord:
    """Run one stage and record its time, physics phases, compilations (this thread's) and
    what it wrote into the run's folder (bytes, and seconds during which some of those writes
    were under way: its store's and its checkpoints')."""
    import jax

    from pmpipe.runtime import compilation
    from pmpipe.storage import writes

    progress = Progress(stage, setup.run_file.run_id)
    before, start = compilation.thread_totals(), time.perf_counter()
    began = time.time()
    path = registry.execute(stage, setup, inputs, progress)
    seconds, counts = time.perf_counter() - start, compilation.thread_totals() - before
    written = writes.written_since(inputs.run_dir, began)
    progress(f"{counts.summary()}")
    return StageRecord(
        stage,
        seconds,
        dict(progress.physics),
        compile_counts(counts),
        {"bytes": written.bytes, "seconds": written.seconds},
        directory_bytes(path) if jax.process_index() == 0 else 0,
        {
            "start": began,
            "end": time.time(),
            "phases": [list(span) for span in progress.spans],
            "writes": [list(span) for span in written.spans],
        },
    )


@dataclasses.dataclass
class _Run:
    """A run under way: where it is, what it computed, and what its tail needs (its setup,
    the fields kept for the next stages, the stages left, the writer lock to release)."""

    config_path: Path
    index: int
    timeout_s: float
    guard: object
    start: float
    run_id: str
    stage: str | None = None
    names: tuple[str, ...] = ()
    computed: list = dataclasses.field(default_factory=list)
    setup: derive.RunSetup | None = None
    inputs: Inputs | None = None
    left: tuple[str, ...] = ()
    exits: contextlib.ExitStack = dataclasses.field(default_factory=contextlib.ExitStack)

    def outcome(self, error: str | None = None) -> Outcome:
        """The run's outcome: what it computed and skipped, or its failure (``error``)."""
        seconds = time.perf_counter() - self.start
        if error is not None:
            computed = tuple(self.computed)
            return Outcome(self.config_path, self.run_id, computed, (), seconds, error, self.stage)
        done = {r.stage for r in self.computed}
        skipped = tuple(s for s in self.names if s not in done)
        return Outcome(self.config_path, self.run_id, tuple(self.computed), skipped, seconds)

    def compute(self, names) -> None:
        """Compute the stages ``names`` in order, each agreed on by the processes."""
        assert self.setup is not None and self.inputs is not None
        for self.stage in names:
            _stop_if_signalled(self.guard, self.stage, self.run_id)
            step = partial(compute_stage, self.stage, self.setup, self.inputs)
            agreed = agreed_steps.agreed_step(
                self.index, self.run_id, self.stage, step, self.timeout_s
            )
            self.computed.append(agreed)


def _head(run: _Run, mesh_of) -> Outcome | None:
    """Load the run, take its writer lock, derive its setup and compute its pending stages of
    :data:`HEAD`; its outcome when nothing is left, else None (its tail: ``run.left``)."""
    run_file = runner.load(run.config_path)
    run.run_id = run_file.run_id
    run.names = stages.run_stages(run_file.config)
    run.exits.enter_context(runner.writing(run.config_path.parent))
    todo = status.pending_stages(run_file.config, run_file.config_hash, run.config_path.parent)
    if not todo:
        return run.outcome()
    _started(run.config_path.parent)
    pdims = run_file.config.parallel.pdims
    run.setup = agreed_steps.agreed_step(
        run.index,
        run.run_id,
        "setup",
        lambda: runner.setup(run_file, run.config_path, mesh_of(pdims), todo),
        run.timeout_s,
    )
    run.inputs = Inputs(run.config_path.parent, run.setup, keep=True)
    head = tuple(s for s in todo if s in HEAD)
    run.compute(head)
    run.left = todo[len(head) :]
    return None


def _tail(run: _Run) -> Outcome:
    """Compute the run's stages left after its head; its outcome."""
    run.compute(run.left)
    run.exits.close()  # the writer lock: every store is complete
    assert run.inputs is not None
    run.inputs.forget()
    return run.outcome()


def _guarded(run: _Run, part, *args) -> Outcome | None:
    """``part(run, *args)``, its failure the run's Outcome; the writer lock released unless
    the run goes on (``part`` returned None). A preemption (checkpoint.Preempted) goes up;
    agreed_steps.JobStopped when the processes could not agree."""
    import jax

    from pmpipe.storage import checkpoint

    going_on = False
    try:
        found = part(run, *args)
        going_on = found is None
        return found
    except checkpoint.Preempted:  # the job is about to end: so does this process
        raise
    except agreed_steps.StepLost as err:
        raise agreed_steps.JobStopped(run.outcome(str(err))) from err
    except agreed_steps.StepFailed as err:
        return run.outcome(str(err))
    except Exception as err:  # noqa: BLE001  one run's failure must not stop the other runs of the job
        if jax.process_index() == 0:
            LOG.error("[pmpipe run %s] traceback:\n%s", run.run_id, traceback.format_exc())
        else:  # the reason, should this process be the only one that failed
            LOG.error(
                "[pmpipe run %s] process %d: %s",
                run.run_id,
                jax.process_index(),
                agreed_steps.error_line(err),
            )
        return run.outcome(agreed_steps.error_line(err))
    finally:
        if not going_on:
            run.exits.close()


def run_one(  # parameters: the run, its mesh, the job's guard and pool, the run's place in it
    config_path: Path,
    mesh_of,
    guard=None,
    index: int = 0,
    partner_timeout_s: float | None = None,
    tails: Executor | None = None,
) -> Future[Outcome]:
    """Every pending stage of one run, its fields kept on the devices between stages; its
    Outcome as a future, done on return unless ``tails`` (a pool of one thread) computes the
    run's tail. A preemption (checkpoint.Preempted) is not one run's failure and goes up (from
    the future for the tail). Process 0 records the outcome when the run ends (:func:`recorded`).
    ``guard`` (a listening checkpoint.Schedule): a signal that
    arrived outside the N-body stops the job before the run's next stage. The run's setup and
    each stage end with the processes' agreement (:func:`pmpipe.job.agreed_steps.agreed_step`):
    a failure on any process is the run's failure on every process, and they go on together
    to the next run (this is the ``index``-th run of the job); agreed_steps.JobStopped when
    some process does not arrive within ``partner_timeout_s`` (default
    agreement.PARTNER_TIMEOUT_S)."""
    from pmpipe.runtime import agreement

    timeout_s = agreement.PARTNER_TIMEOUT_S if partner_timeout_s is None else partner_timeout_s
    run = _Run(config_path, index, timeout_s, guard, time.perf_counter(), config_path.parent.name)
    found = _guarded(run, _head, mesh_of)
    if found is None:
        if tails is not None:
            return tails.submit(_finished, run)
        found = _finished(run)
    done: Future[Outcome] = Future()
    done.set_result(recorded(found))
    return done


def _finished(run: _Run) -> Outcome:
    """The run's tail computed; its outcome, recorded."""
    outcome = _guarded(run, _tail)
    assert outcome is not None  # a tail ends the run
    return recorded(outcome)


def recorded(outcome: Outcome) -> Outcome:
    """``outcome``, recorded by process 0 (:func:`record_outcome`) when its run computed a
    stage or failed, as soon as the run ends."""
    import jax

    if jax.process_index() == 0 and (outcome.computed or outcome.error is not None):
        record_outcome(outcome)
    return outcome


def record_outcome(outcome: Outcome) -> None:
    """The run's outcome.json (pmpipe.storage.run_record; a failure before any stage is in
    stage 'setup'); a record that cannot be written is logged, not fatal: the stores are what
    the run made. A failure a partner process recorded while this one computed the run is
    kept: it is the first diagnosis (this process's failure often follows from the partner's
    stop)."""
    run_dir = outcome.config_path.parent
    if outcome.error is not None and run_record.failed_within(run_dir, outcome.seconds):
        LOG.info("[pmpipe run %s] the failure its partner recorded is kept", outcome.run_id)
        return
    stores = {
        stage: run_record.fingerprint(stages.store_path(run_dir, stage))
        for stage in (*outcome.skipped, *outcome.stages)
    }
    try:
        run_record.write(
            run_dir,
            outcome.error,
            outcome.failed_stage or ("setup" if outcome.error is not None else None),
            outcome.seconds,
            sum(r.store_bytes for r in outcome.computed),
            stores if outcome.error is None else None,
        )
    except OSError as err:
        LOG.warning("[pmpipe run %s] its outcome.json was not written: %s", outcome.run_id, err)


def _stop_if_signalled(guard, stage: str, run_id: str) -> None:
    """checkpoint.Preempted when ``guard`` (a listening checkpoint.Schedule, or None) caught a
    signal: the job stops before ``stage`` of the run."""
    import signal

    from pmpipe.storage import checkpoint

    if guard is not None and guard.stop_requested():
        raise checkpoint.Preempted(
            f"{signal.Signals(guard.signalled).name} arrived: stopped before stage "
            f"{stage} of run {run_id}, which resumes there when started again",
            guard.signalled,
        )


def _started(run_dir: Path) -> None:
    """Process 0 records that the run started (pmpipe.storage.run_record)."""
    import jax

    if jax.process_index() == 0:
        run_record.write_started(run_dir)
