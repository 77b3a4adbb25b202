"""Report figures (PNG) from complete stores: per run (of at most SAMPLED_RUNS runs sampled in
design order), P(k) against linear theory and a density slice, and with lensing a κ map and
C_ell against theory; per campaign (pmpipe.results.campaign_figures), P(k) / linear
theory of every run, the design with each run's state, and with lensing peak counts and the κ
PDF per cosmology.

    python -m pmpipe.results.report results/<campaign> results/<campaign>/report/<run>/pk.png ...

draws every figure named (per run: pk, slice, kappa, cl; per campaign: pk_ratio, design,
peaks) in one process.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np

from pmpipe.results import campaign_figures
from pmpipe.results.plotting import first_draw, open_checked, pyplot, save_figure, shade_outside
from pmpipe.runtime import log
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
CAMPAIGN_FIGURES = {
    "pk_ratio": "Campaign",
    "design": "Campaign",
    "cl_ratio": "Campaign",
    "peaks": "Campaign",
}
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
        if f not in ("cl_ratio", "peaks") or lensing
    ]


def _ratio_panels():
    """A figure with a log-log panel above a ratio panel sharing the x axis."""
    plt = pyplot()
    fig, (top, bottom) = plt.subplots(
        2, 1, sharex=True, figsize=(6, 6), gridspec_kw={"height_ratios": (2, 1)}
    )
    bottom.axhline(1.0, color="grey", lw=0.5)
    return fig, top, bottom


def plot_power(summaries_path, out_path) -> None:
    """P(k) at each snapshot with linear theory and shot noise; ratio panel below."""
    plt = pyplot()
    g = open_checked(summaries_path)
    a, k_mean, pk, lin = g["a"][:], g["k_mean"][:], g["pk"][:], g["pk_linear"][:]
    fig, top, bottom = _ratio_panels()
    colours = plt.cm.viridis(np.linspace(0, 0.9, a.size))
    for i, c in enumerate(colours):
        top.loglog(k_mean, pk[i], color=c, label=f"a = {a[i]:.3g}")
        top.loglog(k_mean, lin[i], color=c, ls="--")
        bottom.semilogx(k_mean, pk[i] / lin[i], color=c)
    top.axhline(g.attrs["shot_noise"], color="grey", ls=":", label="shot noise")
    shade_outside((top, bottom), 0.0, float(g["k_max_valid"][-1]), "not resolved")
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
    g = open_checked(nbody_path)
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


def plot_kappa(lensing_path, out_path) -> None:
    """The flat-sky κ map of the last source (the HEALPix map in Mollweide when there is no
    flat-sky map), of the first draw with lensing.draws."""
    plt = pyplot()
    g = open_checked(lensing_path)
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
    g = open_checked(summaries_path)
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
    shade_outside((top, bottom), float(np.min(low)), float(np.max(high)), "resolved for no source")
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


def make_figures(campaign_dir: str | Path, paths) -> None:
    """Draw every figure of ``paths`` (files under <campaign_dir>/report/, named as in
    RUN_FIGURES and CAMPAIGN_FIGURES) in this one process."""
    campaign_dir = Path(campaign_dir)
    plots = {
        "pk": plot_power,
        "slice": plot_slice,
        "kappa": plot_kappa,
        "cl": plot_cl,
        "pk_ratio": campaign_figures.plot_campaign,
        "design": campaign_figures.plot_design,
        "cl_ratio": campaign_figures.plot_cl_spread,
        "peaks": campaign_figures.plot_peaks,
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
        prog="python -m pmpipe.results.report", description=__doc__.split("\n")[0]
    )
    parser.add_argument("campaign_dir", help="results/<campaign>")
    parser.add_argument(
        "figures",
        nargs="+",
        help="PNG files to draw: <campaign_dir>/report/<run>/{pk,slice,kappa,cl}.png "
        "and <campaign_dir>/report/{pk_ratio,design,cl_ratio,peaks}.png",
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
