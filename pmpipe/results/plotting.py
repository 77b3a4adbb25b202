"""What every report figure uses: matplotlib on the Agg backend, the checked opening of a
store, saving, shading the unresolved ranges, a statistic's first draw, the x range where
curves have weight."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pmpipe.stages import status
from pmpipe.storage import store


def pyplot():
    """matplotlib's pyplot on the Agg backend (imported when a figure is drawn, not when the
    workflow lists the figures)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def open_checked(path):
    """A run's store, refused (IncompleteStoreError) unless it is complete, intact and made
    from its run's config and stores as they are now: the report draws nothing stale."""
    return store.open_complete(path, status.run_config_hash(path))


def save_figure(fig, out_path) -> None:
    """Write the figure to out_path (its folder made when missing) and close it."""
    plt = pyplot()
    fig.tight_layout()
    Path(out_path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_path, dpi=100)
    plt.close(fig)


def shade_outside(axes, low, high, label) -> None:
    """Grey bands on every panel of ``axes`` below ``low`` and above ``high`` (x units); the
    first band labelled."""
    for ax in axes:
        left, right = ax.get_xlim()
        for lo, hi in ((left, low), (high, right)):
            if hi > lo:
                ax.axvspan(lo, hi, color="grey", alpha=0.2, lw=0, label=label)
                label = None
        ax.set_xlim(left, right)


def first_draw(array) -> np.ndarray:
    """A stored array's values, at the first draw when it has a ``draw`` dimension
    (lensing.draws)."""
    dims = tuple(array.metadata.dimension_names)
    return np.asarray(array[:] if "draw" not in dims else np.take(array[:], 0, dims.index("draw")))


def fitted_range(x, curves, fraction: float = 1e-3) -> tuple[float, float]:
    """The x range (one bin beyond each end) where any of ``curves`` (C, X) exceeds
    ``fraction`` of its maximum; all of x when none does."""
    curves = np.atleast_2d(np.asarray(curves, np.float64))
    above = np.any(curves > fraction * np.nanmax(curves, axis=1, keepdims=True), axis=0)
    if not above.any():
        return float(x[0]), float(x[-1])
    where = np.flatnonzero(above)
    step = float(x[1] - x[0]) if len(x) > 1 else 0.0
    return float(x[where[0]]) - step, float(x[where[-1]]) + step
