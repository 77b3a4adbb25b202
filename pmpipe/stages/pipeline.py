"""Every stage of one or many runs in one process: ``pmpipe run all CONFIG [CONFIG ...]``.

JAX starts once, so the compiled programs serve every run of the job (runs of one campaign
have the same sizes; their cosmologies and seeds are arguments of the programs). Inside a run,
the fields a stage produces stay on the devices for the next stage, and every stage still
writes its store, complete or absent, as when the stages run one by one.

A stage whose store is complete (made from the run's current config) is skipped, unless an
earlier stage of the run was computed again. A run that fails is logged with its run id and
leaves its unfinished stores without a completion marker; the other runs go on, and
:func:`run_all` reports the failures at the end.

    python -m pmpipe.stages.pipeline results/<campaign>/<run_id>/config.json [...]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
import traceback
from pathlib import Path

from pmpipe import stages


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What happened to one run of a job: the stages computed, those found complete, and the
    error (one line, None when the run succeeded) with the stage it happened in."""

    config_path: Path
    run_id: str
    computed: tuple[str, ...]
    skipped: tuple[str, ...]
    seconds: float
    error: str | None = None
    failed_stage: str | None = None


def run_one(config_path: Path, mesh_of) -> Outcome:
    """Every pending stage of one run, its fields kept on the devices between stages."""
    import jax

    start = time.perf_counter()
    run_id, stage = config_path.parent.name, None
    computed: list[str] = []
    try:
        run_file = stages.load(config_path)
        run_id = run_file.run_id
        todo = stages.pending_stages(run_file.config, run_file.config_hash, config_path.parent)
        names = stages.run_stages(run_file.config)
        inputs = stages.Inputs(config_path.parent, run_file.config_hash,
                               mesh_of(run_file.config.parallel.pdims), keep=True)
        for stage in todo:
            progress = stages.Progress(stage, run_id, jax.process_index())
            stages.execute(stage, run_file, inputs, progress)
            computed.append(stage)
        inputs.forget()
        skipped = tuple(s for s in names if s not in todo)
        return Outcome(config_path, run_id, tuple(computed), skipped, time.perf_counter() - start)
    except Exception as err:  # one run's failure must not stop the other runs of the job
        if jax.process_index() == 0:
            print(f"[pmpipe run {run_id}] traceback:\n{traceback.format_exc()}", file=sys.stderr)
        line = f"{type(err).__name__}: {err}".splitlines()[0] if str(err) else type(err).__name__
        return Outcome(config_path, run_id, tuple(computed), (), time.perf_counter() - start,
                       error=line, failed_stage=stage)


def run_all(config_paths) -> list[Outcome]:
    """Run every run of ``config_paths`` in this process (JAX started once for all of them;
    they must share their device mesh); returns one Outcome per run, in order."""
    import jax

    from pmpipe import parallel

    paths = [Path(p) for p in config_paths]
    launcher, processes = stages.start(paths)
    if processes > 1:
        print(f"[pmpipe] process {jax.process_index()} of {processes} ({launcher}): "
              f"{jax.local_device_count()} local of {jax.device_count()} devices",
              file=sys.stderr, flush=True)
    meshes = {}  # the one device mesh of the job, by pdims

    def mesh_of(pdims):
        pdims = tuple(pdims)
        if meshes and pdims not in meshes:
            raise ValueError(f"parallel.pdims {list(pdims)} differs from {list(next(iter(meshes)))} "
                             "of the job's first run: the runs of one job share their device mesh")
        if pdims not in meshes:
            meshes[pdims] = parallel.make_mesh(pdims)
        return meshes[pdims]

    outcomes = []
    for path in paths:
        outcome = run_one(path, mesh_of)
        outcomes.append(outcome)
        if jax.process_index() == 0:
            print(summary_line(outcome), file=sys.stderr, flush=True)
    return outcomes


def run_job(config_paths) -> list[str]:
    """:func:`run_all` for a job array element (submitit): RuntimeError naming every failed
    run when any failed; else the run ids."""
    outcomes = run_all(config_paths)
    failed = [o for o in outcomes if o.error is not None]
    if failed:
        raise RuntimeError("; ".join(f"run {o.run_id} failed in stage {o.failed_stage}: {o.error}"
                                     for o in failed))
    return [o.run_id for o in outcomes]


def summary_line(outcome: Outcome) -> str:
    """'[pmpipe run <id>] ...' line of one run: computed and skipped stages, or the error."""
    prefix = f"[pmpipe run {outcome.run_id}]"
    if outcome.error is not None:
        return (f"{prefix} FAILED in stage {outcome.failed_stage}: {outcome.error} "
                f"({outcome.config_path})")
    if not outcome.computed:
        return f"{prefix} complete already: {', '.join(outcome.skipped)} skipped"
    skipped = f"; {', '.join(outcome.skipped)} complete already" if outcome.skipped else ""
    return f"{prefix} {', '.join(outcome.computed)} done in {outcome.seconds:.1f} s{skipped}"


def main(argv=None) -> int:
    """Run the runs; exit status 1 when any run failed (each failure named on stderr)."""
    parser = argparse.ArgumentParser(
        prog="python -m pmpipe.stages.pipeline",
        description="run every stage of one or more runs in one process")
    parser.add_argument("config", nargs="+", help="runs' config.json files")
    outcomes = run_all(parser.parse_args(argv).config)
    failed = [o for o in outcomes if o.error is not None]
    if failed:
        print(f"error: {len(failed)} of {len(outcomes)} runs failed: "
              f"{', '.join(o.run_id for o in failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
