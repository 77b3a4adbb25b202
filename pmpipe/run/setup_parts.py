"""The parts of a run's :class:`pmpipe.run.derive.RunSetup` that its stages read in place of the
configuration: plain values, numpy arrays and the files a run names (masks, a depth map), read
once. What the stores keep, when the N-body writes checkpoints, the lightcone's planes and how
the N-body captures them, the lensing maps with their sources and bins, the summaries' bins."""

from __future__ import annotations

import dataclasses

import numpy as np

from pmpipe.physics.evolution import sky
from pmpipe.physics.statistics import stats
from pmpipe.run import config, draws, validation
from pmpipe.run.observables import FlatSky, FullSky

XI_PIXELS = 3  # pixel sides: the smallest default angle of ξ±


@dataclasses.dataclass(frozen=True)
class Kept:
    """What the stores keep (docs/outputs.md): ``ic`` 'all', 'linear' or 'none'; the final
    ``particles``; the snapshots' ``density``, means over f^3 force-mesh cells for the factor
    f it holds (1: the force mesh; None: no snapshots, config.Run.density_factor); the ``lightcone`` planes and lensing maps; ``keepbits``, the mantissa bits of lossy
    float arrays (None: exact)."""

    ic: str
    particles: bool
    density: int | None
    lightcone: bool
    keepbits: int | None


@dataclasses.dataclass(frozen=True)
class Checkpointing:
    """When the N-body writes checkpoints: every ``every_steps`` steps, after the step ending
    ``every_minutes`` after the last one (either None: not by it), and whether the last one is
    ``kept`` once nbody.zarr is complete."""

    every_steps: int | None
    every_minutes: float | None
    kept: bool


@dataclasses.dataclass(frozen=True)
class BaryonsSetup:
    """The baryons section's ``parameters`` as JSON (the stores' provenance) and whether
    lensing.draws draws them (then the run's S(k, z) are one per draw)."""

    parameters: dict
    per_draw: bool


@dataclasses.dataclass(frozen=True, eq=False)
class LightconeSetup:
    """The lightcone's ``planes`` and how the N-body sees them: the ``observer`` (Mpc/h), a
    box copy rotated and shifted at random (``randomize``) for every plane or every box length
    of planes (``copy_every`` 'plane' or 'box'), the planes' thickness (Mpc/h) and force-mesh
    cells, and the consecutive planes one copy holds."""

    planes: sky.Planes
    observer: tuple[float, float, float]
    randomize: bool
    copy_every: str
    plane_thickness: float
    plane_cells: int
    planes_per_copy: int


@dataclasses.dataclass(frozen=True, eq=False)
class FlatSkySetup:
    """The flat-sky maps: side (deg) and pixels per side, the mask (pixels, pixels; None
    without one) and the C_ℓ bin edges (bins + 1,)."""

    field_of_view: float
    pixels: int
    mask: np.ndarray | None
    ell_edges: np.ndarray

    @property
    def pixel_arcmin(self) -> float:
        """Side of a pixel in arcmin."""
        return self.field_of_view * 60 / self.pixels


@dataclasses.dataclass(frozen=True, eq=False)
class FullSkySetup:
    """The HEALPix maps: nside, the band limit (h/Mpc) of every plane's shell (plane,), the
    mask and the shape noise's depth map (12 nside², RING; None without them), the C_ℓ bin
    edges (bins + 1,) and the angles of ξ± (arcmin, xi_bins)."""

    nside: int
    shell_k_max: np.ndarray
    mask: np.ndarray | None
    depth: np.ndarray | None
    ell_edges: np.ndarray
    xi_theta: np.ndarray


@dataclasses.dataclass(frozen=True, eq=False)
class LensingSetup:
    """The lensing maps: ``method`` 'born', 'raytrace' or 'both', whether the reduced shear is
    written; the ``sources``, (label, mean redshift, pmpipe.physics.lensing.projection.Source)
    in store order; with lensing.draws each draw's (values, sources), else None; the flat-sky
    and HEALPix maps (None where the run makes none) and every source's shape noise
    (σ_e, n_gal per arcmin²; None without)."""

    method: str
    reduced_shear: bool
    sources: tuple[tuple, ...]
    draws: tuple[tuple[dict, tuple], ...] | None
    flat: FlatSkySetup | None
    full: FullSkySetup | None
    shape_noise: tuple[tuple[float, float], ...] | None


@dataclasses.dataclass(frozen=True, eq=False)
class SummariesSetup:
    """The summaries' bins: ``pk_bins`` |k| bins of width 2π/L, whether P(k) divides out the
    CIC window, the smoothing σ (arcmin) of κ's peaks and PDF and their κ bin edges
    (kappa_bins + 1,)."""

    pk_bins: int
    compensate_cic: bool
    smoothing_arcmin: tuple[float, ...]
    kappa_edges: np.ndarray


def kept(run: config.Run) -> Kept:
    """The run's outputs section as :class:`Kept`."""
    out = run.outputs
    return Kept(out.ic, out.particles, run.density_factor(), out.lightcone, out.keepbits)


def checkpointing(run: config.Run) -> Checkpointing | None:
    """The run's checkpoints section as :class:`Checkpointing` (None without one)."""
    found = run.checkpoints
    if found is None:
        return None
    return Checkpointing(found.every_steps, found.every_minutes, found.keep)


def baryons_setup(run: config.Run) -> BaryonsSetup | None:
    """The run's baryons section as :class:`BaryonsSetup` (None without one)."""
    if run.baryons is None:
        return None
    per_draw = draws.baryon_values(run) is not None
    return BaryonsSetup(run.baryons.model_dump(mode="json"), per_draw)


def lightcone(run: config.Run, planes: sky.Planes) -> LightconeSetup:
    """The :class:`LightconeSetup` of a run with a lightcone, of its ``planes``."""
    cone = config.section(run.lightcone, "lightcone")
    return LightconeSetup(
        planes,
        cone.observer,
        cone.randomize,
        cone.copy_every,
        run.plane_thickness(),
        run.plane_cells(),
        run.planes_per_copy(),
    )


def lensing(
    run: config.Run, planes: sky.Planes, sources: tuple, drawn: tuple | None
) -> LensingSetup:
    """The :class:`LensingSetup` of a run with lensing, of its lightcone ``planes``, its
    ``sources`` and each draw's (values, sources) ``drawn`` (None without draws;
    :func:`pmpipe.run.derive.sources`, ``draw_sources``)."""
    lens = config.section(run.lensing, "lensing")
    noise = run.summaries.shape_noise
    return LensingSetup(
        lens.method,
        lens.reduced_shear,
        sources,
        drawn,
        None if lens.flat_sky is None else flat_sky(run, lens.flat_sky),
        None if lens.full_sky is None else full_sky(run, lens.full_sky, planes),
        None if noise is None else tuple(noise.per_source(lens.source_labels())),
    )


def flat_sky(run: config.Run, flat: FlatSky) -> FlatSkySetup:
    """The run's flat-sky maps (``flat``: its lensing.flat_sky), the mask read; C_ℓ bins from
    the map's fundamental to its Nyquist multipole, within summaries.ell_range."""
    held = sky.flat_multipoles(flat.field_of_view, flat.pixels)
    low, high = sky.clipped_multipoles(held, run.summaries.ell_range)
    mask = None if flat.mask is None else validation.load_flat_mask(flat.mask, flat.pixels)
    return FlatSkySetup(
        flat.field_of_view,
        flat.pixels,
        mask,
        stats.log_bin_edges(low, high, run.summaries.ell_bins),
    )


def full_sky(run: config.Run, full: FullSky, planes: sky.Planes) -> FullSkySetup:
    """The run's HEALPix maps (``full``: its lensing.full_sky) of the lightcone's ``planes``,
    the mask and depth map read; C_ℓ bins from ℓ = 2 to the band limit 3 nside - 1
    (inclusive), within summaries.ell_range; ξ± at summaries.xi_theta_arcmin, or from 3 pixel
    sides to 300 arcmin (at least 10 times further, at most 180 degrees), log-spaced."""
    summaries, noise = run.summaries, run.summaries.shape_noise
    low, high = sky.clipped_multipoles(sky.healpix_multipoles(full.nside), summaries.ell_range)
    closest = XI_PIXELS * sky.pixel_arcmin(full.nside)
    near, far = summaries.xi_theta_arcmin or (closest, min(max(300.0, 10 * closest), 10800.0))
    depth = None
    if noise is not None and noise.depth_map is not None:
        depth = validation.load_depth(noise.depth_map, run)
    return FullSkySetup(
        full.nside,
        shell_band_limits(run, full.nside, planes),
        None if full.mask is None else validation.load_mask(full.mask, full.nside),
        depth,
        stats.log_bin_edges(low, high, summaries.ell_bins),
        np.geomspace(near, far, summaries.xi_bins),
    )


def shell_band_limits(run: config.Run, nside: int, planes: sky.Planes) -> np.ndarray:
    """Band limit (h/Mpc) of each plane's full-sky shell of HEALPix maps of ``nside``
    (:func:`pmpipe.physics.evolution.sky.shell_band_limits` for this box and mesh)."""
    return sky.shell_band_limits(
        planes.chi_edges[1:],
        sky.shell_k_max(run.box.particles, run.force_cells(), run.box.box_size),
        sky.rays_nside(nside),
    )


def summaries(run: config.Run) -> SummariesSetup:
    """The run's summaries section as :class:`SummariesSetup` (pk_bins by default N B / 2,
    up to the force mesh's Nyquist; κ bins linear over summaries.kappa_range)."""
    found = run.summaries
    return SummariesSetup(
        found.pk_bins or run.force_cells() // 2,
        found.compensate_cic,
        tuple(found.smoothing_arcmin),
        np.linspace(*found.kappa_range, found.kappa_bins + 1),
    )
