"""Compile once: runs of one size with other cosmologies, seeds and a_init reuse the compiled
programs, in the same process (in-memory caches) and in a new job process (persistent cache,
also when the cache folder was copied to another path, for a packed job of other runs), which
make the very results of the programs compiled in the first; the counts come from
pmpipe.runtime.compilation (JAX's monitoring events)."""

import itertools
import json
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest
import yaml
import zarr
from conftest import TINY, job_env

from pmpipe import stages
from pmpipe.run import config
from pmpipe.runtime import compilation


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
# the TINY campaign's size (flat and full sky), every one with its own cosmology, seed and
# a_init.
COSMOLOGIES = [  # Omega_m, sigma8, h, n_s, w0, wa: every run differs in all of them
    {"Omega_m": 0.30, "sigma8": 0.80, "h": 0.67, "n_s": 0.96, "w0": -1.0, "wa": 0.0},
    {"Omega_m": 0.32, "sigma8": 0.83, "h": 0.70, "n_s": 0.98, "w0": -0.9, "wa": 0.1},
    {"Omega_m": 0.29, "sigma8": 0.78, "h": 0.65, "n_s": 0.95, "w0": -1.1, "wa": -0.1},
    {"Omega_m": 0.31, "sigma8": 0.85, "h": 0.69, "n_s": 0.97, "w0": -0.95, "wa": 0.05},
]


def _run_files(results):
    """Four runs of the TINY campaign's size with full-sky shells too, each with its own
    cosmology, seed and a_init."""
    base = yaml.safe_load(TINY)["base"]
    base["parallel"]["halo_cells"] = 6  # room for the most clustered of the cosmologies
    base["lensing"]["full_sky"] = {"nside": 8}  # the shells' programs too
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


def _arrays(run_dir):
    """Every array of the run's stores by (store, path), as numpy."""
    found = {}
    for stage in stages.STAGES:
        group = zarr.open_group(stages.store_path(run_dir, stage), mode="r")
        found.update({(stage, path): np.asarray(array[...]) for path, array in group.arrays()})
    return found


@pytest.mark.slow
def test_a_second_process_of_the_same_sizes_compiles_nothing(tmp_path):
    """A job of two runs compiles for the first and nothing for the second (other cosmology,
    seed and a_init: the parameters are arguments, not constants of the programs). A job of
    the other three runs in a new process, with the cache copied elsewhere, compiles nothing
    and makes the second run's stores again bit for bit from the programs it read."""
    paths = _run_files(tmp_path / "results")
    cache = tmp_path / "cache"
    first = _job(paths[:2], tmp_path / "first.json", cache)
    assert first["compilation"]["compiled"] > 10 and first["compilation"]["cache_hits"] == 0
    second = first["runs"][1]["stages"]  # every program in memory
    assert sum(s["compilation"]["programs"] for s in second) == 0, second
    made, run_file = _arrays(paths[1].parent), paths[1].read_text()
    shutil.rmtree(paths[1].parent)  # made again below, from the persistent cache
    paths[1].parent.mkdir()
    paths[1].write_text(run_file)
    cache = shutil.copytree(cache, tmp_path / "elsewhere" / "cache")  # the cache moved
    packed = _job(paths[1:], tmp_path / "packed.json", cache)  # a job of three runs
    assert packed["compilation"]["compiled"] == 0, packed["compilation"]
    assert packed["compilation"]["cache_hits"] == first["compilation"]["programs"]
    later = packed["runs"][1]["stages"]  # the job's second run: every program in memory
    assert sum(s["compilation"]["programs"] for s in later) == 0, later
    again = _arrays(paths[1].parent)
    assert again.keys() == made.keys()
    for key, values in made.items():
        np.testing.assert_array_equal(again[key], values, err_msg=str(key))
    # each run's own results: P(k) of the four cosmologies all differ
    spectra = [_arrays(path.parent)[("summaries", "pk")] for path in paths]
    assert all(np.all(np.isfinite(s)) for s in spectra)
    assert all(not np.allclose(a, b, rtol=1e-3) for a, b in itertools.combinations(spectra, 2))
