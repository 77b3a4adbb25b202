"""The Apptainer image this process runs in, if any: its path and its %labels."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

LABELS = Path("/.singularity.d/labels.json")  # where an Apptainer image keeps its %labels
REVISION = "org.opencontainers.image.revision"  # the label of pmpipe's git commit (containers/)


def current(environ: Mapping[str, str]) -> tuple[str | None, dict]:
    """(image path, labels) inside an Apptainer (or Singularity) container, else (None, {})."""
    path = environ.get("APPTAINER_CONTAINER") or environ.get("SINGULARITY_CONTAINER")
    if not path or not LABELS.is_file():
        return path, {}
    try:
        return path, json.loads(LABELS.read_text())
    except (OSError, ValueError):
        return path, {"error": f"{LABELS} could not be read as JSON"}
