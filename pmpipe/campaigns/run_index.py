"""A campaign's run index, ``<results>/<campaign>/.pmpipe/runs.json``: its name, the stages of
its runs and its run ids by job, written when its runs are prepared (campaign.write_run_files),
so that ``pmpipe status`` reads them without expanding the campaign."""

from __future__ import annotations

import json
from pathlib import Path

from pmpipe.run import config

STATE_FOLDER = ".pmpipe"  # pmpipe's bookkeeping in a campaign's results folder
INDEX = f"{STATE_FOLDER}/runs.json"


def write(campaign_dir: str | Path, name: str, run_stages, jobs: dict[str, list[str]]) -> Path:
    """Write the index of campaign ``name`` (its runs' stages; ``jobs``: job name -> run ids,
    in design order), leaving the file untouched when its content is unchanged."""
    path = Path(campaign_dir) / INDEX
    text = json.dumps({"campaign": name, "stages": list(run_stages), "jobs": jobs}, indent=1)
    if not path.exists() or path.read_text() != text + "\n":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")
    return path


def read(campaign_dir: str | Path) -> dict:
    """The index of the campaign whose results folder is ``campaign_dir``; ConfigError naming
    the folder when there is none."""
    try:
        return json.loads((Path(campaign_dir) / INDEX).read_text())
    except (OSError, ValueError):
        raise config.ConfigError(
            f"{campaign_dir}: no readable campaign index {INDEX}: give the results folder of a "
            "campaign whose runs were prepared (by the workflow or pmpipe submit)"
        ) from None
