"""Report figures (PNG) from complete stores: per run, P(k) against linear theory and a density
slice; per campaign, P(k) / linear theory of every run.

    python -m pmpipe.report run SUMMARIES.zarr NBODY.zarr PK.png SLICE.png
    python -m pmpipe.report campaign CAMPAIGN_SUMMARIES.zarr PK_RATIO.png
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


def plot_power(summaries_path, out_path) -> None:
    """P(k) at each snapshot with linear theory and shot noise; ratio panel below."""
    g = store.open_complete(summaries_path)
    a, k_mean, pk, lin = g["a"][:], g["k_mean"][:], g["pk"][:], g["pk_linear"][:]
    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(6, 6),
                                      gridspec_kw={"height_ratios": (2, 1)})
    colours = plt.cm.viridis(np.linspace(0, 0.9, a.size))
    for i, c in enumerate(colours):
        top.loglog(k_mean, pk[i], color=c, label=f"a = {a[i]:.3g}")
        top.loglog(k_mean, lin[i], color=c, ls="--")
        bottom.semilogx(k_mean, pk[i] / lin[i], color=c)
    top.axhline(g.attrs["shot_noise"], color="grey", ls=":", label="shot noise")
    top.set_ylabel("P(k) [(Mpc/h)³]")
    top.legend(fontsize="small")
    top.set_title(f"{g.attrs['run_id']}: matter power spectrum (dashed: linear)")
    bottom.axhline(1.0, color="grey", lw=0.5)
    bottom.set_xlabel("k [h/Mpc]")
    bottom.set_ylabel("P / P_lin")
    fig.tight_layout()
    fig.savefig(out_path, dpi=100)
    plt.close(fig)


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
    fig.tight_layout()
    fig.savefig(out_path, dpi=100)
    plt.close(fig)


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
    fig.tight_layout()
    fig.savefig(out_path, dpi=100)
    plt.close(fig)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pmpipe.report", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    run = sub.add_parser("run", help="figures of one run")
    for name in ("summaries", "nbody", "pk_png", "slice_png"):
        run.add_argument(name)
    camp = sub.add_parser("campaign", help="figure of a campaign")
    camp.add_argument("summaries")
    camp.add_argument("pk_ratio_png")
    args = parser.parse_args(argv)
    try:
        if args.what == "run":
            plot_power(args.summaries, args.pk_png)
            plot_slice(args.nbody, args.slice_png)
        else:
            plot_campaign(args.summaries, args.pk_ratio_png)
    except store.IncompleteStoreError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
