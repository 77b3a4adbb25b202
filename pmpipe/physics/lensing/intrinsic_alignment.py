"""Intrinsic alignments of galaxies in the non-linear alignment model (NLA: Hirata & Seljak
2004, with the non-linear density of Bridle & King 2007).

Galaxies are sheared by the tidal field where they sit. Projected like the lensing signal, a
source population of density n(χ) (per comoving distance, normalised to 1) adds to its
convergence and shear the intrinsic part

    κ_I(θ) = ∫ dχ n(χ) F(χ) δ(χθ, χ),
    F(χ) = -A_IA C1ρ_crit Ω_m / D(z) ((1 + z)/(1 + z_pivot))^η_IA,

with D the linear growth (D(0) = 1) and C1ρ_crit = 0.0134 (C1 = 5e-14 h⁻² M_sun Mpc³ of Brown et
al. 2002; the value CosmoGridV1 and GLASS use. pyccl's use_A_ia takes 5e-14 ρ_crit = 0.01388,
so its A_IA is 0.966 times pmpipe's for the same alignment). Its kernel n F takes the place of the lensing efficiency q: for A_IA > 0 it is
negative where q is positive, so the GI term lowers the spectra. A single source plane (a
delta-function n(z)) has no density to project and no intrinsic part here.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from pmpipe.physics.theory import cosmology

C1_RHO_CRIT = 0.0134  # C1 ρ_crit, dimensionless (C1 = 5e-14 h^-2 M_sun Mpc^3, ρ_crit today)


@dataclasses.dataclass(frozen=True)
class NLA:
    """Parameters of the NLA model: amplitude A_IA, redshift index eta_IA and the pivot
    redshift z_pivot of that power law."""

    A_IA: float
    eta_IA: float = 0.0
    z_pivot: float = 0.62


def amplitude(cosmo: cosmology.Cosmology, chi, model: NLA) -> np.ndarray:
    """F(χ) of the NLA model (dimensionless) at comoving distances chi (Mpc/h)."""
    chi = np.asarray(chi, np.float64)
    a = cosmology.on_host(cosmology.scale_factor_at_distance, cosmo, chi)
    growth = cosmology.on_host(cosmology.growth_factor, cosmo, a)
    evolution = (1.0 / a / (1.0 + model.z_pivot)) ** model.eta_IA
    return -model.A_IA * C1_RHO_CRIT * cosmo.Omega_m / growth * evolution


def source_density(chi, source_chi, source_weights) -> np.ndarray:
    """n(χ) in h/Mpc at comoving distances chi of a source population sampled at increasing
    distances source_chi with weights summing to 1: each sample's weight spread evenly over
    its cell (from the midpoint with the sample before to that with the sample after). Zero
    everywhere for a single source plane."""
    chi = np.asarray(chi, np.float64)
    source_chi = np.asarray(source_chi, np.float64)
    if source_chi.size < 2:
        return np.zeros_like(chi)
    middles = 0.5 * (source_chi[1:] + source_chi[:-1])
    edges = np.concatenate([source_chi[:1], middles, source_chi[-1:]])
    widths = np.diff(edges)
    density = np.divide(
        np.asarray(source_weights, np.float64),
        widths,
        out=np.zeros(widths.shape),
        where=widths > 0,
    )
    cell = np.searchsorted(edges, chi, side="right") - 1
    inside = (cell >= 0) & (cell < widths.size)
    return np.where(inside, density[np.clip(cell, 0, widths.size - 1)], 0.0)


def kernel(cosmo: cosmology.Cosmology, chi, source_chi, source_weights, model: NLA):
    """The intrinsic part's kernel n(χ) F(χ) in h/Mpc at comoving distances chi (Mpc/h): the
    counterpart of the lensing efficiency (pmpipe.physics.lensing.projection.lensing_efficiency)."""
    return source_density(chi, source_chi, source_weights) * amplitude(cosmo, chi, model)
