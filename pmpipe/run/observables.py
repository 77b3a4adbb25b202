"""What a run observes and measures: the lightcone planes, the lensing maps with their
sources, and the summary statistics (sections of :class:`pmpipe.run.config.Run`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, model_validator

from pmpipe.run.files import StrictModel

NAME_PATTERN_SOURCE = r"^[A-Za-z0-9][A-Za-z0-9_.=-]*$"


class Lightcone(StrictModel):
    """Planes of the past light cone, captured during the N-body (pmpipe.physics.evolution.lightcone)."""

    z_max: float = Field(
        1.0,
        gt=0,
        le=20,
        description="largest source redshift: planes reach at least the comoving distance of z_max",
    )
    plane_thickness: float | None = Field(
        None,
        gt=0,
        description="comoving thickness of a plane in Mpc/h: a whole number of force-mesh cells, at most box.box_size (default box_size: a slab one box thick holds Limber's projection exactly; thinner planes lose power at low multipoles, docs/validation.md)",
    )
    observer: tuple[float, float, float] = Field(
        (0.0, 0.0, 0.0),
        description="observer's position in the box, Mpc/h; the flat-sky line of sight is the observer's z axis",
    )
    randomize: bool = Field(
        True, description="rotate and shift the box at random for every copy (seeded by ic.seed)"
    )
    copy_every: Literal["plane", "box"] = Field(
        "plane",
        description="plane: every plane sees its own copy of the box (planes thinner than the "
        "box then lose power at low multipoles, the correlations between them missing); box: "
        "the planes within each box length of distance share a copy and tile it slab after "
        "slab, keeping those correlations (for the thin planes intrinsic alignments and "
        "photo-z shifts need)",
    )


class FlatSky(StrictModel):
    """Square flat-sky maps around the line of sight."""

    field_of_view: float = Field(5.0, gt=0, le=60, description="side of the map in degrees")
    pixels: int = Field(128, ge=8, le=16384, description="pixels per side")
    mask: Path | None = Field(
        None,
        description="a mask image of pixels x pixels (.npy, first axis theta_x, values from 0 "
        "to 1): the summaries add the spectra of the maps times the mask, decoupled "
        "(pseudo-C_ell), and peaks and PDF inside it (null: none)",
    )


def _power_of_two(n: int) -> int:
    if n & (n - 1):
        raise ValueError(f"nside must be a power of two (1, 2, 4, ..., 2048), got {n}")
    return n


class FullSky(StrictModel):
    """Full-sky HEALPix maps (RING ordering)."""

    nside: Annotated[int, AfterValidator(_power_of_two)] = Field(
        64,
        ge=1,
        le=2048,
        description="HEALPix resolution parameter, a power of two (the shells' "
        "rays are traced on a finer grid, whose pixel indices are int32)",
    )
    mask: Path | None = Field(
        None,
        description="a HEALPix mask of this nside (.npy or FITS, RING, values from 0 to 1): "
        "the summaries add the spectra of the maps times the mask, decoupled (pseudo-C_ell) "
        "up to 2 nside (null: none)",
    )


class SmailSources(StrictModel):
    """Parametric n(z) ∝ z^alpha exp(-(z/z0)^beta) (Smail et al. 1994), cut at lightcone.z_max."""

    kind: Literal["smail"]
    name: str = Field(
        pattern=NAME_PATTERN_SOURCE, description="label of the distribution in the stores"
    )
    z0: float = Field(gt=0, description="redshift scale")
    alpha: float = Field(2.0, ge=0, description="power-law index at low z")
    beta: float = Field(1.5, gt=0, description="exponential cut-off index")


class TableSources(StrictModel):
    """Tabulated n(z): redshifts and densities of any normalisation."""

    kind: Literal["table"]
    name: str = Field(
        pattern=NAME_PATTERN_SOURCE, description="label of the distribution in the stores"
    )
    z: list[float] = Field(description="increasing redshifts, from >= 0")
    n: list[float] = Field(description="n(z) >= 0 at those redshifts, not all zero")

    @model_validator(mode="after")
    def _valid_table(self):
        if len(self.z) < 2 or len(self.z) != len(self.n):
            raise ValueError(
                f"empty or short n(z) table '{self.name}': give z and n of equal "
                f"length >= 2 (got {len(self.z)} and {len(self.n)})"
            )
        if self.z[0] < 0 or any(b <= a for a, b in zip(self.z, self.z[1:])):
            raise ValueError(f"n(z) table '{self.name}': z must be increasing from >= 0")
        if min(self.n) < 0 or max(self.n) <= 0:
            raise ValueError(f"n(z) table '{self.name}' is empty: n must be >= 0 and not all zero")
        return self


def values_per_source(values: float | list[float], labels: list[str], field: str) -> list[float]:
    """One value per source named in ``labels`` from one value for all or a list of one per
    source; ValueError naming ``field`` when the list's length is another."""
    if not isinstance(values, list):
        return [values] * len(labels)
    if len(values) != len(labels):
        raise ValueError(
            f"{field} lists {len(values)} values, but the run has {len(labels)} sources "
            f"({', '.join(labels)}): give one per source or one for all"
        )
    return list(values)


class IntrinsicAlignment(StrictModel):
    """Intrinsic alignments of the source distributions' galaxies in the non-linear alignment
    model (pmpipe.physics.lensing.intrinsic_alignment); single source planes have none."""

    A_IA: float = Field(
        ge=-10,
        le=10,
        description="amplitude A_IA, from -10 to 10 (positive: the GI term is negative)",
    )
    eta_IA: float = Field(
        0.0,
        ge=-10,
        le=10,
        description="index of the redshift dependence ((1+z)/(1+z_pivot))^eta_IA",
    )
    z_pivot: float = Field(0.62, ge=0, le=3, description="pivot redshift of that power law")


class Baryons(StrictModel):
    """Baryonic feedback: a suppression of the matter power after the N-body
    (pmpipe.physics.theory.baryons), applied to the lightcone planes and beside the snapshots' P(k)."""

    model: Literal["hmcode2020"] = Field(
        "hmcode2020",
        description="hmcode2020: HMcode-2020's single-parameter feedback through CAMB "
        "(Mead et al. 2021)",
    )
    log_T_AGN: float = Field(
        7.8,
        ge=7.6,
        le=8.0,
        description="log10 of the AGN heating temperature in K, from 7.6 to 8.0 (the "
        "BAHAMAS runs the model was fitted to)",
    )


MAX_DRAWS = 1000
# Drawn parameters: the lensing field each sets, and (for the per-source fields) a source's
# label after a dot sets that source's value only; and the baryons section's
ALIGNMENT_PARAMETERS = ("A_IA", "eta_IA")
PER_SOURCE_PARAMETERS = ("photo_z_shift", "shear_bias")
BARYON_PARAMETERS = ("log_T_AGN",)


def _increasing_range(bounds: tuple[float, float]) -> tuple[float, float]:
    if not bounds[0] < bounds[1]:
        raise ValueError("range inverted or empty: give [low, high] with low < high")
    return bounds


def _some_drawn(parameters: dict) -> dict:
    if not parameters:
        raise ValueError(
            "no parameters to draw: name at least one of "
            + ", ".join((*ALIGNMENT_PARAMETERS, *PER_SOURCE_PARAMETERS, *BARYON_PARAMETERS))
        )
    return parameters


DrawRange = Annotated[tuple[float, float], AfterValidator(_increasing_range)]


class SampledDraws(StrictModel):
    """Draws on a Latin hypercube (scipy.stats.qmc, scrambled) in a box of parameter ranges,
    seeded by the run's ic.seed: every N-body run gets its own draws."""

    kind: Literal["latin_hypercube"]
    count: int = Field(ge=1, le=MAX_DRAWS, description=f"number of draws, 1 to {MAX_DRAWS}")
    parameters: Annotated[dict[str, DrawRange], AfterValidator(_some_drawn)] = Field(
        description="[low, high] of each drawn parameter: A_IA, eta_IA (need "
        "lensing.intrinsic_alignment), photo_z_shift, shear_bias (every source), "
        "photo_z_shift.<source>, shear_bias.<source> (one source, named as in the store), "
        "log_T_AGN (needs a baryons section; one pass over the planes per value)"
    )


class ListedDraws(StrictModel):
    """Draws given one by one."""

    kind: Literal["list"]
    points: list[Annotated[dict[str, float], AfterValidator(_some_drawn)]] = Field(
        min_length=1,
        max_length=MAX_DRAWS,
        description="the values of each draw (parameters named as in latin_hypercube); the "
        "fields a draw leaves out keep the lensing section's values",
    )


Draws = Annotated[SampledDraws | ListedDraws, Field(discriminator="kind")]


def draw_parameter_names(draws: SampledDraws | ListedDraws) -> list[str]:
    """The drawn parameters in order of first appearance."""
    if isinstance(draws, SampledDraws):
        return list(draws.parameters)
    return list(dict.fromkeys(name for point in draws.points for name in point))


def check_draw_names(
    names: list[str], labels: list[str], alignment: bool, where: str = "lensing.draws"
) -> None:
    """ValueError naming ``where`` and the nuisance parameter the lensing section cannot vary
    (sources named by their ``labels``; A_IA and eta_IA need an intrinsic alignment section;
    the baryons' need a baryons section, which the run's validation checks)."""
    allowed = [*ALIGNMENT_PARAMETERS, *PER_SOURCE_PARAMETERS, *BARYON_PARAMETERS] + [
        f"{field}.{label}" for field in PER_SOURCE_PARAMETERS for label in labels
    ]
    for name in names:
        if name not in allowed:
            raise ValueError(
                f"{where} parameter {name!r} is not one the run can vary: use {', '.join(allowed)}"
            )
        if name in ALIGNMENT_PARAMETERS and not alignment:
            raise ValueError(
                f"{where} parameter {name} needs lensing.intrinsic_alignment (its other "
                "fields stay as they are)"
            )
        field = name.split(".", 1)[0]
        if field in PER_SOURCE_PARAMETERS and "." in name and field in names:
            raise ValueError(
                f"{where} varies {field} for every source and {name} for one: vary one of them"
            )


NUISANCE_LIMIT = 0.5  # largest |Δz| and |m| accepted


class Lensing(StrictModel):
    """Convergence and shear maps from the lightcone planes: Born (pmpipe.physics.lensing.projection) or
    ray-traced (pmpipe.physics.lensing.raytrace_flat)."""

    source_redshifts: list[float] = Field(
        default_factory=lambda: [1.0],
        description="redshifts of single source planes (delta-function n(z))",
    )
    distributions: list[Annotated[SmailSources | TableSources, Field(discriminator="kind")]] = (
        Field(
            default_factory=list, description="source redshift distributions: kind smail or table"
        )
    )
    flat_sky: FlatSky | None = Field(
        default_factory=FlatSky, description="flat-sky maps (null: none)"
    )
    full_sky: FullSky | None = Field(None, description="HEALPix maps (null: none)")
    method: Literal["born", "raytrace", "both"] = Field(
        "born",
        description="born: κ as the lensing-weighted sum of the planes along straight lines "
        "of sight (fast); raytrace: rays deflected at every plane (multiple lens planes, "
        "flat and full sky), with the rotation ω and lens-lens coupling; both: the ray-traced "
        "maps and Born's from the same planes (kappa_born, gamma1_born, gamma2_born, "
        "kappa_born_healpix, ...)",
    )
    reduced_shear: bool = Field(
        False, description="also write the reduced shear g = γ / (1 - κ) of the maps (g1, g2)"
    )
    intrinsic_alignment: IntrinsicAlignment | None = Field(
        None,
        description="intrinsic alignments (NLA) added to the distributions' maps (null: none); "
        "needs lightcone.plane_thickness of at most 100 Mpc/h",
    )
    photo_z_shift: float | list[float] = Field(
        0.0,
        description="photometric-redshift shift Δz of each source, in store order "
        "(source_redshifts, then distributions): n(z) becomes n(z - Δz); one value for all "
        "or a list, each from -0.5 to 0.5",
    )
    shear_bias: float | list[float] = Field(
        0.0,
        description="multiplicative shear bias m of each source, in store order: its maps are "
        "(1 + m) times the true ones; one value for all or a list, each from -0.5 to 0.5",
    )
    draws: Draws | None = Field(
        None,
        description="several sets of nuisances (A_IA, eta_IA, photo_z_shift, shear_bias) for "
        "the maps and statistics of one N-body run, each with its own shape noise: kind "
        "latin_hypercube (count, parameters: ranges) or list (points); the lensing and "
        "summaries stores gain a leading draw dimension (null: one set, this section's)",
    )

    @model_validator(mode="after")
    def _some_sources_and_maps(self):
        if not self.source_redshifts and not self.distributions:
            raise ValueError("no sources: give lensing.source_redshifts or lensing.distributions")
        if any(z <= 0 for z in self.source_redshifts):
            raise ValueError(f"lensing.source_redshifts must be > 0, got {self.source_redshifts}")
        names = [d.name for d in self.distributions]
        if len(set(names)) != len(names):
            raise ValueError(f"lensing.distributions names must be unique, got {names}")
        if self.flat_sky is None and self.full_sky is None:
            raise ValueError("lensing needs flat_sky or full_sky maps (or both)")
        for field in ("photo_z_shift", "shear_bias"):
            values = self.per_source(field)
            if any(abs(v) > NUISANCE_LIMIT for v in values):
                raise ValueError(
                    f"lensing.{field} values must lie from -{NUISANCE_LIMIT} to "
                    f"{NUISANCE_LIMIT}, got {getattr(self, field)}"
                )
        shifts = self.per_source("photo_z_shift")
        for z, dz in zip(self.source_redshifts, shifts):
            if z + dz <= 0:
                raise ValueError(
                    f"lensing.photo_z_shift {dz} moves source_redshifts value {z} to z <= 0"
                )
        for d, dz in zip(self.distributions, shifts[len(self.source_redshifts) :]):
            kept = (
                [n for z, n in zip(d.z, d.n) if z + dz >= 0] if isinstance(d, TableSources) else [1]
            )
            if len(kept) < (2 if isinstance(d, TableSources) else 1) or max(kept) <= 0:
                raise ValueError(
                    f"lensing.photo_z_shift {dz} leaves '{d.name}' without sources at z >= 0 "
                    "(a table needs two points there, one with n > 0)"
                )
        if self.intrinsic_alignment is not None and not self.distributions:
            raise ValueError(
                "lensing.intrinsic_alignment acts on lensing.distributions, and there are none "
                "(single source planes have no intrinsic alignment)"
            )
        if self.draws is not None:
            check_draw_names(
                draw_parameter_names(self.draws),
                self.source_labels(),
                self.intrinsic_alignment is not None,
            )
        return self

    def per_source(self, field: str) -> list[float]:
        """The value of a per-source field (photo_z_shift, shear_bias) for each source."""
        return values_per_source(getattr(self, field), self.source_labels(), f"lensing.{field}")

    def source_labels(self) -> list[str]:
        """Names of the sources in store order: 'z=<z>' for single redshifts, then the n(z)s."""
        return [f"z={z:g}" for z in self.source_redshifts] + [d.name for d in self.distributions]


class ShapeNoise(StrictModel):
    """Gaussian shape noise added to κ: one value for every source, or a list with one per
    source in store order (lensing.source_redshifts, then lensing.distributions); on the full
    sky, n_gal may vary over the sky by a depth map."""

    sigma_e: float | list[float] = Field(
        0.26, description="ellipticity dispersion per component (per source: a list)"
    )
    n_gal: float | list[float] = Field(
        30.0, description="galaxies per square arcminute (per source: a list)"
    )
    depth_map: Path | None = Field(
        None,
        description="a HEALPix map of lensing.full_sky.nside (.npy or FITS, RING, values >= 0): "
        "the full-sky maps' n_gal at a pixel is n_gal times its value (0: no galaxies and no "
        "noise there, a pixel to mask); null: n_gal everywhere",
    )

    @model_validator(mode="after")
    def _positive(self):
        for name in ("sigma_e", "n_gal"):
            values = getattr(self, name)
            if min(values if isinstance(values, list) else [values], default=0) <= 0:
                raise ValueError(f"summaries.shape_noise.{name} must be > 0, got {values}")
        return self

    def per_source(self, labels: list[str]) -> list[tuple[float, float]]:
        """(σ_e, n_gal) of each source named in ``labels``; ValueError naming the field when a
        list does not give one value per source."""
        return list(
            zip(
                *(
                    values_per_source(getattr(self, n), labels, f"summaries.shape_noise.{n}")
                    for n in ("sigma_e", "n_gal")
                )
            )
        )


class Summaries(StrictModel):
    """Summary statistics of each snapshot and of the lensing maps."""

    pk_bins: int | None = Field(
        None,
        ge=1,
        description="number of linear |k| bins of width 2pi/L from 0 (default: N B / 2, up to the force mesh's Nyquist)",
    )
    compensate_cic: bool = Field(
        True, description="divide the density modes by the CIC window before P(k)"
    )
    ell_bins: int = Field(
        12,
        ge=1,
        description="logarithmic multipole bins of C_ell between the map's fundamental and Nyquist multipoles (within ell_range)",
    )
    ell_range: tuple[float, float] | None = Field(
        None,
        description="[low, high] multipoles the C_ell bins span, clipped to what each map "
        "holds (null: all it holds: a flat map's fundamental to its Nyquist multipole, a "
        "HEALPix map's 2 to 3 nside)",
    )
    smoothing_arcmin: list[float] = Field(
        default_factory=lambda: [2.0, 5.0],
        min_length=1,
        description="Gaussian smoothing scales (sigma, arcmin) of kappa for peaks and PDF; 0: none",
    )
    kappa_range: tuple[float, float] = Field(
        (-0.05, 0.15), description="[low, high] of the kappa bins of peaks and PDF"
    )
    kappa_bins: int = Field(40, ge=1, description="number of linear kappa bins of peaks and PDF")
    shape_noise: ShapeNoise | None = Field(
        None, description="shape noise added before smoothing (null: none)"
    )
    xi_bins: int = Field(
        15, ge=1, description="angles (log-spaced) of the full-sky shear correlations xi+/-"
    )
    xi_theta_arcmin: tuple[float, float] | None = Field(
        None,
        description="[smallest, largest] angle of xi+/- in arcmin (default: 3 pixel sides of "
        "the full-sky map to 300, or to 10 times the smallest if that is more)",
    )

    @model_validator(mode="after")
    def _valid(self):
        if not self.kappa_range[0] < self.kappa_range[1]:
            raise ValueError(
                f"summaries.kappa_range must be [low, high] with low < high, got {list(self.kappa_range)}"
            )
        if self.ell_range is not None and not 0 < self.ell_range[0] < self.ell_range[1]:
            raise ValueError(
                f"summaries.ell_range must be [low, high] with 0 < low < high, got {list(self.ell_range)}"
            )
        if min(self.smoothing_arcmin) < 0:
            raise ValueError("summaries.smoothing_arcmin values must be >= 0")
        if (
            self.xi_theta_arcmin is not None
            and not 0 < self.xi_theta_arcmin[0] < self.xi_theta_arcmin[1] <= 10800
        ):
            raise ValueError(
                "summaries.xi_theta_arcmin must be [smallest, largest] with 0 < smallest < "
                f"largest <= 10800 (180 deg), got {list(self.xi_theta_arcmin)}"
            )
        return self
