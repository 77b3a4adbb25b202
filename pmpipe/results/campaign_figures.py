"""The campaign's report figures, from its summaries.zarr: P(k) / linear theory of every run
(:func:`plot_campaign`), the design points with each run's state (:func:`plot_design`) and,
with lensing, C_ℓ / Limber of every run (:func:`plot_cl_spread`) and peak counts and the κ PDF
per cosmology (:func:`plot_peaks`). The P(k) and C_ℓ figures mark the fiducial cosmology's runs
(:func:`fiducial_runs`)."""

from __future__ import annotations

import numpy as np

from pmpipe.campaigns import design
from pmpipe.results.plotting import (
    first_draw,
    fitted_range,
    open_checked,
    pyplot,
    save_figure,
    shade_outside,
)
from pmpipe.run import config

MAX_LEGEND_COSMOLOGIES = 8  # above, campaign figures colour runs by their first parameter
MAX_LINES = 50  # above, the P(k) figure draws the runs' median and spread, not each run


def cosmology_labels(g) -> tuple[list[str], list[str]]:
    """The design parameters of a campaign's summaries ``g`` (its arrays whose long name says
    so) and, per run, its cosmology's label ('Omega_m = 0.3111, sigma8 = 0.8'; 'fiducial'
    when the design has none)."""
    params = [
        p
        for p in str(g["pk"].attrs.get("coordinates", "")).split()
        if design.holds_design_parameter(g[p].attrs)
    ]
    runs = g["run"].shape[0]
    values = {p: g[p][:] for p in params}  # each array read once
    return params, [
        ", ".join(f"{p} = {values[p][i]:.4g}" for p in params) or "fiducial" for i in range(runs)
    ]


def fiducial_runs(g, collected: np.ndarray) -> tuple[np.ndarray, bool]:
    """The positions of the collected runs (``collected``, bool per run) whose design point is
    nearest the campaign's base configuration (its fiducial cosmology; distance in units of
    each design parameter's spread over the campaign), and whether they are at it: every
    collected run, at it, when the design has no parameter; none when the base leaves a
    design parameter to be derived (as σ8 of a base normalised by A_s)."""
    params, _ = cosmology_labels(g)
    base = config.Run.model_validate(g.attrs["campaign_config"]["base"])
    distance = np.zeros(g["run"].shape[0])
    for name in params:
        values, at = g[name][:], design.run_value(base, name)
        if at is None:
            return np.array([], int), False
        spread = np.ptp(values[np.isfinite(values)]) if np.isfinite(values).any() else 0.0
        distance += ((values - at) / (spread or 1.0)) ** 2
    distance = np.where(collected & np.isfinite(distance), distance, np.inf)
    if not np.isfinite(distance).any():
        return np.array([], int), False
    nearest = np.flatnonzero(distance == distance.min())
    return nearest, bool(distance.min() < 1e-12)


def draw_fiducial(ax, x, curves, exact: bool) -> None:
    """The mean of the fiducial runs' ``curves`` (run, x), dashed black above the other
    lines; nothing without fiducial runs."""
    if len(curves):
        label = "fiducial" if exact else "runs nearest the fiducial"
        mean = np.mean(curves, axis=0)
        ax.semilogx(x, mean, color="black", lw=1.5, ls="--", label=label, zorder=3)


def run_colours(labels: list[str], first: np.ndarray | None):
    """A colour per run: one per cosmology (label) when there are at most
    MAX_LEGEND_COSMOLOGIES, else by ``first`` (the first parameter's value per run) on a
    colour map; returns (colours, a ScalarMappable for a colour bar or None)."""
    plt = pyplot()
    cosmologies = list(dict.fromkeys(labels))
    if len(cosmologies) <= MAX_LEGEND_COSMOLOGIES or first is None:
        cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
        return [cycle[cosmologies.index(lab) % len(cycle)] for lab in labels], None
    norm = plt.Normalize(float(np.min(first)), float(np.max(first)))
    mappable = plt.cm.ScalarMappable(norm=norm, cmap="viridis")
    return [mappable.to_rgba(v) for v in first], mappable


def draw_power_ratios(ax, k, ratio, labels, first, k_max: float):
    """P/P_lin (run, k) on ``ax``, coloured by cosmology (:func:`run_colours`), one legend
    entry per cosmology, k above ``k_max`` shaded, the y range fitted to the resolved k (to
    every k when no bin is resolved);
    returns the colour bar's mappable or None."""
    colours, mappable = run_colours(labels, first)
    shown = set()
    for label, colour, r in zip(labels, colours, ratio):
        legend = label if mappable is None and label not in shown else None
        ax.semilogx(k, r, color=colour, lw=1, alpha=0.8, label=legend)
        shown.add(label)
    _ratio_axes(ax, k, ratio, k_max)
    return mappable


def draw_power_spread(ax, k, ratio, k_max: float) -> None:
    """The median over the runs of P/P_lin (run, k) and the bands that hold 68 % and 95 % of
    the runs (runs not collected, NaN, left out), k above ``k_max`` shaded, the y range fitted
    to the resolved k."""
    collected = ratio[np.isfinite(ratio).all(axis=1)]
    low95, low68, median, high68, high95 = np.percentile(collected, [2.5, 16, 50, 84, 97.5], 0)
    ax.fill_between(k, low95, high95, color="tab:blue", alpha=0.2, lw=0, label="95 % of runs")
    ax.fill_between(k, low68, high68, color="tab:blue", alpha=0.4, lw=0, label="68 % of runs")
    ax.semilogx(k, median, color="tab:blue", lw=1.5, label="median")
    _ratio_axes(ax, k, np.stack([low95, high95]), k_max)


def _ratio_axes(ax, k, curves, k_max: float) -> None:
    """Line at 1, y range fitted to ``curves`` (C, k) at the resolved k (every k when none
    is), k above ``k_max`` shaded, labels and legend."""
    ax.axhline(1.0, color="grey", lw=0.5)
    resolved = curves[:, (k > 0) & (k <= k_max)]
    shown = (
        resolved[np.isfinite(resolved)]
        if np.isfinite(resolved).any()
        else curves[np.isfinite(curves)]
    )
    if shown.size:
        margin = 0.05 * (shown.max() - shown.min()) + 1e-3
        ax.set_ylim(shown.min() - margin, shown.max() + margin)
    shade_outside((ax,), 0.0, k_max, "not resolved")
    ax.set_xlabel("k [h/Mpc]")
    ax.set_ylabel("P(k) / D² P_lin(k)")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize="small", loc="upper left")


def plot_campaign(summaries_path, out_path) -> None:
    """P(k) / linear theory at the last snapshot: of every run, coloured by cosmology, or for
    a campaign of more than MAX_LINES runs their median and spread; k beyond what every run
    resolves shaded."""
    plt = pyplot()
    g = open_checked(summaries_path)
    params, labels = cosmology_labels(g)
    k = g["k_mean"][0]
    ratio = g["pk"][:, -1, :] / g["pk_linear"][:, -1, :]
    k_max = float(np.nanmin(np.asarray(g["k_max_valid"][:])[..., -1]))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    fiducial, exact = fiducial_runs(g, np.isfinite(ratio).all(axis=1))
    draw_fiducial(ax, k, ratio[fiducial], exact)
    if len(labels) > MAX_LINES:
        draw_power_spread(ax, k, ratio, k_max)
    else:
        first = g[params[0]][:] if params else None
        mappable = draw_power_ratios(ax, k, ratio, labels, first, k_max)
        if mappable is not None:
            fig.colorbar(mappable, ax=ax, label=params[0])
    ax.set_title(f"{g.attrs['campaign']}: {len(labels)} runs, a = {g['a'][-1]:.3g}")
    save_figure(fig, out_path)


def plot_cl_spread(summaries_path, out_path) -> None:
    """The campaign's C_ℓ figure (:func:`cl_spread_figure`) of its summaries, saved."""
    save_figure(cl_spread_figure(open_checked(summaries_path)), out_path)


def cl_spread_figure(g):
    """C_ℓ / C_ℓ,lin (Limber with the linear P(k)) of each source's convergence over the
    campaign's summaries ``g``, a panel per source: every run, or for more than MAX_LINES runs
    their median and the bands of 68 % and 95 % of them; the fiducial runs' mean dashed; ℓ
    outside the range every run resolves shaded (the first draw of each run with
    lensing.draws)."""
    plt = pyplot()
    suffix = "" if "cl" in g else "_healpix"
    ell = np.nanmax(g["ell" + suffix + "_mean"][:], axis=0)
    cl, lin = (
        np.diagonal(first_draw(g[name + suffix]), axis1=1, axis2=2)  # (run, ell, source)
        for name in ("cl", "cl_linear")
    )
    ratio = np.moveaxis(cl / lin, 2, 1)  # (run, source, ell)
    low = np.nanmax(g["ell_min_valid" + suffix][:], axis=0)
    high = np.nanmin(g["ell_max_valid" + suffix][:], axis=0)
    sources = [str(s) for s in g["source"][:]]
    columns = min(3, len(sources))
    rows = -(-len(sources) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(4.5 * columns, 3.6 * rows), squeeze=False)
    fiducial, exact = fiducial_runs(g, np.isfinite(ratio).all(axis=(1, 2)))
    for i, (ax, source) in enumerate(zip(axes.flat, sources)):
        collected = ratio[np.isfinite(ratio[:, i]).all(axis=1), i]
        if len(collected) > MAX_LINES:
            bands = np.percentile(collected, [2.5, 16, 50, 84, 97.5], axis=0)
            ax.fill_between(
                ell, bands[0], bands[4], color="tab:blue", alpha=0.2, lw=0, label="95 % of runs"
            )
            ax.fill_between(
                ell, bands[1], bands[3], color="tab:blue", alpha=0.4, lw=0, label="68 % of runs"
            )
            ax.semilogx(ell, bands[2], color="tab:blue", label="median")
        else:
            for r in collected:
                ax.semilogx(ell, r, color="tab:blue", lw=0.8, alpha=0.5)
        draw_fiducial(ax, ell, ratio[fiducial, i], exact)
        ax.axhline(1.0, color="grey", lw=0.5)
        shade_outside((ax,), float(low[i]), float(high[i]), "not resolved")
        ax.set_title(f"source {source}", fontsize="medium")
        ax.set_xlabel("ℓ")
        ax.set_ylabel("C_ℓ / C_ℓ,lin")
    for ax in axes.flat[len(sources) :]:
        ax.set_visible(False)
    axes.flat[0].legend(fontsize="small", loc="best")
    fig.suptitle(
        f"{g.attrs['campaign']}: convergence C_ℓ of {len(ratio)} runs{' (HEALPix)' if suffix else ''}"
    )
    return fig


def draw_peaks(left, right, kappa, peaks, pdf, labels) -> None:
    """Peak counts and PDF (run, κ bin) averaged over the runs of each cosmology (``labels``
    per run), κ range fitted to the data, at most 5 κ ticks."""
    from matplotlib.ticker import MaxNLocator

    curves = []
    for label in dict.fromkeys(labels):
        rows = [i for i, lab in enumerate(labels) if lab == label]
        for ax, values in ((left, peaks), (right, pdf)):
            mean = values[rows].mean(axis=0)
            ax.plot(kappa, np.where(mean > 0, mean, np.nan) if ax is right else mean, label=label)
            curves.append(mean)
    low, high = fitted_range(kappa, curves)
    for ax in (left, right):
        ax.set_xlim(low, high)
        ax.xaxis.set_major_locator(MaxNLocator(4))
        ax.set_xlabel("κ")
    left.set_ylabel("peaks per bin")
    right.set_ylabel("PDF")
    right.set_yscale("log")
    left.legend(fontsize="small", loc="upper right")


def plot_peaks(summaries_path, out_path) -> None:
    """Peak counts and κ PDF of the last source at the first smoothing scale, averaged over
    the runs of each cosmology (runs with the same design parameters), each run's first draw
    with lensing.draws."""
    plt = pyplot()
    g = open_checked(summaries_path)
    suffix = "" if "peaks" in g else "_healpix"
    _, labels = cosmology_labels(g)
    peaks, pdf = (first_draw(g[name + suffix])[:, -1, 0, :] for name in ("peaks", "pdf"))
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    draw_peaks(left, right, g["kappa"][:], peaks, pdf, labels)
    scale = g["smoothing"][0]
    sky = " (HEALPix)" if suffix else ""
    fig.suptitle(
        f"{g.attrs['campaign']}: source {g['source'][-1]}{sky}, smoothing {scale:g} arcmin"
    )
    save_figure(fig, out_path)


# how a run is drawn on the design, by its state when collected (campaign_status.STATES)
STATE_STYLES = {
    "done": {"marker": "o", "color": "tab:blue"},
    "running": {"marker": "s", "color": "tab:green"},
    "pending": {"marker": "o", "facecolors": "none", "edgecolors": "grey"},
    "failed": {"marker": "x", "color": "tab:red"},
}
DESIGN_PANELS = 4  # design parameters drawn pairwise (the first four)


def design_axes(g) -> list[tuple[str, np.ndarray, str, np.ndarray]]:
    """The panels of the design figure: (x name, x, y name, y) of every pair of the first
    DESIGN_PANELS design parameters; one parameter against the run's position; none: the
    runs by position."""
    params, _ = cosmology_labels(g)
    position = np.arange(g["run"].shape[0])
    values = {p: g[p][:] for p in params[:DESIGN_PANELS]}
    if len(values) >= 2:
        names = list(values)
        return [(a, values[a], b, values[b]) for i, a in enumerate(names) for b in names[i + 1 :]]
    if values:
        ((name, x),) = values.items()
        return [(name, x, "run position", position)]
    return [("run position", position, "", np.zeros_like(position))]


def plot_design(summaries_path, out_path) -> None:
    """The design points of the campaign pairwise (:func:`design_axes`), each run marked by
    its state when collected (STATE_STYLES: done, running, pending, failed), so that failed
    runs show where in the design they lie."""
    plt = pyplot()
    g = open_checked(summaries_path)
    runs = g["run"].shape[0]
    state = np.array([str(s) for s in g["state"][:]]) if "state" in g else np.full(runs, "done")
    panels = design_axes(g)
    columns = min(3, len(panels))
    rows = -(-len(panels) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(4 * columns, 3.6 * rows), squeeze=False)
    for ax, (xname, x, yname, y) in zip(axes.flat, panels):
        for name, style in STATE_STYLES.items():
            chosen = state == name
            if chosen.any():
                ax.scatter(
                    x[chosen], y[chosen], s=12, lw=1, label=f"{name} ({chosen.sum()})", **style
                )
        ax.set_xlabel(xname)
        ax.set_ylabel(yname)
    for ax in axes.flat[len(panels) :]:
        ax.set_visible(False)
    axes.flat[0].legend(fontsize="small", loc="best")
    fig.suptitle(f"{g.attrs['campaign']}: {runs} runs on the design")
    save_figure(fig, out_path)
