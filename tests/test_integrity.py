"""Every byte a reader depends on is covered: a random byte of a random file of a finished run's
stores and kept checkpoints, changed, is found by verify's check (`store.problems` with
checksums), or leaves the store reading exactly as before (whitespace of the root's JSON)."""

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from pmpipe.run import config
from pmpipe.stages import registry
from pmpipe.storage import store

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> tuple[Path, list[Path]]:
    """A run of 16^3 particles with every stage done and its two last checkpoints kept; its
    stores and every file in them."""
    run = config.Run.model_validate(
        {
            "box": {"particles": 16, "box_size": 64.0},
            "nbody": {"steps": 4, "snapshots": [0.5]},
            "outputs": {"ic": "all"},
            "checkpoints": {"every_steps": 2, "keep": True},
        }
    )
    path = tmp_path_factory.mktemp("integrity") / "run" / "config.json"
    path.parent.mkdir()
    path.write_text(config.RunFile.build("integrity", "run", 0, {}, run).to_json())
    for stage in ("ic", "nbody", "summaries"):
        registry.run_stage(stage, path)
    stores = store.stores_under(path.parent)
    assert len(stores) == 5  # ic, nbody, summaries and two checkpoints
    files = sorted(f for s in stores for f in s.rglob("*") if f.is_file())
    return path.parent, files


def _store_of(file: Path, stores) -> Path:
    return next(s for s in stores if s in file.parents)


@settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    which=st.integers(0, 10**6), where=st.floats(0, 1, exclude_max=True), mask=st.integers(1, 255)
)
def test_a_changed_byte_anywhere_in_a_finished_runs_stores_is_found(
    finished_run, which, where, mask
):
    run_dir, files = finished_run
    stores = store.stores_under(run_dir)
    file = files[which % len(files)]
    original = file.read_bytes()
    at = int(where * len(original))
    changed = bytearray(original)
    changed[at] ^= mask
    file.write_bytes(bytes(changed))
    try:
        found = store.problems(_store_of(file, stores), checksums=True)
    finally:
        file.write_bytes(original)
    if found:
        event("found")
        return
    # the one change left unseen: one that leaves the root metadata the same JSON document
    assert file.name == "zarr.json" and file.parent in stores, (file, at, mask)
    assert json.loads(bytes(changed)) == json.loads(original), (file, at, mask)
    event("same document")


def test_the_finished_run_is_intact(finished_run):
    run_dir, _ = finished_run
    assert all(store.problems(s, checksums=True) == [] for s in store.stores_under(run_dir))
