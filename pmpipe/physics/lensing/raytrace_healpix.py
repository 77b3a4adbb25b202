"""Multiple-lens-plane ray tracing on the full sky through the lightcone's shells.

Shell i at comoving distance χ_i has projected overdensity Σ_i (Mpc/h) given by its harmonic
coefficients up to ℓ_max. Its angular potential φ_i solves ∇²φ_i = 2 Σ_i on the unit sphere, so
that at the transverse comoving position x = χ_i β the flat sky's fields of
:mod:`pmpipe.physics.lensing.raytrace_flat` are α_i = χ_i ∇φ_i and T_i = ∂α_i/∂x = ∇∇φ_i. They are evaluated
at the rays' positions by ducc0's synthesis at arbitrary points (a non-uniform transform, exact
to SYNTHESIS_EPSILON within the band limit; single precision for a float32 state): ∇φ as
spin 1, Σ (half the trace of T) as spin 0, T's trace-free part as spin 2
(E = sqrt((ℓ+2)(ℓ-1) / (ℓ(ℓ+1))) Σ_ℓm, healpy's Q and U).

Each ray starts at a pixel centre n of a HEALPix grid twice as fine as the map's
(:func:`pmpipe.physics.evolution.sky.traced_rays_nside`) and keeps the state of the flat sky (the
deviation d of its transverse position, the Jacobian, the sources' sums) in the tangent plane
at n, basis (e_θ, e_φ). At shell i it sits at β = exp_n(d / χ_i), the end of the great circle
from n of length |d| / χ_i along d; the fields read at β in β's basis are turned into the basis
carried from n along that circle (parallel transport), so that the recursion and
A = I - Σ_i w_i T_i X_i / χ_i are the flat sky's (:func:`pmpipe.physics.lensing.raytrace_flat.advance`,
:func:`pmpipe.physics.lensing.raytrace_flat.deflect`). Treating the tangent plane as flat over a ray's
excursion errs by the square of its deflection angle (10⁻⁶ for arcminutes); near the poles the
carried basis differs from the local one by the turn of e_θ along the circle, which the
rotation takes exactly.

One shell leaves the rays at the pixel centres: κ = w Σ at every ray, Born's. The rays' κ, γ,
ω are analysed into harmonic coefficients up to the map's band limit 3 nside - 1 (healpy's
map2alm with ANALYSIS_ITERATIONS Jacobi iterations, accurate there on a grid of 2 nside), and
the maps are synthesised from them, as Born's are.
"""

from __future__ import annotations

import concurrent.futures

import jax
import jax.numpy as jnp
import numpy as np

from pmpipe.physics.evolution import sky
from pmpipe.physics.lensing import raytrace_flat
from pmpipe.runtime import openmp

ANALYSIS_ITERATIONS = 3  # Jacobi iterations of the rays' analysis (about 1e-6 at 3 nside - 1)
SYNTHESIS_EPSILON = {True: 2e-6, False: 1e-10}  # ducc0's accuracy at the rays, single or not
_CHUNK = 1 << 18  # rays per block of the float64 geometry


def lens_alm(sigma_alm) -> tuple[np.ndarray, np.ndarray]:
    """Harmonic coefficients (healpy's ordering) of a shell's angular potential φ
    (∇²φ = 2Σ: φ_ℓm = -2 Σ_ℓm / (ℓ(ℓ+1)), 0 for ℓ = 0) and of the E modes of its tidal
    field's trace-free part (sqrt((ℓ+2)(ℓ-1) / (ℓ(ℓ+1))) Σ_ℓm), from Σ_ℓm."""
    import healpy

    from pmpipe.physics.lensing import projection

    sigma_alm = np.asarray(sigma_alm, np.complex128)
    ell = np.arange(healpy.Alm.getlmax(sigma_alm.size) + 1, dtype=np.float64)
    potential = np.divide(-2.0, ell * (ell + 1), out=np.zeros_like(ell), where=ell > 0)
    return (
        healpy.almxfl(sigma_alm, potential),
        healpy.almxfl(sigma_alm, projection.spin2_factor(ell.size - 1)),
    )


def plane_fields(sigma_alm, loc, dtype=np.float32):
    """∇φ (2, N), Σ = half the trace of ∇∇φ (N,) and ∇∇φ's trace-free part (2, N: its
    (θθ - φφ)/2 and θφ components) of a shell with coefficients sigma_alm (Σ, ℓ ≤ ℓ_max) at
    the points loc (N, 2: colatitude, longitude in rad), in the local basis (e_θ, e_φ), in
    ``dtype`` (float32: single-precision transforms). The monopole is left out: on the closed
    sphere a uniform Σ has no potential (the shells have none)."""
    import ducc0
    import healpy

    single = np.dtype(dtype) == np.float32
    sigma_alm = np.array(sigma_alm, np.complex128)
    sigma_alm[0] = 0.0
    potential, tidal = lens_alm(sigma_alm)
    complex_type = np.complex64 if single else np.complex128
    common = {
        "lmax": healpy.Alm.getlmax(potential.size),
        "loc": loc,
        "epsilon": SYNTHESIS_EPSILON[single],
        "nthreads": openmp.threads_for(openmp.usable_cores()),
    }
    synthesis = ducc0.sht.synthesis_general
    grad = synthesis(alm=potential[None].astype(complex_type), spin=1, mode="DERIV1", **common)
    sigma = synthesis(alm=sigma_alm[None].astype(complex_type), spin=0, **common)
    shear = synthesis(alm=tidal[None].astype(complex_type), spin=2, mode="GRAD_ONLY", **common)
    return grad, sigma[0], shear


def along_great_circles(theta, phi, delta):
    """The ends β of the great circles from (theta, phi) (N,) rad along the tangent vectors
    delta (2, N) (components on e_θ, e_φ; length the arc a in rad): their (colatitude,
    longitude) (N, 2), and cos ρ, sin ρ (N,) of the angle ρ by which e_θ carried along the
    circle is turned from β's: carried e_θ = cos ρ e_θ(β) + sin ρ e_φ(β). With s = sin a / a
    and b = (cos a - 1) / a², β's height is cos θ (1 + b a²) - s δ_θ sin θ and its horizontal
    components along and across the start's meridian sin θ (1 + b a²) + s δ_θ cos θ and s δ_φ;
    the circle's heading, turned by ρ, keeps sin θ sin ψ (Clairaut), which gives
    sin θ_β (cos ρ, sin ρ) = (s δ_θ cos θ + sin θ (1 + b δ_θ²), -δ_φ (s cos θ + b δ_θ sin θ)).
    At a pole, where e_θ is not defined, ρ = 0."""
    arc2 = delta[0] ** 2 + delta[1] ** 2
    arc = np.sqrt(arc2)
    small = arc < 1e-4  # series below 1e-4 rad: exact to float64
    s = np.where(small, 1 - arc2 / 6, np.sin(arc) / np.where(small, 1.0, arc))
    b = np.where(small, -0.5 + arc2 / 24, (np.cos(arc) - 1) / np.where(small, 1.0, arc2))
    sin, cos = np.sin(theta), np.cos(theta)
    shrink = 1 + b * arc2
    height = cos * shrink - s * delta[0] * sin
    along, across = sin * shrink + s * delta[0] * cos, s * delta[1]
    turn_cos = s * delta[0] * cos + sin * (1 + b * delta[0] ** 2)
    turn_sin = -delta[1] * (s * cos + b * delta[0] * sin)
    norm = np.hypot(turn_cos, turn_sin)
    pole = norm == 0
    norm = np.where(pole, 1.0, norm)
    loc = np.stack(
        [
            np.arctan2(np.hypot(along, across), height),
            np.mod(phi + np.arctan2(across, along), 2 * np.pi),
        ],
        axis=-1,
    )
    return loc, np.where(pole, 1.0, turn_cos / norm), turn_sin / norm


def _positions(rays: raytrace_flat.Rays, theta, phi):
    """The rays' positions at their shell (N, 2) and the cosine and sine (N, the rays' dtype) of
    the turn from their local basis there to the basis carried from their pixel centre
    (theta, phi), in blocks on the host's threads (numpy releases the interpreter in its
    loops)."""
    d = np.asarray(rays.d)
    chi = float(rays.chi)
    loc = np.empty((theta.size, 2))
    cos, sin = np.empty(theta.size, d.dtype), np.empty(theta.size, d.dtype)

    def block(start):
        part = slice(start, start + _CHUNK)
        delta = d[:, part].astype(np.float64) / chi
        loc[part], cos[part], sin[part] = along_great_circles(theta[part], phi[part], delta)

    threads = openmp.threads_for(openmp.usable_cores())
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        list(pool.map(block, range(0, theta.size, _CHUNK)))
    return loc, cos, sin


@jax.jit
def _advance(rays: raytrace_flat.Rays, chi) -> raytrace_flat.Rays:
    return raytrace_flat.advance(rays, chi)


def _turned(x, y, cos, sin):
    """Components (x cos ρ + y sin ρ, -x sin ρ + y cos ρ) on the basis turned by +ρ of the
    vector with components (x, y)."""
    return x * cos + y * sin, y * cos - x * sin


@jax.jit
def _deflect(rays: raytrace_flat.Rays, fields, turn, factor, weights):
    """Rays at a shell deflected by χ ∇φ and ∇∇φ = Σ I + trace-free part read in their local
    basis (fields: :func:`plane_fields`), turned by the angle ρ (turn: cos ρ, sin ρ) into the
    carried basis: a vector by ρ, the trace-free part (spin 2) by 2ρ."""
    (grad, sigma, shear), (cos, sin) = fields, turn
    alpha = jnp.stack(_turned(grad[0], grad[1], cos, sin)) * rays.chi
    t1, t2 = _turned(shear[0], shear[1], cos * cos - sin * sin, 2 * sin * cos)
    T = jnp.stack([jnp.stack([sigma + t1, t2]), jnp.stack([t2, sigma - t1])])
    return raytrace_flat.deflect(rays, alpha, T, factor, weights)


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
    rays = raytrace_flat.Rays(
        zeros(2), zeros(2), zeros(2, 2), zeros(2, 2), zeros(s, 2, 2), zeros(s, 2),
        jnp.zeros((), dt), jnp.zeros((), jnp.int32),
    )  # fmt: skip
    last = max((i for i in range(len(shells)) if np.any(weights[:, i])), default=-1)
    for i in range(last + 1):
        rays = _advance(rays, dt.type(chi[i]))
        loc, cos, sin = _positions(rays, theta, phi)
        rays = _deflect(
            rays,
            plane_fields(shells[i](), loc, dt),
            (cos, sin),
            dt.type(factors[i]),
            weights[:, i].astype(dt),
        )
    return raytrace_flat.distortion(rays)


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
