"""JAX's persistent compilation cache as pmpipe shares it between processes, set through the
environment (no JAX here): a process that starts JAX reads it, and so does every process it
starts (the workflow's jobs)."""

from __future__ import annotations

import os
from pathlib import Path

FOLDER_VARIABLE = "JAX_COMPILATION_CACHE_DIR"
# How the persistent cache works for pmpipe (each also set in the environment, for the
# processes started, unless the environment sets it already):
SETTINGS = {
    # store every program, however fast it compiled (JAX's default: 1 s) and small it is
    # (-1: no minimum, which JAX's cache set-up may not raise, as it may raise its default 0)
    "jax_persistent_cache_min_compile_time_secs": 0.0,
    "jax_persistent_cache_min_entry_size_bytes": -1,
    # jaxdecomp's FFTs are custom_partitioning calls that name their Python callback by its
    # address, different in every process: with it in the key, no program with a distributed
    # FFT would ever be found again. Without it the calls still differ by what surrounds them
    # (the inverse transform's normalisation), shapes and sharding rules
    "jax_remove_custom_partitioning_ptr_from_cache_key": True,
    # JAX writes the cache folder's path into the compile options of XLA's GPU autotuning
    # cache, and so into every key: a cache copied or moved (a new working directory, a
    # node-local copy) would never be hit. The compiled programs themselves are cached
    "jax_persistent_cache_enable_xla_caches": "none",
}


def share(folder: str | Path) -> Path:
    """The persistent cache in ``folder`` for the processes started from here on, unless
    JAX_COMPILATION_CACHE_DIR names a folder already (that one is used); returns the folder.

    With SETTINGS, every program pmpipe compiles is stored, so the processes of runs of one
    size load their XLA programs instead of compiling them again (the runs' parameters are
    arguments of the programs). Process 0 writes entries; an entry that cannot be read is
    compiled again (JAX warns)."""
    path = Path(os.environ.get(FOLDER_VARIABLE) or Path(folder).absolute())
    os.environ[FOLDER_VARIABLE] = str(path)
    for name, value in SETTINGS.items():
        os.environ.setdefault(name.upper(), str(value))
    return path
