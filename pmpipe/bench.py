"""`pmpipe bench nbody`: reproducible timings and memory of the PM core, as JSON.

Runs 2LPT at a = 0.1 then S PM steps to a = 1 on an N^3 particle grid in a 256 Mpc/h box,
once to compile (warm-up) and once timed, and times painting, reading and the FFT floor
(one r2c + three c2r of the force mesh) on their own in the same process.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import sys
import time

import jax
import jax.numpy as jnp

from pmpipe import cosmology, fft, ics, nbody, painting, parallel, simulation

BOX_SIZE = 256.0
A_INIT = 0.1


def _timed(fn, *args, repeat: int = 5) -> float:
    """Best-of-`repeat` wall time (s) of a jitted call, after one warm-up call."""
    jax.block_until_ready(fn(*args))
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        best = min(best, time.perf_counter() - t0)
    return best


def _peak_rss_bytes() -> int:
    scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss is KiB on Linux
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


def bench_nbody(particles: int, steps: int, pdims=(1, 1), oversample: int = 1, halo: int = 8,
                seed: int = 0) -> dict:
    """Measure one configuration; returns the JSON-ready record."""
    mesh = parallel.make_mesh(pdims)
    parallel.check_divisible(particles, pdims)
    cosmo = cosmology.Cosmology()
    grid = nbody.PMGrid(particles, oversample, BOX_SIZE, halo)
    noise = ics.white_noise(seed, particles, mesh)

    def full_run():
        _, res = simulation.simulate(cosmo, noise, mesh, grid, A_INIT, 1.0, steps)
        jax.block_until_ready(res.disp)
        return res

    t0 = time.perf_counter()
    full_run()
    warm_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    res = full_run()
    run_s = time.perf_counter() - t0

    m = grid.mesh
    paint = jax.jit(lambda d: painting.paint(d, mesh, m, BOX_SIZE, halo, float(oversample**3)))
    rho, _ = paint(res.disp)
    force_mesh = jax.device_put(jnp.zeros((m, m, m, 3), rho.dtype), parallel.field_sharding(mesh))
    read = jax.jit(lambda f, d: painting.read(f, d, mesh, BOX_SIZE, halo))
    r2c = jax.jit(lambda x: fft.r2c(x, mesh))
    rho_k = r2c(rho)

    def floor(x):
        xk = fft.r2c(x, mesh)
        return [fft.c2r(xk * (i + 1.0), mesh) for i in range(3)]

    record = {
        "benchmark": "nbody",
        "mesh": particles,
        "force_mesh": m,
        "oversample": oversample,
        "steps": steps,
        "box_size": BOX_SIZE,
        "pdims": list(pdims),
        "devices": mesh.size,
        "device_kind": jax.devices()[0].device_kind,
        "platform": jax.default_backend(),
        "compile_s": warm_s - run_s,
        "run_s": run_s,
        "step_s": sum(res.step_seconds) / len(res.step_seconds),
        "paint_s": _timed(paint, res.disp),
        "read_s": _timed(read, force_mesh, res.disp),
        "fft_s": _timed(r2c, rho),
        "c2r_s": _timed(jax.jit(lambda k: fft.c2r(k, mesh)), rho_k),
        "fft_floor_s": _timed(jax.jit(floor), rho),
        "jax": jax.__version__,
        "python": platform.python_version(),
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "cpu_count": os.cpu_count(),
    }
    peak = _peak_rss_bytes()  # after every measurement above
    record.update(peak_rss_bytes=peak, bytes_per_particle=peak / particles**3)
    return record


def write_json(record: dict, path: str) -> None:
    with open(path, "w") as fh:
        json.dump(record, fh, indent=2)
        fh.write("\n")
