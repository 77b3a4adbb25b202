"""``pmpipe bench store``: write, read and verify throughput of a particle store, through the
path the stages take.

One store of N³ particles (displacement and momentum, (N, N, N, 3) float32 each, sharded over
the device mesh) is written as the N-body stage writes its particles
(pmpipe.stages.layout.write_particles, then store.mark_complete with its manifest), opened as a
reading stage opens it (store.open_complete) and read back onto the devices
(store.read_sharded), then verified with every shard's checksum (store.problems, as
``pmpipe verify --checksums``). Each is timed from the call to the data on disk or on the
devices, best of ``repeat``; a fresh folder each time. Reads right after the write come mostly
from the page cache.
"""

from __future__ import annotations

import os
import platform
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import zarr

from pmpipe.runtime import memory, parallel
from pmpipe.stages import layout
from pmpipe.storage import integrity, store

ARRAYS = ("displacement", "momentum")


def _disk(path: Path) -> tuple[int, int]:
    """Files and bytes under path."""
    sizes = [p.stat().st_size for p in path.rglob("*") if p.is_file()]
    return len(sizes), sum(sizes)


def bench_store(
    particles: int, pdims: tuple[int, int] = (1, 1), repeat: int = 3, folder=None
) -> dict:
    """Seconds and GB/s (1e9 bytes) to write, read and verify a store of ``particles``³
    particles on a ``pdims`` device mesh, in new folders under ``folder`` (default: the
    system's temporary folder); its files, bytes, shard and chunk shapes."""
    import jax

    mesh = parallel.make_mesh(pdims)
    shape = (particles,) * 3 + (3,)
    sharding = parallel.field_sharding(mesh)
    disp, mom = (
        jax.device_put(jax.random.normal(jax.random.key(i), shape, np.float32), sharding)
        for i in range(2)
    )
    jax.block_until_ready((disp, mom))
    seconds: dict[str, list[float]] = {"write": [], "read": [], "verify": []}
    for _ in range(repeat):
        root = Path(tempfile.mkdtemp(prefix="pmpipe-bench-store-", dir=folder))
        path = root / "nbody.zarr"
        try:
            start = time.perf_counter()
            group = store.create(path, {"benchmark": "store"})
            layout.write_particles(group, disp, mom, 1.0)
            store.mark_complete(group)
            seconds["write"].append(time.perf_counter() - start)
            start = time.perf_counter()
            opened = store.open_complete(path)
            arrays = [a for a in (opened[name] for name in ARRAYS) if isinstance(a, zarr.Array)]
            back = [store.read_sharded(a, mesh) for a in arrays]
            jax.block_until_ready(back)
            seconds["read"].append(time.perf_counter() - start)
            equal = all(bool(jax.numpy.array_equal(a, b)) for a, b in zip(back, (disp, mom)))
            start = time.perf_counter()
            problems = store.problems(path, checksums=True)
            seconds["verify"].append(time.perf_counter() - start)
            files, disk_bytes = _disk(path)
            shards = list(integrity.shard_shape(arrays[0]))
            chunks = list(arrays[0].chunks)
        finally:
            shutil.rmtree(root)
        if not equal or problems:
            raise RuntimeError(f"the store read back differs or fails its checks: {problems}")
    data_bytes = 2 * disp.nbytes
    best = {name: min(values) for name, values in seconds.items()}
    return {
        "benchmark": "store",
        "particles": particles,
        "pdims": list(pdims),
        "devices": jax.device_count(),
        "device_kind": jax.devices()[0].device_kind,
        "platform": jax.default_backend(),
        "folder": str(Path(folder or tempfile.gettempdir()).resolve()),
        "repeat": repeat,
        "data_bytes": data_bytes,
        "files": files,
        "disk_bytes": disk_bytes,
        "shards": shards,
        "chunks": chunks,
        **{f"{name}_s": value for name, value in best.items()},
        **{f"{name}_gb_per_s": data_bytes / value / 1e9 for name, value in best.items()},
        "peak_rss_bytes": memory.peak_rss_bytes(),
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
    }
