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


def _rotate_left(x: np.uint32, bits: int) -> np.uint32:
    return (x << np.uint32(bits)) | (x >> np.uint32(32 - bits))


def threefry2x32(key: tuple[int, int], count: tuple[int, int]) -> tuple[int, int]:
    """The Threefry-2x32 hash (20 rounds) of one pair of 32-bit words under a 32-bit key pair."""
    with np.errstate(over="ignore"):
        ks = [np.uint32(key[0]), np.uint32(key[1])]
        ks.append(ks[0] ^ ks[1] ^ np.uint32(_PARITY))
        x = [np.uint32(count[0]) + ks[0], np.uint32(count[1]) + ks[1]]
        for block in range(5):
            for bits in _ROTATIONS[block % 2]:
                x[0] = x[0] + x[1]
                x[1] = _rotate_left(x[1], bits) ^ x[0]
            x[0] = x[0] + ks[(block + 1) % 3]
            x[1] = x[1] + ks[(block + 2) % 3] + np.uint32(block + 1)
    return int(x[0]), int(x[1])


def derive_seed(campaign_seed: int, index: int) -> int:
    """32-bit seed of the run at position ``index`` (both 32-bit unsigned integers):
    fold_in(key(campaign_seed), index), then 32 random bits."""
    key = threefry2x32((0, campaign_seed), (0, index))
    high, low = threefry2x32(key, (0, 0))
    return high ^ low
