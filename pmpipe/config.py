"""Configuration of one simulation: pydantic v2 models (unknown keys rejected), the files
they are read from and the errors that name file and field.

This module checks what a configuration says on its own; it imports no physics and no JAX.
The checks that need a run's physics (distances, step times, the P(k) table, the device split)
are :mod:`pmpipe.validation`'s, and the physics inputs are built from a validated run by
:mod:`pmpipe.derive`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Annotated, Literal, TypeVar, get_args

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    WithJsonSchema,
    model_validator,
)

StepSpacing = Literal["a", "log_a", "growth"]  # what a number of N-body steps is equal in
PowerKind = Literal["eisenstein_hu", "eisenstein_hu_nowiggle", "table"]  # linear P(k) sources
STEP_SPACINGS: tuple[str, ...] = get_args(StepSpacing)
POWER_KINDS: tuple[str, ...] = get_args(PowerKind)


Section = TypeVar("Section")


def section(value: Section | None, name: str) -> Section:
    """An optional section of a run (``run.lightcone``, say) that the caller needs; ValueError
    naming it when the run has none."""
    if value is None:
        raise ValueError(f"the run has no {name} section")
    return value


class StrictModel(BaseModel):
    """A configuration section: unknown keys, infinities and NaNs rejected; frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class Cosmology(StrictModel):
    """Flat ΛCDM / w0waCDM parameters."""

    Omega_m: float = Field(
        0.3111, gt=0, le=1, description="total matter density today (CDM + baryons), dimensionless"
    )
    Omega_b: float = Field(
        0.0490, ge=0, lt=1, description="baryon density today, dimensionless; must be < Omega_m"
    )
    h: float = Field(0.6766, gt=0, le=2, description="H0 / (100 km/s/Mpc), dimensionless")
    n_s: float = Field(0.9665, gt=0, le=2, description="primordial spectral index, dimensionless")
    sigma8: float = Field(
        0.8102, gt=0, le=5, description="rms linear overdensity in 8 Mpc/h spheres at a = 1"
    )
    w0: float = Field(-1.0, ge=-3, le=0, description="dark energy equation of state today")
    wa: float = Field(0.0, ge=-3, le=3, description="CPL evolution of w: w(a) = w0 + wa (1 - a)")
    T_cmb: float = Field(2.7255, ge=0, le=10, description="CMB temperature in K (0: no radiation)")
    N_eff: float = Field(
        3.046, ge=0, le=10, description="effective number of massless neutrino species"
    )

    @model_validator(mode="after")
    def _baryons_below_matter(self):
        if self.Omega_b >= self.Omega_m:
            raise ValueError(
                f"cosmology.Omega_b = {self.Omega_b} must be smaller than cosmology.Omega_m = {self.Omega_m}"
            )
        return self


class Power(StrictModel):
    """Linear matter power spectrum at a = 1."""

    kind: PowerKind = Field(
        "eisenstein_hu",
        description="Eisenstein & Hu (1998) fit with or without BAO, normalised to sigma8, or a table",
    )
    table: Path | None = Field(
        None,
        description="file of k [h/Mpc] and P(k) [(Mpc/h)^3] columns as CAMB / CLASS write them (kind 'table')",
    )

    @model_validator(mode="after")
    def _table_given(self):
        if (self.kind == "table") != (self.table is not None):
            raise ValueError("power.table must be given exactly when power.kind is 'table'")
        return self


class Box(StrictModel):
    """Simulation volume and resolution."""

    box_size: float = Field(256.0, gt=0, description="comoving side of the periodic box in Mpc/h")
    particles: int = Field(64, ge=4, le=16384, description="particles per side (N^3 in total)")
    oversample: int = Field(
        1, ge=1, le=4, description="force mesh cells per particle spacing, B (mesh = B N per side)"
    )


def _not_auto(pdims):
    if pdims == "auto":
        raise ValueError(
            "parallel.pdims 'auto' is chosen for a campaign's runs (base.parallel "
            "with a decomposition section: devices, file); a run needs (px, py)"
        )
    return pdims


# pdims in files: (px, py), or 'auto' in a campaign's base (pmpipe.orchestration.campaign chooses them)
PDIMS_SCHEMA = {
    "anyOf": [
        {"maxItems": 2, "minItems": 2, "prefixItems": [{"type": "integer"}] * 2, "type": "array"},
        {"const": "auto", "type": "string"},
    ]
}


class Parallel(StrictModel):
    """Decomposition over devices."""

    pdims: Annotated[tuple[int, int], BeforeValidator(_not_auto), WithJsonSchema(PDIMS_SCHEMA)] = (
        Field(
            (1, 1),
            description="devices along x and y, (px, py); px * py devices in all; 'auto' "
            "in a campaign's base: chosen from recorded sweeps (its "
            "decomposition section)",
        )
    )
    halo_cells: int = Field(
        8, ge=1, description="halo width in force-mesh cells for particles that left their block"
    )

    @model_validator(mode="after")
    def _positive(self):
        if min(self.pdims) < 1:
            raise ValueError(f"parallel.pdims must be positive integers, got {self.pdims}")
        return self


class IC(StrictModel):
    """Initial conditions."""

    seed: int = Field(
        0, ge=0, description="seed of the white noise (same seed, same universe on any device mesh)"
    )
    a_init: float = Field(0.1, gt=0, lt=1, description="scale factor of the LPT initial conditions")
    lpt_order: Literal[1, 2] = Field(2, description="Lagrangian perturbation theory order")
    fixed_amplitude: bool = Field(
        False, description="set every |delta_k| to its mean (Angulo & Pontzen 2016)"
    )
    paired: bool = Field(False, description="invert the phases (the partner of a pair)")


class NBody(StrictModel):
    """Particle-mesh evolution."""

    a_final: float = Field(1.0, gt=0, le=1, description="scale factor at the end of the run")
    steps: int | list[float] = Field(
        10, description="number of steps, or the scale factors bounding them"
    )
    spacing: StepSpacing = Field(
        "a",
        description="what a number of steps is equally spaced in: the scale factor a, ln a, "
        "or the linear growth factor D1 (docs/validation.md gives the accuracy of each)",
    )
    snapshots: list[float] = Field(
        default_factory=list,
        description="scale factors at which the density is kept (a_final always)",
    )
    dtype: Literal["float32", "float64"] = Field("float32", description="floating point precision")


NAME_PATTERN_SOURCE = r"^[A-Za-z0-9][A-Za-z0-9_.=-]*$"


class Lightcone(StrictModel):
    """Planes of the past light cone, captured during the N-body (pmpipe.physics.lightcone)."""

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
        True, description="rotate and shift the box at random for every plane (seeded by ic.seed)"
    )


class FlatSky(StrictModel):
    """Square flat-sky maps around the line of sight."""

    field_of_view: float = Field(5.0, gt=0, le=60, description="side of the map in degrees")
    pixels: int = Field(128, ge=8, le=16384, description="pixels per side")


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


class Lensing(StrictModel):
    """Born convergence and shear maps from the lightcone planes (pmpipe.physics.lensing)."""

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
        return self

    def source_labels(self) -> list[str]:
        """Names of the sources in store order: 'z=<z>' for single redshifts, then the n(z)s."""
        return [f"z={z:g}" for z in self.source_redshifts] + [d.name for d in self.distributions]


class ShapeNoise(StrictModel):
    """Gaussian shape noise added to κ before smoothing."""

    sigma_e: float = Field(0.26, gt=0, description="ellipticity dispersion per component")
    n_gal: float = Field(30.0, gt=0, description="galaxies per square arcminute")


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
        description="logarithmic multipole bins of C_ell between the map's fundamental and Nyquist multipoles",
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

    @model_validator(mode="after")
    def _valid(self):
        if not self.kappa_range[0] < self.kappa_range[1]:
            raise ValueError(
                f"summaries.kappa_range must be [low, high] with low < high, got {list(self.kappa_range)}"
            )
        if min(self.smoothing_arcmin) < 0:
            raise ValueError("summaries.smoothing_arcmin values must be >= 0")
        return self


class Outputs(StrictModel):
    """What a run's stores keep. Summaries are always written; the ICs can always be made
    again from the seed and the config. A field that is not stored still reaches the later
    stages of the run when they run in the same process (``pmpipe run all``, the workflow)."""

    particles: bool = Field(True, description="final displacement and momentum in nbody.zarr")
    density: Literal["full", "none"] | Annotated[int, Field(ge=2)] = Field(
        "full",
        description="snapshot densities in nbody.zarr: full (the force mesh), none, or "
        "an integer factor f >= 2 (means over f^3 cells)",
    )
    ic: Literal["all", "linear", "none"] = Field(
        "all",
        description="ic.zarr: all (linear density, displacement, momentum), linear "
        "(the linear density), none (seed and config only)",
    )
    lightcone: bool = Field(
        True,
        description="lightcone planes in nbody.zarr and convergence and shear maps in lensing.zarr",
    )
    keepbits: int | None = Field(
        None,
        ge=1,
        le=23,
        description="lossy compression of large float arrays: keep this many "
        "mantissa bits (bit rounding, then zstd); null: exact",
    )


class Checkpoints(StrictModel):
    """Checkpoints of the N-body (pmpipe.storage.checkpoint): its state, step and what it captured so
    far, written every few steps or minutes and on SIGTERM / SIGUSR2, so that a killed or
    preempted run resumes where it stopped. The steps then run one program call each."""

    every_steps: int | None = Field(None, ge=1, description="write one every this many steps")
    every_minutes: float | None = Field(
        None,
        gt=0,
        description="write one after the step that ends this many minutes after the "
        "last one (or the start)",
    )
    keep: bool = Field(False, description="keep the last checkpoint once nbody.zarr is complete")

    @model_validator(mode="after")
    def _some_schedule(self):
        if self.every_steps is None and self.every_minutes is None:
            raise ValueError(
                "checkpoints needs every_steps or every_minutes (or both); "
                "checkpoints: null turns them off"
            )
        return self


class Run(StrictModel):
    """One simulation: everything needed to produce its ICs, N-body output and summaries."""

    cosmology: Cosmology = Field(default_factory=Cosmology)
    power: Power = Field(default_factory=Power)
    box: Box = Field(default_factory=Box)
    parallel: Parallel = Field(default_factory=Parallel)
    ic: IC = Field(default_factory=IC)
    nbody: NBody = Field(default_factory=NBody)
    summaries: Summaries = Field(default_factory=Summaries)
    lightcone: Lightcone | None = Field(
        None, description="lightcone planes captured during the N-body (null: none)"
    )
    lensing: Lensing | None = Field(
        None, description="convergence and shear maps from the planes (null: none); needs lightcone"
    )
    outputs: Outputs = Field(default_factory=Outputs, description="what the stores keep")
    checkpoints: Checkpoints | None = Field(
        None,
        description="N-body checkpoints (null: none; a signal then ends the run without "
        "one). Not part of the config hash: they change where a run may stop, "
        "not what it computes",
    )

    @model_validator(mode="after")
    def _consistent(self):
        n, pdims = self.box.particles, self.parallel.pdims
        if self.power.kind != "table" and self.cosmology.T_cmb <= 0:
            raise ValueError(
                f"cosmology.T_cmb must be > 0 for power.kind {self.power.kind!r} "
                "(the Eisenstein-Hu transfer function depends on it); use "
                "power.kind 'table' to run without radiation"
            )
        factor = self.outputs.density
        if isinstance(factor, int) and any((n * self.box.oversample) % (factor * p) for p in pdims):
            raise ValueError(
                f"outputs.density = {factor} must divide the force mesh's block on "
                f"every device: {n * self.box.oversample} cells per side over "
                f"parallel.pdims = {tuple(pdims)}"
            )
        if self.lightcone is not None:
            self._check_lightcone()
        elif self.lensing is not None:
            raise ValueError("lensing needs lightcone planes: add a lightcone section")
        return self

    def force_cells(self) -> int:
        """Force-mesh cells per side: box.particles times box.oversample."""
        return self.box.particles * self.box.oversample

    def plane_thickness(self) -> float:
        """Comoving thickness of a lightcone plane in Mpc/h."""
        return section(self.lightcone, "lightcone").plane_thickness or self.box.box_size

    def plane_cells(self) -> int:
        """Force-mesh cells across a lightcone plane."""
        return round(self.plane_thickness() / (self.box.box_size / self.force_cells()))

    def _check_lightcone(self) -> None:
        """Plane thickness, final time and source redshifts (errors name fields); the checks
        that need distances are :func:`pmpipe.validation.check_run`'s."""
        box, cell = self.box.box_size, self.box.box_size / self.force_cells()
        thickness = self.plane_thickness()
        if (
            thickness > box * (1 + 1e-9)
            or abs(thickness / cell - round(thickness / cell)) > 1e-6
            or thickness < cell
        ):
            raise ValueError(
                f"lightcone.plane_thickness = {thickness} Mpc/h must be a whole number of "
                f"force-mesh cells ({cell:g} Mpc/h) between {cell:g} and box.box_size = {box}"
            )
        if abs(self.nbody.a_final - 1.0) > 1e-9:
            raise ValueError(
                f"a lightcone needs nbody.a_final = 1 (the observer is at z = 0), got {self.nbody.a_final}"
            )
        if self.lensing is None:
            return
        lens, z_max = self.lensing, section(self.lightcone, "lightcone").z_max
        for z in lens.source_redshifts:
            if z > z_max:
                raise ValueError(
                    f"lensing.source_redshifts value {z} lies beyond the lightcone "
                    f"(lightcone.z_max = {z_max})"
                )
        for d in lens.distributions:
            if isinstance(d, TableSources) and any(n > 0 and z > z_max for z, n in zip(d.z, d.n)):
                raise ValueError(
                    f"lensing.distributions '{d.name}' has sources beyond the lightcone "
                    f"(n > 0 at z > lightcone.z_max = {z_max})"
                )


def config_hash(run: Run) -> str:
    """sha256 of the run's canonical JSON (sorted keys, no spaces; the checkpoints section
    left out), as 'sha256:<hex>'."""
    text = json.dumps(
        run.model_dump(mode="json", exclude={"checkpoints"}), sort_keys=True, separators=(",", ":")
    )
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


class RunFile(StrictModel):
    """Content of ``results/<campaign>/<run_id>/config.json``: one resolved run of a campaign."""

    campaign: str = Field(description="campaign name")
    run_id: str = Field(description="stable id: campaign name + position in the design")
    index: int = Field(ge=0, description="position of the run in the expanded design")
    parameters: dict[str, float] = Field(
        default_factory=dict, description="design parameters of this run (cosmology field names)"
    )
    config: Run = Field(description="the resolved run configuration")
    config_hash: str = Field(description="config_hash(config): 'sha256:<hex>'")

    @model_validator(mode="after")
    def _hash_matches(self):
        expected = config_hash(self.config)
        if self.config_hash != expected:
            raise ValueError(
                f"config_hash {self.config_hash!r} does not match the config ({expected}); "
                "the file was edited by hand: regenerate it from the campaign"
            )
        return self

    @classmethod
    def build(cls, campaign: str, run_id: str, index: int, parameters: dict, run: Run) -> RunFile:
        return cls(
            campaign=campaign,
            run_id=run_id,
            index=index,
            parameters=parameters,
            config=run,
            config_hash=config_hash(run),
        )

    def to_json(self) -> str:
        return json.dumps(self.model_dump(mode="json"), indent=2, sort_keys=True) + "\n"


class ConfigError(ValueError):
    """A configuration file that does not validate; the message names file and fields."""


def invalid(source: str, field: str, message: str) -> ConfigError:
    """A ConfigError of one problem, laid out as :func:`format_errors` lays out its lines."""
    return ConfigError(f"{source}: invalid configuration\n  {field}: {message}")


def format_errors(
    source: str, err: ValidationError, unions: Mapping[str, Collection[str]] = {}
) -> str:
    """One line per problem: file, dotted field path, message and the value given. ``unions``
    maps a top-level field holding a tagged union to its tags, which are left out of the path
    (design.grid.parameters reads design.parameters)."""
    lines = [f"{source}: invalid configuration"]
    for e in err.errors():
        parts = [str(x) for x in e["loc"]]
        if len(parts) > 1 and parts[1] in unions.get(parts[0], ()):
            del parts[1]
        loc = ".".join(parts) or "(top level)"
        msg = e["msg"].removeprefix("Value error, ")
        shown = (
            e["type"] != "missing"
            and not isinstance(e["input"], dict)
            and len(repr(e["input"])) <= 80
        )
        given = f" (got {e['input']!r})" if shown else ""  # no dumps of whole sections
        lines.append(f"  {loc}: {msg}{given}")
    return "\n".join(lines)


MAX_FILE_BYTES = 2**20  # a configuration file is at most this large
MAX_VALUES = 100_000  # values in a configuration once its YAML aliases are expanded
MAX_DEPTH = 32  # nesting of mappings and lists


def read_mapping(path: str | Path) -> dict:
    """The top-level mapping of a JSON or YAML (.yaml / .yml) file; ConfigError names the file.
    YAML is read with the safe loader (no Python tags); a file over MAX_FILE_BYTES, or whose
    values (aliases expanded) exceed MAX_VALUES or nest deeper than MAX_DEPTH, is refused."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise ConfigError(
                f"{path}: {size} bytes; a configuration file is at most {MAX_FILE_BYTES} bytes"
            )
        text = path.read_text()
    except OSError as err:
        raise ConfigError(f"{path}: cannot be read ({err.strerror})") from None
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from None
    if path.suffix in (".yaml", ".yml"):
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as err:
            raise ConfigError(f"{path}: not valid YAML ({err})") from None
    else:
        try:
            data = json.loads(text)
        except (json.JSONDecodeError, RecursionError) as err:
            raise ConfigError(f"{path}: not valid JSON ({err})") from None
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path}: the top level must be a mapping of sections, got {type(data).__name__}"
        )
    _check_size(data, path)
    return data


def _check_size(data, path: Path) -> None:
    """ConfigError when data holds more than MAX_VALUES values (shared YAML aliases counted at
    every use) or nests deeper than MAX_DEPTH."""
    count, stack = 0, [(data, 1)]
    while stack:
        value, depth = stack.pop()
        count += 1
        if count > MAX_VALUES:
            raise ConfigError(
                f"{path}: more than {MAX_VALUES} values once its aliases are "
                "expanded; a configuration is far smaller"
            )
        if isinstance(value, (dict, list)):
            if depth > MAX_DEPTH:
                raise ConfigError(f"{path}: nested deeper than {MAX_DEPTH} levels")
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for key, item in items:
                if isinstance(key, (dict, list, tuple)):
                    raise ConfigError(f"{path}: a key that is a mapping or a list")
                stack.append((item, depth + 1))


def validate(
    model: type[BaseModel],
    data: dict,
    source: str | Path,
    unions: Mapping[str, Collection[str]] = {},
):
    """model.model_validate(data), with errors turned into a ConfigError naming source and
    fields (:func:`format_errors`). Validators read the source from the context's
    ``source``; a ConfigError they raise, which names its file and fields already, is raised
    as it is."""
    try:
        return model.model_validate(data, context={"source": str(source)})
    except ValidationError as err:
        for e in err.errors():
            if isinstance(e.get("ctx", {}).get("error"), ConfigError):
                raise e["ctx"]["error"] from None
        raise ConfigError(format_errors(str(source), err, unions)) from None
