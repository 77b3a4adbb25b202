"""Nuisance parameters of a run: the values of each draw of lensing.draws (several sets for one
N-body run's maps and statistics) and the run configuration each draw stands for; a run with
nuisance values set, as a campaign's design sets them."""

from __future__ import annotations

import numpy as np
from pydantic import ValidationError

from pmpipe.run import config
from pmpipe.run.files import format_errors
from pmpipe.run.observables import (
    ALIGNMENT_PARAMETERS,
    BARYON_PARAMETERS,
    PER_SOURCE_PARAMETERS,
    ListedDraws,
    SampledDraws,
    check_draw_names,
    draw_parameter_names,
)

DRAW_STREAM = 0x64726177  # tags the draws' random stream apart from the run's others


def points(draws: SampledDraws | ListedDraws, seed: int) -> list[dict[str, float]]:
    """The parameter values of every draw, in draw order (a Latin hypercube seeded by ``seed``,
    the run's ic.seed, on a stream of its own)."""
    if isinstance(draws, ListedDraws):
        return [dict(p) for p in draws.points]
    from scipy.stats import qmc

    names = list(draws.parameters)
    stream = np.random.default_rng([seed, DRAW_STREAM])  # not the shape noise's (seed, source)
    engine = qmc.LatinHypercube(d=len(names), scramble=True, seed=stream)
    low, high = (np.array([draws.parameters[n][i] for n in names]) for i in (0, 1))
    values = qmc.scale(engine.random(draws.count), low, high)
    return [{n: float(v) for n, v in zip(names, row)} for row in values]


def filled_points(run: config.Run) -> list[dict[str, float | None]]:
    """:func:`points` of the run's lensing.draws, each with every drawn parameter: a listed
    draw's omitted ones at the section's value (:func:`nuisance_value`)."""
    found = config.section(run.lensing, "lensing").draws
    assert found is not None  # a run with draws
    names = draw_parameter_names(found)
    return [
        {n: values[n] if n in values else nuisance_value(run, n) for n in names}
        for values in points(found, run.ic.seed)
    ]


def maps_per_source(run: config.Run) -> int:
    """How many maps the lensing stage makes of each source: one per draw (1 without)."""
    found = run.lensing.draws if run.lensing is not None else None
    if found is None:
        return 1
    return found.count if isinstance(found, SampledDraws) else len(found.points)


def baryon_values(run: config.Run) -> list[dict[str, float]] | None:
    """The baryons' parameters of each draw of lensing.draws (those a listed draw leaves out
    at the section's values); None when the draws leave the baryons section as it is, or
    without draws."""
    found = run.lensing.draws if run.lensing is not None else None
    if found is None or not set(BARYON_PARAMETERS) & set(draw_parameter_names(found)):
        return None
    section = config.section(run.baryons, "baryons (drawn by lensing.draws)")
    return [
        {n: values[n] if n in values else getattr(section, n) for n in BARYON_PARAMETERS}
        for values in points(found, run.ic.seed)
    ]


def plane_passes(run: config.Run) -> int:
    """How many passes over the planes the lensing stage makes: one per distinct value of the
    baryons' parameters the draws take (:func:`baryon_values`), else 1."""
    found = baryon_values(run)
    return 1 if found is None else len({tuple(sorted(v.items())) for v in found})


def with_nuisances(
    run: config.Run, values: dict[str, float], where: str = "design.parameters"
) -> config.Run:
    """The run with the nuisance ``values`` set: the lensing ones as lensing.draws names them
    (a per-source field for every source, or ``<field>.<source>`` for one) and the baryons'
    log_T_AGN; validated as a run (pydantic's ValidationError names the field), ValueError
    naming ``where`` and the parameter the run has no section for."""
    check_names(run, list(values), where)
    data = run.model_dump(mode="json")
    lens = run.lensing
    if lens is not None and any(n not in BARYON_PARAMETERS for n in values):
        section = data["lensing"]
        for field in PER_SOURCE_PARAMETERS:
            per_source = lens.per_source(field)
            for i, label in enumerate(lens.source_labels()):
                per_source[i] = values.get(f"{field}.{label}", values.get(field, per_source[i]))
            section[field] = per_source if len(set(per_source)) > 1 else per_source[0]
        for name in ALIGNMENT_PARAMETERS:
            if name in values:
                section["intrinsic_alignment"][name] = values[name]
    for name in BARYON_PARAMETERS:
        if name in values:
            data["baryons"][name] = values[name]
    return type(run).model_validate(data)


def check_names(run: config.Run, names: list[str], where: str = "design.parameters") -> None:
    """ValueError naming ``where`` and the nuisance parameter (:func:`with_nuisances`' names)
    that the run has no section or source for."""
    lensing_names = [n for n in names if n not in BARYON_PARAMETERS]
    if lensing_names:
        lens = run.lensing
        if lens is None:
            raise ValueError(f"{where} {', '.join(lensing_names)} need a lensing section")
        alignment = lens.intrinsic_alignment is not None
        check_draw_names(lensing_names, lens.source_labels(), alignment, where)
    for name in BARYON_PARAMETERS:
        if name in names and run.baryons is None:
            raise ValueError(f"{where} parameter {name} needs a baryons section (its model)")


def draw_run(run: config.Run, values: dict[str, float]) -> config.Run:
    """The run as one draw sees it: its lensing section with the drawn ``values`` and without
    draws (:func:`with_nuisances`)."""
    lens = config.section(run.lensing, "lensing")
    return with_nuisances(
        run.model_copy(update={"lensing": lens.model_copy(update={"draws": None})}),
        values,
        "lensing.draws",
    )


def nuisance_value(run: config.Run, name: str) -> float | None:
    """The value of a nuisance parameter (:func:`with_nuisances`' names) in the run; None
    where the run has no section for it, or gives its sources different values of a field
    named for all of them."""
    if name in BARYON_PARAMETERS:
        return None if run.baryons is None else getattr(run.baryons, name)
    lens = run.lensing
    if lens is None:
        return None
    if name in ALIGNMENT_PARAMETERS:
        alignment = lens.intrinsic_alignment
        return None if alignment is None else getattr(alignment, name)
    field, _, label = name.partition(".")
    per_source = dict(zip(lens.source_labels(), lens.per_source(field)))
    if label:
        return per_source.get(label)
    return per_source.popitem()[1] if len(set(per_source.values())) == 1 else None


def check(run: config.Run) -> None:
    """ValueError naming lensing.draws and the draw when a draw of the run (or a Latin
    hypercube's corner of lowest or highest values: the limits are per parameter, so every
    draw inside lies within them) is not a valid run."""
    found = config.section(run.lensing, "lensing").draws
    if found is None:
        return
    named: list[tuple[object, dict]] = []
    if isinstance(found, SampledDraws):
        named += [
            (corner, {n: r[end] for n, r in found.parameters.items()})
            for corner, end in (("with every low end", 0), ("with every high end", 1))
        ]
    named += list(enumerate(points(found, run.ic.seed)))
    for which, values in named:
        try:
            draw_run(run, values)
        except ValidationError as err:
            raise ValueError(format_errors(f"lensing.draws, draw {which} {values}", err)) from None
