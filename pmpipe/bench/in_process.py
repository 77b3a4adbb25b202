"""The benchmarks' runs made in this process: a run's config.json written in a campaign folder
of a results folder, which then keeps the runs' power cache (pmpipe.storage.power_cache), and
its stages run one by one, each timed."""

from __future__ import annotations

import time
from pathlib import Path


def run_stages(
    run, results: str | Path, campaign: str, name: str, index: int = 0, only: int | None = None
) -> tuple[Path, dict[str, float]]:
    """Write ``run`` (config.Run) as results/<campaign>/<name>/config.json (the campaign's
    run number ``index``) and run its stages (the first ``only``; None: all) in this process; the run's
    folder and each stage's seconds."""
    from pmpipe import stages
    from pmpipe.run import config
    from pmpipe.stages import registry

    folder = Path(results) / campaign / name
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "config.json"
    path.write_text(config.RunFile.build(campaign, name, index, {}, run).to_json())
    seconds = {}
    for stage in stages.run_stages(run)[:only]:
        start = time.perf_counter()
        registry.run_stage(stage, path)
        seconds[stage] = time.perf_counter() - start
    return folder, seconds
