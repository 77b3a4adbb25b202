"""Reference computations the tests compare pmpipe with, outside the programs and stages that
pmpipe runs: one lightcone shell on its own, the convergence from shear maps, a run's status
from its stores, a run configuration read from a file, the planes of a lightcone from JAX's
distance table."""

from __future__ import annotations

import math
from functools import partial
from pathlib import Path

import healpy
import numpy as np

from pmpipe import stages
from pmpipe.physics.evolution import lightcone, sky
from pmpipe.physics.lensing import projection
from pmpipe.physics.theory import cosmology
from pmpipe.run import config, validation
from pmpipe.storage import store


def shell_healpix(  # parameters: the field on its mesh and one shell's geometry
    delta_compensated,
    mesh,
    box_size: float,
    rays_nside: int,
    chi_lo: float,
    chi_hi: float,
    observer,
    transform: lightcone.PlaneTransform,
    k_max: float = math.inf,
    gather: bool | None = None,
):
    """Projected overdensity Σ (Mpc/h) of the shell [chi_lo, chi_hi) at the pixel centres of
    the HEALPix grid ``rays_nside`` (RING) of a density band-limited to k_max (h/Mpc): δ summed
    along each ray at the middles of :func:`pmpipe.physics.evolution.lightcone.ray_samples` equal steps dχ, times dχ, mean over
    the sphere removed; sampled from the gathered density or each device's block as a run
    would (``gather`` None: :func:`pmpipe.physics.evolution.sky.shell_gathers`). Returns a
    (12 rays_nside²,) array, each device holding its share of the rays when they divide."""
    mesh_n = delta_compensated.shape[0]
    n_r = lightcone.ray_samples(chi_hi - chi_lo, box_size / mesh_n, k_max)
    source, scale, offset = lightcone.box_frame(observer, transform, box_size, mesh_n)
    dtype = np.dtype(delta_compensated.dtype)
    return lightcone._shell(
        delta_compensated,
        dtype.type(chi_lo),
        dtype.type((chi_hi - chi_lo) / n_r),
        np.int32(n_r),
        source,
        scale.astype(dtype),
        offset.astype(dtype),
        mesh=mesh,
        rays_nside=rays_nside,
        gather=(
            sky.shell_gathers(mesh_n, sky.healpix_pixels(rays_nside), mesh.size)
            if gather is None
            else gather
        ),
    )


def convergence_from_shear(gamma1, gamma2):
    """Inverse Kaiser-Squires: the E-mode κ (..., n1, n2) of a flat-sky shear field (zero mean)."""
    return projection.shear_modes(gamma1, gamma2)[0]


def healpix_convergence_from_shear(gamma1, gamma2, lmax: int):
    """Harmonic coefficients (ℓ ≤ lmax) of κ from the E modes of the shear maps (γ1, γ2):
    the inverse of :func:`pmpipe.physics.lensing.projection.healpix_shear`, up to the monopole and dipole."""
    e_alm, _ = healpy.map2alm_spin(
        [np.asarray(gamma1, np.float64), np.asarray(gamma2, np.float64)], 2, lmax=lmax
    )
    with np.errstate(invalid="ignore", divide="ignore"):
        inverse = np.where(
            projection.spin2_factor(lmax) > 0, 1.0 / projection.spin2_factor(lmax), 0.0
        )
    return healpy.almxfl(e_alm, inverse)


def run_status(run_dir: str | Path) -> str:
    """'complete' when the store of each of the run's stages is complete, else '<last complete
    stage> done' or 'planned' (a store without its completion marker counts as absent). The
    stages come from the run's config.json (all of them when it is missing)."""
    config_path = Path(run_dir) / "config.json"
    names = (
        stages.run_stages(validation.load_run_file(config_path).config)
        if config_path.exists()
        else stages.STAGES
    )
    done = [s for s in names if store.is_complete(stages.store_path(run_dir, s))]
    if len(done) == len(names):
        return "complete"
    return f"{done[-1]} done" if done else "planned"


def load_run(path: str | Path) -> config.Run:
    """Read, validate and check a run configuration from JSON or YAML."""
    return validation.validate_run(config.read_mapping(path), path)


def plane_geometry(cosmo: cosmology.Cosmology, z_max: float, thickness: float) -> sky.Planes:
    """Planes of ``thickness`` Mpc/h from χ = 0 until the first edge at or beyond χ(z_max)."""
    cosmo = cosmology.tabulated(cosmo)
    chi_max = float(cosmology.comoving_distance(cosmo, 1.0 / (1.0 + z_max)))
    return sky.planes(
        chi_max,
        thickness,
        partial(cosmology.on_host, cosmology.scale_factor_at_distance, cosmo),
    )
