"""The stages of one run: ``ic`` -> ``nbody`` -> ``lensing`` -> ``summaries`` (``lensing`` only
for runs with a ``lensing`` section).

Each stage reads the run's ``config.json`` and the stores of the stages before it from the run
directory (the folder of config.json), and writes its own store there:

    python -m pmpipe.stages.nbody results/<campaign>/<run_id>/config.json

or ``pmpipe run nbody <config.json>``. Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import importlib
import math
import sys
import time
from pathlib import Path

STAGES = ("ic", "nbody", "lensing", "summaries")


def run_stages(run) -> tuple[str, ...]:
    """The stages a run (config.Run) goes through."""
    return tuple(s for s in STAGES if s != "lensing" or run.lensing is not None)


def store_path(run_dir: str | Path, stage: str) -> Path:
    """Path of a stage's store in a run directory."""
    return Path(run_dir) / f"{stage}.zarr"


class Progress:
    """Progress lines on stderr: '[pmpipe <stage> <run_id>] <message> (<elapsed> s)', from
    process 0 only unless a line is meant for every process."""

    def __init__(self, stage: str, run_id: str, process: int = 0):
        self.prefix = f"[pmpipe {stage} {run_id}]"
        self.start = time.perf_counter()
        self.shown = process == 0

    def __call__(self, message: str, every_process: bool = False) -> None:
        if self.shown or every_process:
            elapsed = time.perf_counter() - self.start
            print(f"{self.prefix} {message} ({elapsed:.1f} s)", file=sys.stderr, flush=True)

    def step(self, i: int, total: int, a: float, elapsed: float) -> None:
        self(f"step {i}/{total} a = {a:.4f}")


def run_stage(stage: str, config_path: str | Path) -> Path:
    """Run one stage of the run described by config_path; returns the path of its store.

    Under srun or mpiexec with several processes, joins them first (parallel.start_processes);
    on CPU each process's share of the run's px * py devices comes from XLA_FLAGS (set here
    when absent, before JAX starts its backend). Then validates config.json.
    """
    import jax

    from pmpipe import config, parallel

    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}; the stages are {', '.join(STAGES)}")
    # validation itself runs JAX (lightcone geometry), so the processes and host devices are
    # set up from the file's pdims first, while the backend has not started
    raw = config.read_mapping(config_path)
    pdims = raw.get("config", {}).get("parallel", {}).get("pdims", (1, 1))
    valid = isinstance(pdims, list | tuple) and all(isinstance(p, int) and p > 0 for p in pdims)
    launcher, processes = parallel.start_processes(math.prod(pdims) if valid else 1)
    run_file = config.load_run_file(config_path)
    if run_file.config.nbody.dtype == "float64":
        jax.config.update("jax_enable_x64", True)
    module = importlib.import_module(f"pmpipe.stages.{stage}")
    progress = Progress(stage, run_file.run_id, jax.process_index())
    if processes > 1:
        progress(f"process {jax.process_index()} of {processes} ({launcher}): "
                 f"{jax.local_device_count()} local of {jax.device_count()} devices",
                 every_process=True)
    mesh = parallel.make_mesh(run_file.config.parallel.pdims)
    path = module.run(run_file, Path(config_path).parent, mesh, progress)
    progress(f"wrote {path}")
    return path


def run_checked(stage: str, config_path: str | Path) -> int:
    """:func:`run_stage` for command lines: bad input or missing inputs print one message
    naming the file and field and give exit status 2."""
    from pmpipe import config, painting, store

    try:
        run_stage(stage, config_path)
    except (config.ConfigError, store.IncompleteStoreError, painting.HaloError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


def main(stage: str, argv=None) -> int:
    """``python -m pmpipe.stages.<stage> CONFIG``."""
    parser = argparse.ArgumentParser(prog=f"python -m pmpipe.stages.{stage}",
                                     description=f"run the {stage} stage of one simulation")
    parser.add_argument("config", help="the run's config.json (results/<campaign>/<run_id>/config.json)")
    return run_checked(stage, parser.parse_args(argv).config)


def run_status(run_dir: str | Path) -> str:
    """'complete' when the store of each of the run's stages is complete, else '<last complete
    stage> done' or 'planned' (a store without its completion marker counts as absent). The
    stages come from the run's config.json (all of them when it is missing)."""
    from pmpipe import config, store

    config_path = Path(run_dir) / "config.json"
    stages = run_stages(config.load_run_file(config_path).config) if config_path.exists() else STAGES
    done = [s for s in stages if store.is_complete(store_path(run_dir, s))]
    if len(done) == len(stages):
        return "complete"
    return f"{done[-1]} done" if done else "planned"
