"""Several processes form one device mesh: the stages under `mpiexec -n 2` (MPICH from PyPI,
gloo collectives on CPU) and under `srun -n 2` on the test SLURM cluster write the same stores
as one process, each process writing only its own blocks."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import zarr
from conftest import job_env, made_once

from pmpipe.run import config
from pmpipe.runtime import parallel
from pmpipe.stages import registry

RUN = {
    "box": {"particles": 16, "box_size": 64.0},
    "nbody": {"steps": 3, "snapshots": [0.5]},
    "parallel": {"pdims": [1, 2], "halo_cells": 4},
    "lightcone": {"z_max": 0.05, "plane_thickness": 32.0},
    "lensing": {
        "source_redshifts": [0.05],
        "flat_sky": {"field_of_view": 20.0, "pixels": 32},
        "full_sky": {"nside": 8},
    },
    "summaries": {"shape_noise": {}, "kappa_range": [-0.01, 0.01]},
}


def test_launcher_is_read_from_the_environment():
    assert parallel.launcher_processes({}) == ("single", 1)
    assert parallel.launcher_processes({"PMI_SIZE": "4", "PMI_RANK": "1"}) == ("mpi", 4)
    assert parallel.launcher_processes({"OMPI_COMM_WORLD_SIZE": "2"}) == ("mpi", 2)
    srun = {"SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "8", "SLURM_NTASKS": "8", "PMI_SIZE": "8"}
    assert parallel.launcher_processes(srun) == ("slurm", 8)
    assert parallel.launcher_processes({"SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "1"}) == (
        "single",
        1,
    )


def _run(stage, config_path, launcher=()):
    env = job_env()  # each process sets its share
    out = subprocess.run(
        [*launcher, sys.executable, "-m", f"pmpipe.stages.{stage}", str(config_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    return out.stderr


def _write_config(run_dir, pdims=(1, 2)):
    run_dir.mkdir()
    path = run_dir / "config.json"
    run = config.Run.model_validate({**RUN, "parallel": {**RUN["parallel"], "pdims": list(pdims)}})
    path.write_text(config.RunFile.build("mp", run_dir.name, 0, {}, run).to_json())
    return path


@pytest.fixture(scope="session")  # the SLURM worker's srun tests and the others' share it
def one_process_stores():
    """ic and nbody of RUN in one process (the first worker that asks, on 2 of its host
    devices): the reference stores."""
    with made_once("one_process_stores") as (folder, make):
        if make:
            path = _write_config(folder / "p1")
            for stage in ("ic", "nbody"):
                registry.run_stage(stage, path)
    return folder / "p1"


def _assert_same_stores(one_dir, two_dir, stage_names):
    for stage in stage_names:
        one = zarr.open_group(one_dir / f"{stage}.zarr", mode="r")
        two = zarr.open_group(two_dir / f"{stage}.zarr", mode="r")
        assert "pmpipe_complete" in two.attrs and two.attrs["process_count"] == 2
        assert sorted(one.array_keys()) == sorted(two.array_keys())
        for name in one.array_keys():
            x, y = one[name][:], two[name][:]
            if x.dtype.kind not in "fc":
                assert np.array_equal(x, y), (stage, name)
                continue
            assert np.array_equal(np.isnan(x), np.isnan(y)), (stage, name)
            scale = max(float(np.nanmax(np.abs(x))), 1e-30)
            assert np.nanmax(np.abs(x - y)) <= 1e-5 * scale, (stage, name)


_SHARDED_SUM = """
import json, sys
import jax.numpy as jnp
from pmpipe.runtime import compilation, parallel
parallel.use_compilation_cache(sys.argv[1])
parallel.start_processes(4)
import jax
from jax.sharding import NamedSharding, PartitionSpec
sharding = NamedSharding(jax.make_mesh((4,), ("x",)), PartitionSpec("x"))
def total(a):
    return jnp.sin(a).sum()
x = jax.make_array_from_callback((8,), sharding, lambda i: jnp.arange(8.0)[i])
with compilation.CompileCounter() as counter:
    jax.jit(total, in_shardings=sharding)(x).block_until_ready()
with open(f"{sys.argv[2]}/{jax.process_index()}.json", "w") as out:
    json.dump(counter.counts.compiled_names, out)
"""


@pytest.mark.slow
def test_every_process_of_a_cpu_job_finds_its_programs_in_the_persistent_cache(tmp_path):
    """Process 0 writes a program to the cache; in the next job every process loads it (JAX's
    key holds each process's own CPU topology; pmpipe.runtime.parallel puts one that all
    processes share in its place)."""
    cache, env = str(tmp_path / "cache"), job_env()
    env.pop("JAX_COMPILATION_CACHE_DIR", None)  # not the session's: a cache of its own
    jobs = []
    for job in ("first", "second"):
        (tmp_path / job).mkdir()  # each process writes the names of the programs it compiled
        out = subprocess.run(
            [shutil.which("mpiexec"), "-n", "2"]
            + [sys.executable, "-c", _SHARDED_SUM, cache, str(tmp_path / job)],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
        assert out.returncode == 0, out.stderr[-4000:]
        jobs.append([json.loads((tmp_path / job / f"{p}.json").read_text()) for p in (0, 1)])
    # process 1 of the first job compiles it too, unless process 0 has written it already
    assert jobs[0][0] == ["jit(total)"] and jobs[0][1] in (["jit(total)"], []), jobs[0]
    assert jobs[1] == [[], []]


@pytest.mark.slow
def test_two_processes_under_mpiexec_write_the_stores_of_one(one_process_stores, tmp_path):
    """ic and nbody; lensing and summaries on 2 processes: tests/test_slurm.py (submit)."""
    assert shutil.which("mpiexec"), "mpiexec missing: pip install mpich mpi4py (the [test] extra)"
    path = _write_config(tmp_path / "p2")
    names = ("ic", "nbody")
    for stage in names:
        log = _run(stage, path, [shutil.which("mpiexec"), "-n", "2"])
        assert "process 1 of 2 (mpi): 1 local of 2 devices" in log
        assert log.count(" wrote ") == 1  # progress from process 0 only
    _assert_same_stores(one_process_stores, path.parent, names)
    assert json.loads(path.read_text())["config"]["parallel"]["pdims"] == [1, 2]


@pytest.mark.slow
def test_two_processes_of_two_devices_each_write_the_stores_of_one(one_process_stores, tmp_path):
    """One process per node with several devices: pdims (2, 2) over 2 processes under
    mpiexec, each holding 2 host devices, against one process on (1, 2)."""
    path = _write_config(tmp_path / "p2x2", pdims=(2, 2))
    for stage in ("ic", "nbody"):
        log = _run(stage, path, [shutil.which("mpiexec"), "-n", "2"])
        assert "process 1 of 2 (mpi): 2 local of 4 devices" in log
    _assert_same_stores(one_process_stores, path.parent, ("ic", "nbody"))


@pytest.mark.slow
@pytest.mark.parametrize(
    "binding",
    [(), ("--gres=gpu:2",), ("--gpus-per-task=1",)],
    ids=["no-gpus", "gres", "gpus-per-task"],
)
def test_two_processes_under_srun_write_the_stores_of_one(
    slurm, one_process_stores, tmp_path, binding
):
    """The ICs under each binding of the test cluster's 2 (fake) GPUs that a CPU cluster can
    express (none, both to each task, one per task); the device ids each gets:
    tests/test_doctor.py. Every stage of 2 processes under srun: tests/test_slurm.py."""
    path = _write_config(tmp_path / "p2")
    log = _run("ic", path, ["srun", "-n", "2", "-p", "pmpipe", "-t", "10", *binding])
    assert "process 1 of 2 (slurm): 1 local of 2 devices" in log
    _assert_same_stores(one_process_stores, path.parent, ("ic",))


@pytest.mark.parametrize("processes", [3, 5])
def test_processes_hold_equal_shares_of_the_devices(monkeypatch, processes):
    monkeypatch.setenv("PMI_SIZE", str(processes))
    with pytest.raises(
        ValueError,
        match=f"needs 4 devices but {processes} processes were "
        "launched; each process holds an equal share",
    ):
        parallel.start_processes(4)


def _rank_pid(config_path, rank: int) -> int | None:
    """The pid of the stage process of ``rank`` (PMI_RANK) running ``config_path``."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if str(config_path).encode() in cmdline and f"PMI_RANK={rank}".encode() in environ:
            return int(entry.name)
    return None


def test_a_process_that_dies_ends_its_partner_within_two_minutes(tmp_path):
    """Under mpiexec -n 2, rank 1 killed (SIGKILL) once both have joined: rank 0 does not wait
    in its next collective until the job's time limit."""
    path = _write_config(tmp_path / "lost")
    env = job_env()
    launcher = subprocess.Popen(
        [shutil.which("mpiexec"), "-n", "2", sys.executable, "-m", "pmpipe.stages.ic", str(path)],
        env=env,
        text=True,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        lines = []
        for line in launcher.stderr:  # both processes have joined once rank 1 says so
            lines.append(line)
            if "process 1 of 2" in line:
                break
        victim = _rank_pid(path, 1)
        assert victim, "".join(lines)[-3000:]
        os.kill(victim, signal.SIGKILL)
        start = time.monotonic()
        launcher.communicate(timeout=120)
        assert launcher.returncode != 0
        assert time.monotonic() - start < 120
        assert not (path.parent / "ic.zarr" / "zarr.json").exists() or not zarr.open_group(
            path.parent / "ic.zarr", mode="r"
        ).attrs.get("pmpipe_complete")
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
