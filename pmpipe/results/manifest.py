"""manifest.csv, a campaign's table of runs: one row per run (per run and draw with
lensing.draws) with its design values, derived parameters and status."""

from __future__ import annotations

import csv
import math
from collections.abc import Callable
from pathlib import Path

from pmpipe.campaigns import design as designs
from pmpipe.campaigns.campaign import Campaign, RunSpec
from pmpipe.physics.theory import background
from pmpipe.physics.theory.power_table import BOLTZMANN_KINDS
from pmpipe.run import config
from pmpipe.run import draws as nuisance_draws
from pmpipe.storage import integrity, store

DERIVED = ("sigma8", "A_s", "S8", "sigma8_cb", "Omega_cb")  # columns of every run, given or derived


def parameter_names(specs: list[RunSpec]) -> list[str]:
    """Design parameter names in order of first appearance."""
    return list(dict.fromkeys(name for spec in specs for name in spec.parameters))


def derived_parameters(spec: RunSpec, run_dir: Path) -> dict[str, float | None]:
    """σ8, A_s, S8 = σ8 (Ω_m / 0.3)^½, σ8 of CDM + baryons and Ω_cb of a run: as its
    configuration gives them, else as its complete ic store records them (the Boltzmann code's
    derived normalisation, docs/outputs.md); None where neither says (A_s of an Eisenstein-Hu
    run, σ8 of a tabulated P(k), or a run not made yet). Without massive neutrinos σ8_cb is σ8
    and Ω_cb is Ω_m."""
    cosmo = spec.run.cosmology
    sigma8, A_s = cosmo.sigma8, cosmo.A_s
    sigma8_cb = sigma8 if cosmo.m_nu == 0 else None
    if spec.run.power.kind == "table":  # the table as it is: cosmology.sigma8 does not apply
        sigma8 = sigma8_cb = None
    elif spec.run.power.kind in BOLTZMANN_KINDS and None in (sigma8, A_s, sigma8_cb):
        ic = Path(run_dir) / "ic.zarr"
        attrs = integrity.root_attributes(ic) if store.has_marker(ic) else None
        if attrs and attrs.get("config_hash") == config.config_hash(spec.run):
            source = attrs.get("linear_power") or {}
            sigma8, A_s = source.get("sigma8", sigma8), source.get("A_s", A_s)
            sigma8_cb = source.get("sigma8_cb", sigma8_cb)
    S8 = None if sigma8 is None else sigma8 * math.sqrt(cosmo.Omega_m / 0.3)
    return {
        "sigma8": sigma8,
        "A_s": A_s,
        "S8": S8,
        "sigma8_cb": sigma8_cb,
        "Omega_cb": float(background.omega_cb(cosmo)),
    }


def design_values(spec: RunSpec, names: list[str], derived: dict) -> dict[str, float | None]:
    """Each design parameter of ``names`` for the run: the point's own value, else the run's
    (:func:`pmpipe.campaigns.design.run_value`), else the ``derived`` one
    (:func:`derived_parameters`); None where none is known."""
    values = {}
    for name in names:
        value = spec.parameters.get(name, designs.run_value(spec.run, name))
        values[name] = derived.get(name) if value is None else value
    return values


def draw_columns(spec: RunSpec) -> list[dict]:
    """The columns of each draw of the run's lensing.draws: its index ``draw`` and the values
    of every drawn parameter (pmpipe.run.draws.filled_points; empty where unknown); [{}] for
    a run without draws."""
    lens = spec.run.lensing
    if lens is None or lens.draws is None:
        return [{}]
    return [
        {"draw": d, **{n: "" if v is None else v for n, v in values.items()}}
        for d, values in enumerate(nuisance_draws.filled_points(spec.run))
    ]


def manifest_rows(
    camp: Campaign, results_dir: str | Path, status: Callable[[Path], str]
) -> list[dict]:
    """One row per run (with lensing.draws, per run and draw): id, the draw's index and drawn
    values (:func:`draw_columns`), index, point,
    realisation, paired, seed, each design parameter (:func:`design_values`; empty where
    unknown), the columns of DERIVED (:func:`derived_parameters`, empty where unknown), run
    folder, config hash and status(run folder)."""
    specs = list(camp.runs)
    names = parameter_names(specs)
    draws = {spec.run_id: draw_columns(spec) for spec in specs}
    drawn = list(dict.fromkeys(name for rows in draws.values() for row in rows for name in row))
    rows = []
    for spec in specs:
        run_dir = Path(results_dir) / camp.name / spec.run_id
        derived = derived_parameters(spec, run_dir)
        run_columns = {
            "index": spec.index,
            "point": spec.point,
            "realisation": spec.realisation,
            "paired": spec.paired,
            "seed": spec.seed,
            **{n: "" if v is None else v for n, v in design_values(spec, names, derived).items()},
            **{n: "" if v is None else v for n, v in derived.items()},
            "run_dir": run_dir,
            "config_hash": config.config_hash(spec.run),
            "status": status(run_dir),
        }
        for draw in draws[spec.run_id]:
            rows.append(
                {"run_id": spec.run_id, **{n: draw.get(n, "") for n in drawn}, **run_columns}
            )
    return rows


def recorded_seeds(path: Path) -> dict[str, int]:
    """{run id: seed} of a manifest.csv (rows without a run id or an integer seed skipped)."""
    with path.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    return {
        row["run_id"]: int(row["seed"])
        for row in rows
        if row.get("run_id") and (row.get("seed") or "").isdigit()
    }


def seed_collisions(camp: Campaign, results_dir: str | Path) -> dict[str, int]:
    """{campaign: runs} of the other campaigns in ``results_dir`` (their manifest.csv) whose
    runs have the seed of one of ``camp``'s runs."""
    mine = {spec.seed for spec in camp.runs}
    found = {}
    for path in sorted(Path(results_dir).glob("*/manifest.csv")):
        if path.parent.name != camp.name:
            shared = [run for run, seed in recorded_seeds(path).items() if seed in mine]
            if shared:
                found[path.parent.name] = len(shared)
    return found


def write_manifest(camp: Campaign, path: str | Path, status: Callable[[Path], str]) -> None:
    """Write manifest.csv at path = <results>/<campaign>/manifest.csv, next to the run folders."""
    path = Path(path)
    if path.parent.name != camp.name:
        raise ValueError(
            f"the manifest of campaign {camp.name} belongs in <results>/{camp.name}/, "
            f"next to its run folders, not in {path.parent}"
        )
    rows = manifest_rows(camp, path.parent.parent, status)
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
