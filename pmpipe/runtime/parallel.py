"""Device meshes and shardings: the only module that knows about devices.

A field of shape (X, Y, Z, ...) is sharded ``P('x', 'y')`` over a mesh of ``pdims = (px, py)``
devices: device (i, j) holds the block X[i*X/px:(i+1)*X/px], Y[j*Y/py:(j+1)*Y/py], all of Z.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
from pathlib import Path

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from pmpipe.runtime import backend, compilation_cache

AXES = ("x", "y")
FIELD_SPEC = P("x", "y")


def make_mesh(pdims: tuple[int, int], devices=None) -> Mesh:
    """A ('x', 'y') mesh of px * py devices (the first px*py of ``jax.devices()`` by default).

    Built from an explicit device array (auto axis types), which jaxdecomp needs.
    """
    px, py = (int(p) for p in pdims)
    devices = jax.devices() if devices is None else list(devices)
    if px < 1 or py < 1:
        raise ValueError(f"parallel.pdims must be two positive integers, got {tuple(pdims)}")
    if px * py > len(devices):
        raise ValueError(
            f"parallel.pdims = ({px}, {py}) needs {px * py} devices but {len(devices)} are "
            f"visible; on CPU set XLA_FLAGS=--xla_force_host_platform_device_count={px * py}"
        )
    return Mesh(np.asarray(devices[: px * py], dtype=object).reshape(px, py), AXES)


def spread_devices(count: int) -> list:
    """``count`` devices taken equally from every process (the first ones of each), process by
    process: the devices of a mesh over part of a run of several processes."""
    processes = jax.process_count()
    if count % processes:
        raise ValueError(
            f"{count} devices cannot be taken equally from {processes} processes: "
            f"use a multiple of {processes}"
        )
    share = count // processes
    owned = [[d for d in jax.devices() if d.process_index == p] for p in range(processes)]
    if any(len(devices) < share for devices in owned):
        raise ValueError(
            f"{count} devices need {share} in each of {processes} processes; "
            f"they hold {min(len(d) for d in owned)}"
        )
    return [d for devices in owned for d in devices[:share]]


def pdims_of(mesh: Mesh) -> tuple[int, int]:
    """(px, py) of a mesh made by :func:`make_mesh`."""
    return int(mesh.shape["x"]), int(mesh.shape["y"])


def field_sharding(mesh: Mesh) -> NamedSharding:
    """Sharding of meshes and particle arrays: blocks over the first two axes."""
    return NamedSharding(mesh, FIELD_SPEC)


def request_host_devices(n: int) -> None:
    """Ask XLA for n CPU devices (XLA_FLAGS) unless a device count is already set.

    Takes effect only before JAX's first device query; harmless on GPU machines, where it
    shapes only the CPU backend. This is how a single process on CPU gets the px * py devices
    that a run's pdims need.
    """
    flags = os.environ.get("XLA_FLAGS", "")
    if n > 1 and not re.search(rf"{backend.HOST_DEVICES_FLAG}=\d+", flags):
        os.environ["XLA_FLAGS"] = f"{flags} {backend.HOST_DEVICES_FLAG}={n}".strip()


def use_host_only() -> None:
    """Run this process's JAX on the CPU only (for orchestrating processes such as Snakemake's,
    which must leave the accelerators and their memory to the jobs they start). Processes it
    starts are not affected. Must run before JAX's first computation."""
    jax.config.update("jax_platforms", "cpu")


def use_compilation_cache(folder: str | Path) -> Path:
    """JAX's persistent compilation cache in ``folder`` for this process and every process it
    starts (:func:`pmpipe.runtime.compilation_cache.share`); returns the folder in use."""
    preset = {name for name in compilation_cache.SETTINGS if name.upper() in os.environ}
    path = compilation_cache.share(folder)
    for name, value in compilation_cache.SETTINGS.items():
        if name not in preset:  # else JAX read the user's setting at import
            jax.config.update(name, value)
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_enable_compilation_cache", True)
    return path


def launcher_processes(environ=None) -> tuple[str, int]:
    """How this process was launched and how many processes the launch has: ('slurm', n) under
    srun, ('mpi', n) under mpiexec (MPICH / Open MPI variables), else ('single', 1)."""
    env = os.environ if environ is None else environ
    tasks = int(env.get("SLURM_STEP_NUM_TASKS", env.get("SLURM_NTASKS", "1")))
    if "SLURM_STEP_ID" in env and tasks > 1:
        return "slurm", tasks
    for size in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MPI_LOCALNRANKS"):
        if int(env.get(size, "1")) > 1:
            return "mpi", int(env[size])
    return "single", 1


LOCAL_RANK_VARIABLES = ("SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID")


def local_device_ids(per_process: int = 1, environ=None) -> list[int] | None:
    """The ``per_process`` GPUs of its node that this process drives, as
    jax.distributed.initialize numbers them among the GPUs it can see (CUDA_VISIBLE_DEVICES,
    else ROCR_VISIBLE_DEVICES):
    - the launcher left exactly its share visible (srun --gpus-per-task, --gpu-bind=single:1 or
      map_gpu, a cgroup per task): all of them, 0 .. per_process - 1; JAX's own default,
      [SLURM_LOCALID], names a GPU the process cannot see for every task but the first;
    - one process on its node: None, every visible GPU;
    - all the node's GPUs visible to each of several processes (srun --ntasks-per-node=T
      --gres=gpu:G): the local rank's share, rank * per_process onwards.
    The local rank is SLURM_LOCALID (srun), OMPI_COMM_WORLD_LOCAL_RANK (Open MPI) or
    MPI_LOCALRANKID (MPICH)."""
    env = os.environ if environ is None else environ
    visible = env.get("CUDA_VISIBLE_DEVICES", env.get("ROCR_VISIBLE_DEVICES"))
    if visible is not None and len([v for v in visible.split(",") if v.strip()]) == per_process:
        return list(range(per_process))
    per_node = env.get("SLURM_STEP_TASKS_PER_NODE", env.get("SLURM_TASKS_PER_NODE", ""))
    if per_node.split("(")[0] == "1" or (
        not per_node
        and "OMPI_COMM_WORLD_LOCAL_SIZE" in env
        and env["OMPI_COMM_WORLD_LOCAL_SIZE"] == "1"
    ):
        return None
    rank = next((int(env[v]) for v in LOCAL_RANK_VARIABLES if v in env), None)
    return None if rank is None else list(range(rank * per_process, (rank + 1) * per_process))


GPU_PLUGIN_NAMES = ("cuda", "rocm")  # JAX's GPU plugins: jax_plugins entry points xla_cuda13, ...


def gpu_platform(platforms: str | None = None, plugins=None, device_files=None) -> bool:
    """Whether JAX will run this process on GPUs, known before JAX starts: its platforms
    (``platforms``, default jax_platforms / JAX_PLATFORMS; empty means any) admit a GPU, a GPU
    plugin of JAX is installed (``plugins``: names of the jax_plugins entry points) and the
    node has a GPU device file (``device_files``: /dev/nvidia<i>, /dev/kfd)."""
    if platforms is None:
        platforms = jax.config.jax_platforms or ""  # type: ignore[attr-defined]  # set at run time
    if platforms and not any(p in platforms for p in ("cuda", "rocm", "gpu")):
        return False
    if plugins is None:
        plugins = [e.name for e in importlib.metadata.entry_points(group="jax_plugins")]
    if not any(gpu in name for name in plugins for gpu in GPU_PLUGIN_NAMES):
        return False
    if device_files is None:
        device_files = backend.gpu_device_files()
    return bool(device_files)


HEARTBEAT_TIMEOUT_SECONDS = 60  # a process that stops answering ends the others after this


def start_processes(total_devices: int) -> tuple[str, int]:
    """Start JAX in this process for a run on ``total_devices`` devices, split equally over the
    processes launched (SLURM detection under srun, mpi4py under mpiexec): one process per GPU,
    one per node with all its GPUs, or anything between; on CPU each process asks for its share
    as XLA host devices. Must run before JAX's first computation; later calls in the same
    process (several stages in one job) find the processes joined already. When a process
    dies, JAX's coordination service ends the others once its heartbeat is missed for
    HEARTBEAT_TIMEOUT_SECONDS (srun's --kill-on-bad-exit and mpiexec end them sooner), so none
    waits in a collective until the job's time limit. Returns (launcher, processes)."""
    launcher, processes = launcher_processes()
    if total_devices % processes:
        raise ValueError(
            f"parallel.pdims needs {total_devices} devices but {processes} processes "
            f"were launched; each process holds an equal share of the devices: "
            f"launch a divisor of {total_devices} processes "
            f"(execution.processes_per_node)"
        )
    per_process = total_devices // processes
    request_host_devices(per_process)
    if processes > 1 and not jax.distributed.is_initialized():
        on_cpu = not gpu_platform()
        if on_cpu:
            jax.config.update("jax_cpu_collectives_implementation", "gloo")
            # CPU programs run to completion in the order they are dispatched, the same order
            # on every process: concurrent programs could enter their collectives in a
            # different order on each process and wait for each other forever (seen with
            # async dispatch)
            jax.config.update("jax_cpu_enable_async_dispatch", False)
        jax.distributed.initialize(
            cluster_detection_method="mpi4py" if launcher == "mpi" else None,
            local_device_ids=local_device_ids(per_process),
            heartbeat_timeout_seconds=HEARTBEAT_TIMEOUT_SECONDS,
        )
        if on_cpu:
            _share_cpu_programs_between_processes()
    return launcher, processes


def _share_cpu_programs_between_processes() -> None:
    """Give the processes of a multi-process CPU job the same persistent-cache keys.

    JAX keys a program by, among others, its backend's topology, and on CPU that is each
    process's own (its local devices), so only process 0 ever found its programs in the cache
    (JAX writes from process 0 alone) and every other process compiled each program again in
    every job. Here the topology fingerprint of a fresh one-process CPU client of this machine
    stands for it, the same on every process. The devices a program runs on stay in its key
    (its device assignment). GPU keys are left as JAX makes them (there it strips the device
    assignment itself to share programs between processes)."""
    from jax._src import cache_key
    from jax._src.lib import xla_client

    devices = xla_client.make_cpu_client().devices()  # type: ignore[attr-defined]  # untyped
    fingerprint = xla_client.get_topology_for_devices(devices).fingerprint()
    topology = cache_key._hash_accelerator_config

    def hash_topology(hash_obj, accelerators):  # JAX's signature: hashlib object, device array
        if all(device.platform == "cpu" for device in accelerators.flat):
            hash_obj.update(fingerprint.to_bytes(8, byteorder="big"))
        else:
            topology(hash_obj, accelerators)

    cache_key._hash_accelerator_config = hash_topology


def barrier(name: str) -> None:
    """Wait until every process reaches this point (no-op with one process)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def largest(value: int) -> int:
    """The largest of an integer over every process (collective: each calls it at the same
    point; the value itself with one process)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        return int(np.max(multihost_utils.process_allgather(np.int32(value))))
    return int(value)


def to_host(x) -> np.ndarray:
    """A (small) JAX array as numpy on every process, gathering the blocks other processes hold."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(x)
