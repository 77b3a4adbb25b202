"""Stage ``summaries``: statistics of every N-body snapshot.

Reads ``nbody.zarr``; writes ``summaries.zarr`` (docs/outputs.md): the matter power spectrum
``pk`` (a, k) of ρ/ρ̄ with the CIC window divided out (shot noise L³/N³ recorded, not
subtracted), the mean wavenumber and mode count per bin, and linear theory D1(a)² P_lin(k).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from jax.sharding import Mesh

from pmpipe import config, cosmology, stats, store
from pmpipe.stages import Progress, main, store_path


def run(run_file: config.RunFile, run_dir: Path, mesh: Mesh, progress: Progress) -> Path:
    """Measure and write the summaries of the run's snapshots; returns the store's path."""
    cfg = run_file.config
    started = store.now()
    nb = store.open_complete(store_path(run_dir, "nbody"), run_file.config_hash)
    a = np.asarray(nb["a"][:], dtype=np.float64)
    density = nb["density"]
    box_size, n_mesh = cfg.box.box_size, int(density.shape[1])
    n_bins = cfg.summaries.pk_bins or n_mesh // 2
    spectra = []
    for i in range(a.size):
        field = store.read_sharded(density, mesh, (i,))
        k_mean, pk, modes = stats.power_spectrum(field, mesh, box_size, n_bins,
                                                 compensate_cic=cfg.summaries.compensate_cic)
        spectra.append(pk)
        progress(f"P(k) at a = {a[i]:.4f}")
    cosmo = cfg.cosmology_params()
    growth = np.asarray(cosmology.growth_factor(cosmo, a, cosmology.growth_table(cosmo)), np.float64)
    k_centre = np.arange(1, n_bins + 1) * (2 * np.pi / box_size)
    k_eval = np.where(np.isfinite(k_mean), k_mean, k_centre)
    linear = growth[:, None] ** 2 * np.asarray(cfg.linear_power()(k_eval), np.float64)[None, :]
    shot_noise = box_size**3 / cfg.box.particles**3
    path = store_path(run_dir, "summaries")
    group = store.create(path, store.provenance(run_file, "summaries", mesh, started))
    store.write_coordinate(group, "a", a, "1", "scale factor of the snapshot")
    store.write_coordinate(group, "k", k_centre, "h/Mpc",
                           "centre of the |k| bin (bins of width 2 pi / L from 0)")
    store.write_array(group, "pk", np.asarray(spectra), ("a", "k"), "(Mpc/h)^3",
                      "matter power spectrum of rho / rho_mean, CIC window divided out"
                      if cfg.summaries.compensate_cic else "matter power spectrum of rho / rho_mean",
                      shot_noise=shot_noise, shot_noise_subtracted=False,
                      compensated=cfg.summaries.compensate_cic)
    store.write_array(group, "k_mean", k_mean, ("k",), "h/Mpc", "mean |k| of the modes in the bin")
    store.write_array(group, "modes", modes, ("k",), "1", "number of Fourier modes in the bin")
    store.write_array(group, "pk_linear", linear, ("a", "k"), "(Mpc/h)^3",
                      "linear theory D1(a)^2 P_lin(k) at k_mean")
    group.attrs["shot_noise"] = shot_noise
    store.mark_complete(group)
    return path


if __name__ == "__main__":
    sys.exit(main("summaries"))
