"""Validated configuration of one simulation (pydantic v2, unknown keys rejected).

Validation happens once, here, before any expensive work; the physics modules then receive
plain frozen parameters (:meth:`Run.cosmology_params`, :meth:`Run.pm_grid`).
"""

from __future__ import annotations

import hashlib
import json
import math
from functools import partial
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from pmpipe import cosmology, nbody, painting, parallel, simulation


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class Cosmology(_Model):
    """Flat ΛCDM / w0waCDM parameters."""

    Omega_m: float = Field(0.3111, gt=0, le=1, description="total matter density today (CDM + baryons), dimensionless")
    Omega_b: float = Field(0.0490, ge=0, lt=1, description="baryon density today, dimensionless; must be < Omega_m")
    h: float = Field(0.6766, gt=0, le=2, description="H0 / (100 km/s/Mpc), dimensionless")
    n_s: float = Field(0.9665, gt=0, le=2, description="primordial spectral index, dimensionless")
    sigma8: float = Field(0.8102, gt=0, le=5, description="rms linear overdensity in 8 Mpc/h spheres at a = 1")
    w0: float = Field(-1.0, ge=-3, le=0, description="dark energy equation of state today")
    wa: float = Field(0.0, ge=-3, le=3, description="CPL evolution of w: w(a) = w0 + wa (1 - a)")
    T_cmb: float = Field(2.7255, ge=0, le=10, description="CMB temperature in K (0: no radiation)")
    N_eff: float = Field(3.046, ge=0, le=10, description="effective number of massless neutrino species")

    @model_validator(mode="after")
    def _baryons_below_matter(self):
        if self.Omega_b >= self.Omega_m:
            raise ValueError(
                f"cosmology.Omega_b = {self.Omega_b} must be smaller than cosmology.Omega_m = {self.Omega_m}"
            )
        return self

    def params(self) -> cosmology.Cosmology:
        return cosmology.Cosmology(**self.model_dump())


class Power(_Model):
    """Linear matter power spectrum at a = 1."""

    kind: Literal["eisenstein_hu", "eisenstein_hu_nowiggle", "table"] = Field(
        "eisenstein_hu", description="Eisenstein & Hu (1998) fit with or without BAO, normalised to sigma8, or a table")
    table: Path | None = Field(
        None, description="file of k [h/Mpc] and P(k) [(Mpc/h)^3] columns as CAMB / CLASS write them (kind 'table')")

    @model_validator(mode="after")
    def _table_given(self):
        if (self.kind == "table") != (self.table is not None):
            raise ValueError("power.table must be given exactly when power.kind is 'table'")
        return self


class Box(_Model):
    """Simulation volume and resolution."""

    box_size: float = Field(256.0, gt=0, description="comoving side of the periodic box in Mpc/h")
    particles: int = Field(64, ge=4, le=16384, description="particles per side (N^3 in total)")
    oversample: int = Field(1, ge=1, le=4, description="force mesh cells per particle spacing, B (mesh = B N per side)")


class Parallel(_Model):
    """Decomposition over devices."""

    pdims: tuple[int, int] | Literal["auto"] = Field(
        (1, 1), description="devices along x and y, (px, py); px * py devices in all; 'auto' "
                            "in a campaign's base: chosen from recorded sweeps (its "
                            "decomposition section)")
    halo_cells: int = Field(8, ge=1, description="halo width in force-mesh cells for particles that left their block")

    @model_validator(mode="after")
    def _positive(self):
        if self.pdims == "auto":
            raise ValueError("parallel.pdims 'auto' is chosen for a campaign's runs (base.parallel "
                             "with a decomposition section: devices, file); a run needs (px, py)")
        if min(self.pdims) < 1:
            raise ValueError(f"parallel.pdims must be positive integers, got {self.pdims}")
        return self


class IC(_Model):
    """Initial conditions."""

    seed: int = Field(0, ge=0, description="seed of the white noise (same seed, same universe on any device mesh)")
    a_init: float = Field(0.1, gt=0, lt=1, description="scale factor of the LPT initial conditions")
    lpt_order: Literal[1, 2] = Field(2, description="Lagrangian perturbation theory order")
    fixed_amplitude: bool = Field(False, description="set every |delta_k| to its mean (Angulo & Pontzen 2016)")
    paired: bool = Field(False, description="invert the phases (the partner of a pair)")


class NBody(_Model):
    """Particle-mesh evolution."""

    a_final: float = Field(1.0, gt=0, le=1, description="scale factor at the end of the run")
    steps: int | list[float] = Field(10, description="number of steps, or the scale factors bounding them")
    spacing: Literal[nbody.STEP_SPACINGS] = Field(
        "a", description="what a number of steps is equally spaced in: the scale factor a, ln a, "
        "or the linear growth factor D1 (docs/validation.md gives the accuracy of each)")
    snapshots: list[float] = Field(default_factory=list, description="scale factors at which the density is kept (a_final always)")
    dtype: Literal["float32", "float64"] = Field("float32", description="floating point precision")


NAME_PATTERN_SOURCE = r"^[A-Za-z0-9][A-Za-z0-9_.=-]*$"


class Lightcone(_Model):
    """Planes of the past light cone, captured during the N-body (pmpipe.lightcone)."""

    z_max: float = Field(1.0, gt=0, le=20, description="largest source redshift: planes reach at least the comoving distance of z_max")
    plane_thickness: float | None = Field(
        None, gt=0, description="comoving thickness of a plane in Mpc/h: a whole number of force-mesh cells, at most box.box_size (default box_size: a slab one box thick holds Limber's projection exactly; thinner planes lose power at low multipoles, docs/validation.md)")
    observer: tuple[float, float, float] = Field(
        (0.0, 0.0, 0.0), description="observer's position in the box, Mpc/h; the flat-sky line of sight is the observer's z axis")
    randomize: bool = Field(True, description="rotate and shift the box at random for every plane (seeded by ic.seed)")


class FlatSky(_Model):
    """Square flat-sky maps around the line of sight."""

    field_of_view: float = Field(5.0, gt=0, le=60, description="side of the map in degrees")
    pixels: int = Field(128, ge=8, le=16384, description="pixels per side")


def _power_of_two(n: int) -> int:
    if n & (n - 1):
        raise ValueError(f"nside must be a power of two (1, 2, 4, ..., 2048), got {n}")
    return n


class FullSky(_Model):
    """Full-sky HEALPix maps (RING ordering)."""

    nside: Annotated[int, AfterValidator(_power_of_two)] = Field(
        64, ge=1, le=2048, description="HEALPix resolution parameter, a power of two (the shells' "
        "rays are traced on a finer grid, whose pixel indices are int32)")


class SmailSources(_Model):
    """Parametric n(z) ∝ z^alpha exp(-(z/z0)^beta) (Smail et al. 1994), cut at lightcone.z_max."""

    kind: Literal["smail"]
    name: str = Field(pattern=NAME_PATTERN_SOURCE, description="label of the distribution in the stores")
    z0: float = Field(gt=0, description="redshift scale")
    alpha: float = Field(2.0, ge=0, description="power-law index at low z")
    beta: float = Field(1.5, gt=0, description="exponential cut-off index")


class TableSources(_Model):
    """Tabulated n(z): redshifts and densities of any normalisation."""

    kind: Literal["table"]
    name: str = Field(pattern=NAME_PATTERN_SOURCE, description="label of the distribution in the stores")
    z: list[float] = Field(description="increasing redshifts, from >= 0")
    n: list[float] = Field(description="n(z) >= 0 at those redshifts, not all zero")

    @model_validator(mode="after")
    def _valid_table(self):
        if len(self.z) < 2 or len(self.z) != len(self.n):
            raise ValueError(f"empty or short n(z) table '{self.name}': give z and n of equal "
                             f"length >= 2 (got {len(self.z)} and {len(self.n)})")
        if self.z[0] < 0 or any(b <= a for a, b in zip(self.z, self.z[1:])):
            raise ValueError(f"n(z) table '{self.name}': z must be increasing from >= 0")
        if min(self.n) < 0 or max(self.n) <= 0:
            raise ValueError(f"n(z) table '{self.name}' is empty: n must be >= 0 and not all zero")
        return self


class Lensing(_Model):
    """Born convergence and shear maps from the lightcone planes (pmpipe.lensing)."""

    source_redshifts: list[float] = Field(
        default_factory=lambda: [1.0], description="redshifts of single source planes (delta-function n(z))")
    distributions: list[Annotated[SmailSources | TableSources, Field(discriminator="kind")]] = Field(
        default_factory=list, description="source redshift distributions: kind smail or table")
    flat_sky: FlatSky | None = Field(default_factory=FlatSky, description="flat-sky maps (null: none)")
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


class ShapeNoise(_Model):
    """Gaussian shape noise added to κ before smoothing."""

    sigma_e: float = Field(0.26, gt=0, description="ellipticity dispersion per component")
    n_gal: float = Field(30.0, gt=0, description="galaxies per square arcminute")


class Summaries(_Model):
    """Summary statistics of each snapshot and of the lensing maps."""

    pk_bins: int | None = Field(
        None, ge=1, description="number of linear |k| bins of width 2pi/L from 0 (default: N B / 2, up to the force mesh's Nyquist)")
    compensate_cic: bool = Field(True, description="divide the density modes by the CIC window before P(k)")
    ell_bins: int = Field(12, ge=1, description="logarithmic multipole bins of C_ell between the map's fundamental and Nyquist multipoles")
    smoothing_arcmin: list[float] = Field(
        default_factory=lambda: [2.0, 5.0], min_length=1, description="Gaussian smoothing scales (sigma, arcmin) of kappa for peaks and PDF; 0: none")
    kappa_range: tuple[float, float] = Field((-0.05, 0.15), description="[low, high] of the kappa bins of peaks and PDF")
    kappa_bins: int = Field(40, ge=1, description="number of linear kappa bins of peaks and PDF")
    shape_noise: ShapeNoise | None = Field(None, description="shape noise added before smoothing (null: none)")

    @model_validator(mode="after")
    def _valid(self):
        if not self.kappa_range[0] < self.kappa_range[1]:
            raise ValueError(f"summaries.kappa_range must be [low, high] with low < high, got {list(self.kappa_range)}")
        if min(self.smoothing_arcmin) < 0:
            raise ValueError("summaries.smoothing_arcmin values must be >= 0")
        return self


class Outputs(_Model):
    """What a run's stores keep. Summaries are always written; the ICs can always be made
    again from the seed and the config. A field that is not stored still reaches the later
    stages of the run when they run in the same process (``pmpipe run all``, the workflow)."""

    particles: bool = Field(True, description="final displacement and momentum in nbody.zarr")
    density: Literal["full", "none"] | Annotated[int, Field(ge=2)] = Field(
        "full", description="snapshot densities in nbody.zarr: full (the force mesh), none, or "
                            "an integer factor f >= 2 (means over f^3 cells)")
    ic: Literal["all", "linear", "none"] = Field(
        "all", description="ic.zarr: all (linear density, displacement, momentum), linear "
                           "(the linear density), none (seed and config only)")
    lightcone: bool = Field(True, description="lightcone planes in nbody.zarr and convergence "
                                              "and shear maps in lensing.zarr")
    keepbits: int | None = Field(
        None, ge=1, le=23, description="lossy compression of large float arrays: keep this many "
                                       "mantissa bits (bit rounding, then zstd); null: exact")


class Checkpoints(_Model):
    """Checkpoints of the N-body (pmpipe.checkpoint): its state, step and what it captured so
    far, written every few steps or minutes and on SIGTERM / SIGUSR2, so that a killed or
    preempted run resumes where it stopped. The steps then run one program call each."""

    every_steps: int | None = Field(None, ge=1, description="write one every this many steps")
    every_minutes: float | None = Field(
        None, gt=0, description="write one after the step that ends this many minutes after the "
                                "last one (or the start)")
    keep: bool = Field(False, description="keep the last checkpoint once nbody.zarr is complete")

    @model_validator(mode="after")
    def _some_schedule(self):
        if self.every_steps is None and self.every_minutes is None:
            raise ValueError("checkpoints needs every_steps or every_minutes (or both); "
                             "checkpoints: null turns them off")
        return self


class Run(_Model):
    """One simulation: everything needed to produce its ICs, N-body output and summaries."""

    cosmology: Cosmology = Field(default_factory=Cosmology)
    power: Power = Field(default_factory=Power)
    box: Box = Field(default_factory=Box)
    parallel: Parallel = Field(default_factory=Parallel)
    ic: IC = Field(default_factory=IC)
    nbody: NBody = Field(default_factory=NBody)
    summaries: Summaries = Field(default_factory=Summaries)
    lightcone: Lightcone | None = Field(None, description="lightcone planes captured during the N-body (null: none)")
    lensing: Lensing | None = Field(None, description="convergence and shear maps from the planes (null: none); needs lightcone")
    outputs: Outputs = Field(default_factory=Outputs, description="what the stores keep")
    checkpoints: Checkpoints | None = Field(
        None, description="N-body checkpoints (null: none; a signal then ends the run without "
                          "one). Not part of the config hash: they change where a run may stop, "
                          "not what it computes")

    @model_validator(mode="after")
    def _consistent(self):
        n, pdims = self.box.particles, self.parallel.pdims
        parallel.check_divisible(n, pdims)
        painting.check_halo_fits(n * self.box.oversample, pdims, self.parallel.halo_cells)
        self.step_boundaries()
        if self.power.kind == "table":
            cosmology.load_power_table(self.power.table, *self.k_range())
        elif self.cosmology.T_cmb <= 0:
            raise ValueError(f"cosmology.T_cmb must be > 0 for power.kind {self.power.kind!r} "
                             "(the Eisenstein-Hu transfer function depends on it); use "
                             "power.kind 'table' to run without radiation")
        factor = self.outputs.density
        if isinstance(factor, int) and any((n * self.box.oversample) % (factor * p) for p in pdims):
            raise ValueError(f"outputs.density = {factor} must divide the force mesh's block on "
                             f"every device: {n * self.box.oversample} cells per side over "
                             f"parallel.pdims = {tuple(pdims)}")
        if self.lightcone is not None:
            self._check_lightcone()
        elif self.lensing is not None:
            raise ValueError("lensing needs lightcone planes: add a lightcone section")
        return self

    def plane_thickness(self) -> float:
        """Comoving thickness of a lightcone plane in Mpc/h."""
        return self.lightcone.plane_thickness or self.box.box_size

    def plane_cells(self) -> int:
        """Force-mesh cells across a lightcone plane."""
        return round(self.plane_thickness() / (self.box.box_size / self.pm_grid().mesh))

    def planes(self):
        """The lightcone's planes (pmpipe.lightcone.Planes)."""
        from pmpipe import lightcone

        return lightcone.plane_geometry(self.cosmology_params(), self.lightcone.z_max, self.plane_thickness())

    def shell_band_limits(self, planes=None) -> np.ndarray:
        """Band limit (h/Mpc) of each plane's full-sky shell (pmpipe.lightcone.shell_band_limits
        for this box, mesh and nside)."""
        from pmpipe import lightcone

        planes = self.planes() if planes is None else planes
        grid = self.pm_grid()
        return lightcone.shell_band_limits(
            planes.chi_edges[1:],
            lightcone.shell_k_max(grid.particles, grid.mesh, self.box.box_size),
            lightcone.rays_nside(self.lensing.full_sky.nside))

    def _check_lightcone(self) -> None:
        """Plane thickness, time span and map geometry, before any work (errors name fields)."""
        box, cell = self.box.box_size, self.box.box_size / self.pm_grid().mesh
        thickness = self.plane_thickness()
        if thickness > box * (1 + 1e-9) or abs(thickness / cell - round(thickness / cell)) > 1e-6 or thickness < cell:
            raise ValueError(f"lightcone.plane_thickness = {thickness} Mpc/h must be a whole number of "
                             f"force-mesh cells ({cell:g} Mpc/h) between {cell:g} and box.box_size = {box}")
        if abs(self.nbody.a_final - 1.0) > 1e-9:
            raise ValueError(f"a lightcone needs nbody.a_final = 1 (the observer is at z = 0), got {self.nbody.a_final}")
        planes = self.planes()
        chi_far = float(planes.chi_edges[-1])
        if float(planes.a[-1]) <= self.ic.a_init:
            raise ValueError(f"lightcone.z_max = {self.lightcone.z_max} reaches back before the initial "
                             f"conditions (ic.a_init = {self.ic.a_init}); lower z_max or a_init")
        if self.lensing is None:
            return
        lens = self.lensing
        for z in lens.source_redshifts:
            if z > self.lightcone.z_max:
                raise ValueError(f"lensing.source_redshifts value {z} lies beyond the lightcone "
                                 f"(lightcone.z_max = {self.lightcone.z_max})")
        for d in lens.distributions:
            if d.kind == "table" and any(n > 0 and z > self.lightcone.z_max for z, n in zip(d.z, d.n)):
                raise ValueError(f"lensing.distributions '{d.name}' has sources beyond the lightcone "
                                 f"(n > 0 at z > lightcone.z_max = {self.lightcone.z_max})")
        if lens.flat_sky is not None:
            fov = math.radians(lens.flat_sky.field_of_view)
            if chi_far * fov > box:
                widest = math.degrees(box / chi_far)
                raise ValueError(
                    f"lensing.flat_sky.field_of_view = {lens.flat_sky.field_of_view} deg is wider than the "
                    f"box allows: at the first plane the light cone crosses (the farthest, chi = "
                    f"{chi_far:.0f} Mpc/h) it spans {chi_far * fov:.0f} Mpc/h > box.box_size = {box}; "
                    f"use at most {widest:.2f} deg, a larger box or a lower lightcone.z_max")

    def k_range(self) -> tuple[float, float]:
        """Smallest and largest |k| (h/Mpc) of the particle grid's modes."""
        k_f = 2 * math.pi / self.box.box_size
        return k_f, math.sqrt(3) * k_f * (self.box.particles // 2)

    def cosmology_params(self) -> cosmology.Cosmology:
        return self.cosmology.params()

    def linear_power(self):
        """Linear P(k) at a = 1 [(Mpc/h)^3] as a callable of k [h/Mpc]."""
        table = None
        if self.power.kind == "table":
            table = cosmology.load_power_table(self.power.table, *self.k_range())
        return simulation.power_function(self.cosmology_params(), self.power.kind, table)

    def step_boundaries(self) -> np.ndarray:
        """Scale factors bounding the N-body's steps, snapshots included
        (pmpipe.nbody.step_boundaries)."""
        growth = None
        if self.nbody.spacing == "growth" and isinstance(self.nbody.steps, int):
            cosmo = self.cosmology_params()
            table = cosmology.growth_table(cosmo)
            growth = partial(cosmology.on_host, cosmology.growth_factor, cosmo, table=table)
        return nbody.step_boundaries(self.ic.a_init, self.nbody.a_final, self.nbody.steps,
                                     self.nbody.snapshots, self.nbody.spacing, growth)

    def pm_grid(self) -> nbody.PMGrid:
        return nbody.PMGrid(self.box.particles, self.box.oversample, self.box.box_size,
                            self.parallel.halo_cells)


def config_hash(run: Run) -> str:
    """sha256 of the run's canonical JSON (sorted keys, no spaces; the checkpoints section
    left out), as 'sha256:<hex>'."""
    text = json.dumps(run.model_dump(mode="json", exclude={"checkpoints"}), sort_keys=True,
                      separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


class RunFile(_Model):
    """Content of ``results/<campaign>/<run_id>/config.json``: one resolved run of a campaign."""

    campaign: str = Field(description="campaign name")
    run_id: str = Field(description="stable id: campaign name + position in the design")
    index: int = Field(ge=0, description="position of the run in the expanded design")
    parameters: dict[str, float] = Field(default_factory=dict, description="design parameters of this run (cosmology field names)")
    config: Run = Field(description="the resolved run configuration")
    config_hash: str = Field(description="config_hash(config): 'sha256:<hex>'")

    @model_validator(mode="after")
    def _hash_matches(self):
        expected = config_hash(self.config)
        if self.config_hash != expected:
            raise ValueError(f"config_hash {self.config_hash!r} does not match the config ({expected}); "
                             "the file was edited by hand: regenerate it from the campaign")
        return self

    @classmethod
    def build(cls, campaign: str, run_id: str, index: int, parameters: dict, run: Run) -> RunFile:
        return cls(campaign=campaign, run_id=run_id, index=index, parameters=parameters,
                   config=run, config_hash=config_hash(run))

    def to_json(self) -> str:
        return json.dumps(self.model_dump(mode="json"), indent=2, sort_keys=True) + "\n"


class ConfigError(ValueError):
    """A configuration file that does not validate; the message names file and fields."""


def format_errors(source: str, err: ValidationError) -> str:
    """One line per problem: file, dotted field path, message and the value given."""
    lines = [f"{source}: invalid configuration"]
    for e in err.errors():
        parts = [str(x) for x in e["loc"]]
        if parts[:1] == ["design"] and len(parts) > 1:  # drop the union tag: design.grid.x -> design.x
            parts = [p for i, p in enumerate(parts) if not (i == 1 and p in DESIGN_KINDS)]
        loc = ".".join(parts) or "(top level)"
        msg = e["msg"].removeprefix("Value error, ")
        shown = e["type"] != "missing" and not isinstance(e["input"], dict) and len(repr(e["input"])) <= 80
        given = f" (got {e['input']!r})" if shown else ""  # no dumps of whole sections
        lines.append(f"  {loc}: {msg}{given}")
    return "\n".join(lines)


MAX_FILE_BYTES = 2**20   # a configuration file is at most this large
MAX_VALUES = 100_000      # values in a configuration once its YAML aliases are expanded
MAX_DEPTH = 32            # nesting of mappings and lists


def read_mapping(path: str | Path) -> dict:
    """The top-level mapping of a JSON or YAML (.yaml / .yml) file; ConfigError names the file.
    YAML is read with the safe loader (no Python tags); a file over MAX_FILE_BYTES, or whose
    values (aliases expanded) exceed MAX_VALUES or nest deeper than MAX_DEPTH, is refused."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise ConfigError(f"{path}: {size} bytes; a configuration file is at most "
                              f"{MAX_FILE_BYTES} bytes")
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
        raise ConfigError(f"{path}: the top level must be a mapping of sections, got {type(data).__name__}")
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
            raise ConfigError(f"{path}: more than {MAX_VALUES} values once its aliases are "
                              "expanded; a configuration is far smaller")
        if isinstance(value, (dict, list)):
            if depth > MAX_DEPTH:
                raise ConfigError(f"{path}: nested deeper than {MAX_DEPTH} levels")
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for key, item in items:
                if isinstance(key, (dict, list, tuple)):
                    raise ConfigError(f"{path}: a key that is a mapping or a list")
                stack.append((item, depth + 1))


def validate(model: type[BaseModel], data: dict, source: str | Path):
    """model.model_validate(data), with errors turned into a ConfigError naming source and fields."""
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_errors(str(source), err)) from None


def load_run(path: str | Path) -> Run:
    """Read and validate a run configuration from JSON or YAML."""
    return validate(Run, read_mapping(path), path)


def load_run_file(path: str | Path) -> RunFile:
    """Read and validate a run's config.json as written for a campaign."""
    return validate(RunFile, read_mapping(path), path)


# ---------------------------------------------------------------------------------------------
# Campaigns: a design of runs (pmpipe.campaign expands them)

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
DESIGN_KINDS = ("fiducial", "grid", "latin_hypercube", "sobol", "derivatives", "list")
DESIGN_PARAMETERS = tuple(Cosmology.model_fields)  # design parameters are cosmology fields
ParameterName = Literal[DESIGN_PARAMETERS]  # type: ignore[valid-type]


def _not_empty(parameters: dict) -> dict:
    if not parameters:
        raise ValueError("empty design: name at least one cosmology parameter "
                         f"({', '.join(DESIGN_PARAMETERS)})")
    return parameters


def _increasing(bounds: tuple[float, float]) -> tuple[float, float]:
    if not bounds[0] < bounds[1]:
        raise ValueError("parameter range inverted or empty: give [low, high] with low < high")
    return bounds


def _positive_step(step: float) -> float:
    if not step > 0:
        raise ValueError("the derivative step must be > 0")
    return step


Values = Annotated[list[float], Field(min_length=1)]
Range = Annotated[tuple[float, float], AfterValidator(_increasing)]
Step = Annotated[float, AfterValidator(_positive_step)]


class FiducialDesign(_Model):
    """One point: the base configuration."""

    kind: Literal["fiducial"]


class GridDesign(_Model):
    """Cartesian product of parameter values."""

    kind: Literal["grid"]
    parameters: Annotated[dict[ParameterName, Values], AfterValidator(_not_empty)] = Field(
        description="values of each cosmology parameter (its units); every combination is a "
                    "design point, the last parameter varying fastest")


class SampledDesign(_Model):
    """Quasi-random samples (scipy.stats.qmc, scrambled, seeded by the campaign seed) in a box
    of parameter ranges."""

    kind: Literal["latin_hypercube", "sobol"]
    parameters: Annotated[dict[ParameterName, Range], AfterValidator(_not_empty)] = Field(
        description="[low, high] range of each cosmology parameter (its units)")
    samples: int = Field(ge=1, description="number of design points (a power of 2 for sobol)")

    @field_validator("samples")
    @classmethod
    def _sobol_power_of_two(cls, samples: int, info: ValidationInfo) -> int:
        if info.data.get("kind") == "sobol" and samples & (samples - 1):
            low = 1 << (samples.bit_length() - 1)
            raise ValueError(f"Sobol samples must be a power of 2 for the sequence's balance "
                             f"properties: use {low} or {2 * low}, or kind latin_hypercube")
        return samples


class DerivativesDesign(_Model):
    """Fiducial point plus, for each parameter, a minus and a plus point (central differences);
    all points share the fiducial seeds."""

    kind: Literal["derivatives"]
    parameters: Annotated[dict[ParameterName, Step], AfterValidator(_not_empty)] = Field(
        description="step of each cosmology parameter (its units): points at fiducial - step "
                    "and fiducial + step")


class Point(_Model):
    """A named design point."""

    name: str = Field(pattern=NAME_PATTERN, description="point label used in the run id")
    parameters: dict[ParameterName, float] = Field(
        default_factory=dict, description="cosmology parameters of the point (their units); "
                                          "the others come from base.cosmology")


class ListDesign(_Model):
    """Explicit, named points."""

    kind: Literal["list"]
    points: list[Point] = Field(min_length=1, description="the design points, each with a unique name")

    @field_validator("points")
    @classmethod
    def _unique(cls, points: list[Point]) -> list[Point]:
        names = [p.name for p in points]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"duplicate point name(s) {', '.join(duplicates)} would give "
                             "duplicate run ids; every point needs its own name")
        return points


# Runs per job by platform. One process compiles once for all its runs, so larger groups
# amortise start-up and compilation (about 10 s a process on 2 CPU cores); smaller groups lose
# less work to a failed job and let a campaign spread over more nodes. A 256^3 run takes
# seconds on a GPU, so 16 of them still make a job of minutes; on CPU 8 runs of 64^3 do.
RUNS_PER_JOB = {"cpu": 8, "gpu": 16}


# What a calibration record (`pmpipe bench nbody --json`) must hold: the configuration measured
# and its step time and peak memory (device_peak_bytes on gpu, peak_rss_bytes on cpu).
CALIBRATION_FIELDS = ("platform", "mesh", "oversample", "pdims", "halo", "steps", "step_s",
                      "peak_rss_bytes")


class Execution(_Model):
    """Where and how the runs execute; used for resources and `pmpipe plan`."""

    platform: Literal["cpu", "gpu"] = Field("cpu", description="devices the stages run on")
    device_memory_gb: float = Field(
        16.0, gt=0, description="memory of one device in GB (1e9 bytes); on cpu the memory one "
                                "process may use, all its XLA host devices together")
    devices_per_node: int = Field(
        1, ge=1, description="GPUs per node; on cpu the XLA host devices one process may use")
    processes_per_node: int | None = Field(
        None, ge=1, description="processes (srun tasks) per node, each holding an equal share of "
                                "the node's devices: on gpu one per GPU by default, or 1 for "
                                "one process that drives every GPU of its node; on cpu 1 by "
                                "default (one process holds every host device)")
    cpus_per_task: int = Field(2, ge=1, description="CPU cores per process")
    runtime_safety: float = Field(
        3.0, ge=1, description="factor applied to the runtime estimate in resource requests")
    runs_per_job: int | None = Field(
        None, ge=1, description="runs packed into one job and one process, every stage of each "
                                "(default: 8 on cpu, 16 on gpu); runs are grouped by their "
                                "position in the design")
    calibration: Path | None = Field(
        None, description="a `pmpipe bench nbody --json` record measured on this platform: the "
                          "runtime and memory model is scaled to its step time and peak memory "
                          "(device memory on gpu, the process's on cpu)")
    _calibration_record: dict | None = PrivateAttr(None)

    @model_validator(mode="after")
    def _read_calibration(self):
        if self.calibration is None:
            return self
        record = read_mapping(self.calibration)
        measured = "gpu" if record.get("platform") in ("gpu", "cuda", "rocm") else record.get("platform")
        if measured != self.platform:
            raise ValueError(f"execution.calibration {self.calibration} was measured on "
                             f"{record.get('platform')}, execution.platform is {self.platform}")
        needed = CALIBRATION_FIELDS + (("device_peak_bytes",) if self.platform == "gpu" else ())
        missing = [k for k in needed if record.get(k) is None]
        if missing:
            raise ValueError(f"execution.calibration {self.calibration}: the record lacks "
                             f"{', '.join(missing)}; write it with `pmpipe bench nbody --json` "
                             f"on the {self.platform} platform")
        self._calibration_record = record
        return self

    @property
    def calibration_record(self) -> dict | None:
        """The bench record of ``calibration``, validated (None without one)."""
        return self._calibration_record

    def node_layout(self, devices: int) -> tuple[int, int]:
        """(processes per node, devices per process) of a run on ``devices`` devices; raises
        ValueError when the processes cannot hold equal shares of a node's devices."""
        gpu = self.platform == "gpu"
        on_node = min(devices, self.devices_per_node) if gpu else devices
        processes = min(on_node, self.processes_per_node or (on_node if gpu else 1))
        if on_node % processes:
            raise ValueError(
                f"execution.processes_per_node = {self.processes_per_node} with {on_node} "
                f"devices on a node: each process holds an equal share of its node's devices; "
                f"choose a divisor of {on_node}")
        return processes, on_node // processes

    def job_size(self) -> int:
        """Runs per job: runs_per_job, else the platform's default (RUNS_PER_JOB)."""
        return self.runs_per_job or RUNS_PER_JOB[self.platform]


class Decomposition(_Model):
    """base.parallel.pdims chosen for a device count by measurement (pmpipe.decomposition)."""

    devices: int = Field(ge=1, description="devices of every run, px * py")
    file: Path | None = Field(
        None, description="decomposition file kept with the site settings (e.g. "
                          "profiles/<site>/decompositions.yaml), written by `pmpipe tune`; "
                          "without one, or without a sweep of these devices, pdims are guessed")


class Campaign(_Model):
    """A suite of runs: a base configuration, a design that varies cosmology parameters,
    realisations (seeds) per point, and the execution platform."""

    name: str = Field(pattern=NAME_PATTERN, description="campaign name: results/<name>/, run ids <name>-<point>-r<i>")
    seed: int = Field(0, ge=0, description="campaign seed; run seeds derive from it and the run's position")
    base: Run = Field(default_factory=Run, description="configuration shared by every run; "
                                                       "base.ic.seed stays unset (seeds are derived)")
    design: FiducialDesign | GridDesign | SampledDesign | DerivativesDesign | ListDesign = Field(
        default_factory=lambda: FiducialDesign(kind="fiducial"), discriminator="kind",
        description="how the runs vary: fiducial, grid, latin_hypercube, sobol, derivatives, list")
    realisations: int = Field(1, ge=1, description="seeds (independent white-noise fields) per design point")
    common_seeds: bool = Field(False, description="every design point uses the same realisation seeds (always so for derivatives)")
    paired: bool = Field(False, description="each realisation also runs with inverted phases (Angulo & Pontzen 2016)")
    execution: Execution = Field(default_factory=Execution)
    decomposition: Decomposition | None = Field(
        None, description="choose base.parallel.pdims for this many devices from recorded "
                          "sweeps (pmpipe tune) instead of giving them")
    _pdims_source: str = PrivateAttr("given")

    @property
    def pdims_source(self) -> str:
        """How base.parallel.pdims were chosen: 'given', or pmpipe.decomposition.choose's
        'recorded', 'nearest' or 'guessed'."""
        return self._pdims_source

    @model_validator(mode="before")
    @classmethod
    def _auto_pdims(cls, data):
        """base.parallel.pdims 'auto' is left out of the base run, to be chosen (_choose_pdims)."""
        base = data.get("base") if isinstance(data, dict) else None
        parallel = base.get("parallel") if isinstance(base, dict) else None
        if not isinstance(parallel, dict) or parallel.get("pdims") != "auto":
            return data
        if not data.get("decomposition"):
            raise ValueError("base.parallel.pdims 'auto' needs a decomposition section: devices "
                             "(and file, the sweeps recorded by `pmpipe tune`)")
        rest = {k: v for k, v in parallel.items() if k != "pdims"}
        return {**data, "base": {**base, "parallel": rest}}

    @model_validator(mode="after")
    def _consistent(self):
        if self.decomposition is not None:
            self._choose_pdims()
        if self.base.ic.seed != 0:
            raise ValueError("base.ic.seed must not be set: run seeds derive from the campaign "
                             "seed and the run's position; change 'seed' instead")
        if self.base.ic.paired:
            raise ValueError("base.ic.paired must not be set: use 'paired: true' at the top level")
        devices = self.base.parallel.pdims[0] * self.base.parallel.pdims[1]
        if self.execution.platform == "cpu" and devices > self.execution.devices_per_node:
            raise ValueError(
                f"base.parallel.pdims needs {devices} devices but execution.devices_per_node = "
                f"{self.execution.devices_per_node} on cpu (one process); raise devices_per_node "
                "or use fewer devices")
        self.execution.node_layout(devices)
        return self

    def _choose_pdims(self) -> None:
        from pmpipe import decomposition

        if "pdims" in self.base.parallel.model_fields_set:
            raise ValueError("base.parallel.pdims are given and so is a decomposition section: "
                             "set base.parallel.pdims to 'auto' or remove the section")
        box, par = self.base.box, self.base.parallel
        pdims, source = decomposition.choose(self.decomposition.devices, box.particles,
                                             box.oversample, par.halo_cells, self.decomposition.file)
        base = self.base.model_dump()
        base["parallel"]["pdims"] = pdims
        object.__setattr__(self, "base", Run.model_validate(base))
        self._pdims_source = source


def load_campaign(path: str | Path) -> Campaign:
    """Read and validate a campaign file (YAML or JSON), every expanded run included."""
    from pmpipe import campaign  # campaign imports this module

    camp = validate(Campaign, read_mapping(path), path)
    campaign.expand(camp, source=str(path))
    return camp
