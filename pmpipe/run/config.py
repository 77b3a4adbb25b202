"""Configuration of one simulation: the pydantic v2 models of a run (unknown keys rejected),
its hash and its file in a campaign; the sections of what a run observes are
:mod:`pmpipe.run.observables`', those of what it writes :mod:`pmpipe.run.outputs`', and
reading files and their errors :mod:`pmpipe.run.files`' (their names are at hand here too).

This module checks what a configuration says on its own; it imports no JAX (from the physics
only the host facts it validates against: the fiducial cosmology, P(k) kinds, step spacings).
The checks that need a run's physics (distances, step times, the P(k) table, the device split)
are :mod:`pmpipe.run.validation`'s, and the physics inputs are built from a validated run by
:mod:`pmpipe.run.derive`.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, WithJsonSchema, field_validator, model_validator

from pmpipe.physics.evolution.timesteps import StepSpacing
from pmpipe.physics.theory.boltzmann_tables import NU_A_MIN
from pmpipe.physics.theory.power_table import BOLTZMANN_KINDS, PowerKind
from pmpipe.run.files import (
    ConfigError,
    StrictModel,
    format_errors,
    invalid,
    read_mapping,
    section,
    validate,
)
from pmpipe.run.observables import (
    Baryons,
    Lensing,
    Lightcone,
    SmailSources,
    Summaries,
    TableSources,
)
from pmpipe.run.outputs import PREVIEW_CELLS, Checkpoints, Outputs
from pmpipe.run.universe import Cosmology

# the run's models, and the names of files and observables a configuration's reader needs
__all__ = [
    "IC",
    "PDIMS_SCHEMA",
    "Baryons",
    "Box",
    "Checkpoints",
    "ConfigError",
    "Cosmology",
    "Lensing",
    "Lightcone",
    "NBody",
    "Outputs",
    "Parallel",
    "Power",
    "Run",
    "RunFile",
    "SmailSources",
    "StrictModel",
    "Summaries",
    "TableSources",
    "config_hash",
    "format_errors",
    "invalid",
    "read_mapping",
    "section",
    "validate",
]


class Power(StrictModel):
    """Linear matter power spectrum at a = 1."""

    kind: PowerKind = Field(
        "eisenstein_hu",
        description="Eisenstein & Hu (1998) fit with or without BAO, normalised to sigma8; "
        "CAMB or CLASS at the run's cosmology, normalised to sigma8 or A_s; or a table",
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


# pdims in files: (px, py), or 'auto' in a campaign's base (pmpipe.campaigns.campaign chooses them)
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
    halo_cells: Annotated[int, Field(ge=1)] | Literal["auto"] = Field(
        "auto",
        description="halo width in force-mesh cells for particles that left their block; "
        "'auto': from the run's linear rms displacement at nbody.a_final (a campaign: the "
        "largest over its design)",
    )
    backend: Literal["jax", "cudecomp"] = Field(
        "jax",
        description="jaxdecomp's backend of the distributed FFTs: 'jax' (JAX's collectives, any "
        "build); 'cudecomp' (NVIDIA cuDecomp's transposes) is refused, with why and what a site "
        "build needs (docs/slurm.md)",
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


# More PM steps than any run needs (a 64^3 run of this many steps takes hours on a GPU): the
# bound refuses a mistyped count before its time grid is allocated.
MAX_STEPS = 100_000
MAX_ALIGNMENT_THICKNESS = 100.0  # Mpc/h: thickest planes that resolve a source n(z)


class NBody(StrictModel):
    """Particle-mesh evolution."""

    a_final: float = Field(1.0, gt=0, le=1, description="scale factor at the end of the run")
    steps: int | list[float] = Field(
        10,
        description=f"number of steps (1 to {MAX_STEPS}), or the scale factors bounding them "
        f"(at most {MAX_STEPS + 1})",
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

    @field_validator("steps")
    @classmethod
    def _steps_bounded(cls, steps):
        if isinstance(steps, int) and not 1 <= steps <= MAX_STEPS:
            raise ValueError(f"a number of steps must be 1 to {MAX_STEPS}, not {steps}")
        if isinstance(steps, list) and len(steps) > MAX_STEPS + 1:
            raise ValueError(f"at most {MAX_STEPS + 1} scale factors, not {len(steps)}")
        return steps


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
    baryons: Baryons | None = Field(
        None,
        description="baryonic feedback applied to the lightcone planes and beside the "
        "snapshots' P(k) (null: none)",
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
        if self.cosmology.m_nu > 0 and (problems := _massive_neutrino_problems(self)):
            raise ValueError(
                f"cosmology.m_nu = {self.cosmology.m_nu} eV needs {'; '.join(problems)}"
            )
        if self.cosmology.A_s is not None and self.power.kind not in BOLTZMANN_KINDS:
            raise ValueError(
                f"cosmology.A_s needs power.kind 'camb' or 'class' (power.kind "
                f"{self.power.kind!r} is normalised by cosmology.sigma8): set power.kind: camb "
                "or class, or give sigma8"
            )
        if self.power.kind != "table" and self.cosmology.T_cmb <= 0:
            raise ValueError(
                f"cosmology.T_cmb must be > 0 for power.kind {self.power.kind!r} "
                "(the Eisenstein-Hu transfer function and CAMB depend on it); use "
                "power.kind 'table' to run without radiation"
            )
        factor = self.outputs.density
        if isinstance(factor, int) and any((n * self.box.oversample) % (factor * p) for p in pdims):
            raise ValueError(
                f"outputs.density = {factor} must divide the force mesh's block on "
                f"every device: {n * self.box.oversample} cells per side over "
                f"parallel.pdims = {tuple(pdims)}"
            )
        if self.baryons is not None and self.power.kind == "table":
            raise ValueError(
                "baryons need a cosmology CAMB computes: power.kind eisenstein_hu, camb or "
                "class, not table"
            )
        if self.lightcone is not None:
            self._check_lightcone()
        elif self.lensing is not None:
            raise ValueError("lensing needs lightcone planes: add a lightcone section")
        return self

    def density_factor(self) -> int | None:
        """Force-mesh cells per side averaged into one cell of the kept density snapshots
        (outputs.density): 1 for the force mesh itself, None when none are kept; for
        'preview' the smallest factor that divides every device's block and leaves at most
        PREVIEW_CELLS cells per side."""
        kept, cells = self.outputs.density, self.force_cells()
        if kept == "none":
            return None
        if kept != "preview":
            return 1 if kept == "full" else kept
        block = math.gcd(cells, *(cells // p for p in self.parallel.pdims))  # divides every block
        return min(f for f in range(1, block + 1) if block % f == 0 and cells // f <= PREVIEW_CELLS)

    def force_cells(self) -> int:
        """Force-mesh cells per side: box.particles times box.oversample."""
        return self.box.particles * self.box.oversample

    def plane_thickness(self) -> float:
        """Comoving thickness of a lightcone plane in Mpc/h."""
        return section(self.lightcone, "lightcone").plane_thickness or self.box.box_size

    def planes_per_copy(self) -> int:
        """Consecutive lightcone planes that see one copy of the box (lightcone.copy_every)."""
        if section(self.lightcone, "lightcone").copy_every == "plane":
            return 1
        return max(1, self.force_cells() // self.plane_cells())

    def plane_cells(self) -> int:
        """Force-mesh cells across a lightcone plane."""
        return round(self.plane_thickness() / (self.box.box_size / self.force_cells()))

    def _check_lightcone(self) -> None:
        """Plane thickness, final time and source redshifts (errors name fields); the checks
        that need distances are :func:`pmpipe.run.validation.check_run`'s."""
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
        shifts = lens.per_source("photo_z_shift")
        for z, dz in zip(lens.source_redshifts, shifts):
            if z + dz > z_max:
                raise ValueError(
                    f"lensing.source_redshifts value {z} (shifted by lensing.photo_z_shift "
                    f"{dz}) lies beyond the lightcone (lightcone.z_max = {z_max})"
                )
        for d, dz in zip(lens.distributions, shifts[len(lens.source_redshifts) :]):
            if isinstance(d, SmailSources) and dz >= z_max:
                raise ValueError(
                    f"lensing.photo_z_shift {dz} moves all of '{d.name}' beyond the lightcone "
                    f"(lightcone.z_max = {z_max})"
                )
            if isinstance(d, TableSources) and any(
                n > 0 and z + dz > z_max for z, n in zip(d.z, d.n)
            ):
                raise ValueError(
                    f"lensing.distributions '{d.name}' has sources beyond the lightcone "
                    f"(n > 0 at z + photo_z_shift > lightcone.z_max = {z_max})"
                )
        if lens.intrinsic_alignment is not None and thickness > MAX_ALIGNMENT_THICKNESS:
            raise ValueError(
                f"lensing.intrinsic_alignment needs lightcone.plane_thickness of at most "
                f"{MAX_ALIGNMENT_THICKNESS:g} Mpc/h (the planes must resolve each "
                f"distribution's n(z); with lightcone.copy_every 'box' thin planes keep the "
                f"correlations between them), got {thickness:g}"
            )
        if self.summaries.shape_noise is not None:
            self.summaries.shape_noise.per_source(lens.source_labels())


def _massive_neutrino_problems(run: Run) -> list[str]:
    """What a run with cosmology.m_nu > 0 needs and lacks (empty when nothing)."""
    problems = []
    if run.power.kind not in BOLTZMANN_KINDS:
        problems.append(
            f"power.kind 'camb' or 'class' (not {run.power.kind!r}): the neutrinos' response "
            "comes from the Boltzmann code"
        )
    if run.ic.a_init < NU_A_MIN:
        problems.append(
            f"ic.a_init >= {NU_A_MIN} (not {run.ic.a_init}): the neutrino tables start there"
        )
    return problems


# Fields a run's hash leaves out while they hold these values, by section: added after results
# existed, so that a run that does not use them hashes as it did without them.
HASHED_UNLESS: dict[str, dict[str, object]] = {
    "cosmology": {"A_s": None, "m_nu": 0.0, "neutrino_hierarchy": "degenerate"},
    "lightcone": {"copy_every": "plane"},
    "parallel": {"backend": "jax"},
    "lensing": {
        "method": "born",
        "reduced_shear": False,
        "intrinsic_alignment": None,
        "photo_z_shift": 0.0,
        "shear_bias": 0.0,
        "full_sky.mask": None,
        "flat_sky.mask": None,
        "draws": None,
    },
    "summaries": {
        "xi_bins": 15,
        "xi_theta_arcmin": None,
        "shape_noise.depth_map": None,
        "ell_range": None,
    },
}


HALO_HASHED = 8  # the halo changes no result: hashed as the fixed halo runs had before 'auto'


def config_hash(run: Run, halo: object = HALO_HASHED) -> str:
    """sha256 of the run's canonical JSON (sorted keys, no spaces; the checkpoints section
    left out, so is the baryons section while it is null, and each field of HASHED_UNLESS
    while it holds the value given there, a dotted name reaching into a subsection: a run
    normalised by σ8 with massless neutrinos and Born lensing hashes the same with or without
    those fields; outputs.density as what it keeps: 'full', 'none' or its factor), as
    'sha256:<hex>'."""
    exclude: dict = {"checkpoints": True}
    if run.baryons is None:
        exclude["baryons"] = True
    for name, fields in HASHED_UNLESS.items():
        for dotted, value in fields.items():
            *parents, field = [name, *dotted.split(".")]
            owner, where = run, exclude
            for part in parents:
                owner = getattr(owner, part)
                if owner is None:
                    break
                where = where.setdefault(part, {})
            if owner is not None and getattr(owner, field) == value:
                where[field] = True
    data = run.model_dump(mode="json", exclude=exclude)
    data["parallel"]["halo_cells"] = halo  # a file hashed with its own halo: RunFile
    factor = run.density_factor()
    data["outputs"]["density"] = {None: "none", 1: "full"}.get(factor, factor)
    text = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


class RunFile(StrictModel):
    """Content of ``results/<campaign>/<run_id>/config.json``: one resolved run of a campaign."""

    campaign: str = Field(description="campaign name")
    run_id: str = Field(description="stable id: campaign name + position in the design")
    index: int = Field(ge=0, description="position of the run in the expanded design")
    parameters: dict[str, float] = Field(
        default_factory=dict,
        description="design parameters of this run (cosmology field names, or omega_b)",
    )
    config: Run = Field(description="the resolved run configuration")
    config_hash: str = Field(description="config_hash(config): 'sha256:<hex>'")

    @model_validator(mode="after")
    def _hash_matches(self):
        expected, own = config_hash(self.config), self.config.parallel.halo_cells
        if self.config_hash not in (expected, config_hash(self.config, own)):
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
