"""`pmpipe tune`: the sweep that times one PM step for every slab and pencil decomposition of
a device count on this machine; :mod:`pmpipe.campaigns.decomposition` records and reads
the results."""

from __future__ import annotations

import datetime

from pmpipe.campaigns import decomposition, step_timing
from pmpipe.physics.mesh import domain
from pmpipe.runtime import parallel


def sweep(
    devices: int, particles: int, oversample: int, halo: int, repeat: int = 3
) -> decomposition.Sweep:
    """Time one PM step on this machine's first ``devices`` devices for every candidate."""
    import jax

    seconds = {}
    for pdims in decomposition.candidates(devices, particles, oversample, halo):
        mesh = parallel.make_mesh(pdims)
        grid = domain.Grid(mesh, particles, oversample, step_timing.BOX_SIZE, halo)
        disp, mom = step_timing.lpt_particles(particles, mesh)
        seconds[decomposition.label(pdims)] = step_timing.step_seconds(
            disp, mom, grid, step_timing.COSMOLOGY.Omega_m, repeat
        )
    fastest = min(seconds, key=lambda name: seconds[name])
    px, py = (int(p) for p in fastest.split("x"))
    return decomposition.Sweep(
        devices=devices,
        force_mesh=particles * oversample,
        pdims=(px, py),
        step_seconds=seconds,
        measured=datetime.date.today().isoformat(),
        jax=jax.__version__,
    )
