"""A packed job whose runs overlap (``python -m pmpipe.job.pipeline --overlap``): each run's tail
(lensing, summaries) on a second thread while the next run's ICs and N-body go on. The job
record's timelines show it; the stores are those of the job without overlap, bit for bit; a
failed write fails its run only; a signal while runs overlap leaves every store complete or
absent, and the job started again ends like an uninterrupted one."""

import contextlib
import json
import os
import signal
import threading

import numpy as np
import pytest
import zarr
from conftest import TINY, same_store

from pmpipe import stages
from pmpipe.campaigns import campaign
from pmpipe.job import pipeline
from pmpipe.run import validation
from pmpipe.stages import registry
from pmpipe.storage import checkpoint, run_record, store, writes

pytestmark = pytest.mark.slow

WAIT_S = 120  # the longest a stage waits for the other run's (a job that does not overlap)


ONE_DEVICE = TINY.replace("pdims: [1, 2]", "pdims: [1, 1]")


def _runs(folder, text=ONE_DEVICE):
    """The two runs of the TINY campaign on one device each (``text``: the campaign file),
    their config.json files under folder/results."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tiny.yaml").write_text(text)
    return campaign.write_run_files(campaign.load(folder / "tiny.yaml"), folder / "results")


@pytest.fixture(scope="module")
def serial(tmp_path_factory):
    """The config.json files of TINY's two runs made by a job without overlap."""
    paths = _runs(tmp_path_factory.mktemp("serial"))
    assert [o.error for o in pipeline.run_all(paths)] == [None, None]
    return paths


def _arrays(run_dir):
    """Every array of a run's stores by (store, path), as numpy."""
    found = {}
    for stage in stages.STAGES:
        group = zarr.open_group(stages.store_path(run_dir, stage), mode="r")
        for path, array in group.arrays():
            found[stage, path] = np.asarray(array[...])
    return found


def _same_as_serial(paths, serial):
    for path, reference in zip(paths, serial, strict=True):
        made, expected = _arrays(path.parent), _arrays(reference.parent)
        assert made.keys() == expected.keys()
        for key, values in expected.items():
            np.testing.assert_array_equal(made[key], values, err_msg=str(key))


def _meeting(monkeypatch, paths, during=None):
    """Make run 0's summaries wait until run 1's N-body has begun, and run 1's N-body end
    only once run 0's summaries (its writes included) are done: they overlap in any job that
    overlaps runs, and a job that does not fails (TimeoutError). ``during()`` is called in run
    0's summaries once they overlap."""
    begun, done = threading.Event(), threading.Event()
    execute = registry.execute
    first, second = (p.parent.name for p in paths)

    def meeting(stage, setup, inputs, progress):
        run = setup.run_file.run_id
        if (run, stage) == (first, "summaries"):
            if not begun.wait(WAIT_S):
                raise TimeoutError("run 1's N-body did not begin during run 0's summaries")
            if during is not None:
                during()
            try:
                return execute(stage, setup, inputs, progress)
            finally:
                done.set()
        if (run, stage) == (second, "nbody"):
            begun.set()
            path = execute(stage, setup, inputs, progress)
            if not done.wait(WAIT_S):
                raise TimeoutError("run 0's summaries did not end during run 1's N-body")
            return path
        return execute(stage, setup, inputs, progress)

    monkeypatch.setattr(registry, "execute", meeting)


def test_a_runs_tail_and_its_writes_overlap_the_next_runs_n_body(serial, tmp_path, monkeypatch):
    paths = _runs(tmp_path)
    _meeting(monkeypatch, paths)
    report = tmp_path / "job.json"
    outcomes = pipeline.run_all(paths, report, overlap=True)
    assert [(o.error, o.stages) for o in outcomes] == [(None, stages.STAGES)] * 2
    runs = json.loads(report.read_text())["runs"]
    timeline = [{s["stage"]: s["timeline"] for s in run["stages"]} for run in runs]
    summaries, nbody = timeline[0]["summaries"], timeline[1]["nbody"]
    assert summaries["start"] < nbody["end"] and nbody["start"] < summaries["end"]
    assert summaries["writes"] and all(
        nbody["start"] < start <= end < nbody["end"] for start, end in summaries["writes"]
    )
    _same_as_serial(paths, serial)


def test_a_failed_write_of_a_runs_tail_fails_that_run_only(serial, tmp_path, monkeypatch):
    paths = _runs(tmp_path)
    _meeting(monkeypatch, paths)
    failing = writes.key_of_path(stages.store_path(paths[0].parent, "summaries"))
    write = writes._write

    def failing_write(array, selection, block):
        if writes.store_key(array) == failing:
            raise OSError("injected: no space left on device")
        return write(array, selection, block)

    monkeypatch.setattr(writes, "_write", failing_write)
    first, second = pipeline.run_all(paths, overlap=True)
    assert first.failed_stage == "summaries" and "injected: no space left" in first.error
    assert second.error is None and second.stages == stages.STAGES
    assert not store.is_complete(stages.store_path(paths[0].parent, "summaries"))
    assert run_record.read(paths[0].parent)["error"] == first.error  # its record says why
    assert run_record.read(paths[1].parent)["state"] == "done"
    _same_as_serial(paths[1:], serial[1:])


@pytest.mark.parametrize("signum", [signal.SIGUSR2, signal.SIGTERM])
def test_a_signal_while_runs_overlap_leaves_whole_stores_and_a_job_that_resumes(
    serial, tmp_path, monkeypatch, signum
):
    """The signal arrives in run 0's summaries while run 1's N-body goes on: both stages end
    (these runs keep no checkpoints: their N-body ends the stage in progress), and the job
    stops before run 1's tail; run 0 is complete and recorded done, run 1's tail absent. The
    job started again computes run 1's tail only and ends with the stores of the job that was
    never stopped."""
    paths = _runs(tmp_path)
    _meeting(monkeypatch, paths, during=lambda: os.kill(os.getpid(), signum))
    with pytest.raises(checkpoint.Preempted, match=signal.Signals(signum).name):
        pipeline.run_all(paths, overlap=True)
    complete = {
        (p.parent.name, s): store.is_complete(stages.store_path(p.parent, s))
        for p in paths
        for s in stages.STAGES
    }
    first, second = (p.parent.name for p in paths)
    assert complete == {
        **{(first, s): True for s in stages.STAGES},
        **{(second, s): s in ("ic", "nbody") for s in stages.STAGES},
    }
    assert run_record.read(paths[0].parent)["state"] == "done"
    monkeypatch.undo()
    again = pipeline.run_all(paths, overlap=True)
    assert [o.stages for o in again] == [(), ("lensing", "summaries")]
    _same_as_serial(paths, serial)


def test_a_signal_the_n_body_catches_stops_the_tail_under_way_before_its_next_stage(
    serial, tmp_path, monkeypatch
):
    """Runs with checkpoints: SIGUSR2 arrives while run 1's N-body listens with its own
    handlers and run 0's tail waits before its lensing. The N-body writes its checkpoint and
    stops; run 0's lensing ends and its summaries are not begun. The job started again makes
    run 0's summaries and resumes run 1 from its checkpoint: the stores are those of the job
    that was never stopped (to float32 rounding, as checkpoints promise)."""
    every = {"every_steps": 100}  # none but the one a signal asks for
    text = ONE_DEVICE.replace(
        "  nbody: {steps: 3}", f"  nbody: {{steps: 3}}\n  checkpoints: {every}"
    )
    paths = _runs(tmp_path, text)
    first, second = (p.parent.name for p in paths)
    listening, stopped = threading.Event(), threading.Event()
    schedule_listening = checkpoint.Schedule.listening

    evolutions: list = []

    @contextlib.contextmanager
    def announced(self, raise_after=True):  # the N-body's schedule raises after; the job's not
        with schedule_listening(self, raise_after) as schedule:
            evolutions.extend([self] if raise_after else [])
            if len(evolutions) == 2:  # run 1's
                listening.set()
            yield schedule

    execute = registry.execute

    def meeting(stage, setup, inputs, progress):
        run = setup.run_file.run_id
        if (run, stage) == (first, "lensing"):
            assert listening.wait(WAIT_S), "run 1's N-body did not begin during run 0's tail"
            os.kill(os.getpid(), signal.SIGUSR2)
            assert stopped.wait(WAIT_S), "run 1's N-body did not stop"
        if (run, stage) == (second, "nbody"):
            try:
                return execute(stage, setup, inputs, progress)
            except checkpoint.Preempted:
                stopped.set()
                raise
        return execute(stage, setup, inputs, progress)

    monkeypatch.setattr(checkpoint.Schedule, "listening", announced)
    monkeypatch.setattr(registry, "execute", meeting)
    with pytest.raises(checkpoint.Preempted, match="stopped by a signal after step"):
        pipeline.run_all(paths, overlap=True)
    complete = {
        (p.parent.name, s): store.is_complete(stages.store_path(p.parent, s))
        for p in paths
        for s in stages.STAGES
    }
    assert complete == {
        **{(first, s): s != "summaries" for s in stages.STAGES},
        **{(second, s): s == "ic" for s in stages.STAGES},
    }
    assert (
        checkpoint.newest(paths[1].parent, validation.read_run_file(paths[1]).config_hash)
        is not None
    )
    monkeypatch.undo()
    again = pipeline.run_all(paths, overlap=True)
    assert [o.stages for o in again] == [("summaries",), ("nbody", "lensing", "summaries")]
    for path, reference in zip(paths, serial, strict=True):
        for stage in stages.STAGES:
            same_store(
                stages.store_path(reference.parent, stage), stages.store_path(path.parent, stage)
            )


def test_runs_over_several_devices_do_not_overlap(tmp_path, capfd):
    """Runs on two devices go one after the other: run 0's summaries end before run 1 begins."""
    paths = _runs(tmp_path, TINY)
    report = tmp_path / "job.json"
    outcomes = pipeline.run_all(paths, report, overlap=True)
    assert [o.error for o in outcomes] == [None, None]
    assert "runs over 2 devices do not overlap" in capfd.readouterr().err
    runs = json.loads(report.read_text())["runs"]
    timeline = [{s["stage"]: s["timeline"] for s in run["stages"]} for run in runs]
    assert timeline[0]["summaries"]["end"] <= timeline[1]["ic"]["start"]
