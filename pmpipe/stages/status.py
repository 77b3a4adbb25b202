"""Which stores of a run are complete, and which stages a job must compute."""

from __future__ import annotations

from pathlib import Path

from pmpipe.run import config, validation
from pmpipe.runtime import log
from pmpipe.stages import run_stages, store_path
from pmpipe.stages.inputs import left_out

LOG = log.get(__name__)


def is_current(path: str | Path, config_hash: str) -> bool:
    """Whether the store at path is complete, intact (the quick check) and current: made from
    the config ``config_hash`` and from the run's stores as they are."""
    from pmpipe.storage import store

    return not store.problems(path, config_hash=config_hash)


def run_config_hash(path: str | Path) -> str | None:
    """The config hash of the run the store at path belongs to (its folder's config.json), or
    None for a store outside a run folder or beside a config.json that does not load."""
    config_path = Path(path).parent / "config.json"
    if not config_path.is_file():
        return None
    try:
        return validation.read_run_file(config_path).config_hash
    except (config.ConfigError, ValueError) as err:
        LOG.warning("%s: not checked against its run (%s)", path, err)
        return None


def pending_stages(run, config_hash: str, run_dir: str | Path) -> tuple[str, ...]:
    """The stages of ``run`` (config.Run) from the first whose store is not complete or was made
    from another config to the last, or from an earlier one whose store leaves out what one of
    them reads (config.Outputs, inputs.left_out): those a job must compute. Empty when the run
    is complete."""
    names = run_stages(run)
    first = next(
        (i for i, s in enumerate(names) if not is_current(store_path(run_dir, s), config_hash)),
        len(names),
    )
    while needed := [i for i in range(first) if left_out(names[i], names[first:], run)]:
        first = needed[0]
    return names[first:]
