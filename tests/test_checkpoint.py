"""N-body checkpoints: a run killed (SIGKILL) or stopped by a signal (SIGUSR2, SIGTERM) mid
N-body resumes from its last checkpoint and ends with the stores of an uninterrupted run; a
checkpoint of another config is not resumed from."""

import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
import zarr
from conftest import job_env

from pmpipe import stages
from pmpipe.run import config
from pmpipe.stages import registry
from pmpipe.storage import checkpoint, store

RUN = {
    "box": {"box_size": 128.0, "particles": 32, "oversample": 2},
    "nbody": {"steps": 16, "snapshots": [0.5]},
    "parallel": {"pdims": [1, 2], "halo_cells": 8},
    "lightcone": {"z_max": 0.1, "plane_thickness": 64.0},
    "lensing": {
        "source_redshifts": [0.1],
        "flat_sky": {"field_of_view": 10.0, "pixels": 16},
        "full_sky": {"nside": 8},
    },
    "checkpoints": {"every_steps": 3},
}
COMPARED = ("displacement", "momentum", "density", "lightcone_density", "lightcone_healpix")


def _write_run(run_dir, **changes):
    data = {**RUN, **changes}
    run_dir.mkdir(parents=True)
    path = run_dir / "config.json"
    path.write_text(
        config.RunFile.build("ckpt", run_dir.name, 0, {}, config.Run.model_validate(data)).to_json()
    )
    return path


def _stage(stage, path, **kwargs):
    env = job_env()
    return subprocess.Popen(
        [sys.executable, "-m", f"pmpipe.stages.{stage}", str(path)],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )


def _wait_for_checkpoint(run_dir, process, timeout=300):
    """Return once the run holds a complete checkpoint (the process still running)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if any(store.is_complete(p) for p in (run_dir / checkpoint.FOLDER).glob("*.zarr")):
            return
        assert process.poll() is None, process.stderr.read()[-3000:]
        time.sleep(0.05)
    raise AssertionError("no checkpoint was written")


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The ICs (shared by copying) and an uninterrupted nbody stage with checkpoints, run as
    the runs it is compared with are (a process of its own: the same devices)."""
    run_dir = tmp_path_factory.mktemp("checkpoint") / "reference"
    path = _write_run(run_dir)
    registry.run_stage("ic", path)
    done = _stage("nbody", path)
    _, err = done.communicate(timeout=600)
    assert done.returncode == 0, err[-3000:]
    assert not (run_dir / checkpoint.FOLDER).exists()  # removed once nbody.zarr is complete
    return run_dir


def _copy_ics(reference, run_dir, **changes):
    import shutil

    path = _write_run(run_dir, **changes)
    shutil.copytree(reference / "ic.zarr", run_dir / "ic.zarr")
    return path


def _assert_same_stores(a, b, rtol=0.0):
    """The nbody stores of two runs hold the same arrays: bitwise by default."""
    x, y = (zarr.open_group(d / "nbody.zarr", mode="r") for d in (a, b))
    for name in COMPARED:
        u, v = np.asarray(x[name][:], np.float64), np.asarray(y[name][:], np.float64)
        assert np.max(np.abs(u - v)) <= rtol * np.max(np.abs(u)), name


@pytest.mark.slow
@pytest.mark.parametrize("how", ["SIGKILL", "SIGUSR2"])
def test_interrupted_run_resumes_from_its_checkpoint_and_ends_like_an_uninterrupted_one(
    reference, tmp_path, how
):
    run_dir = tmp_path / "run"
    path = _copy_ics(reference, run_dir)
    first = _stage("nbody", path)
    _wait_for_checkpoint(run_dir, first)
    first.send_signal(getattr(signal, how))
    _, err = first.communicate(timeout=300)
    if how == "SIGKILL":
        assert first.returncode == -signal.SIGKILL
    else:  # the step in progress ends, a checkpoint is written, the exit status says so
        assert first.returncode == checkpoint.PREEMPTED_EXIT, err[-3000:]
        assert "preempted: stopped by a signal after step" in err
    assert not store.is_complete(run_dir / "nbody.zarr")
    second = _stage("nbody", path)
    _, err = second.communicate(timeout=600)
    assert second.returncode == 0, err[-3000:]
    assert "resumed after step" in err
    _assert_same_stores(reference, run_dir)
    assert not (run_dir / checkpoint.FOLDER).exists()


@pytest.mark.slow
def test_checkpoints_change_no_result_and_another_configs_checkpoint_is_not_used(
    reference, tmp_path, capfd
):
    """Without checkpoints (one program for all steps) the stores agree to float32 rounding;
    a checkpoint of another config in the run folder is reported and left alone."""
    import shutil

    plain = tmp_path / "plain"
    path = _copy_ics(reference, plain, checkpoints=None)
    registry.run_stage("nbody", path)
    _assert_same_stores(reference, plain, rtol=1e-5)

    other = tmp_path / "other"
    path = _copy_ics(reference, other, checkpoints={"every_steps": 5, "keep": True})
    registry.run_stage("nbody", path)  # keep: the last checkpoint stays
    kept = sorted((other / checkpoint.FOLDER).glob("*.zarr"))
    assert [p.name for p in kept] == ["nbody-step00010.zarr", "nbody-step00015.zarr"]
    changed = tmp_path / "changed"  # another config: its own ICs, the checkpoint of `other`
    path = _write_run(changed, nbody={**RUN["nbody"], "snapshots": [0.6]})
    registry.run_stage("ic", path)
    shutil.copytree(other / checkpoint.FOLDER, changed / checkpoint.FOLDER)
    capfd.readouterr()
    registry.run_stage("nbody", path)
    err = capfd.readouterr().err
    assert "not resumed from" in err and "resumed after step" not in err, err[-3000:]


@pytest.mark.slow
def test_a_damaged_checkpoint_is_removed_and_the_run_resumes_from_the_one_before(
    reference, tmp_path
):
    """One byte flipped in the newest checkpoint's particles: the run says so, removes it,
    resumes from the checkpoint before and ends bitwise like an uninterrupted run."""
    import shutil

    kept = tmp_path / "kept"
    done = _stage("nbody", _copy_ics(reference, kept, checkpoints={"every_steps": 5, "keep": True}))
    _, err = done.communicate(timeout=600)
    assert done.returncode == 0, err[-3000:]
    run_dir = tmp_path / "run"
    path = _copy_ics(reference, run_dir)
    shutil.copytree(kept / checkpoint.FOLDER, run_dir / checkpoint.FOLDER)
    newest = run_dir / checkpoint.FOLDER / "nbody-step00015.zarr"
    chunk = next(f for f in sorted((newest / "disp" / "c").rglob("*")) if f.is_file())
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0x40
    chunk.write_bytes(bytes(data))
    done = _stage("nbody", path)
    _, err = done.communicate(timeout=600)
    assert done.returncode == 0, err[-3000:]
    assert "nbody-step00015.zarr is damaged (shard disp/c/" in err, err[-3000:]
    assert "resumed after step 10 of" in err
    _assert_same_stores(reference, run_dir)


def test_checkpoints_need_a_schedule():
    with pytest.raises(config.ConfigError, match="checkpoints needs every_steps or every_minutes"):
        config.validate(config.Run, {**RUN, "checkpoints": {"keep": True}}, "x.yaml")
    run = config.Run.model_validate(RUN)
    assert config.config_hash(run) == config.config_hash(
        run.model_copy(update={"checkpoints": None})
    )


def test_a_signal_during_the_processes_exchange_stops_them_at_the_next(monkeypatch):
    """stop_requested is a collective: a signal that arrives while the processes exchange what
    they caught is not part of that exchange, and is not lost either."""
    from jax.experimental import multihost_utils

    exchanged = []

    def allgather(value):  # two processes; SIGUSR2 reaches this one during the first exchange
        exchanged.append(int(value))
        if len(exchanged) == 1:
            os.kill(os.getpid(), signal.SIGUSR2)
        return np.array([value, 0], np.int32)

    monkeypatch.setattr(jax, "process_count", lambda: 2)
    monkeypatch.setattr(multihost_utils, "process_allgather", allgather)
    schedule = checkpoint.Schedule(every_steps=10)
    with schedule.listening(raise_after=False):
        assert not schedule.stop_requested()  # both sent 0: neither stops
        assert schedule.stop_requested() and schedule.signalled == signal.SIGUSR2
    assert exchanged == [0, signal.SIGUSR2]


def test_a_signal_after_the_last_step_raises_on_leaving_and_handlers_come_back():
    before = signal.getsignal(signal.SIGTERM)
    schedule = checkpoint.Schedule(every_steps=10)
    with (
        pytest.raises(checkpoint.Preempted, match="SIGTERM arrived after the last step") as got,
        schedule.listening(),
    ):
        os.kill(os.getpid(), signal.SIGUSR2)
        os.kill(os.getpid(), signal.SIGTERM)
    assert got.value.signum == signal.SIGTERM  # SIGTERM over SIGUSR2
    assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.slow
def test_a_signal_outside_the_n_body_stops_a_packed_job_before_its_next_stage(tmp_path):
    """Runs without checkpoints: SIGUSR2 while the first run's N-body goes on ends the stage in
    progress, and the job (exit status 3) before the next stage; started again, the job does
    only what is missing."""
    paths = [
        _write_run(tmp_path / f"packed-r{i}", checkpoints=None, lensing=None, lightcone=None)
        for i in range(2)
    ]
    env = job_env()
    job = [sys.executable, "-m", "pmpipe.job.pipeline", *map(str, paths)]
    first = subprocess.Popen(job, env=env, stderr=subprocess.PIPE, text=True)
    ics = stages.store_path(paths[0].parent, "ic")
    end = time.monotonic() + 300
    while not store.is_complete(ics) and time.monotonic() < end:
        assert first.poll() is None, first.stderr.read()[-3000:]
        time.sleep(0.05)
    first.send_signal(signal.SIGUSR2)
    _, err = first.communicate(timeout=300)
    assert first.returncode == checkpoint.PREEMPTED_EXIT, err[-3000:]
    assert "preempted: SIGUSR2 arrived: stopped before stage" in err
    assert not stages.store_path(paths[1].parent, "ic").exists()  # the second run never began
    made = zarr.open_group(ics, mode="r").attrs["finished"]
    second = subprocess.run(job, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert second.returncode == 0, second.stderr[-3000:]
    assert zarr.open_group(ics, mode="r").attrs["finished"] == made  # not made again
    for path in paths:
        assert all(
            store.is_complete(stages.store_path(path.parent, s))
            for s in ("ic", "nbody", "summaries")
        )


def test_a_checkpoint_holds_the_state_it_was_written_from(tmp_path):
    """A checkpoint of a small run's state before its first step, written then read back as
    a stage finds it (the newest complete one of its config), equals that state."""
    import jax

    from pmpipe.physics.evolution import particle_mesh
    from pmpipe.run import derive, validation
    from pmpipe.runtime import parallel

    run_dir = tmp_path / "run"
    small = {"box": {"box_size": 64.0, "particles": 8, "oversample": 2}, "nbody": {"steps": 2}}
    run_file = validation.load_run_file(_write_run(run_dir, **small))
    setup = derive.setup(run_file, parallel.make_mesh(run_file.config.parallel.pdims))
    init = derive.initial_conditions(setup)
    state = particle_mesh.start_state(
        setup.cosmology, init.disp, init.mom, setup.timeline, setup.grid
    )
    written = checkpoint.write(run_dir, run_file, setup.grid.mesh, state, 1, 0.55)
    assert checkpoint.newest(run_dir, run_file.config_hash) == written
    assert checkpoint.newest(run_dir, "sha256:another") is None
    like = jax.eval_shape(lambda s: s, state)
    back, step = checkpoint.read(written, setup.grid.mesh, like)
    assert step == 1
    for name in ("disp", "mom", "snaps", "needed", "trouble"):
        np.testing.assert_array_equal(
            np.asarray(getattr(back, name)), np.asarray(getattr(state, name))
        )


def test_a_checkpoint_written_with_nan_stops_the_run_naming_it(tmp_path):
    """A checkpoint whose particles hold a NaN (written so: its checksums match) stops the
    N-body before any step, naming the checkpoint rather than a step it never made."""
    from pmpipe.physics.evolution import particle_mesh
    from pmpipe.run import derive, validation
    from pmpipe.runtime import parallel

    run_dir = tmp_path / "run"
    small = {"box": {"box_size": 64.0, "particles": 8, "oversample": 2}, "nbody": {"steps": 4}}
    path = _write_run(run_dir, **small, lightcone=None, lensing=None)
    registry.run_stage("ic", path)
    run_file = validation.load_run_file(path)
    setup = derive.setup(run_file, parallel.make_mesh(run_file.config.parallel.pdims))
    init = derive.initial_conditions(setup)
    state = particle_mesh.start_state(
        setup.cosmology, init.disp, init.mom, setup.timeline, setup.grid
    )
    state = state._replace(mom=state.mom.at[1, 2, 3, 0].set(np.nan))
    a = float(setup.timeline.bounds[2])
    written = checkpoint.write(run_dir, run_file, setup.grid.mesh, state, 2, a)
    assert store.problems(written, checksums=True) == []
    with pytest.raises(
        particle_mesh.NumericalError, match="holds NaN or Inf before the evolution"
    ) as err:
        registry.run_stage("nbody", path)
    assert str(written) in str(err.value) and f"a = {a:.4g}" in str(err.value)
    assert not store.has_marker(run_dir / "nbody.zarr")
