"""pmpipe: suites of cosmological particle-mesh simulations, from initial conditions through
distributed LPT / PM N-body and weak-lensing ray-tracing to summary statistics."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("pmpipe")
except PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"


def open_campaign(campaign_dir):
    """A campaign's collected results (``results/<campaign>``) as an xarray Dataset whose
    ``run`` dimension is indexed by the design parameters
    (:func:`pmpipe.results.export.open_campaign`)."""
    from pmpipe.results import export

    return export.open_campaign(campaign_dir)
