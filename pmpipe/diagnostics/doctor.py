"""`pmpipe doctor`: what this process would run on, and settings known to break runs.

:func:`report` gathers the facts (pmpipe, Python, JAX and its devices, the launcher and process
count, jaxdecomp, NCCL, MPI, SLURM, the Apptainer image and its labels when inside one);
:func:`warnings` is a pure function of those facts and the environment; :func:`table` prints
them for a person; :func:`self_check` imports every module of pmpipe and compares a distributed
FFT on all local devices with numpy's (an image's `%test`). JAX is started on this process's own devices only: `jax.distributed` is not
initialised, so under srun each process reports its local devices.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from pmpipe.runtime import backend, image, parallel, versions

FIELDS = (
    "pmpipe",
    "python",
    "jax",
    "processes",
    "jaxdecomp",
    "nccl",
    "mpi",
    "slurm",
    "container",
    "cuda_driver",
    "warnings",
)
# oldest NVIDIA driver each CUDA major version of the JAX wheels runs on (NVIDIA's CUDA
# toolkit release notes, "minimum required driver version" for Linux)
MIN_DRIVER = {12: (525, 60, 13), 13: (580, 65, 6)}
SLURM_RANK_VARIABLES = ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID")


def _output_line(cmd: list[str], pick: str = "") -> str | None:
    """The first line a command prints, followed by the first that contains ``pick``, or None
    when the command is absent or fails."""
    if shutil.which(cmd[0]) is None:
        return None
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = [line.strip() for line in (done.stdout or done.stderr).splitlines() if line.strip()]
    if done.returncode or not lines:
        return None
    picked = next((line for line in lines if pick and pick in line), lines[0])
    return " ".join((lines[0] if picked == lines[0] else f"{lines[0]} {picked}").split())


def _jax_facts() -> dict:
    import jax

    try:
        devices, problem = backend.local_devices(), None
    except backend.BackendError as err:
        devices, problem = [], str(err)
    return {
        "version": jax.__version__,
        "jaxlib": versions.installed("jaxlib"),
        "backend": None if problem else jax.default_backend(),
        "backend_error": problem,
        "platform_version": devices[0].client.platform_version if devices else None,
        "local_devices": [
            {"id": d.id, "kind": d.device_kind, "platform": d.platform} for d in devices
        ],
        "cuda_plugin": next((p for p in backend.installed_plugins() if "cuda" in p), None),
    }


def _jaxdecomp_facts() -> dict:
    from jaxdecomplib import _jaxdecomp

    calls = sorted(_jaxdecomp.registrations())
    return {
        "version": versions.installed("jaxdecomp"),
        "cudecomp": bool(calls),
        "backend": "jax",  # pmpipe's FFTs and halos take jaxdecomp's JAX path (pmpipe.physics.mesh.fft)
        "custom_calls": calls,
    }


def _container_facts(environ: Mapping[str, str]) -> dict:
    path, labels = image.current(environ)
    return {
        "inside": path is not None,
        "image": path,
        "labels": labels,
        "apptainer": _output_line(["apptainer", "--version"]),
    }


def _cuda_driver() -> str | None:
    return _output_line(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])


def report(environ: Mapping[str, str] | None = None) -> dict:
    """Every field of FIELDS: the facts of this process and the warnings they raise."""
    environ = os.environ if environ is None else environ
    launcher, processes = parallel.launcher_processes(environ)
    facts = {
        "pmpipe": {
            "version": versions.installed("pmpipe"),
            "package": str(Path(__file__).resolve().parents[1]),  # pmpipe/, not this module's
        },
        "python": {"version": platform.python_version(), "executable": sys.executable},
        "jax": _jax_facts(),
        "processes": {
            "launcher": launcher,
            "count": processes,
            "local_device_ids": parallel.local_device_ids(environ=environ),
            "gpu_platform": parallel.gpu_platform(),
        },
        "jaxdecomp": _jaxdecomp_facts(),
        "nccl": versions.installed("nvidia-nccl-cu13") or versions.installed("nvidia-nccl-cu12"),
        "mpi": {
            "mpiexec": shutil.which("mpiexec"),
            "version": _output_line(["mpiexec", "--version"], "Version"),
            "mpi4py": versions.installed("mpi4py"),
        },
        "slurm": {
            "job": environ.get("SLURM_JOB_ID"),
            "step": environ.get("SLURM_STEP_ID"),
            "variables": sorted(k for k in environ if k.startswith("SLURM_")),
        },
        "container": _container_facts(environ),
        "cuda_driver": _cuda_driver(),
    }
    facts["warnings"] = warnings(facts, environ)
    return facts


def lock_for_driver(driver: tuple[int, ...] | None) -> str | None:
    """The export of the lock with JAX's wheels for the newest CUDA that an NVIDIA driver of
    version ``driver`` runs (MIN_DRIVER), or None when it runs none of them."""
    fits = [major for major, need in MIN_DRIVER.items() if driver is not None and driver >= need]
    return f"requirements/gpu-cuda{max(fits)}.txt" if fits else None


def _version_tuple(text: str | None) -> tuple[int, ...] | None:
    numbers = re.findall(r"\d+", text or "")
    return tuple(int(n) for n in numbers) if numbers else None


def warnings(facts: dict, environ: Mapping[str, str]) -> list[str]:
    """Settings known to break (multi-node) runs, each a sentence naming the setting to change;
    first, a JAX backend that cannot start."""
    out = [facts["jax"]["backend_error"]] if facts["jax"].get("backend_error") else []
    if environ.get("SLURM_JOB_ID") and not any(k in environ for k in SLURM_RANK_VARIABLES):
        out.append(
            "inside SLURM job {} without {}: the environment was cleaned (sbatch/srun "
            "--export=NONE, env -i, a container that does not pass SLURM_*), so a "
            "multi-process stage cannot find its rank; start it with srun and keep the "
            "SLURM_* variables".format(environ["SLURM_JOB_ID"], ", ".join(SLURM_RANK_VARIABLES))
        )
    local_tasks = int(environ.get("SLURM_NTASKS_PER_NODE", "1").split("(")[0] or 1)
    gpus = [d for d in facts["jax"]["local_devices"] if d["platform"] == "gpu"]
    if (
        facts["jax"]["backend"] == "gpu"
        and local_tasks > 1
        and len(gpus) > 1
        and environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", "true").lower() != "false"
    ):
        out.append(
            f"{local_tasks} processes on this node each see {len(gpus)} GPUs and JAX "
            "preallocates 75 % of every GPU it sees: give each process its own GPU "
            "(srun --gpus-per-task=1) or set XLA_PYTHON_CLIENT_PREALLOCATE=false"
        )
    plugin, driver = facts["jax"]["cuda_plugin"], _version_tuple(facts["cuda_driver"])
    found = re.search(r"cuda(\d+)", plugin) if plugin else None
    major = int(found.group(1)) if found else None
    if major in MIN_DRIVER and driver is not None and driver < MIN_DRIVER[major]:
        need = ".".join(map(str, MIN_DRIVER[major]))
        fits = lock_for_driver(driver)
        out.append(
            f"NVIDIA driver {facts['cuda_driver']} is older than {need}, the oldest "
            f"that the CUDA {major} wheels of JAX ({plugin}) run on: update the driver or "
            + (
                f"install the wheels for it: python -m pip install --require-hashes -r {fits}"
                if fits
                else "use a node with a newer one"
            )
        )
    if (
        facts["processes"]["count"] > 1
        and facts["jax"]["backend"] == "cpu"
        and backend.HOST_DEVICES_FLAG in environ.get("XLA_FLAGS", "")
    ):
        out.append(
            f"XLA_FLAGS sets {backend.HOST_DEVICES_FLAG} in one of "
            f"{facts['processes']['count']} processes: each process asks for its share "
            "of a run's devices itself, and this setting overrides it; unset it"
        )
    return out


def table(facts: dict) -> str:
    """The report for a person: one line a fact, then the warnings."""
    jax, dec, cont = facts["jax"], facts["jaxdecomp"], facts["container"]
    kinds = sorted({d["kind"] for d in jax["local_devices"]})
    rows = [
        ("pmpipe", f"{facts['pmpipe']['version']} ({facts['pmpipe']['package']})"),
        ("python", f"{facts['python']['version']} ({facts['python']['executable']})"),
        (
            "jax",
            f"{jax['version']}, jaxlib {jax['jaxlib']}, backend {jax['backend']}"
            + (f", {jax['cuda_plugin']}" if jax["cuda_plugin"] else ""),
        ),
        ("devices", f"{len(jax['local_devices'])} local: {', '.join(kinds) or 'none'}"),
        (
            "processes",
            (
                f"{facts['processes']['count']} ({facts['processes']['launcher']}), local "
                f"device ids {facts['processes']['local_device_ids'] or 'all visible'}, "
                + (
                    "GPU collectives"
                    if facts["processes"]["gpu_platform"]
                    else "across processes gloo CPU collectives, synchronous dispatch"
                )
            ),
        ),
        (
            "jaxdecomp",
            (
                f"{dec['version']}, cuDecomp {'yes' if dec['cudecomp'] else 'no'}, "
                f"pmpipe uses the {dec['backend']} backend"
            ),
        ),
        ("nccl", facts["nccl"] or "not installed"),
        ("mpi", facts["mpi"]["version"] or "no mpiexec"),
        (
            "slurm",
            f"job {facts['slurm']['job']}, step {facts['slurm']['step']}"
            if facts["slurm"]["job"]
            else "not in a SLURM job",
        ),
        (
            "container",
            f"{cont['image']} {json.dumps(cont['labels'])}"
            if cont["inside"]
            else "not in an Apptainer image",
        ),
        (
            "cuda driver",
            f"{facts['cuda_driver']} (JAX's CUDA wheels for it: "
            f"{lock_for_driver(_version_tuple(facts['cuda_driver'])) or 'none'})"
            if facts["cuda_driver"]
            else "no nvidia-smi",
        ),
    ]
    width = max(len(name) for name, _ in rows)
    lines = [f"{name:<{width}}  {value}" for name, value in rows]
    lines += [f"WARNING: {w}" for w in facts["warnings"]] or ["no warnings"]
    return "\n".join(lines)


def _fft_mismatch(n: int = 16) -> float:
    """Largest relative difference between |FFT|^2 summed per mode on all local devices
    (pmpipe.physics.mesh.fft on a mesh of them) and numpy's, for an (n, n, n) white-noise field."""
    import jax
    import numpy as np

    from pmpipe.physics.mesh import fft

    mesh = parallel.make_mesh((1, len(jax.local_devices())), jax.local_devices())
    field = np.random.default_rng(0).standard_normal((n, n, n)).astype(np.float32)
    sharded = jax.device_put(field, parallel.field_sharding(mesh))
    field_k = jax.jit(lambda x: fft.r2c(x, mesh))(sharded)
    power = parallel.to_host(fft.mode_weights(field_k, mesh) * abs(field_k) ** 2).sum()
    expected = (abs(np.fft.fftn(field)) ** 2).sum()
    back = parallel.to_host(jax.jit(lambda k: fft.c2r(k, mesh))(field_k))
    return max(abs(power / expected - 1), float(abs(back - field).max() / abs(field).max()))


def self_check() -> list[str]:
    """Problems found (empty when all is well): a pmpipe module that does not import, a
    distributed FFT on the local devices that differs from numpy's by more than 1e-5."""
    import importlib
    import pkgutil

    problems = []
    package = str(Path(__file__).resolve().parents[1])  # pmpipe/
    for module in pkgutil.walk_packages([package], "pmpipe."):
        if module.name.endswith(".__main__"):  # a command's entry point: importing runs it
            continue
        try:
            importlib.import_module(module.name)
        except Exception as err:  # noqa: BLE001 - every failure is reported, none stops the check
            problems.append(f"import {module.name}: {type(err).__name__}: {err}")
    mismatch = _fft_mismatch()
    if not mismatch <= 1e-5:
        problems.append(f"FFT on the local devices differs from numpy's by {mismatch:.2e} (> 1e-5)")
    return problems
