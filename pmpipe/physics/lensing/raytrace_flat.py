"""Multiple-lens-plane ray tracing on the flat sky through the lightcone planes.

Plane i, at comoving distance χ_i (crossed at a_i) with projected overdensity Σ_i (Mpc/h) on
its periodic grid, deflects a ray at transverse comoving position x (Mpc/h, from the line of
sight) by c_i α_i(x), where α_i = ∇ψ_i with ∇²ψ_i = 2 Σ_i and c_i = 3/2 Ω_m (H0/c)² / a_i.
Between planes rays run straight (flat comoving geometry): x(χ) grows with the direction
u = dx/dχ, which each plane changes by -c_i α_i(x_i); the ray bundle's Jacobian X = ∂x/∂θ
likewise with the tidal matrix T_i = ∂α_i/∂x, U = ∂u/∂θ changing by -c_i T_i X_i. For a source s
the distortion matrix and the deflection are

    A_s = I - Σ_i w_i^s T_i(x_i) X_i / χ_i,        θ - β_s = Σ_i (w_i^s / χ_i) α_i(x_i),

w_i^s being Born's weight of plane i (pmpipe.physics.lensing.projection.plane_weights): for thin planes
and a single source this is the thin-lens recursion exactly, and since the first plane's rays
are undeflected (X_1 = χ_1 I), one plane gives Born's κ = w Σ. A source distribution weights
the planes as Born does, which averages A over the source planes. A source's nuisances enter
its weights only (its shear bias scales them, its intrinsic alignment adds to them), never
the rays' paths; the deflection θ - β then carries them too, and is a lensing deflection only
for weights without nuisances.

The plane's mean (a uniform sheet) lenses about the line of sight: α += Σ̄ x, T += Σ̄ I.
Fields are read as in Born (exact Fourier sums, the plane's CIC window divided out and its
modes above the map's Nyquist multipole removed) on a grid RAY_OVERSAMPLING times finer than the
pixels that covers the map and a margin of MAX_DEFLECTION_DEG around it, and interpolated at
the deflected rays by cubic convolution (Keys 1981, a = -1/2): rays that are not deflected sit
on its nodes and read the exact sums.
"""

from __future__ import annotations

import dataclasses
import math
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding

from pmpipe.physics.lensing import projection
from pmpipe.physics.mesh import fft
from pmpipe.physics.mesh.domain import Grid
from pmpipe.physics.theory import cosmology
from pmpipe.runtime.parallel import FIELD_SPEC

MAX_PLANE_THICKNESS = 100.0  # Mpc/h: thicker planes miss the lens-lens coupling between them
RAY_OVERSAMPLING = 2  # nodes per pixel side of the grid the planes' fields are read on
MAX_DEFLECTION_DEG = 0.25  # margin of that grid around the map: no ray moves further
_STENCIL = 2  # nodes a cubic convolution reads on each side of a point


@dataclasses.dataclass(frozen=True)
class RayGrid:
    """The nodes at which each plane's fields are read, in angle: ``nodes`` per side, the first
    at ``start`` rad, ``step`` rad apart; pixel p of the map is node ``first_pixel + p *
    RAY_OVERSAMPLING``."""

    nodes: int
    start: float
    step: float
    first_pixel: int

    def angles(self) -> np.ndarray:
        """Angles (nodes,) in rad."""
        return self.start + np.arange(self.nodes) * self.step


def deflection_factors(cosmo: cosmology.Cosmology, chi) -> np.ndarray:
    """c_i = 3/2 Ω_m (H0/c)² / a(χ_i) of planes at chi (P,) Mpc/h, in (h/Mpc)²."""
    a = cosmology.on_host(cosmology.scale_factor_at_distance, cosmo, np.asarray(chi, np.float64))
    return projection.LENSING_PREFACTOR * cosmo.Omega_m / a


def ray_grid(theta) -> RayGrid:
    """The node grid of a map with pixel centres theta (n,) rad, equally spaced."""
    theta = np.asarray(theta, np.float64)
    pixel = float(theta[1] - theta[0])
    margin = math.ceil(math.radians(MAX_DEFLECTION_DEG) / pixel) + _STENCIL
    step = pixel / RAY_OVERSAMPLING
    first = margin * RAY_OVERSAMPLING
    return RayGrid(
        2 * first + (theta.size - 1) * RAY_OVERSAMPLING + 1, theta[0] - first * step, step, first
    )


def lens_kernels(mesh_n: int, box_size, dtype=np.float64):
    """(5, M, M // 2 + 1) factors that turn a plane's modes Σ_k with k_y ≥ 0 into those of
    α_x, α_y, T_xx, T_xy, T_yy (∇²ψ = 2Σ; 0 at k = 0, where the mean is lensed as a sheet),
    doubled for 0 < k_y < k_Nyquist: the real part of a sum over these modes is the sum over
    all of them, whose k_y < 0 half is the conjugate of this one (the Nyquist modes are removed:
    :func:`pmpipe.physics.lensing.projection.plane_transfer`). A JAX array of the complex type of the real
    ``dtype``, computed where it is traced (box_size in Mpc/h may be traced too)."""
    k = fft.angular_frequencies(mesh_n, 1.0 / mesh_n, jnp, dtype) / box_size
    half = mesh_n // 2 + 1
    kx, ky = k[:, None], jnp.abs(k[None, :half])
    k2 = kx**2 + ky**2
    inv = jnp.where(k2 > 0, 2.0 / jnp.where(k2 > 0, k2, 1.0), 0.0)
    doubled = (jnp.arange(half) >= 1) & (jnp.arange(half) < (mesh_n + 1) // 2)
    inv = inv * jnp.where(doubled, 2.0, 1.0)  # the k_y > 0 columns stand for their conjugates
    alpha = -1j * jnp.stack([kx * inv, ky * inv])
    return jnp.concatenate([alpha, jnp.stack([kx * kx * inv, kx * ky * inv, ky * ky * inv])])


def _cubic_weights(t):
    """Keys' cubic-convolution weights (4, ...) of the nodes -1, 0, 1, 2 for offsets t in [0, 1)."""
    return jnp.stack(
        [
            ((-0.5 * t + 1.0) * t - 0.5) * t,
            (1.5 * t - 2.5) * t * t + 1.0,
            ((-1.5 * t + 2.0) * t + 0.5) * t,
            (0.5 * t - 0.5) * t * t,
        ]
    )


def interpolate(fields, fx, fy):
    """fields (C, m, m) at fractional node indices fx, fy (...) by cubic convolution: (C, ...).
    Indices are clipped to the nodes whose stencil lies inside the grid."""
    m = fields.shape[-1]
    ix, iy = jnp.floor(fx), jnp.floor(fy)
    wx, wy = _cubic_weights(fx - ix), _cubic_weights(fy - iy)
    ix = jnp.clip(ix.astype(jnp.int32), 1, m - 3)
    iy = jnp.clip(iy.astype(jnp.int32), 1, m - 3)
    out = 0.0
    for a in range(4):
        row = 0.0
        for b in range(4):
            row = row + wy[b] * fields[:, ix + a - 1, iy + b - 1]
        out = out + wx[a] * row
    return out


@dataclasses.dataclass(frozen=True)
class Rays:
    """The state of the rays (... : (n, n) on the flat sky, (N,) on the full sky) between planes:
    deflection d = x - χθ of their transverse
    position (2, ...) Mpc/h and of their direction v = u - θ (2, ...), the Jacobian's deviations
    D = X - χI and V = U - I (2, 2, ...), and per source the sums M (S, 2, 2, ...) of
    w T X / χ and B (S, 2, ...) of w α / χ; ``chi`` the distance reached (Mpc/h) and
    ``escaped`` the rays that left the node grid."""

    d: jax.Array
    v: jax.Array
    D: jax.Array
    V: jax.Array
    M: jax.Array
    B: jax.Array
    chi: jax.Array
    escaped: jax.Array


jax.tree_util.register_dataclass(
    Rays, data_fields=[f.name for f in dataclasses.fields(Rays)], meta_fields=[]
)


def _spec(rank: int):
    return jax.P(*([None] * rank), *FIELD_SPEC)


def _start(sources: int, n: int, dtype, mesh: Mesh) -> Rays:
    def zeros(*lead):
        return jax.device_put(np.zeros((*lead, n, n), dtype), NamedSharding(mesh, _spec(len(lead))))

    return Rays(
        zeros(2),
        zeros(2),
        zeros(2, 2),
        zeros(2, 2),
        zeros(sources, 2, 2),
        zeros(sources, 2),
        jnp.zeros((), dtype),
        jnp.zeros((), jnp.int32),
    )


@dataclasses.dataclass(frozen=True)
class LensPlane:
    """What a compiled step needs of plane i: its projected overdensity (M, M), the node grid's
    positions on the plane along x and y as :func:`pmpipe.physics.lensing.projection.fourier_phases`
    (3, nodes), its transfer (M, M // 2 + 1: k_y ≥ 0; :func:`pmpipe.physics.lensing.projection.plane_transfer`),
    the box size and its distance chi (Mpc/h), its deflection factor c_i and Born's weights (S,)
    w_i^s of every source."""

    density: jax.Array
    px: jax.Array
    py: jax.Array
    transfer: jax.Array
    box_size: jax.Array
    chi: jax.Array
    factor: jax.Array
    weights: jax.Array


jax.tree_util.register_dataclass(
    LensPlane, data_fields=[f.name for f in dataclasses.fields(LensPlane)], meta_fields=[]
)


def advance(rays: Rays, chi) -> Rays:
    """The rays run straight from rays.chi to the distance chi (Mpc/h)."""
    step = chi - rays.chi
    return dataclasses.replace(rays, d=rays.d + step * rays.v, D=rays.D + step * rays.V, chi=chi)


def deflect(rays: Rays, alpha, T, factor, weights) -> Rays:
    """Rays at a plane (rays.chi) deflected by it: alpha (2, ...) the field α_i and T (2, 2, ...)
    the tidal matrix ∂α_i/∂x at the rays, in their own basis; factor the plane's c_i, weights
    (S,) Born's w_i^s. The direction changes by -c_i α, its Jacobian by -c_i T X, and every
    source adds w T X / χ and w α / χ to its sums."""
    chi, dtype = rays.chi, rays.D.dtype
    eye = jnp.eye(2, dtype=dtype).reshape(2, 2, *([1] * (rays.D.ndim - 2)))
    TX = jnp.einsum("ab...,bc...->ac...", T, rays.D + chi * eye)
    w = (weights / chi).reshape(-1, *([1] * alpha.ndim))
    return dataclasses.replace(
        rays,
        v=rays.v - factor * alpha,
        V=rays.V - factor * TX,
        M=rays.M + w[..., None] * TX[None],
        B=rays.B + w * alpha[None],
    )


@partial(jax.jit, static_argnames=("grid", "mesh"))
def _through_plane(rays: Rays, lens: LensPlane, theta, grid: RayGrid, mesh: Mesh) -> Rays:
    """Rays moved to the plane and deflected by it; theta (n,) the pixel centres (rad)."""
    plane, chi, dtype = lens.density, lens.chi, rays.d.dtype
    half, mesh_n = lens.transfer.shape[-1], plane.shape[0]
    kernels = lens_kernels(mesh_n, lens.box_size, dtype) * lens.transfer
    ex = projection.fourier_matrix(lens.px, mesh_n)
    ey = projection.fourier_matrix(lens.py, mesh_n, columns=half)
    n = theta.shape[0]
    rays = advance(rays, chi)
    d = rays.d
    sharded = NamedSharding(mesh, FIELD_SPEC)
    modes = fft.fft2(plane, sharded)
    rows = jnp.einsum("am,cmn->can", ex, modes[None, :, :half] * kernels)
    # the real part of rows @ ey.T as two real products: half the work of the complex one
    fields = jnp.einsum("can,bn->cab", rows.real, ey.real)
    fields = (fields - jnp.einsum("can,bn->cab", rows.imag, ey.imag)) / plane.shape[0] ** 2
    sheet = modes[0, 0].real / plane.shape[0] ** 2
    pixel_nodes = grid.first_pixel + RAY_OVERSAMPLING * jnp.arange(n, dtype=dtype)
    node = chi * grid.step
    fx = pixel_nodes[:, None] + d[0] / node
    fy = pixel_nodes[None, :] + d[1] / node
    outside = (fx < 1) | (fx >= grid.nodes - 2) | (fy < 1) | (fy >= grid.nodes - 2)
    ax, ay, txx, txy, tyy = interpolate(fields.astype(dtype), fx, fy)
    position = (chi * theta[:, None] + d[0], chi * theta[None, :] + d[1])
    alpha = jnp.stack([ax + sheet * position[0], ay + sheet * position[1]])
    T = jnp.stack([jnp.stack([txx + sheet, txy]), jnp.stack([txy, tyy + sheet])])
    rays = deflect(rays, alpha, T, lens.factor, lens.weights)

    def laid(x):
        return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, _spec(x.ndim - 2)))

    fields_of_rays = ("d", "v", "D", "V", "M", "B")
    return dataclasses.replace(
        rays,
        **{name: laid(getattr(rays, name)) for name in fields_of_rays},
        escaped=rays.escaped + jnp.sum(outside, dtype=jnp.int32),
    )


def distortion(rays: Rays) -> dict:
    """κ, γ1, γ2, ω (S, ...) of every source from the rays' sums M = I - A (the distortion
    matrix A = [[1 - κ - γ1, -γ2 - ω], [-γ2 + ω, 1 - κ + γ1]]) and the deflection θ - β
    (S, 2, ...) in rad."""
    M = rays.M
    return {
        "kappa": 0.5 * (M[:, 0, 0] + M[:, 1, 1]),
        "gamma1": 0.5 * (M[:, 0, 0] - M[:, 1, 1]),
        "gamma2": 0.5 * (M[:, 0, 1] + M[:, 1, 0]),
        "omega": 0.5 * (M[:, 0, 1] - M[:, 1, 0]),
        "deflection": rays.B,
    }


def trace(planes, weights, factors, chi, theta, offsets, grid: Grid) -> dict:
    """Ray-traced maps (S, n, n) for S sources: planes P callables returning plane i's projected
    overdensity (M, M) on the force mesh of ``grid`` (box, device mesh, dtype), weights (S, P)
    Born's, factors (P,) the planes' c_i = 3/2 Ω_m (H0/c)² / a_i (h²/Mpc²), chi (P,) plane
    distances (Mpc/h, increasing), theta (n,) the pixel centres (rad, equally spaced), offsets
    (P, 2) where the line of sight crosses each plane (Mpc/h). Returns :func:`distortion`'s
    maps (S, n, n) and deflection (S, 2, n, n), laid out like the maps of
    :func:`pmpipe.physics.lensing.projection.flat_sky_convergence`."""
    box_size, mesh, dtype = grid.box_size, grid.mesh, np.dtype(grid.dtype)
    theta = np.asarray(theta, np.float64)
    weights = np.asarray(weights, np.float64)
    nodes = ray_grid(theta)
    pixel = float(theta[1] - theta[0])
    rays = _start(weights.shape[0], theta.size, dtype, mesh)
    last = max((i for i in range(len(planes)) if np.any(weights[:, i])), default=-1)
    for i in range(last + 1):
        plane = planes[i]()
        mesh_n = plane.shape[0]
        px, py = (
            projection.fourier_phases(
                float(chi[i]) * nodes.angles() + offsets[i][j], mesh_n, box_size, dtype
            )
            for j in range(2)
        )
        transfer = projection.plane_transfer(mesh_n, box_size, float(chi[i]), pixel)
        lens_plane = LensPlane(
            plane,
            jnp.asarray(px),
            jnp.asarray(py),
            jnp.asarray(transfer[:, : mesh_n // 2 + 1], dtype),
            dtype.type(box_size),
            dtype.type(chi[i]),
            dtype.type(factors[i]),
            weights[:, i].astype(dtype),
        )
        rays = _through_plane(rays, lens_plane, theta.astype(dtype), grid=nodes, mesh=mesh)
    escaped = int(rays.escaped)
    if escaped:
        raise ValueError(
            f"ray tracing: at {escaped} plane crossings a ray had moved from its line of sight "
            "beyond the margin of the grid the planes' fields are read on (at least "
            f"{MAX_DEFLECTION_DEG} deg, pmpipe.physics.lensing.raytrace_flat.MAX_DEFLECTION_DEG): such "
            "deflections come from more mass than simulated planes hold"
        )
    return distortion(rays)
