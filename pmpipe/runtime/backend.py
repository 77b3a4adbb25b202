"""Starting JAX's backend: the local devices, or one message that names the backend JAX could
not start, what is installed and the fix. Imports JAX only when called."""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Mapping
from pathlib import Path

from pmpipe.runtime import versions

PLUGINS = ("jax-cuda13-plugin", "jax-cuda12-plugin", "jax-rocm7-plugin", "libtpu")
GPU_LOCK = (
    "python -m pip install --require-hashes -r requirements/gpu-cuda13.txt (NVIDIA driver "
    ">= 580; requirements/gpu-cuda12.txt for drivers >= 525.60.13)"
)


# XLA's flag (in XLA_FLAGS) for the number of CPU devices a process gets
HOST_DEVICES_FLAG = "--xla_force_host_platform_device_count"


class BackendError(RuntimeError):
    """JAX could not start the backend this process asks for; the message says why and how to
    fix it."""


def gpu_device_files() -> list[str]:
    """This node's GPU device files: /dev/nvidia<i> (NVIDIA), /dev/kfd (AMD); none without a
    GPU."""
    import glob

    return [*glob.glob("/dev/nvidia[0-9]*"), *glob.glob("/dev/kfd")]


def installed_plugins() -> list[str]:
    """'name version' of every installed JAX device plugin of PLUGINS."""
    return [f"{name} {versions.installed(name)}" for name in PLUGINS if versions.installed(name)]


def diagnosis(requested: str | None, error: str, jaxlib: str | None, plugins: list[str]) -> str:
    """The message for a backend JAX could not start: ``requested`` the JAX_PLATFORMS value
    (None: unset), ``error`` JAX's own message (may be empty), ``jaxlib`` and ``plugins`` what
    is installed."""
    asked = f"the backend JAX_PLATFORMS={requested!r} asks for" if requested else "a backend"
    cause = f"JAX could not start {asked}" + (f" ({error.strip()})" if error.strip() else "")
    have = f"installed: jaxlib {jaxlib}, " + (
        ", ".join(plugins) if plugins else "no device plugin (JAX for the CPU only)"
    )
    wants_gpu = requested is not None and any(p in requested for p in ("cuda", "gpu"))
    if wants_gpu and not any("cuda" in p for p in plugins):
        fix = (
            f"install JAX for NVIDIA GPUs ({GPU_LOCK}) or run on the CPU: export JAX_PLATFORMS=cpu"
        )
    elif plugins:
        fix = (
            "the plugin is installed but found no device it can use: run on a node with one "
            "(nvidia-smi lists NVIDIA GPUs) or run on the CPU: export JAX_PLATFORMS=cpu"
        )
    else:
        fix = "run on the CPU (export JAX_PLATFORMS=cpu) or install JAX's plugin for that device"
    return f"{cause}; {have}; fix: {fix}"


def local_devices(environ: Mapping[str, str] | None = None) -> list:
    """jax.local_devices(), or BackendError with :func:`diagnosis` when JAX cannot start."""
    import jax

    environ = os.environ if environ is None else environ
    try:
        return jax.local_devices()
    except Exception as err:  # JAX raises RuntimeError or a bare AssertionError here
        message = diagnosis(
            environ.get("JAX_PLATFORMS"),
            str(err),
            versions.installed("jaxlib"),
            installed_plugins(),
        )
        raise BackendError(message) from err


def _raised_starting_jax(error: BaseException) -> bool:
    """Whether ``error`` (or an error it was raised from) came out of JAX's backend start-up
    (its xla_bridge module)."""
    seen: BaseException | None = error
    while seen is not None:
        frames = traceback.extract_tb(seen.__traceback__)
        if frames and Path(frames[-1].filename).name == "xla_bridge.py":
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def failure(error: BaseException) -> str | None:
    """The diagnosis of an unexpected ``error`` that JAX raised starting its backend (asked
    again, which starts nothing new: that start failed), else None."""
    if "jax" not in sys.modules or not _raised_starting_jax(error):
        return None
    try:
        local_devices()
    except BackendError as err:
        return str(err)
    return None


CUDECOMP_BUILD_DOC = "docs/slurm.md, 'jaxdecomp with cuDecomp'"


def cudecomp_refusal(registrations: Mapping | None = None) -> str:
    """Why a run cannot ask for jaxdecomp's cuDecomp backend here, with the fix.
    ``registrations``: the cuDecomp operations the installed jaxdecomp registers with XLA
    (default: ``jaxdecomplib._jaxdecomp.registrations()``, empty in a build without cuDecomp,
    such as the PyPI wheels)."""
    if registrations is None:
        from jaxdecomplib import _jaxdecomp

        registrations = _jaxdecomp.registrations()
    if not registrations:
        return (
            "the installed jaxdecomp was built without NVIDIA cuDecomp (it registers no "
            "cuDecomp operations, as the PyPI wheels and a source build without the NVIDIA HPC "
            f"SDK do): build jaxdecomp with cuDecomp at your site ({CUDECOMP_BUILD_DOC}), or "
            "set parallel.backend: jax"
        )
    return (
        "pmpipe lays out its distributed FFTs as jaxdecomp's JAX backend does and calls "
        "no cuDecomp operation, even where the build has them: set parallel.backend: jax"
    )
