"""Convergence C_ell of simulated full-sky maps against pyccl's Limber prediction with a
nonlinear (halofit) P(k), averaged over three pairs of fixed-amplitude runs with inverted
phases (seeds 0, 1, 2); the maps are band-limited to ℓ ≤ 2 nside and carry no pixel window.

The resolved multipoles (docs/validation.md): from ℓ_min ≈ 2π χ_s / L, where the box's
fundamental mode meets the source distance (below it shells lack the transverse modes longer
than the box), to where the modes above the shells' band
limit k_max (the particle Nyquist frequency, pmpipe.lightcone.shell_k_max) start to matter,
ℓ ≈ 60 for this box and mesh.
"""

import json

import healpy
import numpy as np
import pyccl

from pmpipe import config, lightcone, stages

RUN = {"box": {"box_size": 512.0, "particles": 64, "oversample": 2},
       "ic": {"fixed_amplitude": True}, "nbody": {"steps": 12}, "parallel": {"halo_cells": 8},
       "lightcone": {"z_max": 1.0},
       "lensing": {"source_redshifts": [1.0], "flat_sky": None, "full_sky": {"nside": 64}}}
ELL_EDGES = np.array([28, 37, 49, 64])  # ℓ_min = 2π χ(z=1) / L ≈ 28
SEEDS = (0, 1, 2)


def _simulate(root, seed, paired):
    data = json.loads(json.dumps(RUN))
    data["ic"].update(seed=seed, paired=paired)
    run = config.Run.model_validate(data)
    run_dir = root / f"limber-{seed}-{int(paired)}"
    run_dir.mkdir()
    path = run_dir / "config.json"
    path.write_text(config.RunFile.build("limber", run_dir.name, 0, {}, run).to_json())
    for stage in ("ic", "nbody", "lensing"):
        stages.run_stage(stage, path)
    import zarr

    kappa = zarr.open_group(run_dir / "lensing.zarr", mode="r")["kappa_healpix"][0]
    ell_max = lightcone.healpix_ell_max(RUN["lensing"]["full_sky"]["nside"])
    return healpy.anafast(np.asarray(kappa, np.float64), lmax=ell_max, iter=3), run


def test_full_sky_convergence_cl_agrees_with_limber(tmp_path):
    spectra = [_simulate(tmp_path, seed, paired) for seed in SEEDS for paired in (False, True)]
    cl = np.mean([s[0] for s in spectra], axis=0)
    c = spectra[0][1].cosmology
    ccl = pyccl.Cosmology(Omega_c=c.Omega_m - c.Omega_b, Omega_b=c.Omega_b, h=c.h, n_s=c.n_s,
                          sigma8=c.sigma8, T_CMB=c.T_cmb, Neff=c.N_eff, m_nu=0.0,
                          transfer_function="eisenstein_hu", matter_power_spectrum="halofit")
    z = np.linspace(0.001, 1.5, 3000)
    sources = pyccl.WeakLensingTracer(ccl, dndz=(z, np.exp(-0.5 * ((z - 1.0) / 0.002) ** 2)))
    ratios = []
    for lo, hi in zip(ELL_EDGES[:-1], ELL_EDGES[1:]):
        ell = np.arange(lo, hi)
        theory = pyccl.angular_cl(ccl, sources, sources, ell)
        ratios.append(np.sum((2 * ell + 1) * cl[lo:hi]) / np.sum((2 * ell + 1) * theory))
    print("C_ell / Limber per bin", dict(zip(ELL_EDGES[:-1].tolist(), np.round(ratios, 3).tolist())))
    assert np.all(np.abs(np.asarray(ratios) - 1) < 0.10), ratios
