"""JaxPM 0.1.6 peer runs for `pmpipe bench nbody --compare jaxpm`, one per process.

Run as ``python -m pmpipe.bench.peers.jaxpm --field F.npy --box L --cosmology JSON ... --solver S --out O``:
reads the linear density at a = 1 (N, N, N) that pmpipe generated, runs JaxPM's LPT at a_init
and evolves to a = 1 with diffrax, either S constant LeapfrogMidpoint steps (the speed peer:
warm-up run, then a timed run) or adaptive Dopri5 (the converged accuracy reference). Writes
O.npz with the final displacement (N, N, N, 3) in Mpc/h and O.json with the timings and the
peak RSS of this process. JaxPM, jax_cosmo and diffrax are the `bench` extra, never imported
by the rest of pmpipe.
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np

from pmpipe.runtime import memory, versions


def _solve(field, cosmo, a_init: float, lpt_order: int, solver: str, steps: int, rtol: float):
    """JaxPM's LPT then diffrax; returns the final displacement in grid units (N, N, N, 3)."""
    import diffrax
    from jaxpm.pm import lpt, make_diffrax_ode

    dx, p, _ = lpt(cosmo, field, particles=None, a=a_init, order=lpt_order)
    term = diffrax.ODETerm(make_diffrax_ode(field.shape, paint_absolute_pos=False))
    if solver == "leapfrog":
        method, control = diffrax.LeapfrogMidpoint(), diffrax.ConstantStepSize()
        dt0 = (1.0 - a_init) / steps
    else:
        method = diffrax.Dopri5()
        control = diffrax.PIDController(rtol=rtol, atol=rtol)
        dt0 = 0.01
    sol = diffrax.diffeqsolve(
        term,
        method,
        t0=a_init,
        t1=1.0,
        dt0=dt0,
        y0=jnp.stack([dx, p], axis=0),
        args=cosmo,
        saveat=diffrax.SaveAt(t1=True),
        stepsize_controller=control,
        max_steps=100_000,
    )
    return sol.ys[-1, 0], sol.stats["num_steps"]


def run(field: np.ndarray, params: dict, job: argparse.Namespace) -> tuple[np.ndarray, dict]:
    """One JaxPM evolution of the linear density ``field`` at a = 1 in the cosmology ``params``
    (pmpipe Cosmology fields), as the command line's ``job`` gives it (box, a_init, lpt_order,
    solver, steps, rtol); returns (final displacement in Mpc/h, record)."""
    box_size, a_init, lpt_order = job.box, job.a_init, job.lpt_order
    solver, steps, rtol = job.solver, job.steps, job.rtol
    import jax_cosmo

    cosmo = jax_cosmo.Cosmology(
        Omega_c=params["Omega_m"] - params["Omega_b"],
        Omega_b=params["Omega_b"],
        h=params["h"],
        n_s=params["n_s"],
        sigma8=params["sigma8"],
        Omega_k=0.0,
        w0=params["w0"],
        wa=params["wa"],
    )
    solve = jax.jit(lambda f, c: _solve(f, c, a_init, lpt_order, solver, steps, rtol))
    field_on_device = jnp.asarray(field)
    record: dict[str, object] = {
        "solver": solver,
        "jaxpm": versions.installed("jaxpm"),
        "diffrax": versions.installed("diffrax"),
    }
    if solver == "leapfrog":  # the speed peer: compile, then time a warm run
        t0 = time.perf_counter()
        jax.block_until_ready(solve(field_on_device, cosmo))
        warm_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    disp, n_steps = jax.block_until_ready(solve(field_on_device, cosmo))
    run_s = time.perf_counter() - t0
    record.update(steps=int(n_steps), run_s=run_s, step_s=run_s / max(int(n_steps), 1))
    if solver == "leapfrog":
        record["compile_s"] = warm_s - run_s
    else:  # the reference runs once, compile included
        record["rtol"] = rtol
    n = field.shape[0]
    record["peak_rss_bytes"] = memory.peak_rss_bytes()
    return np.asarray(disp) * (box_size / n), record


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pmpipe.bench.peers.jaxpm")
    parser.add_argument("--field", required=True, help=".npy linear density at a = 1")
    parser.add_argument("--box", type=float, required=True, help="box size, Mpc/h")
    parser.add_argument("--cosmology", required=True, help="JSON of pmpipe Cosmology fields")
    parser.add_argument("--a-init", type=float, required=True)
    parser.add_argument("--lpt-order", type=int, choices=(1, 2), default=2)
    parser.add_argument("--solver", choices=("leapfrog", "dopri5"), required=True)
    parser.add_argument("--steps", type=int, default=10, help="leapfrog steps")
    parser.add_argument("--rtol", type=float, default=1e-5, help="Dopri5 rtol (= atol)")
    parser.add_argument("--out", required=True, help="output prefix: writes .npz and .json")
    args = parser.parse_args(argv)
    disp, record = run(np.load(args.field), json.loads(args.cosmology), args)
    np.savez(args.out + ".npz", disp=disp)
    with open(args.out + ".json", "w") as fh:
        json.dump(record, fh)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
