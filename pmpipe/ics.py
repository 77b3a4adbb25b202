"""Initial conditions: decomposition-invariant white noise and the linear density field.

The white noise is drawn for the whole N^3 grid from one key with JAX's partitionable
threefry generator, so every device computes only its own block yet the field is the same
whatever the device mesh: one seed, one universe, on 1 or 512 devices.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from pmpipe import fft
from pmpipe.parallel import field_sharding

# Decomposition invariance of sharded random numbers rests on this flag (the default since
# jax 0.5); it is checked, never flipped.
if not jax.config.jax_threefry_partitionable:  # pragma: no cover - depends on user config
    raise RuntimeError(
        "pmpipe needs jax_threefry_partitionable=True (JAX's default) for white noise that "
        "does not depend on the device mesh"
    )


def white_noise(seed: int | jax.Array, n: int, mesh: Mesh, dtype=jnp.float32):
    """Unit-variance Gaussian white noise on an (n, n, n) grid, sharded over ``mesh``.

    seed: an integer or a JAX PRNG key.
    """
    key = jax.random.key(seed) if isinstance(seed, int) else seed
    draw = jax.jit(
        partial(jax.random.normal, shape=(n, n, n), dtype=dtype),
        out_shardings=field_sharding(mesh),
    )
    return draw(key)


def linear_modes(noise, power, box_size: float, mesh: Mesh, fixed_amplitude=False, paired=False):
    """Fourier modes of the linear density contrast at a = 1.

    noise: (N, N, N) white noise; power: callable k [h/Mpc] -> P [(Mpc/h)^3]; box_size in Mpc/h.
    fixed_amplitude sets every |δ_k| to its expectation (Angulo & Pontzen 2016); paired flips
    the sign of every mode. Returns δ_k in :mod:`pmpipe.fft` layout, normalised so that
    c2r(δ_k) is the real-space contrast and <|δ_k|^2> = P(k) N^6 / L^3; the k = 0 mode is zero.
    """
    n = noise.shape[0]
    wk = fft.r2c(noise, mesh)
    if fixed_amplitude:
        amp = jnp.abs(wk)
        wk = jnp.where(amp > 0, wk / jnp.where(amp > 0, amp, 1.0), 0.0) * n**1.5
    k = fft.wavenumber(wk, mesh, box_size)
    pk = power(jnp.where(k > 0, k, 1.0))  # keeps k = 0 out of P(k) and its gradient
    scale = jnp.sqrt(jnp.where(k > 0, pk, 0.0) * n**3 / box_size**3)
    sign = -1.0 if paired else 1.0
    return (sign * scale).astype(wk.real.dtype) * wk


def linear_density(noise, power, box_size: float, mesh: Mesh, fixed_amplitude=False, paired=False):
    """Real-space linear density contrast at a = 1, (N, N, N), sharded like ``noise``."""
    modes = linear_modes(noise, power, box_size, mesh, fixed_amplitude, paired)
    return fft.c2r(modes, mesh)
