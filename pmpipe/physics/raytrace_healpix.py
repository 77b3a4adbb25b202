"""Multiple-lens-plane ray tracing on the full sky through the lightcone's shells.

Shell i at comoving distance χ_i has projected overdensity Σ_i (Mpc/h) given by its harmonic
coefficients up to ℓ_max. Its angular potential φ_i solves ∇²φ_i = 2 Σ_i on the unit sphere, so
that at the transverse comoving position x = χ_i β the flat sky's fields of
:mod:`pmpipe.physics.raytrace` are α_i = χ_i ∇φ_i and T_i = ∂α_i/∂x = ∇∇φ_i. They are evaluated
at the rays' positions by ducc0's synthesis at arbitrary points (a non-uniform transform, exact
to SYNTHESIS_EPSILON within the band limit): ∇φ as spin 1, Σ (half the trace of T) as spin 0,
T's trace-free part as spin 2 (E = sqrt((ℓ+2)(ℓ-1) / (ℓ(ℓ+1))) Σ_ℓm, healpy's Q and U).

Each ray starts at a pixel centre n of a HEALPix grid RAYS_PER_PIXEL_SIDE times finer than the
map's and keeps the state of the flat sky (the deviation d of its transverse position, the
Jacobian, the sources' sums) in the tangent plane at n, basis (e_θ, e_φ). At shell i it sits at
β = exp_n(d / χ_i), the end of the great circle from n of length |d| / χ_i along d; the fields
read at β in β's basis are turned into the basis carried from n along that circle (parallel
transport), so that the recursion and A = I - Σ_i w_i T_i X_i / χ_i are the flat sky's
(:func:`pmpipe.physics.raytrace.advance`, :func:`pmpipe.physics.raytrace.deflect`). Treating
the tangent plane as flat over a ray's excursion errs by the square of its deflection angle
(10⁻⁶ for arcminutes); near the poles the carried basis differs from the local one by the
turn of e_θ along the circle, which the rotation takes exactly.

One shell leaves the rays at the pixel centres: κ = w Σ at every ray, Born's. The rays' κ, γ,
ω are analysed into harmonic coefficients up to the map's band limit 3 nside - 1 (healpy's
map2alm with ANALYSIS_ITERATIONS Jacobi iterations, accurate there on a grid of 2 nside), and
the maps are synthesised from them, as Born's are.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from pmpipe.physics import raytrace, sky
from pmpipe.runtime import openmp

RAYS_PER_PIXEL_SIDE = 2  # rays on a HEALPix grid of 2 nside: its analysis reaches 3 nside - 1
ANALYSIS_ITERATIONS = 3  # Jacobi iterations of the rays' analysis (about 1e-6 at 3 nside - 1)
SYNTHESIS_EPSILON = 1e-7  # relative accuracy of ducc0's synthesis at the rays
_CHUNK = 1 << 20  # rays per block of the float64 geometry


def lens_alm(sigma_alm) -> tuple[np.ndarray, np.ndarray]:
    """Harmonic coefficients (healpy's ordering) of a shell's angular potential φ
    (∇²φ = 2Σ: φ_ℓm = -2 Σ_ℓm / (ℓ(ℓ+1)), 0 for ℓ = 0) and of the E modes of its tidal
    field's trace-free part (sqrt((ℓ+2)(ℓ-1) / (ℓ(ℓ+1))) Σ_ℓm), from Σ_ℓm."""
    import healpy

    from pmpipe.physics import lensing

    sigma_alm = np.asarray(sigma_alm, np.complex128)
    ell = np.arange(healpy.Alm.getlmax(sigma_alm.size) + 1, dtype=np.float64)
    potential = np.divide(-2.0, ell * (ell + 1), out=np.zeros_like(ell), where=ell > 0)
    return (
        healpy.almxfl(sigma_alm, potential),
        healpy.almxfl(sigma_alm, lensing.spin2_factor(ell.size - 1)),
    )


def plane_fields(sigma_alm, loc) -> tuple[np.ndarray, np.ndarray]:
    """∇φ (2, N) and ∇∇φ (2, 2, N) of a shell with coefficients sigma_alm (Σ, ℓ ≤ ℓ_max) at the
    points loc (N, 2: colatitude, longitude in rad), in the local basis (e_θ, e_φ)."""
    import ducc0
    import healpy

    potential, tidal = lens_alm(sigma_alm)
    common = {
        "lmax": healpy.Alm.getlmax(potential.size),
        "loc": loc,
        "epsilon": SYNTHESIS_EPSILON,
        "nthreads": openmp.threads_for(openmp.usable_cores()),
    }
    synthesis = ducc0.sht.synthesis_general
    grad = synthesis(alm=potential[None], spin=1, mode="DERIV1", **common)
    trace = synthesis(alm=np.asarray(sigma_alm, np.complex128)[None], spin=0, **common)[0]
    shear = synthesis(alm=tidal[None], spin=2, mode="GRAD_ONLY", **common)
    T = np.stack([np.stack([trace + shear[0], shear[1]]), np.stack([shear[1], trace - shear[0]])])
    return grad, T


def _frames(theta, phi):
    """The position n and the basis vectors e_θ, e_φ (3, N) at colatitudes theta, longitudes phi."""
    st, ct, sp, cp = np.sin(theta), np.cos(theta), np.sin(phi), np.cos(phi)
    return (
        np.stack([st * cp, st * sp, ct]),
        np.stack([ct * cp, ct * sp, -st]),
        np.stack([-sp, cp, np.zeros_like(phi)]),
    )


def along_great_circles(theta, phi, delta):
    """The ends β of the great circles from (theta, phi) (N,) rad along the tangent vectors
    delta (2, N) (components on e_θ, e_φ; length the arc in rad): their (colatitude,
    longitude) (N, 2) and cos ρ, sin ρ (N,) of the angle ρ with e_θ carried along the circle
    = cos ρ e_θ(β) + sin ρ e_φ(β)."""
    n, e_theta, e_phi = _frames(theta, phi)
    arc = np.hypot(delta[0], delta[1])
    small = arc < 1e-4
    arc2 = arc * arc  # series below 1e-4 rad: exact to float64
    along = np.where(small, 1 - arc2 / 6, np.sin(arc) / np.where(small, 1.0, arc))
    bend = np.where(small, -0.5 + arc2 / 24, (np.cos(arc) - 1) / np.where(small, 1.0, arc2))
    tangent = delta[0] * e_theta + delta[1] * e_phi
    end = n * (1 + bend * arc2) + along * tangent
    end /= np.linalg.norm(end, axis=0)
    carried = e_theta + delta[0] * (bend * tangent - along * n)
    colatitude = np.arctan2(np.hypot(end[0], end[1]), end[2])
    longitude = np.mod(np.arctan2(end[1], end[0]), 2 * np.pi)
    _, e_theta_end, e_phi_end = _frames(colatitude, longitude)
    return (
        np.stack([colatitude, longitude], axis=-1),
        np.sum(carried * e_theta_end, axis=0),
        np.sum(carried * e_phi_end, axis=0),
    )


def _positions(rays: raytrace.Rays, theta, phi):
    """The rays' positions at their shell (N, 2) and the cosine and sine (N,) of the turn from
    their local basis there to the basis carried from their pixel centre (theta, phi)."""
    delta = np.asarray(rays.d, np.float64) / float(rays.chi)
    loc = np.empty((theta.size, 2))
    cos, sin = np.empty(theta.size), np.empty(theta.size)
    for start in range(0, theta.size, _CHUNK):
        part = slice(start, start + _CHUNK)
        loc[part], cos[part], sin[part] = along_great_circles(
            theta[part], phi[part], delta[:, part]
        )
    return loc, cos, sin


@jax.jit
def _advance(rays: raytrace.Rays, chi) -> raytrace.Rays:
    return raytrace.advance(rays, chi)


@jax.jit
def _deflect(rays: raytrace.Rays, grad, tidal, cos, sin, factor, weights) -> raytrace.Rays:
    """Rays at a shell deflected by χ ∇φ and ∇∇φ read in their local basis, turned by the angle
    ρ (cos, sin) into the carried basis: a vector's components (a1, a2) become
    (a1 cos ρ + a2 sin ρ, -a1 sin ρ + a2 cos ρ), the tidal matrix R T Rᵀ."""
    chi = rays.chi
    R = jnp.stack([jnp.stack([cos, sin]), jnp.stack([-sin, cos])])
    alpha = chi * jnp.einsum("ab...,b...->a...", R, grad)
    T = jnp.einsum("ab...,bc...,dc...->ad...", R, tidal, R)
    return raytrace.deflect(rays, alpha, T, factor, weights)


def trace(shells, weights, factors, chi, nside: int, dtype=np.float32) -> dict:
    """Ray-traced κ, γ1, γ2, ω (S, N) and deflection θ - β (S, 2, N) (rad, on e_θ, e_φ) of S
    sources at the N pixel centres (RING) of the HEALPix grid ``nside`` (the rays'): shells P
    callables returning shell i's coefficients Σ_ℓm (healpy's ordering, Mpc/h), weights (S, P)
    Born's, factors (P,) the c_i (h²/Mpc²), chi (P,) shell distances (Mpc/h, increasing).
    The rays' state is held in ``dtype`` on JAX's default device, their positions in float64
    on the host."""
    import healpy

    weights, dt = np.asarray(weights, np.float64), np.dtype(dtype)
    npix = sky.healpix_pixels(nside)
    theta, phi = healpy.pix2ang(nside, np.arange(npix))

    def zeros(*lead):
        return jnp.zeros((*lead, npix), dt)

    s = weights.shape[0]
    rays = raytrace.Rays(
        zeros(2), zeros(2), zeros(2, 2), zeros(2, 2), zeros(s, 2, 2), zeros(s, 2),
        jnp.zeros((), dt), jnp.zeros((), jnp.int32),
    )  # fmt: skip
    last = max((i for i in range(len(shells)) if np.any(weights[:, i])), default=-1)
    for i in range(last + 1):
        rays = _advance(rays, dt.type(chi[i]))
        loc, cos, sin = _positions(rays, theta, phi)
        grad, tidal = plane_fields(shells[i](), loc)
        rays = _deflect(
            rays,
            grad.astype(dt),
            tidal.astype(dt),
            cos.astype(dt),
            sin.astype(dt),
            dt.type(factors[i]),
            weights[:, i].astype(dt),
        )
    return raytrace.distortion(rays)


def analyse(kappa, gamma1, gamma2, omega, lmax: int) -> dict[str, np.ndarray]:
    """Harmonic coefficients (ℓ ≤ lmax, healpy's ordering) of one source's ray-traced maps
    (HEALPix, RING): kappa and omega (spin 0), the shear's E and B modes (spin 2, γ1 and γ2 as
    healpy's Q and U), by map2alm with ANALYSIS_ITERATIONS iterations; monopoles 0."""
    import healpy

    maps = [np.asarray(m, np.float64) for m in (kappa, gamma1, gamma2)]
    k, e, b = healpy.map2alm(maps, lmax=lmax, pol=True, iter=ANALYSIS_ITERATIONS)
    w = healpy.map2alm(np.asarray(omega, np.float64), lmax=lmax, iter=ANALYSIS_ITERATIONS)
    k[0] = w[0] = 0.0
    return {"kappa": k, "e": e, "b": b, "omega": w}
