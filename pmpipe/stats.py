"""Summary statistics of (sharded) fields."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from pmpipe import fft
from pmpipe.painting import cic_compensation


def power_spectrum(field, mesh: Mesh, box_size: float, n_bins: int | None = None, field2=None,
                   compensate_cic: bool = False):
    """Spherically averaged power spectrum of a real (N, N, N) field (or cross spectrum with field2).

    Bins are linear in |k| with width the fundamental mode 2π/L, from 0 up to the Nyquist
    frequency (N/2 bins by default); empty bins give NaN. Returns numpy arrays
    (k_mean [h/Mpc], P [(Mpc/h)^3], modes per bin) for the bins 1..n_bins (k = 0 excluded).
    """
    n = field.shape[0]
    n_bins = n // 2 if n_bins is None else n_bins
    k_f = 2 * np.pi / box_size
    modes1 = fft.r2c(field, mesh)
    modes2 = modes1 if field2 is None else fft.r2c(field2, mesh)
    if compensate_cic:
        modes1 = cic_compensation(modes1, mesh, box_size)
        modes2 = modes1 if field2 is None else cic_compensation(modes2, mesh, box_size)
    k = fft.wavenumber(modes1, mesh, box_size)
    weights = jnp.broadcast_to(fft.mode_weights(modes1, mesh), modes1.shape)
    power = (modes1 * jnp.conj(modes2)).real * weights
    idx = jnp.floor(k / k_f + 0.5).astype(jnp.int32).reshape(-1)
    sums = jax.ops.segment_sum
    length = n_bins + 1
    count = sums(weights.reshape(-1), idx, num_segments=length)
    psum = sums(power.reshape(-1), idx, num_segments=length)
    ksum = sums((k * weights).reshape(-1), idx, num_segments=length)
    count, psum, ksum = (np.asarray(x, dtype=np.float64)[1:] for x in (count, psum, ksum))
    with np.errstate(invalid="ignore", divide="ignore"):
        pk = psum / count * box_size**3 / float(n) ** 6
        kmean = ksum / count
    return kmean, pk, count
