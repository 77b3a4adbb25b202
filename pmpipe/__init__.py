"""pmpipe: suites of cosmological particle-mesh simulations, from initial conditions through
distributed LPT / PM N-body and weak-lensing ray-tracing to summary statistics."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("pmpipe")
except PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"
