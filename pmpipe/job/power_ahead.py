"""The Boltzmann tables of a job's runs made ahead of them, on CPU threads of process 0, into
the linear power cache of their results folder (pmpipe.storage.power_cache)."""

from __future__ import annotations

import time
from pathlib import Path

from pmpipe.physics.theory.power_table import BOLTZMANN_KINDS
from pmpipe.run import derive
from pmpipe.runtime import log

LOG = log.get(__name__)


def _boltzmann_run(config_path: Path):
    """The run at ``config_path`` when its power.kind takes a Boltzmann table, else None (also
    when its run file does not load: its own run reports that)."""
    from pmpipe.run import files, validation

    try:  # not runner.load: the run in progress keeps its JAX settings
        run = validation.read_run_file(config_path).config
    except (files.ConfigError, OSError):
        return None
    return run if run.power.kind in BOLTZMANN_KINDS else None


def linear_power_ahead(config_path: Path) -> float:
    """Put the Boltzmann table of the run at ``config_path`` (power.kind 'camb' or 'class') into the cache
    of its results folder, computed on a miss; the seconds taken (0 for any other run)."""
    from pmpipe.storage import power_cache

    start = time.perf_counter()
    run = _boltzmann_run(config_path)
    if run is not None:
        power_cache.linear_table(derive.boltzmann_inputs(run), power_cache.folder_of(config_path))
    return time.perf_counter() - start


def table_key(config_path: Path) -> str | None:
    """The cache key of the Boltzmann table of the run at ``config_path`` (None when it takes
    none)."""
    from pmpipe.storage import power_cache

    run = _boltzmann_run(config_path)
    return None if run is None else power_cache.key(derive.boltzmann_inputs(run))


def await_ahead(ahead, path: Path, shared: bool) -> dict:
    """The record of the run's table made ahead (seconds to make it, 0 when an earlier run of
    the job shared it; seconds waited for it here); a failure is logged and left to the run's
    own setup, which makes it again."""
    start = time.perf_counter()
    try:
        made = 0.0 if shared else ahead.result()
    except Exception as err:  # noqa: BLE001  the run's setup computes the table itself and reports
        LOG.warning("[pmpipe] linear P(k) of %s not made ahead: %s", path.parent.name, err)
        made = None
    return {"run": path.parent.name, "seconds": made, "waited_s": time.perf_counter() - start}
