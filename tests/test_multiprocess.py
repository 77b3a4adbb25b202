"""Several processes form one device mesh: the stages under `mpiexec -n 2` (MPICH from PyPI,
gloo collectives on CPU) write the same stores as one process, each process writing only its
own blocks."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import zarr

from pmpipe import config, parallel, stages

RUN = {"box": {"particles": 16, "box_size": 64.0}, "nbody": {"steps": 3, "snapshots": [0.5]},
       "parallel": {"pdims": [2, 2], "halo_cells": 4},
       "lightcone": {"z_max": 0.05, "plane_thickness": 32.0},
       "lensing": {"source_redshifts": [0.05], "flat_sky": {"field_of_view": 20.0, "pixels": 32},
                   "full_sky": {"nside": 8}},
       "summaries": {"shape_noise": {}, "kappa_range": [-0.01, 0.01]}}


def test_launcher_is_read_from_the_environment():
    assert parallel.launcher_processes({}) == ("single", 1)
    assert parallel.launcher_processes({"PMI_SIZE": "4", "PMI_RANK": "1"}) == ("mpi", 4)
    assert parallel.launcher_processes({"OMPI_COMM_WORLD_SIZE": "2"}) == ("mpi", 2)
    srun = {"SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "8", "SLURM_NTASKS": "8", "PMI_SIZE": "8"}
    assert parallel.launcher_processes(srun) == ("slurm", 8)
    assert parallel.launcher_processes({"SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "1"}) == ("single", 1)


def _run(stage, config_path, processes):
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # each process sets its share
    launcher = [shutil.which("mpiexec"), "-n", str(processes)] if processes > 1 else []
    out = subprocess.run([*launcher, sys.executable, "-m", f"pmpipe.stages.{stage}", str(config_path)],
                         capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    return out.stderr


def test_two_processes_write_the_stores_of_one(tmp_path):
    assert shutil.which("mpiexec"), "mpiexec missing: pip install mpich mpi4py (the [test] extra)"
    run = config.Run.model_validate(RUN)
    paths = {}
    for processes in (1, 2):
        run_dir = tmp_path / f"p{processes}"
        run_dir.mkdir()
        paths[processes] = run_dir / "config.json"
        paths[processes].write_text(config.RunFile.build("mp", run_dir.name, 0, {}, run).to_json())
        for stage in stages.run_stages(run):
            log = _run(stage, paths[processes], processes)
            if processes == 2:
                assert "process 1 of 2 (mpi): 2 local of 4 devices" in log
    for stage in stages.run_stages(run):
        one = zarr.open_group(tmp_path / "p1" / f"{stage}.zarr", mode="r")
        two = zarr.open_group(tmp_path / "p2" / f"{stage}.zarr", mode="r")
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
    assert json.loads(paths[2].read_text())["config"]["parallel"]["pdims"] == [2, 2]


def test_devices_must_divide_among_processes(monkeypatch):
    monkeypatch.setenv("PMI_SIZE", "3")
    with pytest.raises(ValueError, match="3 processes cannot share evenly"):
        parallel.start_processes(4)
