"""Compile once: runs of one size with other cosmologies, seeds and a_init reuse the compiled
programs, in the same process (in-memory caches, with the results of programs compiled for
another run) and in a new job process (persistent cache, also when the cache folder was copied
to another path, through `pmpipe run all` and through a packed job); the counts come from
pmpipe.runtime.compilation (JAX's monitoring events)."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import jax
import numpy as np
import pytest
import yaml
from conftest import TINY, job_env

from pmpipe.run import config
from pmpipe.runtime import compilation

# ICs + 2LPT, PM steps with lightcone planes captured part-way through steps (flat and full
# sky), P(k) and a cross spectrum: the physics of the ic, nbody and summaries stages on a 16^3
# grid with a 32^3 force mesh over 2 devices. argv: cache folder, JSON list of runs
# [cosmology, seed, a_init]; prints one JSON line per run: counts and results.
SCRIPT = """
import json, sys
from pmpipe.runtime import parallel
parallel.use_compilation_cache(sys.argv[1])
from pmpipe.runtime import compilation
counter = compilation.CompileCounter().start()
import numpy as np
from pmpipe.physics.evolution import ics, lightcone, simulation, sky, timesteps
from pmpipe.physics.evolution import particle_mesh
from pmpipe.physics.mesh import domain
from pmpipe.physics.statistics import stats
from pmpipe.physics.theory import cosmology

N, BOX, OBSERVER = 16, 64.0, (32.0, 32.0, 32.0)
mesh = parallel.make_mesh((1, 2))
grid = domain.Grid(mesh, N, 2, BOX, 8)


def run(params, seed, a_init):
    cosmo = cosmology.tabulated(cosmology.Cosmology(**params))
    noise = ics.white_noise(seed, N, mesh)
    init = simulation.initial_conditions(cosmo, noise, simulation.power_function(cosmo), grid,
                                         a_init)
    chi_max = float(cosmology.comoving_distance(cosmo, 1.0 / 1.05))
    at = lambda chi: cosmology.on_host(cosmology.scale_factor_at_distance, cosmo, chi)
    planes = sky.planes(chi_max, 32.0, at)
    transforms = lightcone.plane_transforms(seed, len(planes), grid.force_cells, True)
    capture = lightcone.capture_plan(planes, transforms, OBSERVER, grid, 16, 1, 0.5)
    times = timesteps.timeline(a_init, 1.0, 3, (0.5,))
    res = particle_mesh.evolve(cosmo, init.disp, init.mom, times, grid, capture)
    flat, shells = np.asarray(res.planes)[:len(planes)], np.asarray(res.shells)[:len(planes)]
    k, pk, _ = stats.power_spectrum(res.snapshots[1.0], mesh, BOX, compensate_cic=True)
    _, cross, _ = stats.power_spectrum(res.snapshots[0.5], mesh, BOX, field2=res.snapshots[1.0])
    return {"pk": pk.tolist(), "cross": cross.tolist(), "planes": len(planes),
            "flat_std": np.std(flat, axis=(1, 2)).tolist(), "shell_std": np.std(shells, axis=1).tolist(),
            "delta_linear": np.asarray(init.delta_linear).ravel()[:64].tolist()}


for params, seed, a_init in json.loads(sys.argv[2]):
    before = counter.counts
    out = run(params, seed, a_init)
    counts = counter.counts - before
    out.update(programs=counts.programs, compiled=counts.compiled, hits=counts.hits,
               misses=counts.misses, names=list(counts.names),
               compiled_names=list(counts.compiled_names))
    print(json.dumps(out), flush=True)
"""

A = {"Omega_m": 0.3111, "sigma8": 0.8102, "h": 0.6766, "n_s": 0.9665, "w0": -1.0}
B = {"Omega_m": 0.28, "sigma8": 0.75, "h": 0.70, "n_s": 0.95, "w0": -0.9, "Omega_b": 0.045}
C = {"Omega_m": 0.34, "sigma8": 0.86, "h": 0.65, "n_s": 0.98, "w0": -1.1, "wa": 0.1}


def _start(cache, runs):
    """The process of SCRIPT for ``runs`` with the persistent cache in ``cache``, started, its
    output in files beside the cache folder: (process, stdout file, stderr file)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_PERSISTENT_CACHE")}
    env.update(XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu")
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    with (
        tempfile.NamedTemporaryFile("w", suffix=".out", dir=cache.parent, delete=False) as out,
        tempfile.NamedTemporaryFile("w", suffix=".err", dir=cache.parent, delete=False) as err,
    ):
        process = subprocess.Popen(
            [sys.executable, "-c", SCRIPT, str(cache), json.dumps(runs)],
            stdout=out,
            stderr=err,
            env=env,
        )
    return process, Path(out.name), Path(err.name)


def _results(started):
    """The JSON lines of a process from :func:`_start`, once it has finished."""
    process, out, err = started
    try:
        process.wait(timeout=300)
    finally:
        process.kill()
    assert process.returncode == 0, err.read_text()[-4000:]
    return [json.loads(line) for line in out.read_text().splitlines()]


def _runs(cache, runs):
    return _results(_start(cache, runs))


@pytest.mark.slow
def test_runs_of_one_size_compile_once(tmp_path):
    # C with a cache of its own, compiled from scratch: independent of the rest, so it runs
    # beside it
    separate = _start(tmp_path / "other_cache", [[C, 3, 0.08]])
    first, again, third = _runs(tmp_path / "jax_cache", [[A, 1, 0.1], [B, 2, 0.05], [C, 3, 0.08]])
    assert first["compiled"] > 10 and first["misses"] == first["compiled"]  # all written
    # other cosmologies, seeds and a_init in the same process: nothing reaches XLA again
    assert again["programs"] == 0 and third["programs"] == 0, (again["names"], third["names"])
    # the parameters are arguments, not constants of the first run: each run has its own
    # results, and the programs compiled for A give C what programs compiled for C give
    assert first["planes"] == again["planes"] == third["planes"] >= 3
    (alone,) = _results(separate)
    assert alone["compiled"] == alone["programs"] == first["programs"]
    assert sorted(alone["names"]) == sorted(first["names"])
    for key in ("pk", "cross", "flat_std", "shell_std", "delta_linear"):
        values = [np.asarray(r[key]) for r in (first, again, third)]
        assert all(np.all(np.isfinite(v)) for v in values), key
        assert not np.allclose(values[0], values[1], rtol=1e-3), key
        assert not np.allclose(values[0], values[2], rtol=1e-3), key
        np.testing.assert_allclose(third[key], alone[key], rtol=1e-5, err_msg=key)


def test_counter_counts_each_compilation_once():
    counters = [compilation.CompileCounter().start() for _ in range(3)]
    with compilation.CompileCounter() as counter:
        f = jax.jit(lambda x: x * 3.0 + 1.0)
        f(np.ones(13, np.float32))
        f(np.ones(13, np.float32))  # in-memory cache: not compiled again
    counts = counter.counts
    assert counts.programs == 1 and counts.compiled + counts.hits == 1, counts
    assert counts.names == ("jit(<lambda>)",) and counts.seconds > 0
    assert all(c.stop().programs == 1 for c in counters)  # one listener, however many counters
    assert counter.counts == counts  # fixed once stopped
    assert "1 programs" in counts.summary()


# A process running runs of the same sizes as an earlier one compiles no program: four runs of
# the TINY campaign's size, every one with its own cosmology, seed and a_init.
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


def _start_job(paths, report, cache):
    """The job process (pmpipe.job.pipeline) of the runs ``paths``, started; its output
    goes to ``report`` with the suffix .log."""
    env = job_env()
    with open(report.with_suffix(".log"), "w") as log:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pmpipe.job.pipeline",
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
    return _record(_start_job(paths, report, cache), report)


@pytest.mark.slow
def test_a_second_process_of_the_same_sizes_compiles_nothing(tmp_path):
    paths = _run_files(tmp_path / "results")
    cache = tmp_path / "cache"
    first = _job(paths[:1], tmp_path / "first.json", cache)
    assert first["compilation"]["compiled"] > 0 and first["compilation"]["cache_hits"] == 0
    cache = shutil.copytree(cache, tmp_path / "elsewhere" / "cache")  # the cache moved
    # pmpipe run all of one run, and a packed job of two runs, side by side (both only read)
    jobs = {
        name: (_start_job(runs, tmp_path / f"{name}.json", cache), tmp_path / f"{name}.json")
        for name, runs in (("second", paths[1:2]), ("packed", paths[2:]))
    }
    second, packed = (_record(*jobs[name]) for name in ("second", "packed"))
    assert second["compilation"]["compiled"] == 0, second["compilation"]
    assert second["compilation"]["cache_hits"] == first["compilation"]["programs"]
    assert packed["compilation"]["compiled"] == 0, packed["compilation"]
    assert packed["compilation"]["cache_hits"] == first["compilation"]["programs"]
    later = packed["runs"][1]["stages"]  # the job's second run: every program in memory
    assert sum(s["compilation"]["programs"] for s in later) == 0, later
