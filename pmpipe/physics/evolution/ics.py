"""Initial conditions: decomposition-invariant white noise and the linear density field.

The white noise is drawn for the whole N^3 grid from one key with JAX's partitionable
threefry generator, so every device computes only its own block yet the field is the same
whatever the device mesh: one seed, one universe, on 1 or 512 devices.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from pmpipe.physics.mesh import fft
from pmpipe.runtime.parallel import field_sharding

# Decomposition invariance of sharded random numbers rests on this flag (the default since
# jax 0.5); it is checked, never flipped.
if not jax.config.jax_threefry_partitionable:  # type: ignore[attr-defined]  # set at run time
    raise RuntimeError(
        "pmpipe needs jax_threefry_partitionable=True (JAX's default) for white noise that "
        "does not depend on the device mesh"
    )


def white_noise(seed: int | jax.Array, n: int, mesh: Mesh, dtype=jnp.float32):
    """Unit-variance Gaussian white noise on an (n, n, n) grid, sharded over ``mesh``.

    seed: an integer (the key of ``jax.random.key(seed)`` with 64-bit integers, for seeds
    below 2^64) or a JAX PRNG key. The seed is an argument of the compiled program: every
    seed runs the same program.
    """
    return _draw(key_data(seed), n=n, mesh=mesh, dtype=np.dtype(dtype))


def key_data(seed: int | jax.Array):
    """A PRNG key as an argument of compiled programs: an integer seed as the uint32 data
    (2,) of ``jax.random.key(seed)`` (with 64-bit integers), made on the host; a key as it is.
    Inside the program, :func:`as_key` makes it a key again."""
    if isinstance(seed, int | np.integer):
        seed = int(seed)
        return np.array([(seed >> 32) & 0xFFFFFFFF, seed & 0xFFFFFFFF], np.uint32)
    return seed


def as_key(data):
    """The PRNG key of :func:`key_data`'s output (inside jit)."""
    if jax.dtypes.issubdtype(data.dtype, jax.dtypes.prng_key):
        return data
    return jax.random.wrap_key_data(data)


@partial(jax.jit, static_argnames=("n", "mesh", "dtype"))
def _draw(key, n: int, mesh: Mesh, dtype):
    """Normal deviates (n, n, n) from :func:`key_data`, each device drawing only its block."""
    noise = jax.random.normal(as_key(key), (n, n, n), dtype)
    return jax.lax.with_sharding_constraint(noise, field_sharding(mesh))


def linear_modes(noise, power, box_size: float, mesh: Mesh, fixed_amplitude=False, paired=False):
    """Fourier modes of the linear density contrast at a = 1.

    noise: (N, N, N) white noise; power: callable k [h/Mpc] -> P [(Mpc/h)^3]; box_size in Mpc/h.
    fixed_amplitude sets every |δ_k| to its expectation (Angulo & Pontzen 2016); paired flips
    the sign of every mode. Returns δ_k in :mod:`pmpipe.physics.mesh.fft` layout, normalised so that
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
