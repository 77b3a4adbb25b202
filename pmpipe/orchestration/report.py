"""Report figures (PNG) from complete stores: per run (of at most SAMPLED_RUNS runs), P(k) against linear theory and a density
slice, and with lensing a κ map and C_ell against theory; per campaign, P(k) / linear theory
of every run, and with lensing peak counts and the κ PDF per cosmology.

    python -m pmpipe.orchestration.report results/<campaign> results/<campaign>/report/<run>/pk.png ...

draws every figure named (per run: pk, slice, kappa, cl; per campaign: pk_ratio, peaks) in one
process.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np

from pmpipe.orchestration import design
from pmpipe.runtime import log
from pmpipe.stages import status
from pmpipe.storage import store

SLAB_FRACTION = 0.1  # part of the box along z averaged in the density slice

LOG = log.get(__name__)


@dataclasses.dataclass(frozen=True)
class Figure:
    """A report figure: its file, name (also its caption, workflow/report/<name>.rst), report
    category, and run (None for a campaign figure)."""

    path: Path
    name: str
    category: str
    run: str | None


# per run (report/<run>/<name>.png): the run store it is drawn from and its report category;
# per campaign (report/<name>.png): drawn from the campaign's summaries.zarr
RUN_FIGURES = {
    "pk": ("summaries", "Power spectra"),
    "slice": ("nbody", "Density slices"),
    "kappa": ("lensing", "Convergence maps"),
    "cl": ("summaries", "Convergence C_ell"),
}
CAMPAIGN_FIGURES = {"pk_ratio": "Campaign", "peaks": "Campaign"}
SAMPLED_RUNS = 12  # runs with figures of their own, whatever the size of the campaign


def sampled_runs(run_ids, count: int = SAMPLED_RUNS) -> list[str]:
    """The runs whose own figures the report draws: every run of a campaign of at most
    ``count``, else ``count`` runs evenly spaced in design order, the first and last included."""
    run_ids = list(run_ids)
    if len(run_ids) <= count:
        return run_ids
    picked = np.unique(np.round(np.linspace(0, len(run_ids) - 1, count)).astype(int))
    return [run_ids[i] for i in picked]


def figures(campaign_dir: Path, run_ids, lensing: bool, outputs) -> list[Figure]:
    """Every figure of a campaign's report that its stores allow, those of runs for the runs of
    :func:`sampled_runs`: lensing figures with a lensing stage; the density slice and κ map
    only when outputs (config.Outputs) keeps them."""
    shown = [
        f
        for f in RUN_FIGURES
        if (f != "slice" or outputs.density != "none")
        and (f not in ("kappa", "cl") or lensing)
        and (f != "kappa" or outputs.lightcone)
    ]
    return [
        Figure(Path(campaign_dir) / "report" / run / f"{f}.png", f, RUN_FIGURES[f][1], run)
        for run in sampled_runs(run_ids)
        for f in shown
    ] + [
        Figure(Path(campaign_dir) / "report" / f"{f}.png", f, category, None)
        for f, category in CAMPAIGN_FIGURES.items()
        if f != "peaks" or lensing
    ]


def pyplot():
    """matplotlib's pyplot on the Agg backend (imported when a figure is drawn, not when the
    workflow lists the figures)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _ratio_panels():
    """A figure with a log-log panel above a ratio panel sharing the x axis."""
    plt = pyplot()
    fig, (top, bottom) = plt.subplots(
        2, 1, sharex=True, figsize=(6, 6), gridspec_kw={"height_ratios": (2, 1)}
    )
    bottom.axhline(1.0, color="grey", lw=0.5)
    return fig, top, bottom


def _shade_outside(axes, low, high, label) -> None:
    """Grey bands on every panel of ``axes`` below ``low`` and above ``high`` (x units); the
    first band labelled."""
    for ax in axes:
        left, right = ax.get_xlim()
        for lo, hi in ((left, low), (high, right)):
            if hi > lo:
                ax.axvspan(lo, hi, color="grey", alpha=0.2, lw=0, label=label)
                label = None
        ax.set_xlim(left, right)


def _open_checked(path):
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


def plot_power(summaries_path, out_path) -> None:
    """P(k) at each snapshot with linear theory and shot noise; ratio panel below."""
    plt = pyplot()
    g = _open_checked(summaries_path)
    a, k_mean, pk, lin = g["a"][:], g["k_mean"][:], g["pk"][:], g["pk_linear"][:]
    fig, top, bottom = _ratio_panels()
    colours = plt.cm.viridis(np.linspace(0, 0.9, a.size))
    for i, c in enumerate(colours):
        top.loglog(k_mean, pk[i], color=c, label=f"a = {a[i]:.3g}")
        top.loglog(k_mean, lin[i], color=c, ls="--")
        bottom.semilogx(k_mean, pk[i] / lin[i], color=c)
    top.axhline(g.attrs["shot_noise"], color="grey", ls=":", label="shot noise")
    _shade_outside((top, bottom), 0.0, float(g["k_max_valid"][-1]), "not resolved")
    top.set_ylabel("P(k) [(Mpc/h)³]")
    top.legend(fontsize="small")
    top.set_title(f"{g.attrs['run_id']}: matter power spectrum (dashed: linear)")
    bottom.set_xlabel("k [h/Mpc]")
    bottom.set_ylabel("P / P_lin")
    save_figure(fig, out_path)


def slab_density(density, particles: int) -> np.ndarray:
    """ρ/ρ̄ (M, M) of the last snapshot of ``density`` (snapshot, M, M, M; the force mesh or
    its downsampled grid), averaged over the first SLAB_FRACTION of the box along z and
    smoothed in the plane by a periodic Gaussian of one particle spacing (M / ``particles``
    cells): a slab of a run with few particles per cell otherwise shows empty cells in rows
    along the initial lattice, where particles in voids still sit."""
    depth = max(1, round(SLAB_FRACTION * density.shape[3]))
    slab = np.asarray(density[-1, :, :, :depth], dtype=np.float64).mean(axis=2)
    kx = 2 * np.pi * np.fft.fftfreq(slab.shape[0])[:, None]
    ky = 2 * np.pi * np.fft.rfftfreq(slab.shape[1])[None, :]
    window = np.exp(-0.5 * (kx**2 + ky**2) * (slab.shape[0] / particles) ** 2)
    return np.fft.irfft2(np.fft.rfft2(slab) * window, s=slab.shape)


def log_density_limits(values) -> tuple[float, float]:
    """Colour limits of log10 ρ/ρ̄: its 0.5th and 99.9th percentiles over cells with mass, so
    that neither empty cells nor the densest halo set the scale."""
    positive = np.log10(values[values > 0])
    return float(np.percentile(positive, 0.5)), float(np.percentile(positive, 99.9))


def plot_slice(nbody_path, out_path) -> None:
    """log10 ρ/ρ̄ of the last snapshot in a slab (:func:`slab_density`); empty cells at the
    bottom of the colour scale."""
    plt = pyplot()
    g = _open_checked(nbody_path)
    particles = int(g.attrs["config"]["box"]["particles"])
    slab = slab_density(g["density"], particles)
    low, high = log_density_limits(slab)
    x = g["x"][:]
    extent = (x[0] - (x[1] - x[0]) / 2, x[-1] + (x[1] - x[0]) / 2) * 2
    fig, ax = plt.subplots(figsize=(5.5, 5))
    shown = np.log10(np.maximum(slab, 10.0**low))
    image = ax.imshow(shown.T, origin="lower", extent=extent, cmap="magma", vmin=low, vmax=high)
    fig.colorbar(image, ax=ax, label="log10 ρ/ρ̄")
    ax.set_xlabel("x [Mpc/h]")
    ax.set_ylabel("y [Mpc/h]")
    depth = SLAB_FRACTION * (extent[1] - extent[0])
    spacing = (extent[1] - extent[0]) / particles
    ax.set_title(
        f"{g.attrs['run_id']}, a = {g['a'][-1]:.3g}\nslab {depth:.0f} Mpc/h deep, "
        f"Gaussian σ {spacing:.2g} Mpc/h",
        fontsize="medium",
    )
    save_figure(fig, out_path)


MAX_LEGEND_COSMOLOGIES = 8  # above, campaign figures colour runs by their first parameter


def cosmology_labels(g) -> tuple[list[str], list[str]]:
    """The design parameters of a campaign's summaries ``g`` (its arrays whose long name says
    so) and, per run, its cosmology's label ('Omega_m = 0.3111, sigma8 = 0.8'; 'fiducial'
    when the design has none)."""
    params = [
        p
        for p in str(g["pk"].attrs.get("coordinates", "")).split()
        if str(g[p].attrs.get("long_name", "")).endswith(design.DESIGN_PARAMETER)
    ]
    runs = g["run"].shape[0]
    values = {p: g[p][:] for p in params}  # each array read once
    return params, [
        ", ".join(f"{p} = {values[p][i]:.4g}" for p in params) or "fiducial" for i in range(runs)
    ]


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
    ax.axhline(1.0, color="grey", lw=0.5)
    resolved = ratio[:, (k > 0) & (k <= k_max)]
    shown = (
        resolved[np.isfinite(resolved)]
        if np.isfinite(resolved).any()
        else ratio[np.isfinite(ratio)]
    )
    if shown.size:
        margin = 0.05 * (shown.max() - shown.min()) + 1e-3
        ax.set_ylim(shown.min() - margin, shown.max() + margin)
    _shade_outside((ax,), 0.0, k_max, "not resolved")
    ax.set_xlabel("k [h/Mpc]")
    ax.set_ylabel("P(k) / D² P_lin(k)")
    ax.legend(fontsize="small", loc="upper left")
    return mappable


def plot_campaign(summaries_path, out_path) -> None:
    """P(k) / linear theory at the last snapshot of every run, coloured by cosmology; k beyond
    what every run resolves shaded."""
    plt = pyplot()
    g = _open_checked(summaries_path)
    params, labels = cosmology_labels(g)
    k = g["k_mean"][0]
    ratio = g["pk"][:, -1, :] / g["pk_linear"][:, -1, :]
    k_max = float(np.min(np.asarray(g["k_max_valid"][:])[..., -1]))
    first = g[params[0]][:] if params else None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    mappable = draw_power_ratios(ax, k, ratio, labels, first, k_max)
    if mappable is not None:
        fig.colorbar(mappable, ax=ax, label=params[0])
    ax.set_title(f"{g.attrs['campaign']}: {len(labels)} runs, a = {g['a'][-1]:.3g}")
    save_figure(fig, out_path)


def first_draw(array) -> np.ndarray:
    """A stored array's values, at the first draw when it has a ``draw`` dimension
    (lensing.draws)."""
    dims = tuple(array.metadata.dimension_names)
    return np.asarray(array[:] if "draw" not in dims else np.take(array[:], 0, dims.index("draw")))


def plot_kappa(lensing_path, out_path) -> None:
    """The flat-sky κ map of the last source (the HEALPix map in Mollweide when there is no
    flat-sky map), of the first draw with lensing.draws."""
    plt = pyplot()
    g = _open_checked(lensing_path)
    sources = g["source"][:]
    if "kappa" in g:
        kappa, theta = np.asarray(first_draw(g["kappa"])[-1], np.float64), g["theta_x"][:]
        half = (theta[1] - theta[0]) / 2
        extent = (theta[0] - half, theta[-1] + half) * 2
        fig, ax = plt.subplots(figsize=(5.5, 5))
        image = ax.imshow(kappa.T, origin="lower", extent=extent, cmap="inferno")
        fig.colorbar(image, ax=ax, label="κ")
        ax.set_xlabel("θx [deg]")
        ax.set_ylabel("θy [deg]")
        ax.set_title(f"{g.attrs['run_id']}\nconvergence, source {sources[-1]}", fontsize="medium")
        fig.tight_layout()
        fig.savefig(out_path, dpi=100)
        plt.close(fig)
        return
    import healpy

    healpy.mollview(
        first_draw(g["kappa_healpix"])[-1],
        title=f"{g.attrs['run_id']}: κ, source {sources[-1]}",
        cmap="inferno",
    )
    plt.savefig(out_path, dpi=100)
    plt.close("all")


def plot_cl(summaries_path, out_path) -> None:
    """C_ell of κ per source against the Limber prediction with linear P(k); ratio below (the
    first draw's with lensing.draws)."""
    g = _open_checked(summaries_path)
    suffix = "" if "cl" in g else "_healpix"
    ell = g["ell" + suffix + "_mean"][:]
    cl = np.diagonal(first_draw(g["cl" + suffix]), axis1=0, axis2=1).T  # auto-spectra (source, ell)
    lin = np.diagonal(first_draw(g["cl_linear" + suffix]), axis1=0, axis2=1).T
    low, high = g["ell_min_valid" + suffix][:], g["ell_max_valid" + suffix][:]
    fig, top, bottom = _ratio_panels()
    for i, source in enumerate(g["source"][:]):
        inside = (ell >= low[i]) & (ell <= high[i])
        line = top.loglog(ell, ell * (ell + 1) * cl[i] / (2 * np.pi), alpha=0.35)[0]
        colour = line.get_color()
        top.loglog(
            ell[inside],
            (ell * (ell + 1) * cl[i] / (2 * np.pi))[inside],
            color=colour,
            label=str(source),
        )
        top.loglog(ell, ell * (ell + 1) * lin[i] / (2 * np.pi), color=colour, ls="--")
        bottom.semilogx(ell, cl[i] / lin[i], color=colour, alpha=0.35)
        bottom.semilogx(ell[inside], (cl[i] / lin[i])[inside], color=colour)
    _shade_outside((top, bottom), float(np.min(low)), float(np.max(high)), "resolved for no source")
    top.set_ylabel("ℓ(ℓ+1) C_ℓ / 2π")
    top.legend(fontsize="small")
    top.set_title(
        f"{g.attrs['run_id']}: convergence C_ℓ{' (HEALPix)' if suffix else ''}\n"
        "dashed: Limber with the linear P(k)\nfaint: outside the source's resolved "
        "range",
        fontsize="medium",
    )
    bottom.set_xlabel("ℓ")
    bottom.set_ylabel("C_ℓ / C_ℓ,lin")
    save_figure(fig, out_path)


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
    g = _open_checked(summaries_path)
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


def make_figures(campaign_dir: str | Path, paths) -> None:
    """Draw every figure of ``paths`` (files under <campaign_dir>/report/, named as in
    RUN_FIGURES and CAMPAIGN_FIGURES) in this one process."""
    campaign_dir = Path(campaign_dir)
    plots = {
        "pk": plot_power,
        "slice": plot_slice,
        "kappa": plot_kappa,
        "cl": plot_cl,
        "pk_ratio": plot_campaign,
        "peaks": plot_peaks,
    }
    for path in map(Path, paths):
        if path.stem in CAMPAIGN_FIGURES and path.parent.name == "report":
            plots[path.stem](campaign_dir / "summaries.zarr", path)
        elif path.stem in RUN_FIGURES:
            stage = RUN_FIGURES[path.stem][0]
            plots[path.stem](campaign_dir / path.parent.name / f"{stage}.zarr", path)
        else:
            raise ValueError(
                f"{path}: not a report figure (per run: "
                f"{', '.join(RUN_FIGURES)}; per campaign: {', '.join(CAMPAIGN_FIGURES)})"
            )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pmpipe.orchestration.report", description=__doc__.split("\n")[0]
    )
    parser.add_argument("campaign_dir", help="results/<campaign>")
    parser.add_argument(
        "figures",
        nargs="+",
        help="PNG files to draw: <campaign_dir>/report/<run>/{pk,slice,kappa,cl}.png "
        "and <campaign_dir>/report/{pk_ratio,peaks}.png",
    )
    args = parser.parse_args(argv)
    log.configure()
    try:
        make_figures(args.campaign_dir, args.figures)
    except (store.IncompleteStoreError, ValueError) as err:
        LOG.error("error: %s", err)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
