"""Validated configuration of one simulation (pydantic v2, unknown keys rejected).

Validation happens once, here, before any expensive work; the physics modules then receive
plain frozen parameters (:meth:`Run.cosmology_params`, :meth:`Run.pm_grid`).
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (AfterValidator, BaseModel, ConfigDict, Field, ValidationError, ValidationInfo,
                      field_validator, model_validator)

from pmpipe import cosmology, nbody, painting, parallel, simulation


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


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

    pdims: tuple[int, int] = Field((1, 1), description="devices along x and y, (px, py); px * py devices in all")
    halo_cells: int = Field(8, ge=1, description="halo width in force-mesh cells for particles that left their block")

    @model_validator(mode="after")
    def _positive(self):
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
    steps: int | list[float] = Field(10, description="number of steps linear in a, or the scale factors bounding them")
    snapshots: list[float] = Field(default_factory=list, description="scale factors at which the density is kept (a_final always)")
    dtype: Literal["float32", "float64"] = Field("float32", description="floating point precision")


class Summaries(_Model):
    """Summary statistics of each snapshot."""

    pk_bins: int | None = Field(
        None, ge=1, description="number of linear |k| bins of width 2pi/L from 0 (default: N B / 2, up to the force mesh's Nyquist)")
    compensate_cic: bool = Field(True, description="divide the density modes by the CIC window before P(k)")


class Run(_Model):
    """One simulation: everything needed to produce its ICs, N-body output and summaries."""

    cosmology: Cosmology = Field(default_factory=Cosmology)
    power: Power = Field(default_factory=Power)
    box: Box = Field(default_factory=Box)
    parallel: Parallel = Field(default_factory=Parallel)
    ic: IC = Field(default_factory=IC)
    nbody: NBody = Field(default_factory=NBody)
    summaries: Summaries = Field(default_factory=Summaries)

    @model_validator(mode="after")
    def _consistent(self):
        n, pdims = self.box.particles, self.parallel.pdims
        parallel.check_divisible(n, pdims)
        painting.check_halo_fits(n * self.box.oversample, pdims, self.parallel.halo_cells)
        nbody.step_boundaries(self.ic.a_init, self.nbody.a_final, self.nbody.steps,
                              self.nbody.snapshots)
        if self.power.kind == "table":
            cosmology.load_power_table(self.power.table, *self.k_range())
        elif self.cosmology.T_cmb <= 0:
            raise ValueError(f"cosmology.T_cmb must be > 0 for power.kind {self.power.kind!r} "
                             "(the Eisenstein-Hu transfer function depends on it); use "
                             "power.kind 'table' to run without radiation")
        return self

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

    def pm_grid(self) -> nbody.PMGrid:
        return nbody.PMGrid(self.box.particles, self.box.oversample, self.box.box_size,
                            self.parallel.halo_cells)


def config_hash(run: Run) -> str:
    """sha256 of the run's canonical JSON (sorted keys, no spaces), as 'sha256:<hex>'."""
    text = json.dumps(run.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
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
    def build(cls, campaign: str, run_id: str, index: int, parameters: dict, run: Run) -> "RunFile":
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


def read_mapping(path: str | Path) -> dict:
    """The top-level mapping of a JSON or YAML (.yaml / .yml) file; ConfigError names the file."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as err:
        raise ConfigError(f"{path}: cannot be read ({err.strerror})") from None
    if path.suffix in (".yaml", ".yml"):
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as err:
            raise ConfigError(f"{path}: not valid YAML ({err})") from None
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise ConfigError(f"{path}: not valid JSON ({err})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections, got {type(data).__name__}")
    return data


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


class Execution(_Model):
    """Where and how the runs execute; used for resources and `pmpipe plan`."""

    platform: Literal["cpu", "gpu"] = Field("cpu", description="devices the stages run on")
    device_memory_gb: float = Field(
        16.0, gt=0, description="memory of one device in GB (1e9 bytes); on cpu the memory one "
                                "process may use, all its XLA host devices together")
    devices_per_node: int = Field(
        1, ge=1, description="GPUs per node; on cpu the XLA host devices one process may use")
    cpus_per_task: int = Field(2, ge=1, description="CPU cores per process")
    runtime_safety: float = Field(
        3.0, ge=1, description="factor applied to the runtime estimate in resource requests")


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

    @model_validator(mode="after")
    def _consistent(self):
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
        return self


def load_campaign(path: str | Path) -> Campaign:
    """Read and validate a campaign file (YAML or JSON), every expanded run included."""
    from pmpipe import campaign  # campaign imports this module

    camp = validate(Campaign, read_mapping(path), path)
    campaign.expand(camp, source=str(path))
    return camp
