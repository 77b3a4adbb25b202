"""Report figures (PNG) from complete stores: per run, P(k) against linear theory and a density
slice, and with lensing a κ map and C_ell against theory; per campaign, P(k) / linear theory
of every run, and with lensing peak counts and the κ PDF per cosmology.

    python -m pmpipe.report run SUMMARIES.zarr NBODY.zarr PK.png SLICE.png
    python -m pmpipe.report lensing SUMMARIES.zarr LENSING.zarr KAPPA.png CL.png
    python -m pmpipe.report campaign CAMPAIGN_SUMMARIES.zarr PK_RATIO.png
    python -m pmpipe.report peaks CAMPAIGN_SUMMARIES.zarr PEAKS.png
"""

from __future__ import annotations

import argparse
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from pmpipe import store  # noqa: E402

SLAB_FRACTION = 0.1  # part of the box along z averaged in the density slice


def _ratio_panels():
    """A figure with a log-log panel above a ratio panel sharing the x axis."""
    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(6, 6),
                                      gridspec_kw={"height_ratios": (2, 1)})
    bottom.axhline(1.0, color="grey", lw=0.5)
    return fig, top, bottom


def _save(fig, out_path) -> None:
    fig.tight_layout()
    fig.savefig(out_path, dpi=100)
    plt.close(fig)


def plot_power(summaries_path, out_path) -> None:
    """P(k) at each snapshot with linear theory and shot noise; ratio panel below."""
    g = store.open_complete(summaries_path)
    a, k_mean, pk, lin = g["a"][:], g["k_mean"][:], g["pk"][:], g["pk_linear"][:]
    fig, top, bottom = _ratio_panels()
    colours = plt.cm.viridis(np.linspace(0, 0.9, a.size))
    for i, c in enumerate(colours):
        top.loglog(k_mean, pk[i], color=c, label=f"a = {a[i]:.3g}")
        top.loglog(k_mean, lin[i], color=c, ls="--")
        bottom.semilogx(k_mean, pk[i] / lin[i], color=c)
    top.axhline(g.attrs["shot_noise"], color="grey", ls=":", label="shot noise")
    top.set_ylabel("P(k) [(Mpc/h)³]")
    top.legend(fontsize="small")
    top.set_title(f"{g.attrs['run_id']}: matter power spectrum (dashed: linear)")
    bottom.set_xlabel("k [h/Mpc]")
    bottom.set_ylabel("P / P_lin")
    _save(fig, out_path)


def plot_slice(nbody_path, out_path) -> None:
    """log10 ρ/ρ̄ averaged over the first SLAB_FRACTION of the box along z, last snapshot."""
    g = store.open_complete(nbody_path)
    density = g["density"]
    depth = max(1, int(round(SLAB_FRACTION * density.shape[3])))
    slab = np.asarray(density[-1, :, :, :depth], dtype=np.float64).mean(axis=2)
    x = g["x"][:]
    spacing = x[1] - x[0]
    extent = (x[0] - spacing / 2, x[-1] + spacing / 2) * 2
    fig, ax = plt.subplots(figsize=(5.5, 5))
    image = ax.imshow(np.log10(np.maximum(slab, 1e-2)).T, origin="lower", extent=extent,
                      cmap="magma")
    fig.colorbar(image, ax=ax, label="log10 ρ/ρ̄")
    ax.set_xlabel("x [Mpc/h]")
    ax.set_ylabel("y [Mpc/h]")
    ax.set_title(f"{g.attrs['run_id']}, a = {g['a'][-1]:.3g}")
    _save(fig, out_path)


def plot_campaign(summaries_path, out_path) -> None:
    """P(k) / linear theory at the last snapshot, one line per run."""
    g = store.open_complete(summaries_path)
    runs, k = g["run"][:], g["k"][:]
    ratio = g["pk"][:, -1, :] / g["pk_linear"][:, -1, :]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for run, r in zip(runs, ratio):
        ax.semilogx(k, r, label=str(run))
    ax.axhline(1.0, color="grey", lw=0.5)
    ax.set_xlabel("k [h/Mpc]")
    ax.set_ylabel("P(k) / D² P_lin(k)")
    ax.set_title(f"{g.attrs['campaign']}: a = {g['a'][-1]:.3g}")
    ax.legend(fontsize="x-small", ncol=2)
    _save(fig, out_path)


def plot_kappa(lensing_path, out_path) -> None:
    """The flat-sky κ map of the last source (the HEALPix map in Mollweide when there is no
    flat-sky map)."""
    g = store.open_complete(lensing_path)
    sources = g["source"][:]
    if "kappa" in g:
        kappa, theta = np.asarray(g["kappa"][-1], np.float64), g["theta_x"][:]
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

    healpy.mollview(np.asarray(g["kappa_healpix"][-1]), title=f"{g.attrs['run_id']}: κ, source {sources[-1]}",
                    cmap="inferno")
    plt.savefig(out_path, dpi=100)
    plt.close("all")


def plot_cl(summaries_path, out_path) -> None:
    """C_ell of κ per source against the Limber prediction with linear P(k); ratio below."""
    g = store.open_complete(summaries_path)
    suffix = "" if "cl" in g else "_healpix"
    ell, cl, lin = g["ell" + suffix][:], g["cl" + suffix][:], g["cl_linear" + suffix][:]
    fig, top, bottom = _ratio_panels()
    for i, source in enumerate(g["source"][:]):
        line = top.loglog(ell, ell * (ell + 1) * cl[i] / (2 * np.pi), label=str(source))[0]
        top.loglog(ell, ell * (ell + 1) * lin[i] / (2 * np.pi), color=line.get_color(), ls="--")
        bottom.semilogx(ell, cl[i] / lin[i], color=line.get_color())
    top.set_ylabel("ℓ(ℓ+1) C_ℓ / 2π")
    top.legend(fontsize="small")
    top.set_title(f"{g.attrs['run_id']}: convergence C_ℓ{' (HEALPix)' if suffix else ''}\n"
                  "dashed: Limber with the linear P(k)", fontsize="medium")
    bottom.set_xlabel("ℓ")
    bottom.set_ylabel("C_ℓ / C_ℓ,lin")
    _save(fig, out_path)


def plot_peaks(summaries_path, out_path) -> None:
    """Peak counts and κ PDF of the last source at the first smoothing scale, averaged over
    the runs of each cosmology (runs with the same design parameters)."""
    g = store.open_complete(summaries_path)
    suffix = "" if "peaks" in g else "_healpix"
    kappa, runs = g["kappa"][:], g["run"][:]
    params = [p for p in str(g["pk"].attrs.get("coordinates", "")).split() if p not in ("seed", "paired")]
    labels = [", ".join(f"{p} = {g[p][i]:.4g}" for p in params) or "fiducial" for i in range(runs.size)]
    peaks, pdf = g["peaks" + suffix][:, -1, 0, :], g["pdf" + suffix][:, -1, 0, :]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for label in dict.fromkeys(labels):
        rows = [i for i, lab in enumerate(labels) if lab == label]
        left.plot(kappa, peaks[rows].mean(axis=0), label=label)
        right.plot(kappa, pdf[rows].mean(axis=0), label=label)
    left.set_xlabel("κ")
    left.set_ylabel("peaks per bin")
    right.set_xlabel("κ")
    right.set_ylabel("PDF")
    right.set_yscale("log")
    left.legend(fontsize="small")
    scale = g["smoothing"][0]
    fig.suptitle(f"{g.attrs['campaign']}: source {g['source'][-1]}, smoothing {scale:g} arcmin")
    _save(fig, out_path)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pmpipe.report", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    run = sub.add_parser("run", help="figures of one run")
    for name in ("summaries", "nbody", "pk_png", "slice_png"):
        run.add_argument(name)
    lens = sub.add_parser("lensing", help="lensing figures of one run")
    for name in ("summaries", "lensing", "kappa_png", "cl_png"):
        lens.add_argument(name)
    camp = sub.add_parser("campaign", help="figure of a campaign")
    camp.add_argument("summaries")
    camp.add_argument("pk_ratio_png")
    peaks = sub.add_parser("peaks", help="peak counts and PDF of a campaign")
    peaks.add_argument("summaries")
    peaks.add_argument("peaks_png")
    args = parser.parse_args(argv)
    try:
        if args.what == "run":
            plot_power(args.summaries, args.pk_png)
            plot_slice(args.nbody, args.slice_png)
        elif args.what == "lensing":
            plot_kappa(args.lensing, args.kappa_png)
            plot_cl(args.summaries, args.cl_png)
        elif args.what == "peaks":
            plot_peaks(args.summaries, args.peaks_png)
        else:
            plot_campaign(args.summaries, args.pk_ratio_png)
    except store.IncompleteStoreError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
