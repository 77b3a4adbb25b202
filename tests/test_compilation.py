"""Compile once: runs of one size with other cosmologies, seeds and a_init reuse the compiled
programs, in the same process (in-memory caches, with the results of programs compiled for
another run) and in a new job process (persistent cache, also when the cache folder was copied
to another path, for a packed job of other runs); the counts come from
pmpipe.runtime.compilation (JAX's monitoring events)."""

import json
import os
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest
import yaml
from conftest import JOB_XLA_FLAGS, TINY, job_env

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


def _runs(cache, runs):
    """The JSON lines SCRIPT prints for ``runs``, in a process with the persistent cache in
    ``cache``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_PERSISTENT_CACHE")}
    env.update(
        XLA_FLAGS=f"--xla_force_host_platform_device_count=2 {JOB_XLA_FLAGS}", JAX_PLATFORMS="cpu"
    )
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(cache), json.dumps(runs)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    return [json.loads(line) for line in out.stdout.splitlines()]


@pytest.mark.slow
def test_runs_of_one_size_compile_once(tmp_path):
    cache = tmp_path / "jax_cache"
    first, again, third = _runs(cache, [[A, 1, 0.1], [B, 2, 0.05], [C, 3, 0.08]])
    assert first["compiled"] > 10 and first["misses"] == first["compiled"]  # all written
    # other cosmologies, seeds and a_init in the same process: nothing reaches XLA again
    assert again["programs"] == 0 and third["programs"] == 0, (again["names"], third["names"])
    # the parameters are arguments, not constants of the first run: each run has its own
    # results, and C alone in a new process makes the very programs made for A (their keys
    # hold every constant), which give it what they gave C after A
    assert first["planes"] == again["planes"] == third["planes"] >= 3
    (alone,) = _runs(cache, [[C, 3, 0.08]])
    assert alone["hits"] == alone["programs"] == first["programs"] and alone["compiled"] == 0
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


def test_each_thread_counts_what_it_compiles():
    """A program compiled on another thread is in the process's totals, not this thread's
    (a stage of an overlapped job counts its own compilations)."""
    import threading

    compilation.listen()
    before, mine = compilation.totals(), compilation.thread_totals()
    theirs = {}

    def compile_there():
        start = compilation.thread_totals()
        jax.jit(lambda x: x * 5.0 - 2.0)(np.ones(17, np.float32))
        theirs["counts"] = compilation.thread_totals() - start

    thread = threading.Thread(target=compile_there)
    thread.start()
    thread.join()
    assert theirs["counts"].programs == 1 and (compilation.totals() - before).programs == 1
    assert compilation.thread_totals() == mine


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


def _job(paths, report, cache):
    """The record the job process (pmpipe.job.pipeline) of the runs ``paths`` writes to
    ``report`` (its output beside it, with the suffix .log)."""
    log = report.with_suffix(".log")
    with open(log, "w") as output:
        done = subprocess.run(
            [sys.executable, "-m", "pmpipe.job.pipeline", "--report", str(report)]
            + [str(path) for path in paths],
            stdout=output,
            stderr=output,
            env={**job_env(), "JAX_COMPILATION_CACHE_DIR": str(cache)},
            timeout=600,
        )
    assert done.returncode == 0, log.read_text()[-3000:]
    return json.loads(report.read_text())


@pytest.mark.slow
def test_a_second_process_of_the_same_sizes_compiles_nothing(tmp_path):
    paths = _run_files(tmp_path / "results")
    cache = tmp_path / "cache"
    first = _job(paths[:1], tmp_path / "first.json", cache)
    assert first["compilation"]["compiled"] > 0 and first["compilation"]["cache_hits"] == 0
    cache = shutil.copytree(cache, tmp_path / "elsewhere" / "cache")  # the cache moved
    packed = _job(paths[1:], tmp_path / "packed.json", cache)  # a job of three runs
    assert packed["compilation"]["compiled"] == 0, packed["compilation"]
    assert packed["compilation"]["cache_hits"] == first["compilation"]["programs"]
    later = packed["runs"][1]["stages"]  # the job's second run: every program in memory
    assert sum(s["compilation"]["programs"] for s in later) == 0, later
