"""`pmpipe bench nbody`: reproducible timings and memory of the PM core, as JSON.

Runs 2LPT at a = 0.1 then S PM steps to a = 1 on an N^3 particle grid in a 256 Mpc/h box (one
compiled program), once to compile (warm-up, counting the programs compiled) and once timed,
and times one PM step, painting, reading and the FFT floor (one r2c + three c2r of the force
mesh) on their own in the same process. Memory: the evolution program's own memory analysis
(arguments plus temporaries per particle), the process's peak RSS and, on GPUs, the device's
peak. Peers (JaxPM, pmwd) run the same job in processes of their own.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from pmpipe.campaigns import step_timing
from pmpipe.campaigns.step_timing import A_INIT, BOX_SIZE, COSMOLOGY, POWER, timed
from pmpipe.physics.evolution import ics, particle_mesh, schedule, simulation, timesteps
from pmpipe.physics.mesh import domain, fft, painting
from pmpipe.physics.mesh.domain import Grid
from pmpipe.physics.statistics import stats
from pmpipe.physics.theory import cosmology
from pmpipe.runtime import compilation, memory, parallel

REFERENCE_RTOL = 1e-5  # Dopri5 rtol = atol of the converged JaxPM reference


def evolution_memory(particles: int, oversample: int, steps: int, mesh, halo: int) -> dict:
    """The compiled evolution's memory analysis: arguments, temporaries and outputs (bytes)
    and arguments plus temporaries per particle."""
    grid = Grid(mesh, particles, oversample, BOX_SIZE, halo)
    plan = schedule.build(timesteps.timeline(A_INIT, 1.0, steps), None, np.float32)
    state = jax.ShapeDtypeStruct(
        (particles,) * 3 + (3,), jnp.float32, sharding=parallel.field_sharding(mesh)
    )
    cosmo = cosmology.tabulated(COSMOLOGY)
    stats = (
        particle_mesh.evolution.lower(cosmo, state, state, plan, None, grid=grid)
        .compile()
        .memory_analysis()
    )
    if stats is None:
        raise RuntimeError(
            f"XLA gives no memory analysis of the compiled step on {jax.devices()[0].platform}"
        )
    used = stats.argument_size_in_bytes + stats.temp_size_in_bytes
    return {
        "argument_bytes": stats.argument_size_in_bytes,
        "temp_bytes": stats.temp_size_in_bytes,
        "output_bytes": stats.output_size_in_bytes,
        "bytes_per_particle": used / particles**3 * mesh.size,
    }


def step_parts(disp, mom, grid: Grid, omega_m: float, repeat: int = 5) -> dict:
    """Best-of-``repeat`` seconds of one PM step (``step_s``, :func:`step_seconds`) and of its
    parts, each compiled on its own: ``paint_s`` (CIC with halo folding), ``read_s`` (three
    force components at the particles, halo filled), ``fft_s`` (one r2c of the force mesh),
    ``c2r_s`` (one c2r) and ``fft_floor_s`` (one r2c and three c2r, the transforms of a step)."""
    m, mesh = grid.force_cells, grid.mesh
    paint = jax.jit(lambda d: painting.paint(d, grid, float(grid.oversample**3)))
    rho, _ = paint(disp)
    force_mesh = jax.device_put(jnp.zeros((m, m, m, 3), rho.dtype), parallel.field_sharding(mesh))
    read = jax.jit(lambda f, d: painting.read(f, d, grid))
    r2c = jax.jit(lambda x: fft.r2c(x, mesh))

    def floor(x):
        xk = fft.r2c(x, mesh)
        return [fft.c2r(xk * (i + 1.0), mesh) for i in range(3)]

    return {
        "step_s": step_timing.step_seconds(disp, mom, grid, omega_m, repeat),
        "paint_s": timed(paint, disp, repeat=repeat),
        "read_s": timed(read, force_mesh, disp, repeat=repeat),
        "fft_s": timed(r2c, rho, repeat=repeat),
        "c2r_s": timed(jax.jit(lambda k: fft.c2r(k, mesh)), r2c(rho), repeat=repeat),
        "fft_floor_s": timed(jax.jit(floor), rho, repeat=repeat),
    }


def bench_nbody(
    particles: int,
    steps: int,
    pdims=(1, 1),
    oversample: int = 1,
    halo: int = 8,
    compare: str | None = None,
    pmwd_path: str | None = None,
) -> dict:
    """Measure one configuration (the white noise of seed 0); returns the JSON-ready record. compare='jaxpm' adds the
    JaxPM peer and the accuracy of both against a converged JaxPM reference; compare='pmwd'
    adds pmwd's run of the same job (from the Python path or ``pmwd_path``)."""
    domain.check_divisible(particles, pdims)
    # pmwd's process first, while this one holds nothing on the device: otherwise the two
    # together can exceed it (512^3 at B = 2 on one 141 GB GPU)
    peer = compare_pmwd(particles, oversample, steps, pmwd_path) if compare == "pmwd" else None
    mesh = parallel.make_mesh(pdims)
    cosmo = COSMOLOGY
    grid = Grid(mesh, particles, oversample, BOX_SIZE, halo)
    noise = ics.white_noise(0, particles, mesh)
    times = timesteps.timeline(A_INIT, 1.0, steps)

    def full_run():
        init, res = simulation.simulate(cosmo, noise, grid, times, POWER)
        jax.block_until_ready(res.disp)
        return init, res

    t0 = time.perf_counter()
    with compilation.CompileCounter() as warm:
        full_run()
    warm_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    with compilation.CompileCounter() as timed:
        init, res = full_run()
    run_s = time.perf_counter() - t0

    record = {
        "benchmark": "nbody",
        "particles": particles,
        "force_mesh": grid.force_cells,
        "oversample": oversample,
        "steps": steps,
        "box_size": BOX_SIZE,
        "pdims": list(pdims),
        "halo": halo,
        "devices": mesh.size,
        "device_kind": jax.devices()[0].device_kind,
        "platform": jax.default_backend(),
        "compile_s": warm_s - run_s,
        "programs_compiled": warm.counts.compiled,  # by XLA in the warm-up (not from the cache)
        "programs_from_cache": warm.counts.hits,
        "programs_timed_run": timed.counts.programs,  # 0: the timed run compiles nothing
        "run_s": run_s,
        "evolution_s": res.seconds,  # the evolution's share of run_s, timed on its own
        **step_parts(res.disp, res.mom, grid, cosmo.Omega_m),
        "jax": jax.__version__,
        "python": platform.python_version(),
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "cpu_count": os.cpu_count(),
    }
    peak = memory.peak_rss_bytes()  # after every measurement above
    record.update(
        peak_rss_bytes=peak,
        rss_bytes_per_particle=peak / particles**3,
        device_peak_bytes=memory.device_peak_bytes(),
        device_bytes_limit=memory.device_bytes_limit(),
        evolution_memory=evolution_memory(particles, oversample, steps, mesh, halo),
    )
    if record["device_peak_bytes"] is not None:
        record["device_bytes_per_particle"] = record["device_peak_bytes"] / particles**3
    if compare == "jaxpm":
        record.update(compare_jaxpm(init.delta_linear, res.disp, mesh, steps, halo))
        record["vs_jaxpm"] = _versus(record, record["jaxpm"])
    if peer is not None:
        record["pmwd"] = peer
        record["vs_pmwd"] = _versus(record, peer)
    return record


def _versus(record: dict, peer: dict) -> dict:
    """pmpipe's run time and peak memory over the peer's (device peaks where both have one)."""
    ratios = {
        "run_s_ratio": record["run_s"] / peer["run_s"],
        "peak_rss_ratio": record["peak_rss_bytes"] / peer["peak_rss_bytes"],
    }
    if record["device_peak_bytes"] is not None and peer.get("device_peak_bytes"):
        ratios["device_peak_ratio"] = record["device_peak_bytes"] / peer["device_peak_bytes"]
    return ratios


def _peer_env() -> dict:
    """The environment of a peer's process: this process's platform, by the name that
    JAX_PLATFORMS takes ('cuda', not 'gpu', which makes JAX try ROCm too)."""
    backend = "cuda" if parallel.gpu_platform() else "cpu"  # without starting this one's backend
    return dict(os.environ, JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS") or backend)


def compare_pmwd(particles: int, oversample: int, steps: int, pmwd_path: str | None) -> dict:
    """pmwd's run of the job in its own process (pmpipe.bench.peers.pmwd); returns its record."""
    with tempfile.TemporaryDirectory(prefix="pmpipe-bench-") as tmp:
        out = os.path.join(tmp, "pmwd.json")
        cmd = [
            sys.executable,
            "-m",
            "pmpipe.bench.peers.pmwd",
            "--particles",
            str(particles),
            "--oversample",
            str(oversample),
            "--steps",
            str(steps),
            "--box",
            str(BOX_SIZE),
            "--a-init",
            str(A_INIT),
            "--out",
            out,
        ]
        subprocess.run(
            cmd + (["--pmwd", pmwd_path] if pmwd_path else []), check=True, env=_peer_env()
        )
        with open(out) as fh:
            return json.load(fh)


def _run_jaxpm(field_path: str, out: str, solver: str, steps: int) -> tuple[np.ndarray, dict]:
    """One JaxPM evolution in its own process (clean timings and peak memory)."""
    cmd = [
        sys.executable,
        "-m",
        "pmpipe.bench.peers.jaxpm",
        "--field",
        field_path,
        "--box",
        str(BOX_SIZE),
        "--cosmology",
        json.dumps(dataclasses.asdict(COSMOLOGY)),
        "--a-init",
        str(A_INIT),
        "--lpt-order",
        "2",
        "--solver",
        solver,
        "--steps",
        str(steps),
        "--rtol",
        str(REFERENCE_RTOL),
        "--out",
        out,
    ]
    subprocess.run(cmd, check=True, env=_peer_env())
    with open(out + ".json") as fh:
        record = json.load(fh)
    return np.load(out + ".npz")["disp"], record


def accuracy(disp, disp_ref, mesh, halo: int, box_size: float = BOX_SIZE) -> dict:
    """Final-density accuracy of `disp` against `disp_ref` (both (N, N, N, 3), Mpc/h), both
    painted with the same CIC on the particle grid: pk_rel_diff_lowk (max |P/P_ref - 1| over
    the three lowest k bins), pk_rel_diff (max over k < k_Nyquist/4), r_min (min
    cross-correlation coefficient over k < k_Nyquist/4)."""
    n = disp.shape[0]
    grid = Grid(mesh, n, 1, box_size, halo)
    rho = painting.paint(jnp.asarray(disp), grid)[0]
    rho_ref = painting.paint(jnp.asarray(disp_ref), grid)[0]
    k, p, _ = stats.power_spectrum(rho, mesh, box_size)
    _, p_ref, _ = stats.power_spectrum(rho_ref, mesh, box_size)
    _, p_x, _ = stats.power_spectrum(rho, mesh, box_size, field2=rho_ref)
    below = k < np.pi * n / box_size / 4
    rel = np.abs(p / p_ref - 1.0)
    r = p_x / np.sqrt(p * p_ref)
    return {
        "pk_rel_diff_lowk": float(rel[:3].max()),
        "pk_rel_diff": float(rel[below].max()),
        "r_min": float(r[below].min()),
    }


def compare_jaxpm(delta_linear, disp, mesh, steps: int, halo: int) -> dict:
    """JaxPM 0.1.6 from the same linear field: `steps` leapfrog steps (speed peer) and Dopri5
    (reference); returns {'jaxpm': record, 'reference': record, 'accuracy': {...}}."""
    with tempfile.TemporaryDirectory(prefix="pmpipe-bench-") as tmp:
        field_path = os.path.join(tmp, "delta_linear.npy")
        np.save(field_path, np.asarray(delta_linear))
        disp_peer, peer = _run_jaxpm(field_path, os.path.join(tmp, "leapfrog"), "leapfrog", steps)
        disp_ref, ref = _run_jaxpm(field_path, os.path.join(tmp, "dopri5"), "dopri5", steps)
    acc = {
        "pmpipe": accuracy(disp, disp_ref, mesh, halo),
        "jaxpm": accuracy(disp_peer, disp_ref, mesh, halo),
    }
    return {"jaxpm": peer, "reference": ref, "accuracy": acc}


def write_json(record: dict, path: str) -> None:
    with open(path, "w") as fh:
        json.dump(record, fh, indent=2)
        fh.write("\n")
