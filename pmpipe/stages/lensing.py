"""Stage ``lensing``: Born convergence and shear maps from the lightcone planes.

Reads ``nbody.zarr``; writes ``lensing.zarr`` (docs/outputs.md): per source (single redshifts,
then distributions) flat-sky ``kappa``, ``gamma1``, ``gamma2`` (source, theta_x, theta_y) and
full-sky ``kappa_healpix``, ``gamma1_healpix``, ``gamma2_healpix`` (source, pixel), with the
Born weight of every plane.
"""

from __future__ import annotations

import sys
from pathlib import Path

import jax
import numpy as np
from pmpipe import config, cosmology, lensing, store
from pmpipe.stages import Inputs, Progress, main, store_path

REDSHIFT_SAMPLES = 512  # redshifts at which a parametric n(z) is tabulated


def sources(cfg: config.Run, cosmo, table):
    """(label, mean redshift, comoving distances, weights) of every source in store order."""
    out = []
    for z in cfg.lensing.source_redshifts:
        chi = np.asarray(cosmology.comoving_distance(cosmo, 1.0 / (1.0 + z), table), np.float64)
        out.append((f"z={z:g}", z, np.atleast_1d(chi), np.ones(1)))
    for dist in cfg.lensing.distributions:
        if dist.kind == "smail":
            z = np.linspace(0.0, cfg.lightcone.z_max, REDSHIFT_SAMPLES)
            n = lensing.smail(z, dist.z0, dist.alpha, dist.beta)
        else:
            z, n = np.asarray(dist.z), np.asarray(dist.n)
        chi, weights = lensing.source_distribution(cosmo, z, n, table)
        out.append((dist.name, float(np.sum(weights * z)), chi, weights))
    return out


def run(run_file: config.RunFile, run_dir: Path, inputs: Inputs, progress: Progress) -> Path:
    """Compute the run's lensing maps (kept for the summaries) and write them unless
    outputs.lightcone is off (the weights and geometry always); returns the path."""
    cfg, mesh = run_file.config, inputs.mesh
    if cfg.lensing is None:
        raise ValueError(f"run {run_file.run_id} has no lensing section, so it has no lensing stage "
                         "(add lightcone and lensing sections to its campaign's base)")
    started = store.now()
    nb = inputs.store("nbody")
    cosmo = cfg.cosmology_params()
    table = cosmology.growth_table(cosmo)
    chi = np.asarray(nb["plane"][:], np.float64)
    edges = np.append(nb["plane_chi_lo"][:], nb["plane_chi_hi"][-1])
    srcs = sources(cfg, cosmo, table)
    weights = np.stack([lensing.plane_weights(cosmo, edges, c, w, table) for _, _, c, w in srcs])
    path = store_path(run_dir, "lensing")
    maps_kept = cfg.outputs.lightcone
    group = store.create(path, store.provenance(run_file, "lensing", mesh, started)
                         | {"maps_kept": maps_kept}, keepbits=cfg.outputs.keepbits)
    store.write_coordinate(group, "source", np.array([s[0] for s in srcs]), "1",
                           "source: 'z=<z>' for a single redshift, else the n(z) name")
    store.write_array(group, "z_source", np.array([s[1] for s in srcs]), ("source",), "1",
                      "source redshift (mean redshift of a distribution)")
    store.write_coordinate(group, "plane", chi, "Mpc/h", "comoving distance of the plane's centre")
    store.write_array(group, "plane_weight", weights, ("source", "plane"), "h/Mpc",
                      "Born weight of the plane: lensing efficiency averaged over its thickness")
    flat = cfg.lensing.flat_sky
    if flat is not None:
        theta = lensing.pixel_centres(flat.field_of_view, flat.pixels)
        offsets = [t["offsets"] for t in nb.attrs["plane_transforms"]]
        planes = [lambda j=j: inputs.field("nbody", "lightcone_density", (j,)) for j in range(chi.size)]
        with progress.timed("lensing"):
            kappa = lensing.flat_sky_convergence(planes, weights, cfg.box.box_size, chi, theta,
                                                 offsets, mesh, np.dtype(cfg.nbody.dtype))
            gamma1, gamma2 = jax.block_until_ready(lensing.shear_from_convergence(kappa))
        progress(f"flat-sky maps: {len(srcs)} sources, {flat.pixels}^2 pixels over "
                 f"{flat.field_of_view} deg")
        for axis in ("theta_x", "theta_y"):
            store.write_coordinate(group, axis, np.degrees(theta), "deg",
                                   f"angle of the pixel centre from the line of sight, {axis[-1]}")
        dims = ("source", "theta_x", "theta_y")
        for name, data, long_name in (("kappa", kappa, "Born convergence"),
                                      ("gamma1", gamma1, "shear, first component (Kaiser-Squires)"),
                                      ("gamma2", gamma2, "shear, second component (Kaiser-Squires)")):
            if maps_kept:
                store.write_array(group, name, data, dims, "1", long_name)
        for i in range(len(srcs)):
            inputs.keep("lensing", "kappa", kappa[i], (i,))
    if cfg.lensing.full_sky is not None:
        with progress.timed("lensing"):
            shells = np.asarray(inputs.array("nbody", "lightcone_healpix"), np.float64)
            kappa_hp = weights @ shells
            shear = [lensing.healpix_shear_from_convergence(k) for k in kappa_hp]
        progress(f"full-sky maps: {len(srcs)} sources, nside {cfg.lensing.full_sky.nside}")
        attrs = {"grid_name": "HEALPix", "nside": cfg.lensing.full_sky.nside, "nest": False}
        for name, data, long_name in (
                ("kappa_healpix", kappa_hp, "Born convergence"),
                ("gamma1_healpix", np.stack([g[0] for g in shear]), "shear, first component (healpy Q)"),
                ("gamma2_healpix", np.stack([g[1] for g in shear]), "shear, second component (healpy U)")):
            if maps_kept:
                store.write_array(group, name, data.astype(np.float32), ("source", "pixel"), "1",
                                  long_name, **attrs)
        inputs.keep("lensing", "kappa_healpix", kappa_hp.astype(np.float32))
    store.mark_complete(group)
    return path


if __name__ == "__main__":
    sys.exit(main("lensing"))
