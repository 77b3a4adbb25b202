"""Site settings of a SLURM cluster: partition, account, QoS, constraint, GPUs per node, extra
sbatch options, the launcher of multi-process stages, the Apptainer image jobs run in and
the environment variables of their processes.

They come from a small YAML file (``profiles/slurm/site.yaml`` is the documented template)
and from environment variables, which win. This module is the only place that reads them:

    PMPIPE_SITE                 the site file (default: the file given to load_site)
    PMPIPE_SLURM_PARTITION      partition
    PMPIPE_SLURM_ACCOUNT        account
    PMPIPE_SLURM_QOS            quality of service
    PMPIPE_SLURM_CONSTRAINT     node features (sbatch --constraint)
    PMPIPE_SLURM_GPUS_PER_NODE  GPUs per node (overrides execution.devices_per_node on gpu)
    PMPIPE_SLURM_EXTRA          further sbatch options, e.g. "--exclusive --reservation=x"
    PMPIPE_SLURM_SIGNAL_SECONDS seconds before the time limit at which SLURM sends SIGUSR2
    PMPIPE_IMAGE                the Apptainer image every job runs in
    PMPIPE_APPTAINER            the command that runs it, e.g. "singularity"
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from pmpipe.run import config

DEFAULT_MAX_ARRAY_SIZE = 1001  # SLURM's MaxArraySize when slurm.conf sets none

ENVIRONMENT = {
    "PMPIPE_SLURM_PARTITION": "partition",
    "PMPIPE_SLURM_ACCOUNT": "account",
    "PMPIPE_SLURM_QOS": "qos",
    "PMPIPE_SLURM_CONSTRAINT": "constraint",
    "PMPIPE_SLURM_GPUS_PER_NODE": "gpus_per_node",
    "PMPIPE_SLURM_EXTRA": "extra",
    "PMPIPE_SLURM_SIGNAL_SECONDS": "signal_seconds",
    "PMPIPE_IMAGE": "image",
    "PMPIPE_APPTAINER": "apptainer",
}


class Site(BaseModel):
    """Where SLURM jobs go; every field optional (SLURM's defaults apply)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    partition: str | None = Field(None, description="sbatch --partition")
    account: str | None = Field(None, description="sbatch --account")
    qos: str | None = Field(None, description="sbatch --qos")
    constraint: str | None = Field(None, description="sbatch --constraint (node features)")
    gpus_per_node: int | None = Field(
        None,
        ge=1,
        description="GPUs per node; replaces the campaign's execution.devices_per_node on gpu",
    )
    extra: list[str] = Field(default_factory=list, description="further sbatch options")
    launcher: str = Field(
        "srun",
        description="command that starts a multi-process stage "
        "(its geometry options are added by pmpipe)",
    )
    signal_seconds: int = Field(
        300,
        ge=10,
        description="SLURM sends SIGUSR2 this many seconds before a job's time limit "
        "(sbatch --signal=USR2@s; at most a quarter of the job's time): time for the N-body to "
        "end its step and write a checkpoint; the job then requeues itself",
    )
    image: str | None = Field(
        None,
        description="Apptainer image (.sif file or sandbox directory) every job's pmpipe "
        "runs in, as `[srun <geometry>] apptainer exec [--nv] <options> <image> python -m "
        "pmpipe...`; null: the Python of the job's environment",
    )
    apptainer: str = Field(
        "apptainer",
        description="command that runs the image (apptainer, singularity, or a site's wrapper)",
    )
    apptainer_options: list[str] = Field(
        default_factory=list,
        description="options of `apptainer exec`, e.g. --bind=/scratch "
        "(--nv is added for jobs with GPUs)",
    )
    max_array_size: int | None = Field(
        None,
        ge=1,
        description="the most tasks of one job array (slurm.conf MaxArraySize); null: "
        "`scontrol show config` says, else SLURM's default 1001",
    )
    max_submit_jobs: int | None = Field(
        None,
        ge=1,
        description="the most jobs (array tasks count one each) you may have queued and "
        "running at once (your QOS's MaxSubmitJobs): `pmpipe submit` submits at most this many "
        "tasks at a time; null: no limit",
    )
    env: dict[Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")], str] = Field(
        default_factory=dict,
        description="environment variables of every job's pmpipe "
        "processes (NCCL_*, XLA_FLAGS, ...), set by `env NAME=value` in front of the image or "
        "the Python, after the launcher",
    )


def from_mapping(data: Mapping, environ: Mapping[str, str], source: str) -> Site:
    """Site settings from a mapping (named ``source`` in errors) with the PMPIPE_SLURM_*
    variables applied over it. Raises config.ConfigError naming the field or variable."""
    data = dict(data)
    for variable, key in ENVIRONMENT.items():
        value = environ.get(variable)
        if value:
            data[key] = shlex.split(value) if key == "extra" else value
            source = f"{source} and {variable}"
    try:
        return Site.model_validate(data)
    except ValidationError as err:
        raise config.ConfigError(config.format_errors(source, err)) from None


def load_site(path: str | Path | None, environ: Mapping[str, str]) -> Site:
    """Site settings from the file ``environ['PMPIPE_SITE']`` or else ``path`` (its ``site``
    section; a missing default file means none), then the PMPIPE_SLURM_* variables."""
    path = environ.get("PMPIPE_SITE") or path
    data: Mapping = {}
    if path is not None and (Path(path).exists() or environ.get("PMPIPE_SITE")):
        if not Path(path).exists():
            raise config.ConfigError(f"PMPIPE_SITE={path}: no such site file")
        whole = config.read_mapping(path) or {}
        if set(whole) != {"site"}:
            raise config.ConfigError(
                f"{path}: a site file has one top-level key, 'site' "
                f"(found {', '.join(map(str, whole)) or 'none'})"
            )
        data = whole["site"] or {}
    return from_mapping(data, environ, str(path) if path is not None else "site settings")


def scontrol_config() -> str | None:
    """The output of ``scontrol show config``, or None where scontrol is absent or fails."""
    if shutil.which("scontrol") is None:
        return None
    try:
        out = subprocess.run(
            ["scontrol", "show", "config"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def max_array_size(site: Site | None, scontrol_text: str | None) -> tuple[int, str]:
    """The most tasks of one job array and where that comes from: the site's
    ``max_array_size``, else MaxArraySize in ``scontrol_text`` (:func:`scontrol_config`), else
    SLURM's default."""
    if site is not None and site.max_array_size is not None:
        return site.max_array_size, "site max_array_size"
    found = re.search(r"^MaxArraySize\s*=\s*(\d+)", scontrol_text or "", re.MULTILINE)
    if found:
        return int(found.group(1)), "MaxArraySize of scontrol show config"
    return DEFAULT_MAX_ARRAY_SIZE, "SLURM's default MaxArraySize"
