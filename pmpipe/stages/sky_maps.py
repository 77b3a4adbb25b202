"""The lensing maps the summaries measure: per kind of sky (flat, HEALPix) every source's κ, the
shear's E and B modes and shape noise, read from the lensing stage's (kept or stored) maps, with
the bins their statistics use."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding

from pmpipe.physics.evolution import sky
from pmpipe.physics.statistics import stats
from pmpipe.run import derive
from pmpipe.run.setup_parts import FlatSkySetup, FullSkySetup, LensingSetup
from pmpipe.runtime.parallel import FIELD_SPEC
from pmpipe.stages.inputs import Inputs

PAIR_DIMS = ("source", "source2")


@dataclasses.dataclass(frozen=True)
class SkyMaps:
    """One kind of map (flat sky or HEALPix) of every source, with what its statistics need:
    ``suffix`` of the names it is written under, ``ell_dim`` its multipole axis, the C_ℓ bin
    ``edges``, the κ maps and shape
    noise maps (or None), per source the κ, E and B modes and noisy κ (None without noise) as
    ``spectrum`` takes them (maps or harmonic coefficients), ``spectrum`` (a, b) -> (ℓ mean,
    C_ℓ, modes) per bin, ``smooth`` (map, σ arcmin), ``smooth_modes`` (one source's κ as
    ``spectrum`` takes it, σ arcmin) -> smoothed map, and ``peaks_of`` (map, κ edges)."""

    suffix: str
    ell_dim: str
    edges: np.ndarray
    kappa: list
    noise: list | None
    modes: dict[str, list]
    noisy: list | None
    spectrum: Callable
    smooth: Callable
    smooth_modes: Callable
    peaks_of: Callable


def noise_stream(seed: int, source: int, draw: tuple) -> tuple[int, ...]:
    """The random stream of a source's shape noise: (ic.seed, source), and the draw's index
    after them for draws after the first (the first draw's noise is that of the run without
    draws)."""
    return (seed, source, *(d for d in draw if d > 0))


def flat_sky_maps(
    setup: derive.RunSetup,
    lens: LensingSetup,
    flat: FlatSkySetup,
    inputs: Inputs,
    draw: tuple = (),
    suffix="",
) -> SkyMaps:
    """The ``flat`` sky's maps (lens.flat) of every source of ``lens`` (:class:`SkyMaps`) at
    ``draw``: the run's, or with ``suffix`` '_born' Born's of lensing.method both. The shear's
    E and B modes are those of κ and of the rotation ω (0 for Born): the distortion matrix is
    the Jacobian of the deflection, whose gradient part makes κ and the E modes and whose curl
    part ω and the B modes, with equal Fourier amplitudes. κ and ω are local, so their spectra
    are those of the E and B modes without the leakage between them that the shear maps'
    inverse Kaiser-Squires would add by taking a non-periodic ray-traced map as periodic."""
    sharding = NamedSharding(setup.grid.mesh, FIELD_SPEC)
    count = len(lens.sources)
    kappa = [inputs.field("lensing", f"kappa{suffix}", (*draw, i)) for i in range(count)]
    traced = lens.method != "born" and suffix == ""
    rotation = [
        inputs.field("lensing", "omega", (*draw, i)) if traced else jnp.zeros_like(k)
        for i, k in enumerate(kappa)
    ]
    levels = lens.shape_noise
    noise = None
    if levels is not None:
        noise = [
            stats.shape_noise_flat(
                noise_stream(setup.seed, i, draw),
                flat.pixels,
                flat.field_of_view,
                sigma_e,
                n_gal,
                sharding,
            )
            for i, (sigma_e, n_gal) in enumerate(levels)
        ]
    edges = flat.ell_edges

    def smooth(kappa, sigma):
        return stats.smooth_flat(kappa, flat.field_of_view, sigma)

    return SkyMaps(
        suffix,
        "ell",
        edges,
        kappa,
        noise,
        {"": kappa, "_ee": kappa, "_bb": rotation},
        None if noise is None else [k + n for k, n in zip(kappa, noise)],
        lambda a, b: stats.flat_sky_cl(a, flat.field_of_view, edges, b),
        smooth,
        smooth,
        stats.peak_counts_flat,
    )


def full_sky_maps(
    setup: derive.RunSetup,
    lens: LensingSetup,
    full: FullSkySetup,
    inputs: Inputs,
    draw: tuple = (),
    suffix="",
) -> SkyMaps:
    """The ``full`` sky's HEALPix maps (lens.full) of every source of ``lens``
    (:class:`SkyMaps`) at ``draw``: the run's, or with ``suffix`` '_born' Born's of
    lensing.method both."""
    import healpy

    nside, ell_max = full.nside, sky.healpix_ell_max(full.nside)
    name = f"{suffix}_healpix"
    kappa = list(np.asarray(inputs.array("lensing", f"kappa{name}", draw), np.float64))
    alm = list(np.asarray(inputs.array("lensing", f"kappa{name}_alm", draw), np.complex128))
    shear = {
        m: list(np.asarray(inputs.array("lensing", f"gamma_{m}{name}_alm", draw), np.complex128))
        for m in "eb"
    }
    levels = lens.shape_noise
    noise = None
    if levels is not None:
        noise = [
            stats.shape_noise_healpix(
                list(noise_stream(setup.seed, i, draw)), nside, sigma_e, n_gal, full.depth
            )
            for i, (sigma_e, n_gal) in enumerate(levels)
        ]
    edges = full.ell_edges
    return SkyMaps(
        name,
        "ell_healpix",
        edges,
        kappa,
        noise,
        {"": alm, "_ee": shear["e"], "_bb": shear["b"]},
        None
        if noise is None
        else [a + healpy.map2alm(n, lmax=ell_max, iter=3) for a, n in zip(alm, noise)],
        lambda a, b: stats.full_sky_cl(a, edges, b),
        stats.smooth_healpix,
        lambda a, s: stats.smooth_healpix_alm(a, nside, s),
        functools.partial(stats.peak_counts_healpix, neighbours=stats.healpix_neighbours(nside)),
    )
