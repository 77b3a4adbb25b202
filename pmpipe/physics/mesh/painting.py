"""Cloud-in-cell painting and reading of particles on a (sharded) periodic mesh.

Particles live on the Lagrangian grid, shape (N, N, N, 3), sharded like the mesh, so the
particles a device holds start inside the device's block of the M^3 mesh (M = B N). Once they
move, their clouds can fall outside the block: each device paints onto its block padded by
``halo`` cells along every split axis, then the halos are folded (added) onto the neighbours'
blocks with ``lax.ppermute``; reading fills the halos from the neighbours first. Axes that are
not split wrap periodically in place.

A particle whose cloud reaches beyond the halo cannot be painted correctly. Every paint and
read reports the halo the particles would need; :func:`check_halo` turns a shortfall into
:class:`HaloError` rather than dropping mass silently.
"""

from __future__ import annotations

import math
from functools import partial

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import Mesh

from pmpipe.physics.mesh import domain, fft
from pmpipe.physics.mesh.domain import Grid
from pmpipe.runtime.parallel import AXES, FIELD_SPEC, pdims_of


class HaloError(RuntimeError):
    """Particles moved further from their Lagrangian block than the halo allows."""


def check_halo(needed, halo: int, when: str = "") -> None:
    """Raise :class:`HaloError` when ``needed`` (from paint / read) exceeds ``halo`` cells;
    ``when`` says where in the run it first did."""
    needed = int(needed)
    if needed > halo:
        raise HaloError(
            f"particles moved {needed} cells beyond their domain{when} but parallel.halo_cells = "
            f"{halo}; set parallel.halo_cells >= {needed} (or use fewer devices along the split "
            "axes)"
        )


def _block_shape(local_shape, global_n, splits, halo):
    """Shape of the local block padded with halos along the split axes."""
    return tuple(n + 2 * halo if split else global_n for n, split in zip(local_shape, splits))


def _base_index(pos, n_local, n_global, split, halo):
    """Lower CIC corner along one axis: index (n,) into the padded block, fraction (n,) towards
    the upper corner, and the halo this axis needs. On a split axis the index is clipped to
    leave room for the upper corner (a particle that needs that is reported by ``needed``)."""
    i0 = jnp.floor(pos)
    frac = pos - i0
    i0 = i0.astype(jnp.int32)
    if split:
        needed = jnp.maximum(jnp.max(-i0), jnp.max(i0 + 2 - n_local))
        return jnp.clip(i0 + halo, 0, n_local + 2 * halo - 2), frac, needed
    return i0 % n_global, frac, jnp.zeros((), jnp.int32)


def _lower_corners(pos, local_shape, global_n, splits, halo):
    """Padded block shape and, per axis, (lower corner index, fraction, halo needed)."""
    sizes = _block_shape(local_shape, global_n, splits, halo)
    per_axis = [_base_index(pos[d], local_shape[d], global_n, splits[d], halo) for d in range(3)]
    return sizes, per_axis


def _corner_index(lower, upper, sizes):
    """A function of the corner c (0..7; bit 4: x, 2: y, 1: z upper) giving the flat indices
    (n,) of that CIC corner in a block of shape ``sizes``, from the per-axis lower and upper
    indices (n,). Each corner's indices are computed where they are used, so XLA fuses them
    into the scatter or gather instead of materialising (8, n) arrays."""

    def index(c):
        ix, iy, iz = (upper[d] if c & (4 >> d) else lower[d] for d in range(3))
        return (ix * sizes[1] + iy) * sizes[2] + iz

    return index


def _local_cic(pos, local_shape, global_n, splits, halo):
    """The CIC corners of local positions pos = (x, y, z), each (n,), in the padded local block: (corner index
    function from :func:`_corner_index`, fractions (fx, fy, fz) each (n,), halo needed)."""
    sizes, per_axis = _lower_corners(pos, local_shape, global_n, splits, halo)
    lower = [base for base, _, _ in per_axis]
    upper = [base + 1 if splits[d] else (base + 1) % global_n for d, base in enumerate(lower)]
    fracs = tuple(frac for _, frac, _ in per_axis)
    needed = jnp.maximum(per_axis[0][2], per_axis[1][2])
    return _corner_index(lower, upper, sizes), fracs, needed


def _interpolate(table, index, fracs):
    """Trilinear interpolation from the rows of table (cells, ...) at the corners index(c)
    (:func:`_corner_index`) with fractions (fx, fy, fz) each (n,), as nested lerps
    v0 + f (v1 - v0) so that a uniform field reads back exactly. Each corner is gathered where
    it is used, so XLA fuses the eight gathers into the interpolation."""
    channels = (1,) * (table.ndim - 1)
    fx, fy, fz = (f.astype(table.dtype).reshape(f.shape + channels) for f in fracs)

    def corner(c):
        return table.at[index(c)].get(mode="promise_in_bounds")  # indices are in the block

    def along_z(c):
        lo = corner(c)
        return lo + fz * (corner(c + 1) - lo)

    def along_y(c):
        lo = along_z(c)
        return lo + fy * (along_z(c + 2) - lo)

    lo = along_y(0)
    return lo + fx * (along_y(4) - lo)


def _paint_block(  # parameters: the local particles and the block's geometry inside shard_map
    disp, cell: float, resolution: int, mass, local_shape, global_n, splits, halo
):
    """CIC-paint the local particles disp (nx, ny, nz, 3) onto the padded block; returns
    (block, needed).

    Eight scatter-adds of one weight per particle, one per corner, in a loop over the corners.
    Each corner's indices and weights are computed inside the loop, from positions that depend
    on the loop index (by a zero offset) so that XLA does not hoist them out of it: only one
    corner's indices and weights exist at a time.
    """
    sizes = _block_shape(local_shape, global_n, splits, halo)
    _, _, needed = _local_cic(
        _local_positions(disp, cell, resolution), local_shape, global_n, splits, halo
    )

    def add_corner(c, out):
        pos = _local_positions(disp, cell, resolution, first_row=c.astype(disp.dtype) * 0.0)
        _, per_axis = _lower_corners(pos, local_shape, global_n, splits, halo)
        weight, index = mass, 0
        for d, (base, frac, _) in enumerate(per_axis):
            upper = (c >> (2 - d)) & 1
            i = base + upper
            index = index * sizes[d] + (i if splits[d] else i % global_n)
            weight = weight * jnp.where(upper == 1, frac, 1 - frac)
        return out.at[index].add(weight.astype(disp.dtype), mode="promise_in_bounds")

    zero = lax.pcast(jnp.zeros(math.prod(sizes), disp.dtype), AXES, to="varying")
    return lax.fori_loop(0, 8, add_corner, zero).reshape(sizes), needed


def _local_positions(disp, cell: float, resolution: int, first_row=0):
    """Positions (x, y, z), each (n,), in mesh cells relative to the device's block origin.

    disp: local (nx, ny, nz, 3) displacements in Mpc/h on the Lagrangian grid, starting at
    row ``first_row`` of the device's particles along x; resolution B: mesh cells per
    Lagrangian cell; cell: mesh cell size in Mpc/h.
    """
    shape = disp.shape[:3]
    out = []
    for axis in range(3):
        index = lax.broadcasted_iota(disp.dtype, shape, axis) + (first_row if axis == 0 else 0)
        q = index * resolution + 0.5 * (resolution - 1)  # centre of the particle's B^3 cells
        out.append((q + disp[..., axis] / cell).reshape(-1))
    return tuple(out)


def _shift(x, axis_name: str, size: int, step: int):
    """Send x to the neighbour ``step`` places along a mesh axis (periodic)."""
    return lax.ppermute(x, axis_name, perm=[(j, (j + step) % size) for j in range(size)])


def _fold_halo(block, axis: int, halo: int, size: int):
    """Add the halo slabs of a padded block onto the neighbours' interiors; drop the halos."""
    name = AXES[axis]
    lo = lax.slice_in_dim(block, 0, halo, axis=axis)
    hi = lax.slice_in_dim(block, block.shape[axis] - halo, block.shape[axis], axis=axis)
    inner = lax.slice_in_dim(block, halo, block.shape[axis] - halo, axis=axis)
    n = inner.shape[axis]
    from_left = _shift(hi, name, size, +1)  # my left neighbour's upper halo lands on my low edge
    from_right = _shift(lo, name, size, -1)
    inner = lax.dynamic_update_slice_in_dim(
        inner, lax.slice_in_dim(inner, 0, halo, axis=axis) + from_left, 0, axis=axis
    )
    inner = lax.dynamic_update_slice_in_dim(
        inner, lax.slice_in_dim(inner, n - halo, n, axis=axis) + from_right, n - halo, axis=axis
    )
    return inner


def _fill_halo(block, axis: int, halo: int, size: int):
    """Pad a block with ``halo`` cells on both sides along ``axis``, taken from the neighbours."""
    name = AXES[axis]
    n = block.shape[axis]
    lo = _shift(lax.slice_in_dim(block, n - halo, n, axis=axis), name, size, +1)
    hi = _shift(lax.slice_in_dim(block, 0, halo, axis=axis), name, size, -1)
    return jnp.concatenate([lo, block, hi], axis=axis)


def pad_for_reading(block, pdims: tuple[int, int], halo: int = 1):
    """Inside ``shard_map``: the local block (x, y, z, ...) padded with ``halo`` neighbour cells
    on both sides along the split axes (one for :func:`read_owned`)."""
    for d, p in enumerate(pdims):
        if p > 1:
            block = _fill_halo(block, d, halo, p)
    return block


def _check_particles(disp, grid: Grid) -> None:
    if disp.shape[0] != grid.particles:
        raise ValueError(f"{disp.shape[0]} particles per side on a grid of {grid.particles}")


def _splits(mesh: Mesh, mesh_n: int, halo: int):
    """Which axes are split over devices, and pdims."""
    pdims = pdims_of(mesh)
    domain.check_halo_fits(mesh_n, pdims, halo)
    return (pdims[0] > 1, pdims[1] > 1, False), pdims


@partial(jax.jit, static_argnames="grid")
def paint(disp, grid: Grid, mass=1.0):
    """CIC-paint particles onto the grid's periodic force mesh, (B N,)*3 cells sharded like the
    particles.

    disp: (N, N, N, 3) displacements in Mpc/h from the Lagrangian grid points
    q = (i, j, k) L / N, N = grid.particles. Each particle deposits ``mass``.
    Returns (field, needed_halo): the painted field and the halo (cells) the particles need.
    """
    mesh_n, halo, resolution = grid.force_cells, grid.halo, grid.oversample
    _check_particles(disp, grid)
    splits, pdims = _splits(grid.mesh, mesh_n, halo)
    cell = grid.cell_size

    def local(d):
        block = (d.shape[0] * resolution, d.shape[1] * resolution, mesh_n)
        out, needed = _paint_block(d, cell, resolution, mass, block, mesh_n, splits, halo)
        for axis in (0, 1):
            if splits[axis]:
                out = _fold_halo(out, axis, halo, pdims[axis])
        return out, lax.pmax(needed, AXES)

    run = jax.shard_map(local, mesh=grid.mesh, in_specs=FIELD_SPEC, out_specs=(FIELD_SPEC, jax.P()))
    return run(disp)


@partial(jax.jit, static_argnames="grid")
def read(field, disp, grid: Grid):
    """CIC-interpolate a field on the grid's force mesh, sharded over its devices, at the
    particle positions.

    field: (M, M, M) or (M, M, M, C) with M = B N; disp: (N, N, N, 3) in Mpc/h. Returns
    (values, needed_halo) with values of shape (N, N, N) or (N, N, N, C).
    """
    mesh_n, halo, resolution = grid.force_cells, grid.halo, grid.oversample
    _check_particles(disp, grid)
    if field.shape[0] != mesh_n:
        raise ValueError(
            f"a field of {field.shape[0]} cells per side is not on the grid's "
            f"force mesh of {mesh_n}"
        )
    splits, pdims = _splits(grid.mesh, mesh_n, halo)
    cell = grid.cell_size

    def local(f, d):
        block = f.shape[:3]
        f = pad_for_reading(f, pdims, halo)
        pos = _local_positions(d, cell, resolution)
        index, fracs, needed = _local_cic(pos, block, mesh_n, splits, halo)
        out = _interpolate(f.reshape((-1,) + f.shape[3:]), index, fracs)
        return out.reshape(d.shape[:3] + f.shape[3:]), lax.pmax(needed, AXES)

    run = jax.shard_map(
        local, mesh=grid.mesh, in_specs=(FIELD_SPEC, FIELD_SPEC), out_specs=(FIELD_SPEC, jax.P())
    )
    return run(field, disp)


def cic_window_1d(k, cell: float, xp=jnp):
    """The CIC assignment window along one axis, sinc²(k Δ / 2), at wavenumbers k for cells of
    Δ = ``cell`` (k in inverse units of cell); numpy arrays with ``xp`` = numpy."""
    return xp.sinc(k * (cell / 2) / xp.pi) ** 2


def cic_window(field_k, mesh: Mesh, box_size: float):
    """The CIC assignment window W(k) = Π_i sinc²(k_i Δ / 2), Δ = L / N, broadcastable to field_k."""
    cell = box_size / field_k.shape[0]
    window = 1.0
    for k in fft.wavevectors(field_k, mesh, box_size):
        window = window * cic_window_1d(k, cell)
    return window


def cic_compensation(field_k, mesh: Mesh, box_size: float):
    """Divide CIC-painted modes by the CIC window (for estimators)."""
    return field_k / cic_window(field_k, mesh, box_size)


def read_owned(padded, cells, mesh_n: int, pdims: tuple[int, int]):
    """Inside ``shard_map``: trilinear interpolation of the padded block (from
    :func:`pad_for_reading`) at points cells = (x, y, z), each (n,), in cells of the global
    periodic (M, M, M) mesh in [0, M), for the points whose lower corner lies in this device's
    block; 0 for the others, so that a sum over the devices reads every point once. Returns
    (n,). (Three coordinate arrays rather than (n, 3) points: the shells' sampling runs 2.1-2.4
    times faster on CPUs.)"""
    mine = jnp.ones(cells[0].shape, bool)
    fracs, lows, ups = [], [], []
    for d, (c, p) in enumerate(zip(cells, tuple(pdims) + (1,))):
        lower = jnp.floor(c)
        fracs.append(c - lower)
        i = lower.astype(jnp.int32) % mesh_n
        if p > 1:
            n_local = padded.shape[d] - 2
            i = i - lax.axis_index(AXES[d]) * n_local
            mine = mine & (i >= 0) & (i < n_local)
            i = jnp.clip(i, 0, n_local - 1) + 1  # index in the padded block
            lows.append(i)
            ups.append(i + 1)
        else:
            lows.append(i)
            ups.append((i + 1) % mesh_n)
    index = _corner_index(lows, ups, padded.shape)
    return jnp.where(mine, _interpolate(padded.reshape(-1), index, tuple(fracs)), 0)
