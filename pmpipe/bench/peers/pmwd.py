"""pmwd peer run for `pmpipe bench nbody --compare pmwd`, in its own process.

Run as ``python -m pmpipe.bench.peers.pmwd --particles N --oversample B --steps S --box L --a-init A
--out O.json``: pmwd (taken from the Python path: a pmwd checkout on PYTHONPATH, or the folder
given as --pmwd) runs the job of `pmpipe bench nbody` — white noise, its Boltzmann solve,
linear modes, 2LPT at a_init and S PM steps to a = 1, N^3 particles on a (B N)^3 mesh in an
L Mpc/h box, Planck 2018 cosmology — as one jitted function, once to compile and once timed.
Writes the timings, the peak RSS of this process and, on GPUs, the device's peak memory to O.
pmwd is never imported by the rest of pmpipe.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import jax

from pmpipe.runtime import memory


def run(
    particles: int, oversample: int, steps: int, box_size: float, a_init: float, seed: int = 0
) -> dict:
    """One pmwd job; returns its record."""
    import pmwd

    conf = pmwd.Configuration(
        ptcl_spacing=box_size / particles,
        ptcl_grid_shape=(particles,) * 3,
        mesh_shape=oversample,
        a_start=a_init,
        a_stop=1.0,
        a_nbody_maxstep=(1.0 - a_init) / steps,
        lpt_order=2,
    )

    @jax.jit
    def job(seed, cosmo):
        cosmo = pmwd.boltzmann(cosmo, conf)
        modes = pmwd.linear_modes(pmwd.white_noise(seed, conf), cosmo, conf)
        ptcl, obsvbl = pmwd.lpt(modes, cosmo, conf)
        return pmwd.nbody(ptcl, obsvbl, cosmo, conf)[0].disp

    cosmo = pmwd.Planck18(conf)
    t0 = time.perf_counter()
    jax.block_until_ready(job(seed, cosmo))
    warm_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    jax.block_until_ready(job(seed, cosmo))
    run_s = time.perf_counter() - t0
    return {
        "code": "pmwd",
        "module": pmwd.__file__,
        "particles": particles,
        "force_mesh": particles * oversample,
        "steps": conf.a_nbody_num,
        "run_s": run_s,
        "compile_s": warm_s - run_s,
        "peak_rss_bytes": memory.peak_rss_bytes(),
        "device_peak_bytes": memory.device_peak_bytes(),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pmpipe.bench.peers.pmwd")
    parser.add_argument("--particles", type=int, required=True, help="particles per side, N")
    parser.add_argument("--oversample", type=int, default=1, help="mesh / particle grid, B")
    parser.add_argument("--steps", type=int, default=10, help="PM steps to a = 1")
    parser.add_argument("--box", type=float, required=True, help="box size, Mpc/h")
    parser.add_argument("--a-init", type=float, required=True)
    parser.add_argument("--pmwd", help="folder that holds the pmwd package (else the Python path)")
    parser.add_argument("--out", required=True, help="JSON record")
    args = parser.parse_args(argv)
    if args.pmwd:
        sys.path.insert(0, args.pmwd)
    record = run(args.particles, args.oversample, args.steps, args.box, args.a_init)
    with open(args.out, "w") as fh:
        json.dump(record, fh)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
