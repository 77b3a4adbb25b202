"""Draws of lensing.draws: the nuisance values of each draw of one N-body run's maps and
statistics, and the run configuration each draw stands for."""

from __future__ import annotations

import numpy as np
from pydantic import ValidationError

from pmpipe.run import config
from pmpipe.run.files import format_errors
from pmpipe.run.observables import (
    ALIGNMENT_PARAMETERS,
    PER_SOURCE_PARAMETERS,
    ListedDraws,
    SampledDraws,
)


def points(draws: SampledDraws | ListedDraws, seed: int) -> list[dict[str, float]]:
    """The parameter values of every draw, in draw order (a Latin hypercube seeded by ``seed``,
    the run's ic.seed)."""
    if isinstance(draws, ListedDraws):
        return [dict(p) for p in draws.points]
    from scipy.stats import qmc

    names = list(draws.parameters)
    engine = qmc.LatinHypercube(d=len(names), scramble=True, seed=np.random.default_rng(seed))
    low, high = (np.array([draws.parameters[n][i] for n in names]) for i in (0, 1))
    values = qmc.scale(engine.random(draws.count), low, high)
    return [{n: float(v) for n, v in zip(names, row)} for row in values]


def draw_run(run: config.Run, values: dict[str, float]) -> config.Run:
    """The run as one draw sees it: its lensing section with the drawn ``values`` and without
    draws, validated as a run (errors name the field)."""
    lens = run.lensing
    assert lens is not None  # only lensing runs have draws
    section = lens.model_dump(mode="json") | {"draws": None}
    labels = lens.source_labels()
    for field in PER_SOURCE_PARAMETERS:
        per_source = lens.per_source(field)
        for i, label in enumerate(labels):
            per_source[i] = values.get(f"{field}.{label}", values.get(field, per_source[i]))
        section[field] = per_source if len(set(per_source)) > 1 else per_source[0]
    for name in ALIGNMENT_PARAMETERS:
        if name in values:
            section["intrinsic_alignment"][name] = values[name]
    return type(run).model_validate(run.model_dump(mode="json") | {"lensing": section})


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
