"""Every stage of one or many runs in one process: ``pmpipe run all CONFIG [CONFIG ...]``.

JAX starts once, so the compiled programs serve every run of the job (runs of one campaign
have the same sizes; their cosmologies and seeds are arguments of the programs). Inside a run,
the fields a stage produces stay on the devices for the next stage, and every stage still
writes its store, complete or absent, as when the stages run one by one.

A stage whose store is complete (made from the run's current config) is skipped, unless an
earlier stage of the run was computed again. A run that fails is logged with its run id and
leaves its unfinished stores without a completion marker; the other runs go on, and
:func:`run_all` reports the failures at the end.

    python -m pmpipe.job.pipeline results/<campaign>/<run_id>/config.json [...]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import signal
import sys
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from pmpipe.job import agreed_steps, power_ahead
from pmpipe.job.one_run import record_outcome, recorded, run_one
from pmpipe.job.outcomes import HaloShortfalls, Outcome, compile_counts
from pmpipe.results import summary_parts
from pmpipe.runtime import log, memory
from pmpipe.stages import runner
from pmpipe.stages.progress import job_line

LOG = log.get(__name__)


def job_mesh():
    """``mesh_of(pdims)``: the one device mesh of a job, made for its first run; ValueError
    for a run whose parallel.pdims differ."""
    from pmpipe.runtime import parallel

    meshes: dict[tuple[int, ...], object] = {}

    def mesh_of(pdims):
        pdims = tuple(pdims)
        if meshes and pdims not in meshes:
            raise ValueError(
                f"parallel.pdims {list(pdims)} differs from {list(next(iter(meshes)))} "
                "of the job's first run: the runs of one job share their device mesh"
            )
        if pdims not in meshes:
            meshes[pdims] = parallel.make_mesh(pdims)
        return meshes[pdims]

    return mesh_of


def run_all(  # parameters: the runs, what to write besides their stores, how to run them
    config_paths,
    report: str | Path | None = None,
    progress_log: str | None = None,
    part: str | Path | None = None,
    partner_timeout_s: float | None = None,
    overlap: bool = False,
) -> list[Outcome]:
    """Run every run of ``config_paths`` in this process (JAX started once for all of them;
    they must share their device mesh); returns one Outcome per run, in order. Process 0
    makes the first run's Boltzmann table before it starts, and the next runs' while a run
    evolves, on CPU threads (:func:`pmpipe.job.power_ahead.linear_power_ahead`): as many tables at once as the cores
    OpenMP leaves spare (:func:`pmpipe.runtime.openmp.spare_cores`, at least 1; CAMB's calls
    take turns, CLASS's run in processes of their own), each distinct table once. Every process
    starts a run once its table is cached (or making it failed: the run's setup then makes it,
    or reports why). With ``overlap``, in a job of one process whose runs have one device each,
    each run's tail (its stages after the N-body, :mod:`pmpipe.job.one_run`) is computed in a
    second thread while the next run's ICs and N-body go on; a stop waits for the tail under
    way, which ends before its next stage. Process 0 writes the job's record to ``report`` as JSON (:func:`job_record`),
    with ``progress_log`` (the job's log) :func:`pmpipe.stages.progress.job_line` to stdout after
    each run, and the job's part of the campaign summaries to ``part`` (pmpipe.results.summary_parts).
    A run of the size of one that needed more halo fails without evolving (:class:`HaloShortfalls`).
    The processes agree after each step of a run (:func:`run_one`, ``partner_timeout_s``); when
    they cannot, each process that can records the run's failure in its outcome.json and the
    job stops (agreed_steps.JobStopped)."""
    import jax

    from pmpipe.runtime import compilation, openmp, parallel
    from pmpipe.storage import checkpoint

    start = time.perf_counter()
    compilation.listen()
    paths = [Path(p) for p in config_paths]
    launcher, processes = runner.start(paths)
    _log_processes(launcher, processes)
    mesh_of = job_mesh()
    made_ahead: list[dict] = []
    done = _InOrder(len(paths), progress_log)
    guard = checkpoint.Schedule()  # SIGTERM / SIGUSR2 outside the N-body: stop between stages
    at_once = max(1, openmp.spare_cores(openmp.usable_cores()))
    with (
        guard.listening(raise_after=False),  # once every run is done, a signal changes nothing
        ThreadPoolExecutor(max_workers=at_once, thread_name_prefix="linear-power") as pool,
        _tails(overlap and processes == 1 and _may_overlap(paths)) as tails,
    ):
        # each run's table by its cache key (the run's path when it needs none), made once
        keys = [power_ahead.table_key(p) or p for p in paths] if jax.process_index() == 0 else []
        ahead: dict = {}
        try:
            for i, path in enumerate(paths):
                if jax.process_index() == 0:  # this run's table, and those of the next at_once
                    for j in range(i, min(i + 1 + at_once, len(paths))):
                        if keys[j] not in ahead:
                            ahead[keys[j]] = pool.submit(power_ahead.linear_power_ahead, paths[j])
                    shared = keys[i] in keys[:i]  # awaited for an earlier run
                    made_ahead.append(power_ahead.await_ahead(ahead[keys[i]], path, shared))
                parallel.barrier("run's linear power cached")  # the others wait for process 0's
                try:
                    found = done.shortfalls.repeated(path)
                    done.add(
                        _done(recorded(found))
                        if found
                        else run_one(path, mesh_of, guard, i, partner_timeout_s, tails)
                    )
                except agreed_steps.JobStopped as stop:  # every process that can says why
                    LOG.error("%s", summary_line(stop.outcome), extra=log.EVERY_PROCESS)
                    record_outcome(stop.outcome)
                    pool.shutdown(wait=False, cancel_futures=True)  # no table made for later runs
                    raise
            done.close()
        except BaseException as stop:  # a tail under way ends before its next stage
            _stop_tails(guard, stop)
            done.abandon()
            raise
    outcomes = done.outcomes
    if part is not None and jax.process_index() == 0:
        summary_parts.write_part_or_warn(part, [p.parent for p in paths])
    if report is not None and jax.process_index() == 0:
        _write_report(report, job_record(outcomes, time.perf_counter() - start, made_ahead))
    return outcomes


def _log_processes(launcher: str, processes: int) -> None:
    """With several processes, each says which it is (of how many, started by ``launcher``)
    and how many devices it holds."""
    import jax

    if processes > 1:
        LOG.info(
            "[pmpipe] process %d of %d (%s): %d local of %d devices",
            jax.process_index(),
            processes,
            launcher,
            jax.local_device_count(),
            jax.device_count(),
            extra=log.EVERY_PROCESS,
        )


@dataclasses.dataclass
class _InOrder:
    """A job's runs as they finish, in order (each recorded its outcome.json as it ended):
    each Outcome logged, its halo shortfall noted (:class:`HaloShortfalls`) and, by process 0,
    the progress line written (``progress_log``, the job's log, out of ``total`` runs);
    ``unfinished``, the runs whose tails are under way."""

    total: int
    progress_log: str | None
    shortfalls: HaloShortfalls = dataclasses.field(default_factory=HaloShortfalls)
    outcomes: list[Outcome] = dataclasses.field(default_factory=list)
    unfinished: list[Future[Outcome]] = dataclasses.field(default_factory=list)

    def add(self, future: Future[Outcome]) -> None:
        """A run begun: the one before it, whose tail it overlapped, ends first; so does this
        one when it is done."""
        self.unfinished.append(future)
        while self.unfinished and (len(self.unfinished) > 1 or self.unfinished[0].done()):
            self._finish(self.unfinished.pop(0))

    def close(self) -> None:
        """Every run ends (its preemption, checkpoint.Preempted, goes up)."""
        while self.unfinished:
            self._finish(self.unfinished.pop(0))

    def abandon(self) -> None:
        """The job stops: each run under way ends, or stops before its next stage."""
        from pmpipe.storage import checkpoint

        for future in self.unfinished:
            try:
                self._finish(future)
            except checkpoint.Preempted:
                pass
            except Exception as err:  # noqa: BLE001  the job's own stop goes up, not this
                LOG.error("[pmpipe] a run under way as the job stopped: %s", err)
        self.unfinished.clear()

    def _finish(self, future: Future[Outcome]) -> None:
        import jax

        outcome = self.shortfalls.seen(future.result())
        self.outcomes.append(outcome)
        LOG.info("%s", summary_line(outcome))
        if self.progress_log is not None and jax.process_index() == 0:
            line = job_line(self.outcomes, self.total, self.progress_log, sys.stdout.isatty())
            log.terminal().info("%s", line)


def _stop_tails(guard, stop: BaseException) -> None:
    """Let the job's ``guard`` (checkpoint.Schedule) stop the tails under way before their
    next stage as the job stops with ``stop``: the signal of a Preempted (which the N-body's
    own handlers may have caught alone), SIGINT for an interrupt."""
    interrupted = signal.SIGINT if isinstance(stop, KeyboardInterrupt) else None
    signum = getattr(stop, "signum", None) or interrupted
    if signum:
        guard.received = max(guard.received or 0, int(signum))


@contextlib.contextmanager
def _tails(wanted: bool):
    """A pool of one thread for the runs' tails (None unless ``wanted``), its work done when
    the block ends."""
    if not wanted:
        yield None
        return
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="run-tail") as tails:
        yield tails


def _may_overlap(paths: list[Path]) -> bool:
    """Whether the runs of ``paths`` may overlap (:mod:`pmpipe.job.one_run`): each on one
    device, all of one dtype (JAX's 64-bit switch is the process's), each once; else why not
    is logged and they go one after the other."""
    import math

    from pmpipe.run import validation

    why: str | None
    try:
        runs = [validation.read_run_file(path).config for path in paths]
    except Exception as err:  # noqa: BLE001  each run's own setup reports its config
        why = f"a run's config does not load ({agreed_steps.error_line(err)})"
    else:
        devices = max(math.prod(run.parallel.pdims) for run in runs)
        why = (
            f"runs over {devices} devices do not overlap"
            if devices > 1
            else "runs of float32 and float64 do not overlap"
            if len({run.nbody.dtype for run in runs}) > 1
            else "a run given twice does not overlap itself"
            if len({path.resolve() for path in paths}) < len(paths)
            else None
        )
    if why is not None:
        LOG.info("[pmpipe] %s: one run after the other", why)
    return why is None


def _done(outcome: Outcome) -> Future[Outcome]:
    """``outcome`` as a future that is done."""
    future: Future[Outcome] = Future()
    future.set_result(outcome)
    return future


def _write_report(path: str | Path, record: dict) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(record, indent=2) + "\n")


def peak_memory() -> dict:
    """Peak resident memory of this process (MB) and peak memory in use on its first local
    device (MB; None where the backend does not report it, as on CPU)."""
    device = memory.device_peak_bytes()
    return {
        "peak_rss_mb": memory.peak_rss_bytes() / 2**20,
        "peak_device_mb": None if device is None else device / 1e6,
    }


def job_record(outcomes: list[Outcome], wall_s: float, made_ahead: Sequence[dict] = ()) -> dict:
    """The job as JSON data: wall seconds of the process (start-up of JAX included), the
    OMP_NUM_THREADS it ran with, its compilations and peak memory, per run the stages computed
    with their records, and the Boltzmann tables made ahead of their runs (``made_ahead``,
    :func:`pmpipe.job.power_ahead.await_ahead`)."""
    import jax

    from pmpipe.runtime import compilation, openmp

    counts = compilation.totals()
    return {
        "wall_s": wall_s,
        "omp_num_threads": openmp.threads_in_force(),
        "processes": jax.process_count(),
        "devices": jax.device_count(),
        "platform": jax.default_backend(),
        "device_kind": jax.devices()[0].device_kind,
        "compilation": compile_counts(counts),
        **peak_memory(),
        "runs": [
            {
                "run_id": o.run_id,
                "seconds": o.seconds,
                "skipped": list(o.skipped),
                "error": o.error,
                "stages": [dataclasses.asdict(r) for r in o.computed],
            }
            for o in outcomes
        ],
        "linear_power_ahead": list(made_ahead),
    }


def run_job(config_paths, part: str | None = None, overlap: bool = False) -> list[str]:
    """:func:`run_all` for a job array element (submitit), writing its ``part``, its runs
    overlapping with ``overlap`` (execution.overlap): RuntimeError naming every failed run when
    any failed; else the run ids. When the job's processes could not agree
    (agreed_steps.JobStopped), this process ends at once (:func:`stop_now`)."""
    try:
        outcomes = run_all(config_paths, part=part, overlap=overlap)
    except agreed_steps.JobStopped as err:
        LOG.error("error: the job stops: %s", err)
        stop_now(1)
    failed = [o for o in outcomes if o.error is not None]
    if failed:
        raise RuntimeError(
            "; ".join(f"run {o.run_id} failed in stage {o.failed_stage}: {o.error}" for o in failed)
        )
    return [o.run_id for o in outcomes]


def summary_line(outcome: Outcome) -> str:
    """'[pmpipe run <id>] ...' line of one run: computed and skipped stages, or the error."""
    prefix = f"[pmpipe run {outcome.run_id}]"
    if outcome.error is not None:
        return (
            f"{prefix} FAILED in stage {outcome.failed_stage}: {outcome.error} "
            f"({outcome.config_path})"
        )
    if not outcome.computed:
        return f"{prefix} complete already: {', '.join(outcome.skipped)} skipped"
    skipped = f"; {', '.join(outcome.skipped)} complete already" if outcome.skipped else ""
    return f"{prefix} {', '.join(outcome.stages)} done in {outcome.seconds:.1f} s{skipped}"


def stop_now(status: int) -> None:
    """End this process at once with ``status``, its log flushed: not through
    jax.distributed's shutdown, which waits for partners that may never come."""
    import logging
    import os

    logging.shutdown()
    os._exit(status)


def _parser() -> argparse.ArgumentParser:
    """The command line of :func:`main`."""
    parser = argparse.ArgumentParser(
        prog="python -m pmpipe.job.pipeline",
        description="run every stage of one or more runs in one process",
    )
    parser.add_argument("config", nargs="+", help="runs' config.json files")
    parser.add_argument(
        "--report",
        metavar="JSON",
        help="write the job's record (times, physics, compilations, memory) here",
    )
    parser.add_argument(
        "--stop-ahead",
        metavar="SECONDS",
        type=int,
        default=0,
        help="inside a SLURM job, signal this process (SIGUSR2: the N-body writes "
        "a checkpoint and the job requeues itself) SECONDS before the job's "
        "time limit; SLURM's own --signal reaches job steps only, not a "
        "stage run in the batch step",
    )
    parser.add_argument(
        "--progress",
        metavar="LOG",
        help="after each run, write a line to stdout: the run's time, the runs left and an "
        "estimate of the time left, naming LOG, the job's log file (where stderr goes)",
    )
    parser.add_argument(
        "--part", metavar="ZARR", help="write the job's part of the campaign summaries here"
    )
    parser.add_argument(
        "--overlap",
        action="store_true",
        help="in a job of one process whose runs have one device each, compute each run's "
        "stages after the N-body (lensing, "
        "summaries) in a second thread while the next run's ICs and N-body go on: the host "
        "work and the writes of one run overlap the device work of the next, at the cost of "
        "two runs' fields in memory at once",
    )
    parser.add_argument(
        "--partner-timeout",
        metavar="SECONDS",
        type=float,
        default=None,
        help="with several processes, how long a process waits for the others at the end of "
        "each step of a run before it stops the job (default: "
        "pmpipe.runtime.agreement.PARTNER_TIMEOUT_S)",
    )
    return parser


def main(argv=None) -> int:
    """Run the runs; exit status 1 when any run failed (each failure named on stderr),
    checkpoint.PREEMPTED_EXIT when a signal stopped the job (its checkpoint written); when
    the processes of the job could not agree on a step (agreed_steps.JobStopped), this process ends at
    once with status 1 and the others end with it (srun or mpiexec end them, else the
    coordination service once this process's heartbeat stops)."""
    parser = _parser()
    args = parser.parse_args(argv)
    from pmpipe.runtime import slurm_job
    from pmpipe.storage import checkpoint, disk

    log.configure(stamped=True)
    if args.stop_ahead < 0:
        parser.error(f"--stop-ahead must be 0 (off) or a number of seconds, not {args.stop_ahead}")
    delay = slurm_job.signal_before_time_limit(args.stop_ahead)
    if delay is not None:
        LOG.info(
            "[pmpipe] SIGUSR2 to this process in %.0f s, %d s before the job's time limit",
            delay,
            args.stop_ahead,
            extra=log.EVERY_PROCESS,
        )

    try:
        outcomes = run_all(
            args.config, args.report, args.progress, args.part, args.partner_timeout, args.overlap
        )
    except checkpoint.Preempted as err:
        LOG.error("%s", runner.stopped(err))
        return checkpoint.PREEMPTED_EXIT
    except agreed_steps.JobStopped as err:
        LOG.error("error: the job stops: %s", err)
        stop_now(1)
    except Exception as err:  # before any run: JAX's backend, the disk
        problem = disk.known_failure(err)
        if problem is None:
            raise
        LOG.error("error: %s", problem)
        return 2
    failed = [o for o in outcomes if o.error is not None]
    if failed:
        LOG.error(
            "error: %d of %d runs failed: %s",
            len(failed),
            len(outcomes),
            ", ".join(o.run_id for o in failed),
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
