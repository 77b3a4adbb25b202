"""The OpenMP threads of the compiled libraries a job calls on the host (healpy's spherical
harmonic transforms, CAMB), set through the environment: each library's OpenMP runtime reads
OMP_NUM_THREADS once, when it loads.

By default an OpenMP team has a thread on every core the process may use. A job's process runs
other work beside it: up to :data:`pmpipe.storage.writes.WRITE_THREADS` threads compressing and
writing stores, the next run's Boltzmann table made ahead (CLASS in a process of its own), JAX's
host threads. A team whose threads do not each find a free core waits at each of its barriers
for the thread that lost its core: measured on a 16-core node, healpy's map2alm of 5 full-sky
shells took 0.55 s alone with 16 threads and 2.7 s beside a single busy core
(docs/performance.md). A team leaving cores free for that work does not collapse so."""

from __future__ import annotations

import os
from collections.abc import MutableMapping

THREADS_VARIABLE = "OMP_NUM_THREADS"
SPARE_FRACTION = 4  # one core in this many is left to the job's other work


def spare_cores(cpus: int) -> int:
    """The cores of ``cpus`` an OpenMP team leaves to the job's other work: one in
    SPARE_FRACTION (none of 1 to 3, 4 of 16)."""
    return cpus // SPARE_FRACTION


def threads_for(cpus: int) -> int:
    """OpenMP threads for a process with ``cpus`` cores: all but its :func:`spare_cores`
    (12 of 16: beside 4 busy cores the 5 shells took 0.69 s), never fewer than 1."""
    return max(1, cpus - spare_cores(cpus))


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity: SLURM's --cpus-per-task under srun)."""
    return len(os.sched_getaffinity(0))


def leave_spare_cores(environ: MutableMapping[str, str] | None = None) -> int:
    """Set OMP_NUM_THREADS to :func:`threads_for` the usable cores unless the environment sets
    it already (a user's choice is kept); returns the value in force. Effective for the
    libraries loaded after this call, and for the processes started from here on."""
    environ = os.environ if environ is None else environ
    if THREADS_VARIABLE not in environ:
        environ[THREADS_VARIABLE] = str(threads_for(usable_cores()))
    return int(environ[THREADS_VARIABLE])


def threads_in_force(environ: MutableMapping[str, str] | None = None) -> str | None:
    """OMP_NUM_THREADS as this process's environment sets it (None when unset)."""
    return (os.environ if environ is None else environ).get(THREADS_VARIABLE)
