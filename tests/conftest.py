"""Test set-up: 8 fake CPU devices for sharding tests (must precede the first jax import)."""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import pytest  # noqa: E402

PDIMS_8 = [(2, 4), (4, 2), (1, 8), (8, 1)]


def pytest_configure(config):
    if len(jax.devices()) < 8:
        raise pytest.UsageError(
            "the sharding tests need 8 CPU devices; XLA_FLAGS was set before pytest "
            f"started ({os.environ.get('XLA_FLAGS')!r}): add --xla_force_host_platform_device_count=8"
        )


def rel_diff(a, b):
    """max |a - b| / max |b| as a float."""
    import numpy as np

    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    """A real one-node SLURM cluster with accounting and 2 fake GPUs (tests/slurm_cluster.py),
    installed with apt when missing and possible, stopped at the end of the session. Skips
    with what is missing where it cannot run; under CI=true that is a failure instead."""
    import slurm_cluster

    problem = slurm_cluster.install()
    if problem:
        if os.environ.get("CI") == "true":
            pytest.fail(problem)
        pytest.skip(problem)
    cluster = slurm_cluster.Cluster(tmp_path_factory.mktemp("slurm"))
    cluster.start()
    yield cluster
    cluster.stop()
