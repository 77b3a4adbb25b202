"""Lightcone planes, captured during the N-body as the past light cone crosses them.

The observer sits at ``observer`` (Mpc/h) in a periodic box replicated through space. Planes
are shells of comoving distance [χ_lo, χ_hi) of equal thickness Δχ from the observer out to
the first edge beyond χ(z_max). Each plane sees the particles drifted to the scale factor
a(χ_c) at which the light cone crosses the plane's centre χ_c (the drift of the step that
contains that time, stopped there, inside the N-body's compiled program: :class:`Capture`), through a copy of the box: rotated by one of the 24
axis rotations and shifted by a random whole number of cells (seeded by the run's seed, so a
paired run sees the same geometry). Every plane has its own copy, or (``per_copy`` planes to a
copy) the planes within each box length of distance share one and tile it slab after slab,
which keeps the correlations between neighbouring thin planes.

Two products per plane, both projected overdensities Σ = ∫ δ dχ over the plane (Mpc/h), with
their own mean removed:

- flat sky: the slab of the rotated box of thickness Δχ along the line of sight (the observer's
  z axis), projected onto the (x, y) plane: an (M, M) periodic map of the box's transverse
  extent, sharded like the meshes, CIC-painted (the transverse CIC window stays in: the lensing
  stage divides it out when it interpolates);
- full sky: a HEALPix map (RING) of the shell and its harmonic coefficients, band-limited to
  ℓ ≤ :func:`pmpipe.physics.evolution.sky.healpix_ell_max` = 3 nside - 1 (:func:`shell_alm`): the density, CIC-compensated
  and band-limited in 3D to :func:`pmpipe.physics.evolution.sky.shell_band_limits` (so that the shell holds no multipoles
  the rays cannot sample), is sampled by trilinear interpolation along the rays of a finer
  HEALPix grid (:func:`ray_samples` per ray); the harmonic coefficients of that map up to
  3 nside - 1 are the shell's, and the map is their synthesis at nside (:func:`healpix_map`).
  No pixel window. C_ℓ is computed from the coefficients, exact up to 3 nside - 1 (a HEALPix
  map's own analysis is off by percents above 2 nside: measured 1-4 % at ℓ = 80-95 for
  nside 32 even with 10 Jacobi iterations).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding

from pmpipe.physics.evolution import sky
from pmpipe.physics.mesh import fft, painting
from pmpipe.physics.mesh.domain import Grid
from pmpipe.runtime.parallel import AXES, FIELD_SPEC, pdims_of


@dataclasses.dataclass(frozen=True)
class PlaneTransform:
    """How plane i sees the box: box axis ``axes[j]`` becomes the observer's axis j, reversed
    where ``flips[j]``, then shifted by ``shift`` cells (box axes order); its flat slab starts
    ``slab`` cells past the shift along the line of sight (outwards), where the planes before
    it in the same copy end."""

    axes: tuple[int, ...]
    flips: tuple[bool, ...]
    shift: tuple[int, ...]
    slab: int = 0


def rotations() -> list[tuple[tuple[int, ...], tuple[bool, ...]]]:
    """The 24 proper rotations of a cube as (axis permutation, flips) with determinant +1."""
    out = []
    for axes in itertools.permutations(range(3)):
        parity = np.linalg.det(np.eye(3)[list(axes)])
        for flips in itertools.product((False, True), repeat=3):
            if parity * (-1) ** sum(flips) > 0:
                out.append((axes, flips))
    return out


def plane_transforms(
    seed: int, n_planes: int, mesh_n: int, randomize: bool, per_copy: int = 1, n_cells: int = 0
) -> list[PlaneTransform]:
    """One transform per plane: copy i // per_copy of the box, from numpy's generator seeded by
    (seed, copy index) (identities when ``randomize`` is false), its slab (i % per_copy) ×
    n_cells cells into the copy."""
    table = rotations()
    out = []
    for i in range(n_planes):
        copy, within = divmod(i, per_copy)
        axes: tuple[int, ...] = (0, 1, 2)
        flips: tuple[bool, ...] = (False,) * 3
        shift: tuple[int, ...] = (0, 0, 0)
        if randomize:
            rng = np.random.default_rng([seed, copy])
            axes, flips = table[int(rng.integers(len(table)))]
            shift = tuple(int(s) for s in rng.integers(mesh_n, size=3))
        out.append(
            PlaneTransform(tuple(axes), tuple(bool(f) for f in flips), shift, within * n_cells)
        )
    return out


def flat_shift(transform: PlaneTransform) -> tuple[int, ...]:
    """The shift (cells, box axes) that starts the transform's flat slab where its ``slab``
    says: that many cells outwards along the line of sight, down the box axis where the line
    of sight is reversed."""
    los = transform.axes[2]
    step = -transform.slab if transform.flips[2] else transform.slab
    return tuple(c + step if b == los else c for b, c in enumerate(transform.shift))


def flat_plane(delta, mesh: Mesh, box_size: float, n_cells: int, transform: PlaneTransform):
    """Projected overdensity Σ (Mpc/h) of a slab of ``n_cells`` cells of δ (M, M, M) along the
    transform's line of sight, on the transverse (M, M) grid in observer axes, mean removed
    (so ρ/ρ̄ in place of δ gives the same plane). The transform is an argument of the compiled
    program: every plane and seed runs the same one."""
    return _flat_plane(
        delta,
        np.asarray(transform.axes, np.int32),
        np.asarray(transform.flips),
        np.asarray(flat_shift(transform), np.int32),
        mesh=mesh,
        box_size=box_size,
        n_cells=n_cells,
    )


@partial(jax.jit, static_argnames=("mesh", "box_size", "n_cells"))
def _flat_plane(delta, axes, flips, shift, mesh: Mesh, box_size: float, n_cells: int):
    """:func:`flat_plane` with the transform as arrays axes, flips, shift (3,) (its
    :func:`flat_shift`)."""
    mesh_n = delta.shape[0]
    los = axes[2]
    cells = jnp.arange(mesh_n)
    in_slab = ((cells - shift[los]) % mesh_n < n_cells).astype(delta.dtype)  # periodic slab

    def project(axis):
        shape = [1, 1, 1]
        shape[axis] = mesh_n
        return jnp.sum(delta * in_slab.reshape(shape), axis=axis) * (box_size / mesh_n)

    plane = jax.lax.switch(los, [lambda axis=axis: project(axis) for axis in range(3)])
    # the plane's axes are the two box axes other than los, in box order; observer axis j is
    # box axis axes[j], its index i the box cell shift + i (reversed: shift - i)
    plane = jnp.where(axes[0] < axes[1], plane, plane.T)
    index = [
        jnp.where(flips[j], shift[axes[j]] - cells, shift[axes[j]] + cells) % mesh_n
        for j in range(2)
    ]
    plane = plane[index[0][:, None], index[1][None, :]]
    plane = plane - jnp.mean(plane)
    return jax.lax.with_sharding_constraint(plane, NamedSharding(mesh, FIELD_SPEC))


@partial(
    jax.tree_util.register_dataclass,
    data_fields=[
        "a",
        "axes",
        "flips",
        "shift",
        "chi_lo",
        "dr",
        "samples",
        "source",
        "scale",
        "offset",
        "k_max",
    ],
    meta_fields=["n_cells", "rays_nside"],
)
@dataclasses.dataclass(frozen=True)
class Capture:
    """What the N-body program captures as the light cone crosses the planes: arrays of length
    P (padded to a multiple of sky.PLANE_BUCKET; padding planes have a = 0 and are never crossed),
    arguments of the program, and static sizes. The real planes come first; their number is
    no part of the program, so runs whose cosmologies give a few planes more or less share it.

    a (P,) crossing scale factors; axes, flips, shift (P, 3): the planes' transforms (the
    shift their :func:`flat_shift`); chi_lo,
    dr (P,) Mpc/h: start of each shell and the step of its ray samples; samples (P,) int32: the
    number of them (:func:`ray_samples` of the shell's thickness and band limit); source, scale, offset
    (P, 3): :func:`box_frame`; k_max (P,) h/Mpc: band limit of each shell's density.
    n_cells: slab cells of a flat plane; rays_nside: the HEALPix
    grid of the full-sky rays (:func:`ray_directions`), or None for flat planes only.
    """

    a: jax.Array
    axes: jax.Array
    flips: jax.Array
    shift: jax.Array
    chi_lo: jax.Array
    dr: jax.Array
    samples: jax.Array
    source: jax.Array
    scale: jax.Array
    offset: jax.Array
    k_max: jax.Array
    n_cells: int
    rays_nside: int | None


def capture_plan(
    planes: sky.Planes,
    transforms,
    observer,
    grid: Grid,
    n_cells: int,
    rays_nside: int | None = None,
    k_max=0.0,
) -> Capture:
    """The :class:`Capture` of ``planes`` seen through ``transforms`` from ``observer`` on the
    force mesh of ``grid`` (in its dtype), slabs of n_cells cells; with ``rays_nside`` the
    full-sky shells too, sampled along the rays of that HEALPix grid and band-limited to k_max
    (h/Mpc; one value or one per plane)."""
    box_size, mesh_n, dtype = grid.box_size, grid.force_cells, np.dtype(grid.dtype)
    n, size = len(planes), sky.PLANE_BUCKET * math.ceil(len(planes) / sky.PLANE_BUCKET)
    thickness = np.diff(planes.chi_edges)
    k_max = np.broadcast_to(np.asarray(k_max, np.float64), (n,))
    samples = [ray_samples(float(t), box_size / mesh_n, float(k)) for t, k in zip(thickness, k_max)]
    frames = [box_frame(observer, t, box_size, mesh_n) for t in transforms]

    def padded(rows, kind):
        rows = np.asarray(rows, kind)
        return np.concatenate([rows, np.zeros((size - n,) + rows.shape[1:], kind)])

    return Capture(
        a=padded(planes.a, dtype),
        axes=padded([t.axes for t in transforms], np.int32),
        flips=padded([t.flips for t in transforms], bool),
        shift=padded([flat_shift(t) for t in transforms], np.int32),
        chi_lo=padded(planes.chi_edges[:-1], dtype),
        dr=padded(thickness / np.asarray(samples), dtype),
        samples=padded(samples, np.int32),
        source=padded([f[0] for f in frames], np.int32),
        scale=padded([f[1] for f in frames], dtype),
        offset=padded([f[2] for f in frames], dtype),
        k_max=padded(k_max, dtype),
        n_cells=n_cells,
        rays_nside=rays_nside,
    )


def empty_maps(capture: Capture, grid: Grid, dtype):
    """Zeroed outputs of a capture on the grid's force mesh (M cells per side): flat planes
    (P, M, M) sharded like the meshes, and the shells (P, npix) or None."""
    size, mesh_n, mesh = capture.a.shape[0], grid.force_cells, grid.mesh
    flat = jax.lax.with_sharding_constraint(
        jnp.zeros((size, mesh_n, mesh_n), dtype), NamedSharding(mesh, jax.P(None, *FIELD_SPEC))
    )
    if capture.rays_nside is None:
        return flat, None
    rays = sky.healpix_pixels(capture.rays_nside)
    shells = jax.lax.with_sharding_constraint(
        jnp.zeros((size, rays), dtype), NamedSharding(mesh, jax.P(None, *ray_spec(rays, mesh)))
    )
    return flat, shells


def ray_spec(rays: int, mesh: Mesh) -> jax.P:
    """How a shell's (rays,) sums lie on the devices: split over all of them (each keeps
    rays / devices), or on every device when rays / devices is not whole."""
    return jax.P(AXES) if rays % mesh.size == 0 else jax.P()


def capture_plane(maps, rho, j, capture: Capture, grid: Grid):
    """Inside the N-body program: plane j's flat projection and shell of the density rho
    (M, M, M) on the grid's force mesh written into maps = (flat (P, M, M), shells (P, npix)
    or None)."""
    flat, shells = maps
    mesh, box_size = grid.mesh, grid.box_size
    plane = _flat_plane(
        rho,
        capture.axes[j],
        capture.flips[j],
        capture.shift[j],
        mesh=mesh,
        box_size=box_size,
        n_cells=capture.n_cells,
    )
    flat = jax.lax.dynamic_update_index_in_dim(flat, plane.astype(flat.dtype), j, 0)
    if shells is not None:
        delta = band_limited_overdensity(rho, mesh, box_size, capture.k_max[j])
        shell = _shell(
            delta,
            capture.chi_lo[j],
            capture.dr[j],
            capture.samples[j],
            capture.source[j],
            capture.scale[j],
            capture.offset[j],
            mesh=mesh,
            rays_nside=capture.rays_nside,
            gather=sky.shell_gathers(grid.force_cells, shells.shape[1], mesh.size),
        )
        shells = jax.lax.dynamic_update_index_in_dim(shells, shell.astype(shells.dtype), j, 0)
    return flat, shells


def plane_offsets(observer, transform: PlaneTransform) -> tuple[float, float]:
    """Where the observer's line of sight meets a flat plane, in Mpc/h from the plane's index 0,
    along the plane's two axes."""
    return tuple(
        -observer[transform.axes[j]] if transform.flips[j] else observer[transform.axes[j]]
        for j in range(2)
    )


def shell_alm(rays, nside: int) -> np.ndarray:
    """Harmonic coefficients (healpy's ordering, complex128) up to ℓ = :func:`healpix_ell_max`
    of ``nside`` of ray samples ``rays`` on a finer HEALPix grid (RING), 3 Jacobi
    iterations; the monopole set to 0."""
    import healpy

    alm = healpy.map2alm(np.asarray(rays, np.float64), lmax=sky.healpix_ell_max(nside), iter=3)
    alm[0] = 0.0
    return alm


def healpix_map(alm, nside: int) -> np.ndarray:
    """The HEALPix map (RING, float64) of ``nside`` with harmonic coefficients ``alm`` up to
    :func:`healpix_ell_max`, its pixel mean removed (a band-limited synthesis without monopole
    has a pixel mean of about 1e-4 of its largest value); no pixel window."""
    import healpy

    out = healpy.alm2map(np.asarray(alm, np.complex128), nside, lmax=sky.healpix_ell_max(nside))
    return out - out.mean()


def ray_samples(length: float, cell: float, k_max: float) -> int:
    """Samples along a ray of ``length`` Mpc/h through a density band-limited to k_max (h/Mpc,
    the shell's band limit) on a mesh of ``cell`` Mpc/h: one per Nyquist
    spacing π / k_max, at most one per cell. The sum over them weights a line-of-sight mode k
    by (k dχ / 2) / sin(k dχ / 2) against the integral: 1.0004 for the modes of wavelength the
    thickness of a 256 Mpc/h shell sampled every 4 Mpc/h, the modes its projection keeps."""
    step = max(cell, math.pi / k_max) if k_max > 0 else cell
    return max(1, math.ceil(length / step - 1e-9))


def box_frame(observer, transform: PlaneTransform, box_size: float, mesh_n: int):
    """How an observer-frame point x (Mpc/h) lands in the transformed periodic box: box axis b
    has cell coordinate x[source[b]] * scale[b] + offset[b], modulo mesh_n. Returns
    (source (3,) int32, scale (3,), offset (3,)), arrays so that every plane's transform
    runs through one compiled program."""
    cell = box_size / mesh_n
    source, scale, offset = np.zeros(3, np.int32), np.zeros(3), np.zeros(3)
    for j, b in enumerate(transform.axes):
        source[b] = j
        scale[b] = (-1.0 if transform.flips[j] else 1.0) / cell
        offset[b] = observer[b] / cell + transform.shift[b]
    return source, scale, offset


@partial(jax.jit, static_argnames=("mesh", "rays_nside", "gather"))
def _shell(  # parameters: the arguments and statics of one compiled program
    delta, chi_lo, dr, samples, source, scale, offset, mesh: Mesh, rays_nside: int, gather: bool
):
    """dr Σ_k δ(x_k) along the rays of the HEALPix grid rays_nside at distances
    chi_lo + (k + 1/2) dr, k < samples (an argument: shells of other thickness or band limit
    run the same program, each with its own count), mean removed. Every device makes its rays' directions
    itself (:func:`ray_directions`) and generates the samples one distance at a time. With
    ``gather`` (:func:`pmpipe.physics.evolution.sky.shell_gathers`: several devices, a force
    mesh up to sky.SHELL_GATHER_CELLS, rays that divide by the devices) each device gathers
    the whole density and sums the samples of its own part of the rays (:func:`ray_spec`);
    else each samples every ray, reads the samples in its block and the (npix,) sums are
    added over the devices."""
    mesh_n = delta.shape[0]
    pdims = pdims_of(mesh)
    rays = sky.healpix_pixels(rays_nside)
    out_spec = ray_spec(rays, mesh)
    share = mesh.size if gather else 1

    def local(block):
        if gather:  # 'y' first: 1.5 meshes at the peak, not 2
            for d, axis in reversed(list(enumerate(AXES))):
                block = jax.lax.all_gather(block, axis, axis=d, tiled=True)
            read_pdims = (1, 1)
        else:
            block = painting.pad_for_reading(block, pdims)
            read_pdims = pdims
        start = jax.lax.axis_index(AXES) * (rays // share) if gather else 0
        directions = ray_directions(rays_nside, block.dtype, start, rays // share)
        along = tuple((directions[:, source] * scale).T)  # per box axis (rays,)

        def add_distance(k, total):
            chi = chi_lo + (k.astype(block.dtype) + 0.5) * dr
            cells = tuple(jnp.mod(chi * along[b] + offset[b], mesh_n) for b in range(3))
            return total + painting.read_owned(block, cells, mesh_n, read_pdims)

        zero = jax.lax.pcast(jnp.zeros(directions.shape[0], block.dtype), AXES, to="varying")
        total = jax.lax.fori_loop(0, samples, add_distance, zero)
        if gather:
            return total
        if out_spec != jax.P():
            return jax.lax.psum_scatter(total, AXES, scatter_dimension=0, tiled=True)
        return jax.lax.psum(total, AXES)

    run = jax.shard_map(local, mesh=mesh, in_specs=FIELD_SPEC, out_specs=out_spec)
    shell = run(delta) * dr
    return shell - jnp.mean(shell)


def ray_directions(nside: int, dtype=jnp.float32, start=0, count: int | None = None):
    """Unit vectors (count, 3) to the centres of pixels start .. start + count - 1 (count None:
    all 12 nside², from start 0) of the HEALPix grid ``nside`` in RING order (healpy's
    pix2vec), computed from the pixel indices, so that a compiled program makes them where it
    needs them instead of receiving them. Pixel indices are int32: nside ≤ 13377."""
    n = nside
    npix, ncap = sky.healpix_pixels(n), 2 * n * (n - 1)
    p = start + jnp.arange(npix if count is None else count, dtype=jnp.int32)

    def ring(x):
        """(1 + isqrt(x)) // 2 for x ≥ 1 (int32), the float square root corrected by one."""
        r = jnp.floor(jnp.sqrt(x.astype(jnp.float32))).astype(jnp.int32)
        r = jnp.where(r * r > x, r - 1, r)
        r = jnp.where((r + 1) * (r + 1) <= x, r + 1, r)
        return (1 + r) // 2

    north_ring = ring(1 + 2 * jnp.minimum(p, ncap))  # rings counted from the north pole (caps)
    south_pix = npix - p
    south_ring = ring(jnp.clip(2 * south_pix - 1, 1, 2 * ncap + 1))
    equator = p - ncap
    eq_ring = equator // (4 * n) + n  # rings n .. 3n counted from the north pole
    eq_phi_index = equator % (4 * n) + 1
    in_north, in_south = p < ncap, p >= npix - ncap
    cap_ring = jnp.where(in_north, north_ring, south_ring)
    cap_index = jnp.where(
        in_north,
        p + 1 - 2 * north_ring * (north_ring - 1),
        4 * south_ring + 1 - (south_pix - 2 * south_ring * (south_ring - 1)),
    )
    cap_depth = (cap_ring * cap_ring).astype(dtype) / (3 * n * n)  # 1 - |z|
    cap_phi = (cap_index.astype(dtype) - 0.5) * (np.pi / 2) / cap_ring.astype(dtype)
    odd = (eq_ring + n) % 2 == 1
    eq_phi = (eq_phi_index.astype(dtype) - jnp.where(odd, 1.0, 0.5)) * (np.pi / (2 * n))
    eq_z = (2 * n - eq_ring).astype(dtype) * (2.0 / (3 * n))
    in_cap = in_north | in_south
    z = jnp.where(in_cap, jnp.where(in_north, 1 - cap_depth, cap_depth - 1), eq_z)
    sin_theta = jnp.where(
        in_cap, jnp.sqrt(cap_depth * (2 - cap_depth)), jnp.sqrt((1 - eq_z) * (1 + eq_z))
    )
    phi = jnp.where(in_cap, cap_phi, eq_phi)
    return jnp.stack([sin_theta * jnp.cos(phi), sin_theta * jnp.sin(phi), z], axis=-1).astype(dtype)


@partial(jax.jit, static_argnames=("mesh", "box_size"))
def band_limited_overdensity(rho, mesh: Mesh, box_size: float, k_max):
    """δ = ρ/ρ̄ - 1 (M, M, M) for sampling along rays: modes above k_max (h/Mpc) removed, so
    that sampling does not alias the particle grid's small-scale noise onto large angles,
    and the rest divided by the CIC window twice (painting and trilinear interpolation)."""
    delta_k = fft.r2c(rho - jnp.mean(rho), mesh)
    keep = fft.wavenumber(delta_k, mesh, box_size) <= k_max
    window = painting.cic_window(delta_k, mesh, box_size) ** 2
    return fft.c2r(jnp.where(keep, delta_k / window, 0), mesh)
