"""First- and second-order Lagrangian perturbation theory.

Displacements x = q + D1 s1 + D2 s2 with s1 = -∇φ1, ∇²φ1 = δ_L and s2 = ∇φ2,
∇²φ2 = Σ_{i<j} (φ1,ii φ1,jj - φ1,ij²), D2 ≈ -3/7 D1² from the exact second-order growth ODE.
Momenta p = a² dx/dt / H0 = a² E(a) (f1 D1 s1 + f2 D2 s2). Lengths in Mpc/h.
"""

from __future__ import annotations

from jax.sharding import Mesh

from pmpipe.physics.mesh import fft
from pmpipe.physics.theory import cosmology

_PAIRS = ((0, 0), (1, 1), (2, 2), (0, 1), (0, 2), (1, 2))


def lpt_displacements(delta_k, mesh: Mesh, box_size: float, order: int = 2):
    """LPT displacement fields (s1, s2) per unit D1, D2 on the particle grid, each (N, N, N, 3) in
    Mpc/h, from the linear modes δ_k at a = 1 (:func:`pmpipe.physics.evolution.ics.linear_modes`). s2 is None for
    order 1."""
    if order not in (1, 2):
        raise ValueError(f"lpt.order must be 1 or 2, got {order}")
    phi1_k = fft.inverse_laplacian(delta_k, mesh, box_size)
    s1 = -fft.gradient(phi1_k, mesh, box_size)
    if order == 1:
        return s1, None
    d = fft.gradient_kernels(delta_k, mesh, box_size)
    hess = {ij: fft.c2r(d[ij[0]] * d[ij[1]] * phi1_k, mesh) for ij in _PAIRS}
    source = (
        hess[0, 0] * hess[1, 1]
        + hess[0, 0] * hess[2, 2]
        + hess[1, 1] * hess[2, 2]
        - hess[0, 1] ** 2
        - hess[0, 2] ** 2
        - hess[1, 2] ** 2
    )
    phi2_k = fft.inverse_laplacian(fft.r2c(source, mesh), mesh, box_size)
    return s1, fft.gradient(phi2_k, mesh, box_size)


def lpt_state(cosmo: cosmology.Cosmology, s1, s2, a, s1_rate=None):
    """Displacement and momentum (Mpc/h) of particles at scale factor a from LPT fields;
    ``s1_rate``: s1 with each mode weighted by its own growth rate f1(k) (scale-dependent
    growth), else the momentum takes the scale-free f1(a)."""
    cosmo = cosmology.tabulated(cosmo)
    d1 = cosmology.growth_factor(cosmo, a)
    f1 = cosmology.growth_rate(cosmo, a)
    a2e = a**2 * cosmology.E(cosmo, a)
    disp = d1 * s1
    mom = a2e * f1 * d1 * s1 if s1_rate is None else a2e * d1 * s1_rate
    if s2 is not None:
        d2 = cosmology.growth_factor_2(cosmo, a)
        f2 = cosmology.growth_rate_2(cosmo, a)
        disp = disp + d2 * s2
        mom = mom + a2e * f2 * d2 * s2
    return disp.astype(s1.dtype), mom.astype(s1.dtype)
