"""Run seeds derived on the host (numpy Threefry) are JAX's: fold_in(key(campaign seed), i),
then 32 random bits."""

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pmpipe.campaigns import seeds

UINT32 = st.integers(min_value=0, max_value=2**32 - 1)


def _jax_seed(campaign_seed: int, index: int) -> int:
    key = jax.random.fold_in(jax.random.key(campaign_seed), index)
    return int(jax.random.bits(key, dtype=np.uint32))


@pytest.mark.parametrize(
    "campaign_seed, index", [(0, 0), (1, 2), (5, 1), (2**32 - 1, 2**32 - 1), (123456789, 987654)]
)
def test_edge_seeds_are_jaxs(campaign_seed, index):
    assert int(seeds.derive_seeds(campaign_seed, [index])[0]) == _jax_seed(campaign_seed, index)


@settings(max_examples=50, deadline=None)
@given(UINT32, UINT32)
def test_generated_seeds_are_jaxs(campaign_seed, index):
    assert int(seeds.derive_seeds(campaign_seed, [index])[0]) == _jax_seed(campaign_seed, index)
