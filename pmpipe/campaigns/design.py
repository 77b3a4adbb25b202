"""Designs: how the runs of a campaign vary its base cosmology and nuisances (fiducial, grid,
Latin hypercube, Sobol, derivatives, a list of named points), and the points they expand
into."""

from __future__ import annotations

import itertools
from typing import Annotated, Literal

import numpy as np
from pydantic import AfterValidator, Field, ValidationInfo, field_validator

from pmpipe.run import config, draws, universe
from pmpipe.run.observables import (
    ALIGNMENT_PARAMETERS,
    BARYON_PARAMETERS,
    PER_SOURCE_PARAMETERS,
    draw_parameter_names,
)

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
# A run folder is named <campaign>-<point>-r<i>[-paired]: two names of at most this many (ASCII)
# characters keep it within the 255 bytes a file name may have on every file system
NAME_MAX_CHARS = 100
DESIGN_KINDS = ("fiducial", "grid", "latin_hypercube", "sobol", "derivatives", "list")
# Design parameters are the cosmology's numeric fields, and physical densities that set one of them with h:
# omega_b = Omega_b h^2 (fixed while h varies, as emulators such as EuclidEmulator2 sample it)
PHYSICAL_DENSITIES = {"omega_b": "Omega_b"}
DESIGN_PARAMETERS = (*universe.NUMERIC_FIELDS, *PHYSICAL_DENSITIES)
# and nuisances, named as lensing.draws names them (a per-source field for every source, or
# <field>.<source> for one), with the baryons' feedback (pmpipe.run.draws.with_nuisances)
NUISANCE_PARAMETERS = (*ALIGNMENT_PARAMETERS, *PER_SOURCE_PARAMETERS, *BARYON_PARAMETERS)


def is_nuisance(name: str) -> bool:
    """Whether a design parameter is a nuisance (else a cosmology parameter)."""
    return name in NUISANCE_PARAMETERS or name.partition(".")[0] in PER_SOURCE_PARAMETERS


def _known(name: str) -> str:
    if name not in DESIGN_PARAMETERS and not is_nuisance(name):
        raise ValueError(
            f"unknown design parameter {name!r}: use a cosmology parameter "
            f"({', '.join(DESIGN_PARAMETERS)}) or a nuisance ({', '.join(NUISANCE_PARAMETERS)}, "
            "photo_z_shift.<source>, shear_bias.<source>)"
        )
    return name


ParameterName = Annotated[str, AfterValidator(_known)]


def _one_per_density(parameters: dict) -> dict:
    for physical, field in PHYSICAL_DENSITIES.items():
        if physical in parameters and field in parameters:
            raise ValueError(f"{physical} ({field} h^2) and {field} both given: vary one of them")
    return parameters


def _not_empty(parameters: dict) -> dict:
    if not parameters:
        raise ValueError(
            f"empty design: name at least one cosmology parameter ({', '.join(DESIGN_PARAMETERS)}) "
            "or nuisance"
        )
    return _one_per_density(parameters)


def physical_parameters(cosmology: dict) -> dict:
    """The cosmology fields of a mapping of design parameters and fields: each physical density
    (omega_b) turned into its field (Omega_b = omega_b / h^2, with the mapping's h; 12
    significant digits, so that a fiducial omega_b gives back the fiducial Omega_b)."""
    fields = dict(cosmology)
    for physical, field in PHYSICAL_DENSITIES.items():
        if physical in fields:
            fields[field] = float(f"{fields.pop(physical) / fields['h'] ** 2:.12g}")
    return fields


def parameter_names(design: Design) -> list[str]:
    """The parameters a design varies, in order of first appearance."""
    if isinstance(design, ListDesign):
        return list(dict.fromkeys(n for p in design.points for n in p.parameters))
    return [] if isinstance(design, FiducialDesign) else list(design.parameters)


def check_nuisances(design: Design, base: config.Run) -> None:
    """ValueError naming the design's nuisance parameter that the base run has no section or
    source for, or that base.lensing.draws draws too (each draw would replace it)."""
    names = [n for n in parameter_names(design) if is_nuisance(n)]
    draws.check_names(base, names)
    found = base.lensing.draws if base.lensing is not None else None
    if found is None:
        return
    drawn = {n.partition(".")[0] for n in draw_parameter_names(found)}
    clash = [n for n in names if n.partition(".")[0] in drawn]
    if clash:
        raise ValueError(
            f"design.parameters {', '.join(clash)}: base.lensing.draws draws "
            f"{', '.join(sorted(drawn))} too, and each draw would replace the design's value: "
            "vary each nuisance in one of them"
        )


def run_value(run: config.Run, name: str) -> float | None:
    """The value of the design parameter ``name`` in a run (None where the run leaves it to be
    derived, as σ8 of a run normalised by A_s, or has no such nuisance:
    :func:`pmpipe.run.draws.nuisance_value`)."""
    if is_nuisance(name):
        return draws.nuisance_value(run, name)
    cosmology = run.cosmology
    if name in PHYSICAL_DENSITIES:
        return getattr(cosmology, PHYSICAL_DENSITIES[name]) * cosmology.h**2
    return getattr(cosmology, name)


DESIGN_PARAMETER = "(design parameter)"  # ends the long name of an array of a design parameter


def holds_design_parameter(attrs) -> bool:
    """Whether a stored array's attributes (its long name) say it holds a design parameter
    (:func:`describe`)."""
    return str(attrs.get("long_name", "")).endswith(DESIGN_PARAMETER)


def describe(name: str) -> str:
    """What a design parameter is, for the long names of the arrays that hold it."""
    if name in PHYSICAL_DENSITIES:
        return f"{name} = {PHYSICAL_DENSITIES[name]} h^2 of the run {DESIGN_PARAMETER}"
    if name in BARYON_PARAMETERS:
        return f"baryons.{name} of the run {DESIGN_PARAMETER}"
    if is_nuisance(name):
        return f"lensing nuisance {name} of the run {DESIGN_PARAMETER}"
    return f"cosmology.{name} of the run {DESIGN_PARAMETER}"


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


class FiducialDesign(config.StrictModel):
    """One point: the base configuration."""

    kind: Literal["fiducial"]


class GridDesign(config.StrictModel):
    """Cartesian product of parameter values."""

    kind: Literal["grid"]
    parameters: Annotated[dict[ParameterName, Values], AfterValidator(_not_empty)] = Field(
        description="values of each cosmology or nuisance parameter (its units); every combination is a "
        "design point, the last parameter varying fastest"
    )


class SampledDesign(config.StrictModel):
    """Quasi-random samples (scipy.stats.qmc, scrambled, seeded by the campaign seed) in a box
    of parameter ranges."""

    kind: Literal["latin_hypercube", "sobol"]
    parameters: Annotated[dict[ParameterName, Range], AfterValidator(_not_empty)] = Field(
        description="[low, high] range of each cosmology or nuisance parameter (its units)"
    )
    samples: int = Field(ge=1, description="number of design points (a power of 2 for sobol)")

    @field_validator("samples")
    @classmethod
    def _sobol_power_of_two(cls, samples: int, info: ValidationInfo) -> int:
        if info.data.get("kind") == "sobol" and samples & (samples - 1):
            low = 1 << (samples.bit_length() - 1)
            raise ValueError(
                f"Sobol samples must be a power of 2 for the sequence's balance "
                f"properties: use {low} or {2 * low}, or kind latin_hypercube"
            )
        return samples


class DerivativesDesign(config.StrictModel):
    """Fiducial point plus, for each parameter, a minus and a plus point (central differences);
    all points share the fiducial seeds."""

    kind: Literal["derivatives"]
    parameters: Annotated[dict[ParameterName, Step], AfterValidator(_not_empty)] = Field(
        description="step of each cosmology or nuisance parameter (its units): points at fiducial - step "
        "and fiducial + step"
    )


class Point(config.StrictModel):
    """A named design point."""

    name: str = Field(
        pattern=NAME_PATTERN,
        max_length=NAME_MAX_CHARS,
        description="point label used in the run id",
    )
    parameters: Annotated[dict[ParameterName, float], AfterValidator(_one_per_density)] = Field(
        default_factory=dict,
        description="cosmology and nuisance parameters of the point (their units); "
        "the others come from the base",
    )


class ListDesign(config.StrictModel):
    """Explicit, named points."""

    kind: Literal["list"]
    points: list[Point] = Field(
        min_length=1, description="the design points, each with a unique name"
    )

    @field_validator("points")
    @classmethod
    def _unique(cls, points: list[Point]) -> list[Point]:
        names = [p.name for p in points]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(
                f"duplicate point name(s) {', '.join(duplicates)} would give "
                "duplicate run ids; every point needs its own name"
            )
        return points


Design = FiducialDesign | GridDesign | SampledDesign | DerivativesDesign | ListDesign


def range_ends(design: Design) -> list[tuple[str, dict]]:
    """(label, parameters) of the ends of a sampled design's ranges: each parameter at its low
    and at its high end, the others at their midpoints (none for other kinds). Samples come
    arbitrarily close to them, so each must make a valid run."""
    if design.kind not in ("latin_hypercube", "sobol"):
        return []
    middle = {name: 0.5 * (low + high) for name, (low, high) in design.parameters.items()}
    return [
        (f"{name} at the {side} end of its range", {**middle, name: value})
        for name, bounds in design.parameters.items()
        for side, value in zip(("low", "high"), bounds)
    ]


def bounding_points(design: Design, base: config.Run, seed: int) -> list[dict]:
    """Parameters of the points that bound, over the design, a quantity monotonic in each
    cosmological parameter: a sampled design's corners of its cosmological ranges (more
    samples change none of them), else its points."""
    if design.kind not in ("latin_hypercube", "sobol"):
        return [parameters for _, parameters in design_points(design, base, seed)]
    ranges = {n: bounds for n, bounds in design.parameters.items() if not is_nuisance(n)}
    return [dict(zip(ranges, ends)) for ends in itertools.product(*ranges.values())]


def design_points(design: Design, base: config.Run, seed: int) -> list[tuple[str, dict]]:
    """(label, parameters) of each point of ``design`` around the run ``base`` (the fiducial
    of derivatives), in a fixed order; samples drawn with the campaign ``seed``."""
    if design.kind == "fiducial":
        return [("fiducial", {})]
    if design.kind == "list":
        return [(p.name, dict(p.parameters)) for p in design.points]
    if design.kind == "derivatives":
        given = {name: run_value(base, name) for name in design.parameters}
        unset = [name for name, value in given.items() if value is None]
        if unset:
            raise ValueError(
                f"design.parameters {', '.join(unset)}: derivatives step from the base, which "
                "does not give it (set it in base.cosmology, or the nuisance's section)"
            )
        fiducial = {name: value for name, value in given.items() if value is not None}
        points = [("fiducial", fiducial)]
        for (
            name,
            step,
        ) in design.parameters.items():  # 12 digits: 0.3111 - 0.01 = 0.3011, not ...0001
            points += [
                (
                    f"{name}-{side}",
                    {**fiducial, name: float(f"{fiducial[name] + sign * step:.12g}")},
                )
                for side, sign in (("minus", -1), ("plus", 1))
            ]
        return points
    names = list(design.parameters)
    if design.kind == "grid":
        values = itertools.product(*(design.parameters[n] for n in names))
    else:
        from scipy.stats import qmc

        # a Generator (not an int) gives the same stream through scipy's `seed` and `rng` keywords
        engine = (qmc.LatinHypercube if design.kind == "latin_hypercube" else qmc.Sobol)(
            d=len(names), scramble=True, seed=np.random.default_rng(seed)
        )
        low, high = (np.array([design.parameters[n][i] for n in names]) for i in (0, 1))
        values = qmc.scale(engine.random(design.samples), low, high)
    return [
        (f"p{i:04d}", {n: float(v) for n, v in zip(names, row)}) for i, row in enumerate(values)
    ]
