"""Test set-up: 8 fake CPU devices for sharding tests (must precede the first jax import)."""

import contextlib
import fcntl
import hashlib
import os
import sys

# LLVM at -O1 rather than XLA's default -O2: the limber, compilation and nbody tests run in
# 268 s instead of 304 s on 2 cores, and every result stays within the tests' tolerances;
# the flag is part of the persistent-cache key, so never mixed with programs compiled at -O2.
# The processes the tests start (jobs, workflows, SLURM steps) compile at -O1 too (JOB_XLA_FLAGS):
# a tiny run's job from an empty cache in 18.7 s of CPU instead of 21.3 s
os.environ.setdefault(
    "XLA_FLAGS", "--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=1"
)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import shutil
import subprocess
import tempfile
from pathlib import Path

import jax
import pytest

# pytest rewrites the asserts of every test module in every worker (a worker's collection:
# 15 s on 2 cores, 6 s with them rewritten) unless it finds them in tests/__pycache__, which
# it writes only where Python writes bytecode: written even under PYTHONDONTWRITEBYTECODE
sys.dont_write_bytecode = False

# The decompositions of 8 devices: a pencil and a slab in the fast tier, the others in the slow one
PDIMS_8 = [
    (2, 4),
    (8, 1),
    pytest.param((4, 2), marks=pytest.mark.slow),
    pytest.param((1, 8), marks=pytest.mark.slow),
]
REPO = Path(__file__).resolve().parent.parent
# A tiny campaign (2 runs of 16^3 on 2 devices) that the workflow and SLURM tests share.
TINY = """\
name: tiny
seed: 3
base:
  box: {box_size: 64.0, particles: 16}
  parallel: {pdims: [1, 2], halo_cells: 4}
  nbody: {steps: 3}
  lightcone: {z_max: 0.05, plane_thickness: 32.0}
  lensing: {source_redshifts: [0.05], flat_sky: {field_of_view: 20.0, pixels: 32}}
  summaries: {kappa_range: [-0.01, 0.01]}
design: {kind: fiducial}
realisations: 2
execution: {platform: cpu, devices_per_node: 2, cpus_per_task: 1, device_memory_gb: 2}
"""


# JAX's persistent compilation cache of the tests: the xdist workers of a session and every
# process they start (workflows, SLURM jobs, mpiexec) share it, and it outlives the session, so
# that a program of the same sizes and flags is compiled once, not once per tier or per run of
# the suite (PMPIPE_TEST_PROGRAMS names another folder). In the temporary folder, which
# Apptainer binds into the images the tests run, one per user; emptied when a session starts
# with more than PROGRAMS_MAX_BYTES in it.
PROGRAMS = Path(tempfile.gettempdir()) / f"pmpipe-test-programs-{os.getuid()}"
PROGRAMS_MAX_BYTES = 2 * 1024**3
# The Boltzmann tables that tests make directly (:func:`linear_table`) outlive the session too,
# in a folder named by a hash of the code that makes them: a change to it makes them again.
TABLE_CODE = sorted((REPO / "pmpipe" / "physics" / "theory").glob("*.py")) + [
    REPO / "pmpipe" / "storage" / "power_cache.py"
]
TABLES = (
    Path(tempfile.gettempdir())
    / f"pmpipe-test-tables-{os.getuid()}"
    / hashlib.sha256(b"".join(path.read_bytes() for path in TABLE_CODE)).hexdigest()[:16]
)
# A folder of each test session (PMPIPE_TEST_SESSION, made by the process that starts the
# session and removed when it ends) that its xdist workers share: what several of them would
# otherwise each make (the tiny workflow's results, shared runs' stores) is made there once.


JOB_XLA_FLAGS = "--xla_backend_optimization_level=1"

# Rules of workflow/rules/report.smk, by their names in a campaign whose runs fit in one job
# (test_workflow's listing checks them): what a rerun that no assertion reads them from leaves
# out with Snakemake's --omit-from
RUN_FIGURES, CAMPAIGN_FIGURES, COLLECT = "figures_job0000", "campaign_figures", "collect"


def job_env(environ=None) -> dict:
    """``environ`` (this process's environment by default) for a process that asks for its
    own devices: XLA_FLAGS without the 8 devices, only JOB_XLA_FLAGS."""
    return {**(os.environ if environ is None else environ), "XLA_FLAGS": JOB_XLA_FLAGS}


def run_snakemake(
    workdir, *args, check=True, env=None, timeout=900, main=None, share_programs=True
):
    """snakemake on the repository's Snakefile in ``workdir`` (in :func:`job_env`: each job
    asks for its own devices); AssertionError with the output tails when it fails. ``main``: a
    script that runs snakemake, instead of ``python -m snakemake``.

    With ``share_programs`` the workflow's jobs use the session's compiled programs
    (JAX_COMPILATION_CACHE_DIR), else their own results/.jax_cache."""
    env = job_env(env)
    if not share_programs:
        env.pop("JAX_COMPILATION_CACHE_DIR", None)
    start = [str(main)] if main else ["-m", "snakemake"]
    cmd = [sys.executable, *start, "-s", str(REPO / "Snakefile"), "-d", str(workdir), *args]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, cwd=workdir)
    if check and out.returncode != 0:
        raise AssertionError(f"snakemake failed:\n{out.stdout[-3000:]}\n{out.stderr[-6000:]}")
    return out


def mount_tmpfs(folder: Path, size: str, read_only: bool = False) -> None:
    """Mount a tmpfs of ``size`` (mount's units: 600k, 20m) on the new folder ``folder``,
    read-only if asked; the test skips, naming why, where this machine lets it mount none."""
    folder.mkdir()
    options = f"size={size}" + (",ro" if read_only else "")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode:
        pytest.skip(
            f"this machine lets no test mount a small filesystem (mount -t tmpfs: "
            f"{done.stderr.strip()})"
        )


def pytest_configure(config):
    if len(jax.devices()) < 8:
        raise pytest.UsageError(
            "the sharding tests need 8 CPU devices; XLA_FLAGS was set before pytest "
            f"started ({os.environ.get('XLA_FLAGS')!r}): add --xla_force_host_platform_device_count=8"
        )
    if not hasattr(config, "workerinput"):  # this process, or the controller of xdist's workers
        if "PMPIPE_TEST_SESSION" not in os.environ:
            config.shared = tempfile.mkdtemp(prefix="pmpipe-test-session-")
            os.environ["PMPIPE_TEST_SESSION"] = config.shared
        programs = Path(os.environ.setdefault("PMPIPE_TEST_PROGRAMS", str(PROGRAMS)))
        if sum(f.stat().st_size for f in programs.rglob("*") if f.is_file()) > PROGRAMS_MAX_BYTES:
            shutil.rmtree(programs)
    # pmpipe's log goes to stderr as in every command line, whichever test runs first
    from pmpipe.runtime import log, parallel

    parallel.use_compilation_cache(os.environ["PMPIPE_TEST_PROGRAMS"])
    log.configure()


def pytest_unconfigure(config):
    if getattr(config, "shared", None):
        shutil.rmtree(config.shared, ignore_errors=True)
        del os.environ["PMPIPE_TEST_SESSION"]


@contextlib.contextmanager
def made_once(name: str):
    """The folder ``name`` of this test session that its workers share (PMPIPE_TEST_SESSION),
    and whether to make it: yields (folder, True) to the first that asks, which makes it,
    else once it is made (folder, False). A folder left half made is made again."""
    folder = Path(os.environ["PMPIPE_TEST_SESSION"]) / name
    with open(folder.with_name(name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = folder.with_name(name + ".done")
        if done.exists():
            yield folder, False
            return
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir()
        yield folder, True
        done.touch()


def linear_table(spec: dict):
    """The Boltzmann table of ``spec`` (pmpipe.physics.theory.boltzmann.inputs) through
    pmpipe.storage.power_cache in TABLES: computed once while the code that makes it (and the
    installed CAMB and CLASS, part of ``spec``) stays the same."""
    from pmpipe.storage import power_cache

    return power_cache.linear_table(spec, TABLES)


@pytest.hookimpl(tryfirst=True)  # before xdist names the groups in the node ids
def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (``-n``, ``--dist loadgroup``): the tests that share an expensive
    fixture run in one worker, which makes it once: those of a session fixture (one real
    SLURM cluster, whose configuration lives in /etc/slurm; the tiny workflow) by its name,
    those of a module fixture by their module, in the SLURM worker when some test of the
    module needs the cluster too."""
    scopes = {}
    for item in items:
        defs = getattr(item, "_fixtureinfo", None)
        scopes[item] = {
            name: fixture[-1].scope
            for name, fixture in (defs.name2fixturedefs.items() if defs else ())
            if fixture and name not in ("tmp_path_factory", "monkeypatch", "request")
        }
    with_slurm = {item.module.__name__ for item in items if "slurm" in scopes[item]}
    for item in items:
        shared = sorted(n for n, scope in scopes[item].items() if scope == "session")
        module = "module" in scopes[item].values()
        if "slurm" in shared or (module and item.module.__name__ in with_slurm):
            item.add_marker(pytest.mark.xdist_group("slurm"))
        elif shared:
            item.add_marker(pytest.mark.xdist_group(shared[0]))
        elif module:
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))


def snakemake_tiny(workdir, *args, check=True, share_programs=True, campaign="tiny.yaml"):
    """run_snakemake with the local profile on 2 cores and the campaign file tiny.yaml (or
    ``campaign``, in workdir)."""
    return run_snakemake(
        workdir,
        "--profile",
        str(REPO / "profiles/local"),
        "--cores",
        "2",
        "--config",
        f"campaign={campaign}",
        *args,
        check=check,
        share_programs=share_programs,
    )


def golden(path: Path, text: str) -> None:
    """Assert that ``text`` is the golden file ``path``; PMPIPE_UPDATE_GOLDEN=1 rewrites it."""
    if os.environ.get("PMPIPE_UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text(), f"{path} differs; PMPIPE_UPDATE_GOLDEN=1 rewrites it"


def run_every_stage(run_dir: Path, run) -> Path:
    """Write ``run`` (a pmpipe.run.config.Run) as run_dir/config.json of a one-run campaign
    and run each of its stages in this process; returns run_dir."""
    from pmpipe import stages
    from pmpipe.run import config
    from pmpipe.stages import registry

    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "config.json"
    path.write_text(config.RunFile.build("test", run_dir.name, 0, {}, run).to_json())
    for stage in stages.run_stages(run):
        registry.run_stage(stage, path)
    return run_dir


def finished(path):
    """Completion time of a store (its 'finished' root attribute)."""
    import zarr

    return zarr.open_group(path, mode="r").attrs["finished"]


def same_store(a, b, tolerance=1e-5):
    """Assert that two stores hold the same arrays: equal integers and text, floats within
    tolerance times the largest |value| (NaN where NaN)."""
    import numpy as np
    import zarr

    one, two = zarr.open_group(a, mode="r"), zarr.open_group(b, mode="r")
    assert sorted(one.array_keys()) == sorted(two.array_keys()), (a, b)
    for name in one.array_keys():
        x, y = one[name][:], two[name][:]
        if x.dtype.kind not in "fc":
            assert np.array_equal(x, y), (a, name)
            continue
        nan = np.isnan(x)
        assert np.array_equal(nan, np.isnan(y)), (a, name)
        if nan.all():  # e.g. A_s of Eisenstein-Hu runs
            continue
        scale = max(float(np.max(np.abs(x[~nan]))), 1e-30)
        assert np.max(np.abs(x[~nan] - y[~nan])) <= tolerance * scale, (a, name)


def rel_diff(a, b):
    """max |a - b| / max |b| as a float."""
    import numpy as np

    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    """A real one-node SLURM cluster with accounting and 2 fake GPUs (tests/slurm_cluster.py,
    provisioned by tests/provision.py), stopped at the end of the session. Skips with what is
    missing where it cannot run; under CI=true that is a failure instead."""
    import slurm_cluster

    problem = slurm_cluster.missing()
    if problem:
        if os.environ.get("CI") == "true":
            pytest.fail(problem)
        pytest.skip(problem)
    cluster = slurm_cluster.Cluster(tmp_path_factory.mktemp("slurm"))
    cluster.start()
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def tiny_local():
    """TINY run to completion by the local profile, once per test session (its workers share
    it): the reference results, which no test changes (test_workflow's changes
    are made to a copy)."""
    with made_once("tiny_local") as (workdir, make):
        if make:
            (workdir / "tiny.yaml").write_text(TINY)
            snakemake_tiny(workdir)
    return workdir
