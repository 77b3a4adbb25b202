"""``pmpipe doctor --distributed``: every process of a job (launched by srun or mpiexec) starts
jax.distributed on its own devices, checks an all-to-all and a psum over all devices of the job,
times the psum for a few sizes, and gathers what each process found; process 0 prints a line
per process (rank, host, local devices, transport, memory fraction in force) and every field
on which the processes disagree. On a GPU node a process touches only its own GPUs and
allocates as it goes (XLA_PYTHON_CLIENT_PREALLOCATE=false unless set)."""

from __future__ import annotations

import ctypes
import json
import os
import platform
import time
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from pmpipe.runtime import log, memory, parallel, versions

LOG = log.get(__name__)
SIZES_BYTES = (1 << 16, 1 << 20, 1 << 24)  # float32 operand of the timed psum, per device
FACTS_BYTES = 8192  # the most one process's facts take as JSON
AGREED = ("pmpipe", "jax", "platform", "device_kind", "local_devices", "transport", "fraction")


def nccl_loaded(maps: str = "/proc/self/maps") -> str | None:
    """The NCCL library this process has loaded, as 'NCCL <version> (<path>)' from its own
    ncclGetVersion; None when none is loaded (a CPU process, or before the first collective)."""
    try:
        paths = sorted(
            {line.split()[-1] for line in Path(maps).read_text().splitlines() if "libnccl" in line}
        )
    except OSError:
        return None
    for path in paths:
        try:
            code = ctypes.c_int()
            ctypes.CDLL(path).ncclGetVersion(ctypes.byref(code))
        except (OSError, AttributeError):
            continue
        v = code.value
        return f"NCCL {v // 10000}.{v // 100 % 100}.{v % 100} ({path})"
    return None


def interconnect(root: str = "/sys/class/infiniband") -> str:
    """The InfiniBand devices the node shows (none visible: 'no InfiniBand device')."""
    try:
        names = sorted(p.name for p in Path(root).iterdir())
    except OSError:
        names = []
    return "InfiniBand " + ", ".join(names) if names else "no InfiniBand device"


def memory_fraction(platform_name: str, environ: Mapping[str, str]) -> str:
    """The share of each GPU's memory XLA's allocator may take, and whether it takes it at
    start; 'n/a' on CPU."""
    if platform_name != "gpu":
        return "n/a"
    fraction = environ.get(memory.MEMORY_FRACTION_VARIABLE, str(memory.XLA_DEFAULT_FRACTION))
    allocate = environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", "true")
    return f"{fraction}, preallocate {allocate}"


def collectives() -> dict:
    """An all-to-all and a psum over every device of the job, checked against their known
    results, and the psum's time for each of SIZES_BYTES (best of 3): a dict of
    'all_to_all' and 'psum' (True when right) and 'psum_timings' [(bytes, seconds)]."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec

    n = jax.device_count()
    mesh = jax.make_mesh((n,), ("d",), devices=jax.devices())
    spec = NamedSharding(mesh, PartitionSpec("d"))

    def mapped(f):
        return jax.jit(
            jax.shard_map(f, mesh=mesh, in_specs=PartitionSpec("d"), out_specs=PartitionSpec("d"))
        )

    rows = np.arange(n * n, dtype=np.int32).reshape(n, n)  # device d holds row d: d n + j
    swapped = mapped(lambda x: jax.lax.all_to_all(x, "d", 1, 1, tiled=True))(
        jax.device_put(rows, spec)
    )
    summed = mapped(lambda x: jax.lax.psum(x, "d"))(
        jax.device_put(np.arange(n, dtype=np.int32), spec)
    )
    timings = []
    psum = mapped(lambda x: jax.lax.psum(x, "d"))
    for size in SIZES_BYTES:
        x = jax.device_put(jnp.ones((n, size // 4), jnp.float32), spec)
        psum(x).block_until_ready()
        best = min(_timed(psum, x) for _ in range(3))
        timings.append((size, best))
    return {
        "all_to_all": bool(np.array_equal(parallel.to_host(swapped), rows.T)),
        "psum": bool(np.all(parallel.to_host(summed) == n * (n - 1) // 2)),
        "psum_timings": timings,
    }


def _timed(f, x) -> float:
    start = time.perf_counter()
    f(x).block_until_ready()
    return time.perf_counter() - start


def facts(environ: Mapping[str, str]) -> dict:
    """What this process found: its rank, host, devices, transport and memory settings."""
    import jax

    name = jax.default_backend()
    local = jax.local_devices()
    return {
        "rank": jax.process_index(),
        "host": platform.node(),
        "pmpipe": versions.installed("pmpipe"),
        "jax": jax.__version__,
        "platform": name,
        "device_kind": local[0].device_kind,
        "local_devices": len(local),
        "device_ids": [d.id for d in local],
        "transport": (nccl_loaded() or "NCCL not loaded") if name == "gpu" else "gloo",
        "interconnect": interconnect(),
        "fraction": memory_fraction(name, environ),
    }


def gathered(mine: dict) -> list[dict]:
    """Every process's facts, in rank order (collective)."""
    from jax.experimental import multihost_utils

    data = json.dumps(mine).encode()[:FACTS_BYTES]
    padded = np.zeros(FACTS_BYTES, np.uint8)
    padded[: len(data)] = np.frombuffer(data, np.uint8)
    every = np.asarray(multihost_utils.process_allgather(padded)).reshape(-1, FACTS_BYTES)
    return [json.loads(bytes(row).rstrip(b"\0")) for row in every]


def disagreements(every: list[dict]) -> list[str]:
    """The fields of AGREED on which processes differ, each with the ranks of each value."""
    out = []
    for field in AGREED:
        ranks: dict[str, list[int]] = {}
        for f in every:
            value = f[field] if field != "transport" else f[field].split(" (")[0]
            ranks.setdefault(str(value), []).append(f["rank"])
        if len(ranks) > 1:
            out.append(f"{field}: " + "; ".join(f"{v} on ranks {r}" for v, r in ranks.items()))
    return out


def run(environ: Mapping[str, str] | None = None) -> int:
    """The check on this process (every process of the job runs it); 0 when the collectives
    are right and the processes agree, else 1. Process 0 prints the report."""
    environ = os.environ if environ is None else environ
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    launcher, processes = parallel.launcher_processes(environ)
    parallel.start_processes(processes)  # one device per process
    import jax

    results = collectives()
    every = gathered(facts(environ))
    problems = disagreements(every)
    problems += [
        f"{name} over {jax.device_count()} devices gave a wrong result"
        for name in ("all_to_all", "psum")
        if not results[name]
    ]
    if jax.process_index() == 0:
        print(f"{processes} processes ({launcher}), {jax.device_count()} devices")
        for f in every:
            print(
                f"rank {f['rank']}  {f['host']}  {f['local_devices']} x {f['device_kind']} "
                f"(ids {f['device_ids']})  {f['transport']}  {f['interconnect']}  "
                f"memory fraction {f['fraction']}"
            )
        print(
            f"all-to-all: {'ok' if results['all_to_all'] else 'WRONG'}; psum: {'ok' if results['psum'] else 'WRONG'}"
        )
        for size, seconds in results["psum_timings"]:
            print(
                f"psum of {size / 2**20:g} MiB per device: {seconds * 1e3:.3g} ms, {size / seconds / 1e9:.3g} GB/s per device"
            )
        for problem in problems:
            LOG.error("PROBLEM: %s", problem)
        if not problems:
            print("no disagreement between the processes")
    return 1 if problems else 0
