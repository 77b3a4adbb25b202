"""Baryonic feedback as a suppression of the matter power spectrum, applied after the N-body.

The model is HMcode-2020's single-parameter feedback (Mead et al. 2021, MNRAS 502, 1401),
through CAMB: S(k, z) = P_feedback(k, z) / P_gravity(k, z), the ratio of HMcode-2020's
non-linear spectra with and without feedback of AGN temperature log10(T_AGN / K). Mead et al.
calibrated it on the BAHAMAS simulations of log T_AGN = 7.6, 7.8 and 8.0; they find the response
of the power to feedback matched within 1 % for z < 1 and k < 20 h/Mpc by the six-parameter
model, the single-parameter one "only slightly less accurate". pmpipe accepts that range only.

A lightcone plane is filtered by sqrt(S(k⊥, z)) at its redshift (a full-sky shell by
sqrt(S((ℓ + 1/2)/χ, z)) per multipole), so the power of its projected density is S times the
N-body's at each transverse wavenumber, and so are Limber's C_ℓ. A Fourier filter changes
every mode's amplitude, not where mass sits: the spectra follow the model by construction, but
peak counts and the one-point PDF do not follow what moving gas out of haloes does to them
(that needs halos displaced one by one, baryonification, and a halo finder).
"""

from __future__ import annotations

import dataclasses
from functools import partial

import jax
import numpy as np

from pmpipe.physics.mesh import fft

LOG_T_AGN_RANGE = (7.6, 8.0)  # the BAHAMAS runs HMcode-2020's feedback was fitted to
K_MIN, K_MAX = 1e-3, 20.0  # h/Mpc: S = 1 below K_MIN, S(K_MAX) above
WAVENUMBERS = 240
REDSHIFTS = 24
SIGMA8_A_S = 2.1e-9  # A_s of the call that normalises a run given by σ8


@dataclasses.dataclass(frozen=True)
class Suppression:
    """S(k, z) tabulated: ``k`` (K,) h/Mpc, increasing log-spaced; ``z`` (Z,) increasing;
    ``ratio`` (Z, K)."""

    k: np.ndarray
    z: np.ndarray
    ratio: np.ndarray


def suppressions(
    cosmology: dict, A_s: float | None, log_t_agns, z_max: float
) -> tuple[Suppression, ...]:
    """S(k, z) from z = 0 to z_max for each AGN temperature of ``log_t_agns``, for a cosmology
    (a mapping of pmpipe's cosmology fields) at amplitude A_s (None: the A_s that gives its
    sigma8), with CAMB's HMcode-2020. One CAMB solution and HMcode-2020 without feedback serve
    every temperature: each costs one more HMcode-2020 (about 1 s), not a CAMB run."""
    import camb

    from pmpipe.physics.theory import boltzmann

    if A_s is None:
        A_s = SIGMA8_A_S * (cosmology["sigma8"] / _sigma8(cosmology, SIGMA8_A_S)) ** 2
    params = boltzmann.camb_params(cosmology, A_s, 2 * K_MAX)
    z = np.linspace(0.0, max(z_max, 1e-3), REDSHIFTS)  # as inputs() says
    params.set_matter_power(redshifts=list(z[::-1]), kmax=2 * K_MAX)
    params.NonLinear = camb.model.NonLinear_pk
    results = camb.get_transfer_functions(params)
    spectra = []
    for model in [{"halofit_version": "mead2020"}] + [
        {"halofit_version": "mead2020_feedback", "HMCode_logT_AGN": t} for t in log_t_agns
    ]:
        params.NonLinearModel.set_params(**model)
        results.calc_power_spectra(params)
        k, found_z, power = results.get_matter_power_spectrum(K_MIN, K_MAX, WAVENUMBERS)
        spectra.append(power)
    k, found_z = np.asarray(k), np.asarray(found_z)
    return tuple(Suppression(k, found_z, power / spectra[0]) for power in spectra[1:])


def inputs(cosmology: dict, A_s: float | None, z_max: float) -> dict:
    """Everything but the temperature that determines :func:`suppressions`' tables of a
    cosmology (a mapping of pmpipe's cosmology fields) at amplitude A_s (None: its sigma8), out
    to z_max (a JSON mapping: with ``log_T_AGN`` added, a cache key's content): the model, CAMB's
    version and settings, the cosmology as :func:`pmpipe.physics.theory.boltzmann.inputs`
    gives it, and the k and z grids."""
    from pmpipe.physics.theory import boltzmann

    normalised = {**cosmology, "A_s": A_s, "sigma8": cosmology["sigma8"] if A_s is None else None}
    linear = boltzmann.inputs(normalised, K_MAX, boltzmann.CODE)
    return {
        "model": "HMcode-2020 with feedback over without",
        "version": linear["version"],
        "cosmology": linear["cosmology"],
        "settings": linear["settings"],
        "k": [K_MIN, K_MAX, WAVENUMBERS],
        "z": [0.0, max(z_max, 1e-3), REDSHIFTS],
    }


def _sigma8(cosmology: dict, A_s: float) -> float:
    import camb

    from pmpipe.physics.theory import boltzmann

    params = boltzmann.camb_params(cosmology, A_s, 2.0)
    return float(camb.get_results(params).get_sigma8_0())


def factor(table: Suppression, k, z: float) -> np.ndarray:
    """S at wavenumbers k (any shape, h/Mpc) and redshift z (linear in z between the table's
    rows, in log k along them; 1 below K_MIN, S(K_MAX) above)."""
    k = np.asarray(k, np.float64)
    row = np.array([np.interp(z, table.z, column) for column in table.ratio.T])
    log_k = np.log(np.clip(k, table.k[0], table.k[-1]))
    return np.where(k < table.k[0], 1.0, np.interp(log_k, np.log(table.k), row))


def plane_kernel(table: Suppression, mesh_n: int, box_size: float, z: float) -> np.ndarray:
    """sqrt(S(|k⊥|, z)) (M, M) on the wavenumbers of a periodic plane of mesh_n cells across
    box_size (Mpc/h)."""
    k = fft.angular_frequencies(mesh_n, box_size / mesh_n)
    return np.sqrt(factor(table, np.hypot(k[:, None], k[None, :]), z))


def shell_kernel(table: Suppression, ell_max: int, chi: float, z: float) -> np.ndarray:
    """sqrt(S((ℓ + 1/2)/χ, z)) for ℓ = 0 .. ell_max: the filter of a full-sky shell at comoving
    distance chi (Mpc/h)."""
    return np.sqrt(factor(table, (np.arange(ell_max + 1) + 0.5) / chi, z))


def filter_plane(plane, kernel):
    """A flat-sky plane (M, M) (sharded or not) with its modes multiplied by ``kernel`` (M, M,
    :func:`plane_kernel`), laid out as it was."""
    return _filtered(plane, kernel.astype(plane.dtype), sharding=fft.map_sharding(plane))


@partial(jax.jit, static_argnames="sharding")
def _filtered(plane, kernel, sharding):
    return fft.laid_out(fft.filter_2d(plane, kernel, sharding).real.astype(plane.dtype), sharding)
