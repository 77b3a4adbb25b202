"""Run seeds of a campaign, derived on the host without JAX.

A run's seed is ``jax.random.bits(jax.random.fold_in(jax.random.key(campaign_seed), i),
dtype=uint32)`` with JAX's default Threefry-2x32 generator (partitionable bits). The same
hash is computed here in numpy, so that a campaign expands before JAX starts;
tests/test_campaign.py checks the two agree.
"""

from __future__ import annotations

import numpy as np

_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_PARITY = 0x1BD11BDA


def _rotate_left(x: np.ndarray, bits: int) -> np.ndarray:
    return (x << np.uint32(bits)) | (x >> np.uint32(32 - bits))


def threefry2x32(key, count) -> tuple[np.ndarray, np.ndarray]:
    """The Threefry-2x32 hash (20 rounds) of pairs of 32-bit words under pairs of 32-bit keys:
    ``key`` and ``count`` are pairs of integers or of uint32 arrays (broadcast together)."""
    with np.errstate(over="ignore"):
        ks = [np.asarray(key[0], np.uint32), np.asarray(key[1], np.uint32)]
        ks.append(ks[0] ^ ks[1] ^ np.uint32(_PARITY))
        x = [np.asarray(count[0], np.uint32) + ks[0], np.asarray(count[1], np.uint32) + ks[1]]
        for block in range(5):
            for bits in _ROTATIONS[block % 2]:
                x[0] = x[0] + x[1]
                x[1] = _rotate_left(x[1], bits) ^ x[0]
            x[0] = x[0] + ks[(block + 1) % 3]
            x[1] = x[1] + ks[(block + 2) % 3] + np.uint32(block + 1)
    return x[0], x[1]


def derive_seeds(campaign_seed: int, indices) -> np.ndarray:
    """32-bit seeds (uint32 array) of the runs at positions ``indices`` (32-bit unsigned
    integers): fold_in(key(campaign_seed), index), then 32 random bits, for each index."""
    index = np.asarray(indices, np.uint32)
    zero = np.zeros_like(index)
    key = threefry2x32((0, campaign_seed), (zero, index))
    high, low = threefry2x32(key, (zero, zero))
    return high ^ low
