"""Real-to-complex 3D FFTs of sharded fields and their wave vectors; 2D FFTs of maps.

On one device this is ``jnp.fft.rfftn`` (half-complex last axis). On several devices it is
jaxdecomp's distributed complex FFT, whose output is transposed to (ky, kz, kx) order. No other
module may depend on either layout: callers combine k-space arrays only with the wave vectors
and mode weights returned here, elementwise.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import jaxdecomp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec


def _distributed(mesh: Mesh) -> bool:
    return mesh.size > 1


def r2c(field, mesh: Mesh):
    """Forward FFT of a real (N, N, N) field (unnormalised, numpy sign convention)."""
    if _distributed(mesh):
        return jaxdecomp.fft.pfft3d(field)
    return jnp.fft.rfftn(field)


def c2r(field_k, mesh: Mesh):
    """Inverse of :func:`r2c` (normalised by 1/N^3); returns a real (N, N, N) field."""
    if _distributed(mesh):
        return jaxdecomp.fft.pifft3d(field_k).real
    n = field_k.shape[0]
    return jnp.fft.irfftn(field_k, s=(n, n, n))


def modes_spec(mesh: Mesh) -> PartitionSpec:
    """How jaxdecomp lays out the output of :func:`r2c` over a mesh of pdims (px, py): the
    (ky, kz, kx) axes split ('x', 'y'), or for slabs (px, 1) the kz axis split over 'x'."""
    px, py = mesh.shape["x"], mesh.shape["y"]
    return PartitionSpec(None, "x") if py == 1 and px > 1 else PartitionSpec("x", "y")


def wavevectors(field_k, mesh: Mesh, box_size: float):
    """(kx, ky, kz) in h/Mpc for box_size in Mpc/h, broadcastable against field_k.

    The Nyquist frequency appears once, as -π N / L. On several devices each vector is split
    like the axis of field_k it lies along, so that the expressions built from them are
    computed block by block, without gathering any of their products.
    """
    if _distributed(mesh):
        spec = tuple(modes_spec(mesh)) + (None,) * 3
        ks = jaxdecomp.fftfreq3d(field_k, d=box_size / field_k.shape[0])  # includes 2π

        def laid_out_along_its_axis(k):
            axis = next(i for i, size in enumerate(k.shape) if size > 1)
            parts = [None, None, None]
            parts[axis] = spec[axis]
            return laid_out(
                k.astype(field_k.real.dtype), NamedSharding(mesh, PartitionSpec(*parts))
            )

        return tuple(laid_out_along_its_axis(k) for k in ks)
    n = field_k.shape[0]
    dtype = field_k.real.dtype
    f = angular_frequencies(n, box_size / n, jnp, dtype)
    fz = angular_frequencies(n, box_size / n, jnp, dtype, real=True)
    return f[:, None, None], f[None, :, None], fz[None, None, :]


def angular_frequencies(n: int, spacing: float, xp=np, dtype=None, real: bool = False):
    """2π times the sample frequencies of n points ``spacing`` apart on a periodic grid: the
    wavenumbers (n,), or with ``real`` the (n // 2 + 1,) of a real transform's last axis, in
    inverse units of spacing; numpy float64, or ``xp`` = jax.numpy arrays of ``dtype``."""
    freq = (xp.fft.rfftfreq if real else xp.fft.fftfreq)(n, d=spacing)
    return 2 * xp.pi * (freq if dtype is None else freq.astype(dtype))


def gradient_kernels(field_k, mesh: Mesh, box_size: float):
    """Spectral derivative operators (i kx, i ky, i kz), zero at each axis' Nyquist frequency
    so that the derivative of a real field stays real."""
    n = field_k.shape[0]
    nyquist = jnp.pi * n / box_size
    return tuple(
        1j * jnp.where(jnp.abs(k) < 0.999 * nyquist, k, 0.0)
        for k in wavevectors(field_k, mesh, box_size)
    )


def wavenumber(field_k, mesh: Mesh, box_size: float):
    """|k| in h/Mpc, same shape as field_k."""
    kx, ky, kz = wavevectors(field_k, mesh, box_size)
    return jnp.sqrt(kx**2 + ky**2 + kz**2)


def mode_weights(field_k, mesh: Mesh):
    """How many Fourier modes each stored element stands for (2 for the implicit conjugate
    half of an rfft, else 1); sums of |δ_k|^2 times these weights run over all N^3 modes."""
    if _distributed(mesh):
        return jnp.ones((1, 1, 1), field_k.real.dtype)
    n = field_k.shape[0]
    nz = field_k.shape[2]
    w = jnp.full((nz,), 2.0, field_k.real.dtype).at[0].set(1.0)
    if n % 2 == 0:
        w = w.at[-1].set(1.0)
    return w[None, None, :]


def inverse_laplacian(field_k, mesh: Mesh, box_size: float):
    """∇⁻² in k-space: -field_k / k², zero at k = 0 (lengths in Mpc/h)."""
    k2 = wavenumber(field_k, mesh, box_size) ** 2
    return jnp.where(k2 > 0, -field_k / jnp.where(k2 > 0, k2, 1.0), 0.0)


def finite_difference_kernels(field_k, mesh: Mesh, box_size: float):
    """Fourth-order central-difference derivative operators i (8 sin(kΔ) - sin(2kΔ)) / (6Δ),
    Δ the cell size. They vanish at the Nyquist frequency and damp the aliased near-Nyquist
    modes that a particle lattice coarser than the mesh paints."""
    cell = box_size / field_k.shape[0]
    return tuple(
        1j * (8 * jnp.sin(k * cell) - jnp.sin(2 * k * cell)) / (6 * cell)
        for k in wavevectors(field_k, mesh, box_size)
    )


def gradient(pot_k, mesh: Mesh, box_size: float, kernels=None):
    """Real-space gradient (N, N, N, 3) of a field given by its modes pot_k (per Mpc/h); spectral
    by default, or with the given derivative kernels."""
    kernels = gradient_kernels(pot_k, mesh, box_size) if kernels is None else kernels
    return jnp.stack([c2r(d * pot_k, mesh) for d in kernels], axis=-1)


def map_sharding(x) -> NamedSharding | None:
    """The NamedSharding of a map (a static argument of the programs that take the map), None
    for numpy and single-device arrays."""
    sharding = getattr(x, "sharding", None)
    return sharding if isinstance(sharding, NamedSharding) else None


def _replicated(sharding: NamedSharding | None) -> NamedSharding | None:
    return None if sharding is None else NamedSharding(sharding.mesh, PartitionSpec())


def fft2(x, sharding: NamedSharding | None = None):
    """2D FFT over the last two axes of a map (..., n1, n2) laid out by ``sharding``, computed
    and returned replicated over the sharding's mesh: XLA's CPU FFT fails (RET_CHECK in
    fft_thunk) on sharded maps whose transforms are fused with other operations, and maps are
    small next to fields."""
    return laid_out(jnp.fft.fft2(laid_out(x, _replicated(sharding))), _replicated(sharding))


def filter_2d(x, kernel, sharding: NamedSharding | None = None):
    """ifft2(fft2(x) * kernel) over the last two axes of a map (..., n1, n2), complex, computed
    and returned replicated as in :func:`fft2`."""
    return laid_out(jnp.fft.ifft2(fft2(x, sharding) * kernel), _replicated(sharding))


def laid_out(x, sharding: NamedSharding | None):
    """x constrained to ``sharding`` (unchanged for None)."""
    return x if sharding is None else jax.lax.with_sharding_constraint(x, sharding)
