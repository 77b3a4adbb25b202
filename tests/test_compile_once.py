"""Compile once per campaign: a process running runs of the same sizes as an earlier one, with
other cosmologies, seeds and a_init, compiles no XLA program (counted by pmpipe.compilation from
JAX's monitoring events), through `pmpipe run all` and through a packed job, also when the
cache folder was copied to another path."""

import json
import os
import shutil
import subprocess
import sys

import yaml
from conftest import TINY

from pmpipe import config

COSMOLOGIES = [  # Omega_m, sigma8, h, n_s, w0, wa: every run differs in all of them
    {"Omega_m": 0.30, "sigma8": 0.80, "h": 0.67, "n_s": 0.96, "w0": -1.0, "wa": 0.0},
    {"Omega_m": 0.32, "sigma8": 0.83, "h": 0.70, "n_s": 0.98, "w0": -0.9, "wa": 0.1},
    {"Omega_m": 0.29, "sigma8": 0.78, "h": 0.65, "n_s": 0.95, "w0": -1.1, "wa": -0.1},
    {"Omega_m": 0.31, "sigma8": 0.85, "h": 0.69, "n_s": 0.97, "w0": -0.95, "wa": 0.05},
]


def _run_files(results):
    """Four runs of the TINY campaign's size, each with its own cosmology, seed and a_init."""
    base = yaml.safe_load(TINY)["base"]
    base["parallel"]["halo_cells"] = 6  # room for the most clustered of the cosmologies
    paths = []
    for i, cosmology in enumerate(COSMOLOGIES):
        data = {**base, "cosmology": cosmology, "ic": {"seed": 11 + i, "a_init": 0.1 + 0.01 * i}}
        run = config.Run.model_validate(data)
        path = results / "compile" / f"run{i}" / "config.json"
        path.parent.mkdir(parents=True)
        path.write_text(config.RunFile.build("compile", f"run{i}", i, {}, run).to_json())
        paths.append(path)
    return paths


def _start(paths, report, cache):
    """The job process (pmpipe.stages.pipeline) of the runs ``paths``, started; its output
    goes to ``report`` with the suffix .log."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    with open(report.with_suffix(".log"), "w") as log:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pmpipe.stages.pipeline",
                "--report",
                str(report),
                *map(str, paths),
            ],
            stdout=log,
            stderr=log,
            env={**env, "JAX_COMPILATION_CACHE_DIR": str(cache)},
        )


def _record(process, report):
    """The record a job process from :func:`_start` wrote to ``report``, once it finished."""
    try:
        process.wait(timeout=600)
    finally:
        process.kill()
    assert process.returncode == 0, report.with_suffix(".log").read_text()[-3000:]
    return json.loads(report.read_text())


def _job(paths, report, cache):
    return _record(_start(paths, report, cache), report)


def test_a_second_process_of_the_same_sizes_compiles_nothing(tmp_path):
    paths = _run_files(tmp_path / "results")
    cache = tmp_path / "cache"
    first = _job(paths[:1], tmp_path / "first.json", cache)
    assert first["compilation"]["compiled"] > 0 and first["compilation"]["cache_hits"] == 0
    cache = shutil.copytree(cache, tmp_path / "elsewhere" / "cache")  # the cache moved
    # pmpipe run all of one run, and a packed job of two runs, side by side (both only read)
    jobs = {
        name: (_start(runs, tmp_path / f"{name}.json", cache), tmp_path / f"{name}.json")
        for name, runs in (("second", paths[1:2]), ("packed", paths[2:]))
    }
    second, packed = (_record(*jobs[name]) for name in ("second", "packed"))
    assert second["compilation"]["compiled"] == 0, second["compilation"]
    assert second["compilation"]["cache_hits"] == first["compilation"]["programs"]
    assert packed["compilation"]["compiled"] == 0, packed["compilation"]
    assert packed["compilation"]["cache_hits"] == first["compilation"]["programs"]
    later = packed["runs"][1]["stages"]  # the job's second run: every program in memory
    assert sum(s["compilation"]["programs"] for s in later) == 0, later
