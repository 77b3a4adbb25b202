"""``pmpipe bench limber``: the convergence C_ℓ of simulated maps, full sky and flat sky,
against pyccl's Limber prediction with a nonlinear (halofit) P(k), as JSON.

``seeds`` fixed-amplitude runs (seeds 0, 1, ...; each seed also sets the planes' rotations,
so the seeds sample as many lightcone geometries) of ``particles``³ in 256 Mpc/h, force mesh
B = 2, ``steps`` PM steps, planes to z = 1, lens a source at z = 1 and three tomographic bins
(Gaussians of width 0.1 around z = 0.4, 0.6 and 0.8) onto a 6° flat map of 32 pixels and a
HEALPix map of ``nside`` (64 by default; the full-sky shells' sampling costs about 4 nside² rays
per plane). The spectra are pmpipe's own products (summaries.zarr: cl,
cl_healpix and the mean multipole of each bin), averaged over the runs and compared in the
bins whose edges lie inside the resolved ranges pmpipe stores with them (ell_min_valid,
ell_max_valid):

- ``single``: per sky, the source at z = 1, C_ℓ / halofit Limber at the bins' mean ℓ;
- ``tomography``: per sky and pair of bins, the same for the cross-spectrum, inside both
  sources' ranges;

each with the flat sky's Gaussian scatter of the mean, sqrt(2 / modes / runs) (None on the
full sky).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

TOMOGRAPHY_Z = np.linspace(0.0, 1.0, 101)
TOMOGRAPHY_N = [np.exp(-0.5 * ((TOMOGRAPHY_Z - zc) / 0.1) ** 2) for zc in (0.4, 0.6, 0.8)]
SKIES = (("flat", ""), ("healpix", "_healpix"))  # (name, suffix of the summaries' arrays)


def bench_run(particles: int, seed: int, steps: int = 10, nside: int = 64, **sections: dict):
    """The benchmark's run (config.Run) of one seed, full-sky maps of ``nside``; ``sections``
    replace the run's own."""
    from pmpipe.run import config, outputs

    data = {
        "box": {"box_size": 256.0, "particles": particles, "oversample": 2},
        "ic": {"fixed_amplitude": True, "seed": seed},
        "nbody": {"steps": steps},
        "parallel": {"halo_cells": 8},
        "lightcone": {"z_max": 1.0},
        "lensing": {
            "source_redshifts": [1.0],
            "distributions": [
                {"kind": "table", "name": f"bin{i}", "z": TOMOGRAPHY_Z.tolist(), "n": n.tolist()}
                for i, n in enumerate(TOMOGRAPHY_N)
            ],
            "flat_sky": {"field_of_view": 6.0, "pixels": 32},
            "full_sky": {"nside": nside},
        },
        "summaries": {"smoothing_arcmin": [20.0]},
        "outputs": outputs.STAGES_ONE_BY_ONE,
    }
    return config.Run.model_validate(data | sections)


def summaries(run, folder: Path):
    """Every stage of ``run`` in this process in ``folder`` (a run folder of a campaign of
    its results folder); its summaries.zarr (read only)."""
    import zarr

    from pmpipe.bench import in_process

    in_process.run_stages(run, folder.parent.parent, folder.parent.name, folder.name)
    return zarr.open_group(folder / "summaries.zarr", mode="r")


def halofit_cosmology(cosmo):
    """pyccl at the run's cosmology (massless neutrinos) with Eisenstein-Hu and halofit."""
    import pyccl

    return pyccl.Cosmology(
        Omega_c=cosmo.Omega_m - cosmo.Omega_b,
        Omega_b=cosmo.Omega_b,
        h=cosmo.h,
        n_s=cosmo.n_s,
        sigma8=cosmo.sigma8,
        T_CMB=cosmo.T_cmb,
        Neff=cosmo.N_eff,
        m_nu=0.0,
        transfer_function="eisenstein_hu",
        matter_power_spectrum="halofit",
    )


def _bins(group, suffix: str, first: int, second: int):
    """(mean ℓ, the bins inside both sources' resolved ranges) of one sky of a summaries store."""
    ell = group["ell" + suffix + "_mean"][:]
    lo, hi = group["ell" + suffix + "_lo"][:], group["ell" + suffix + "_hi"][:]
    low, high = group["ell_min_valid" + suffix][:], group["ell_max_valid" + suffix][:]
    inside = (lo >= max(low[first], low[second])) & (hi <= min(high[first], high[second]) + 1)
    return ell, inside & np.isfinite(ell)


def _entry(ell, ratio, extra: dict | None = None) -> dict:
    return {"ell": ell.tolist(), "ratio": ratio.tolist(), **(extra or {})}


def compare(groups: list, ccl) -> dict[str, Any]:
    """The record's ``single`` and ``tomography`` parts for the runs' summaries ``groups``."""
    import pyccl

    z = np.linspace(0.001, 1.5, 3000)
    point = pyccl.WeakLensingTracer(ccl, dndz=(z, np.exp(-0.5 * ((z - 1.0) / 0.002) ** 2)))
    tracers = [point] + [pyccl.WeakLensingTracer(ccl, dndz=(TOMOGRAPHY_Z, n)) for n in TOMOGRAPHY_N]
    single, tomography = {}, []
    for sky, suffix in SKIES:
        cl = np.mean([g["cl" + suffix][:] for g in groups], axis=0)
        for a in range(len(tracers)):
            for b in range(a, len(tracers)):
                if (a == 0) != (b == 0):
                    continue  # the point source with itself, the bins with each other
                ell, inside = _bins(groups[0], suffix, a, b)
                if not inside.any():
                    continue
                expected = pyccl.angular_cl(ccl, tracers[a], tracers[b], ell[inside])
                ratio = cl[a, b][inside] / expected
                scatter = None
                if not suffix:  # a 6° map's bins hold a few tens of modes
                    modes = groups[0]["cl_modes"][:][inside]
                    scatter = np.sqrt(2 / modes / len(groups)).tolist()
                if a == 0:
                    single[sky] = _entry(ell[inside], ratio, {"scatter": scatter})
                    continue
                pair = {"sky": sky, "bins": [a - 1, b - 1], "scatter": scatter}
                tomography.append(_entry(ell[inside], ratio, pair))
    return {"single": single, "tomography": tomography}


def bench_limber(
    particles: int = 64, seeds: int = 6, steps: int = 10, nside: int = 64
) -> dict[str, Any]:
    """The record of the module docstring."""
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        groups = [
            summaries(bench_run(particles, seed, steps, nside), Path(tmp) / "limber" / f"s{seed}")
            for seed in range(seeds)
        ]
        record = compare(groups, halofit_cosmology(bench_run(particles, 0).cosmology))
    return {
        "benchmark": "limber",
        "particles": particles,
        "seeds": seeds,
        "steps": steps,
        "nside": nside,
        **record,
        "wall_s": time.perf_counter() - start,
    }
