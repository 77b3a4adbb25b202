"""What a store records of how it was made: the run, its config and hash, the software and
its versions (pmpipe's git commit, the JAX stack, the Apptainer image), the devices, the
SLURM job and the start time."""

from __future__ import annotations

import functools
import os
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

from pmpipe.run import config
from pmpipe.runtime import image, versions

if TYPE_CHECKING:
    from jax.sharding import Mesh

FORMAT = "pmpipe-store-1"  # root attribute 'format': layout version of docs/outputs.md
# The layout of each stage's store (root attribute 'layout', 1 where absent), raised when a
# stage's store gains arrays that later stages or readers need: a store of an older layout is
# stale, and only its stage and those after it are made again.
LAYOUTS = {"lensing": 2, "summaries": 3}  # lensing: shear E/B coefficients; summaries: pairs,
# then the flat sky's E and B spectra as those of κ and ω


def layout(stage: str) -> int:
    """The layout version this pmpipe writes for ``stage``'s store."""
    return LAYOUTS.get(stage, 1)


@functools.cache  # once per process: the code it runs is what it imported when it started
def git_commit() -> str | None:
    """Commit of the pmpipe source tree (with '-dirty' when modified), None outside a checkout.
    A checkout owned by another user (a shared clone, a container's bind mount) is read too:
    git refuses such a repository unless it is named safe, which this read-only call does;
    where git is missing or refuses all the same, the commit is read from .git itself
    (without '-dirty')."""
    src = Path(__file__).resolve().parents[2]  # the checkout: pmpipe/storage/ is two below
    if not (src / ".git").exists():
        return None
    try:
        out = subprocess.run(
            [
                "git",
                "-c",
                f"safe.directory={src}",
                "-C",
                str(src),
                "describe",
                "--always",
                "--dirty",
                "--abbrev=40",
            ],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return head_commit(src / ".git")
    return out.stdout.strip() or head_commit(src / ".git")


def head_commit(git_dir: Path) -> str | None:
    """The commit HEAD names in the folder ``git_dir`` (a .git folder): detached, or through
    its branch's ref file or packed-refs; None when it cannot be read."""
    try:
        head = (git_dir / "HEAD").read_text().strip()
        if not head.startswith("ref: "):
            return head or None
        ref = head[len("ref: ") :]
        if (git_dir / ref).is_file():
            return (git_dir / ref).read_text().strip() or None
        for line in (git_dir / "packed-refs").read_text().splitlines():
            if line.endswith(f" {ref}"):
                return line.split()[0]
    except OSError:
        return None
    return None


def software() -> dict:
    """Versions of pmpipe (and its git commit: the checkout's, or the image's revision label)
    and of the JAX stack, and the Apptainer image the process runs in."""
    import jax

    path, labels = image.current(os.environ)
    return {
        "pmpipe_version": versions.installed("pmpipe"),
        "git_commit": git_commit() or labels.get(image.REVISION),
        "image": path,
        "jax_version": jax.__version__,
        "jaxlib_version": versions.installed("jaxlib"),
        "jaxdecomp_version": versions.installed("jaxdecomp"),
    }


def provenance(
    run_file: config.RunFile, stage: str, mesh: Mesh, started: str, upstream: dict | None = None
) -> dict:
    """Root attributes of a stage store: what made it, from which config and which stores of
    the run (``upstream``: {store folder name: CRC-32 of its manifest}), where and when."""
    import jax

    from pmpipe.runtime import parallel

    devices = mesh.devices.reshape(-1)
    return {
        "format": FORMAT,
        "stage": stage,
        "layout": layout(stage),
        "campaign": run_file.campaign,
        "run_id": run_file.run_id,
        "config": run_file.config.model_dump(mode="json"),
        "config_hash": run_file.config_hash,
        "upstream": dict(upstream or {}),
        "parameters": run_file.parameters,
        **software(),
        "device_kind": devices[0].device_kind,
        "device_count": int(devices.size),
        "process_count": jax.process_count(),
        "pdims": list(parallel.pdims_of(mesh)),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        "started": started,
    }
