"""Campaigns: the campaign file's model, its expansion into runs (stable ids, derived seeds),
their config.json files, the check that every run fits its devices, and the packing of runs
into jobs.

Run ids are ``<campaign>-<point>-r<realisation>`` (``-paired`` for the partner with inverted
phases); points are ``fiducial``, ``<param>-minus`` / ``<param>-plus`` (derivatives),
``p0000``, ``p0001``... (grid, Latin hypercube, Sobol) or the user's names (list). Seeds are
``fold_in(key(campaign seed), i)`` as a 32-bit integer, with i the point's position times the
realisations plus the realisation, or the realisation alone when seeds are common (always for
derivatives), so that the fiducial and its ∓ points share their white noise.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import (
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from pmpipe import stages
from pmpipe.campaigns import decomposition, resources, run_index, seeds
from pmpipe.campaigns import design as designs
from pmpipe.run import config, draws, ghost_cells, validation


class Decomposition(config.StrictModel):
    """base.parallel.pdims chosen for a device count by measurement (pmpipe.campaigns.decomposition)."""

    devices: int = Field(ge=1, description="devices of every run, px * py")
    file: Path | None = Field(
        None,
        description="decomposition file kept with the site settings (e.g. "
        "profiles/<site>/decompositions.yaml), written by `pmpipe tune`; "
        "without one, or without a sweep of these devices, pdims are guessed",
    )


class Campaign(config.StrictModel):
    """A suite of runs: a base configuration, a design that varies cosmology and nuisance
    parameters, realisations (seeds) per point, and the execution platform."""

    name: str = Field(
        pattern=designs.NAME_PATTERN,
        max_length=designs.NAME_MAX_CHARS,
        description="campaign name: results/<name>/, run ids <name>-<point>-r<i>",
    )
    seed: int | None = Field(
        None,
        ge=0,
        description="campaign seed; run seeds derive from it and the run's position; unset: "
        "derived from the name, so that campaigns of other names get other seeds",
    )
    shared_seeds: bool = Field(
        False,
        description="the runs' seeds equal another campaign's on purpose (paired comparisons): "
        "pmpipe plan does not warn of it",
    )
    base: config.Run = Field(
        default_factory=config.Run,
        description="configuration shared by every run; "
        "base.ic.seed stays unset (seeds are derived)",
    )
    design: designs.Design = Field(
        default_factory=lambda: designs.FiducialDesign(kind="fiducial"),
        discriminator="kind",
        description="how the runs vary: fiducial, grid, latin_hypercube, sobol, derivatives, list",
    )
    realisations: int = Field(
        1, ge=1, description="seeds (independent white-noise fields) per design point"
    )
    common_seeds: bool = Field(
        False,
        description="every design point uses the same realisation seeds (always so for derivatives)",
    )
    seed_index: Literal["point_major", "pairing"] = Field(
        "point_major",
        description="the position a run's seed derives from: point_major, point x realisations "
        "+ realisation (more points keep every seed); pairing, (point + realisation)(point + "
        "realisation + 1)/2 + realisation (more points or more realisations keep every seed)",
    )
    paired: bool = Field(
        False, description="each realisation also runs with inverted phases (Angulo & Pontzen 2016)"
    )
    execution: resources.Execution = Field(default_factory=resources.Execution)
    decomposition: Decomposition | None = Field(
        None,
        description="choose base.parallel.pdims for this many devices from recorded "
        "sweeps (pmpipe tune) instead of giving them",
    )
    _pdims_source: str = PrivateAttr("given")
    _halo_source: str = PrivateAttr("given")
    _runs: tuple[RunSpec, ...] = PrivateAttr(())

    @property
    def runs(self) -> tuple[RunSpec, ...]:
        """Every run of the campaign in design order (:func:`expand`), expanded once when the
        campaign is validated."""
        return self._runs

    @property
    def halo_source(self) -> str:
        """How base.parallel.halo_cells was set: 'given', or 'auto' (:meth:`_choose_halo`)."""
        return self._halo_source

    @property
    def pdims_source(self) -> str:
        """How base.parallel.pdims were chosen: 'given', or pmpipe.campaigns.decomposition.choose's
        'recorded', 'nearest' or 'guessed'."""
        return self._pdims_source

    @model_validator(mode="before")
    @classmethod
    def _auto_pdims(cls, data):
        """base.parallel.pdims 'auto' is left out of the base run, to be chosen (_choose_pdims)."""
        base = data.get("base") if isinstance(data, dict) else None
        parallel = base.get("parallel") if isinstance(base, dict) else None
        if (
            not isinstance(base, dict)
            or not isinstance(parallel, dict)
            or parallel.get("pdims") != "auto"
        ):
            return data
        if not data.get("decomposition"):
            raise ValueError(
                "base.parallel.pdims 'auto' needs a decomposition section: devices "
                "(and file, the sweeps recorded by `pmpipe tune`)"
            )
        rest = {k: v for k, v in parallel.items() if k != "pdims"}
        return {**data, "base": {**base, "parallel": rest}}

    @field_validator("base")
    @classmethod
    def _simulable(cls, base: config.Run) -> config.Run:
        validation.check_run(base)
        return base

    @model_validator(mode="after")
    def _consistent(self, info: ValidationInfo):
        if self.base.parallel.halo_cells == "auto":
            self._choose_halo()
        if self.decomposition is not None:
            self._choose_pdims()
        if self.base.ic.seed != 0:
            raise ValueError(
                "base.ic.seed must not be set: run seeds derive from the campaign "
                "seed and the run's position; change 'seed' instead"
            )
        if self.base.ic.paired:
            raise ValueError("base.ic.paired must not be set: use 'paired: true' at the top level")
        devices = self.base.parallel.pdims[0] * self.base.parallel.pdims[1]
        if self.execution.platform == "cpu" and devices > self.execution.devices_per_node:
            raise ValueError(
                f"base.parallel.pdims needs {devices} devices but execution.devices_per_node = "
                f"{self.execution.devices_per_node} on cpu (one process); raise devices_per_node "
                "or use fewer devices"
            )
        self.execution.node_layout(devices)
        self._runs = tuple(expand(self, (info.context or {}).get("source", "campaign")))
        return self

    def _choose_halo(self) -> None:
        """base.parallel.halo_cells 'auto': the halo the design's largest displacements need
        (pmpipe.run.ghost_cells.auto_cells), one for every run, so that runs of a size share one
        compiled program. A design that makes no estimate leaves it to each run, whose
        check then names what is wrong (:func:`expand`)."""
        given = self.base.cosmology.model_fields_set
        base = self.base.cosmology.model_dump()
        try:
            points = designs.bounding_points(self.design, self.base, campaign_seed(self))
            cosmologies = [
                _point_cosmology(
                    base, given, {k: v for k, v in p.items() if not designs.is_nuisance(k)}
                )
                for p in points
            ]
            cells = ghost_cells.auto_cells(self.base, cosmologies)
        except ValueError:
            return
        run = self.base.model_dump(exclude_unset=True)
        run.setdefault("parallel", {})["halo_cells"] = cells
        object.__setattr__(self, "base", self._simulable(config.Run.model_validate(run)))
        self._halo_source = "auto"

    def _choose_pdims(self) -> None:
        if "pdims" in self.base.parallel.model_fields_set:
            raise ValueError(
                "base.parallel.pdims are given and so is a decomposition section: "
                "set base.parallel.pdims to 'auto' or remove the section"
            )
        box = self.base.box
        chosen = config.section(self.decomposition, "decomposition")
        pdims, source = decomposition.choose(
            chosen.devices, box.particles, box.oversample, ghost_cells.cells(self.base), chosen.file
        )
        base = self.base.model_dump(exclude_unset=True)  # what the file sets stays told apart
        base.setdefault("parallel", {})["pdims"] = pdims
        object.__setattr__(self, "base", self._simulable(config.Run.model_validate(base)))
        self._pdims_source = source


def seed_from_name(name: str) -> int:
    """The seed of a campaign whose file sets none: the first 31 bits of SHA-256 of its name."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "big") >> 1


def campaign_seed(camp: Campaign) -> int:
    """The seed the runs of ``camp`` derive from: its ``seed``, else :func:`seed_from_name`."""
    return camp.seed if camp.seed is not None else seed_from_name(camp.name)


def load(path: str | Path) -> Campaign:
    """Read and validate a campaign file (YAML or JSON), every expanded run included."""
    return config.validate(
        Campaign, config.read_mapping(path), path, {"design": designs.DESIGN_KINDS}
    )


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """One run of a campaign: id, position in the expansion, design point label, realisation,
    whether it is the phase-inverted partner, design parameters, white-noise seed (32-bit) and
    the resolved run (parameters, ic.seed and ic.paired applied)."""

    run_id: str
    index: int
    point: str
    realisation: int
    paired: bool
    parameters: dict[str, float]
    seed: int
    run: config.Run


def _point_cosmology(base: dict, given: set[str], parameters: dict[str, float]) -> dict:
    """The base cosmology (``given``: the fields the campaign file sets) with a design point's
    parameters (a physical density, such as omega_b, sets its field with the point's h). A
    point that gives one normalisation (sigma8 or A_s) replaces the other when the file does
    not set it: a design over A_s derives sigma8, not the fiducial default."""
    cosmology = designs.physical_parameters({**base, **parameters})
    for name, other in (("A_s", "sigma8"), ("sigma8", "A_s")):
        if name in parameters and other not in parameters and other not in given:
            cosmology[other] = None
    return cosmology


def _point_run(
    base: dict, given: set[str], label: str, parameters: dict[str, float], source: str
) -> config.Run:
    """The base run with a design point's cosmology (:func:`_point_cosmology`) and nuisances
    (pmpipe.run.draws.with_nuisances), checked; ConfigError naming the point otherwise."""
    values = ", ".join(f"{k} = {v:.6g}" for k, v in parameters.items())
    where = f"{source}: design point {label} (design parameters {values})"
    nuisances = {k: v for k, v in parameters.items() if designs.is_nuisance(k)}
    cosmological = {k: v for k, v in parameters.items() if k not in nuisances}
    try:
        cosmology = _point_cosmology(base["cosmology"], given, cosmological)
        run = config.Run.model_validate({**base, "cosmology": cosmology})
        if nuisances:
            run = draws.with_nuisances(run, nuisances)
    except ValidationError as err:
        raise config.ConfigError(config.format_errors(where, err)) from None
    except ValueError as err:
        raise config.ConfigError(f"{where}: {err}") from None
    return validation.checked(run, where)


def expand(camp: Campaign, source: str = "campaign") -> list[RunSpec]:
    """Every run of the campaign, in design order; raises ConfigError naming source (the
    campaign file) when a point's parameters make an invalid run. A validated campaign holds
    them (:attr:`Campaign.runs`)."""
    common = camp.common_seeds or camp.design.kind == "derivatives"
    base = camp.base.model_dump()
    specs: list[RunSpec] = []
    try:
        designs.check_nuisances(camp.design, camp.base)
    except ValueError as err:
        raise config.ConfigError(f"{source}: {err}") from None
    for label, parameters in designs.range_ends(camp.design):
        _point_run(base, camp.base.cosmology.model_fields_set, label, parameters, source)
    root = campaign_seed(camp)
    points = designs.design_points(camp.design, camp.base, root)
    try:
        positions = seed_positions(len(points), camp.realisations, common, camp.seed_index)
    except ValueError as err:
        raise config.ConfigError(f"{source}: {err}") from None
    run_seeds = seeds.derive_seeds(root, positions).tolist()
    for p, (label, parameters) in enumerate(points):
        run = _point_run(base, camp.base.cosmology.model_fields_set, label, parameters, source)
        for r in range(camp.realisations):
            seed = run_seeds[p * camp.realisations + r]
            for paired in (False, True) if camp.paired else (False,):
                run_id = f"{camp.name}-{label}-r{r}" + ("-paired" if paired else "")
                ic = run.ic.model_copy(update={"seed": seed, "paired": paired})
                specs.append(
                    RunSpec(
                        run_id,
                        len(specs),
                        label,
                        r,
                        paired,
                        parameters,
                        seed,
                        run.model_copy(update={"ic": ic}),
                    )
                )
    counts = collections.Counter(s.run_id for s in specs)
    duplicates = sorted(i for i, n in counts.items() if n > 1)
    if duplicates:
        raise config.ConfigError(f"{source}: duplicate run ids {', '.join(duplicates)}")
    return specs


def seed_positions(points: int, realisations: int, common: bool, index: str) -> np.ndarray:
    """The position each run's seed derives from (seeds.derive_seeds), point-major: the
    realisation alone with ``common`` seeds, else by ``index`` (Campaign.seed_index);
    ValueError when a position passes 2**32 - 1."""
    p, r = np.divmod(np.arange(points * realisations, dtype=np.int64), realisations)
    if common:
        positions = r
    elif index == "pairing":  # Cantor's pairing: a place for every (point, realisation)
        positions = (p + r) * (p + r + 1) // 2 + r
    else:
        positions = p * realisations + r
    if positions.size and positions.max() > np.iinfo(np.uint32).max:
        raise ValueError(
            f"seed_index {index}: {points} points x {realisations} realisations need seed "
            "positions beyond 2**32 - 1; use seed_index point_major"
        )
    return positions


def run_file(camp: Campaign, spec: RunSpec) -> config.RunFile:
    """The config.json content of a run."""
    return config.RunFile.build(camp.name, spec.run_id, spec.index, spec.parameters, spec.run)


def write_run_files(camp: Campaign, results_dir: str | Path) -> list[Path]:
    """Write results_dir/<campaign>/<run_id>/config.json for every run, leaving files whose
    content is unchanged untouched (Snakemake compares mtimes), and the campaign's run index
    (pmpipe.campaigns.run_index); returns the config.json paths."""
    run_index.write(
        Path(results_dir) / camp.name,
        camp.name,
        stages.run_stages(camp.base),  # a design changes no stage
        job_ids(camp),
    )
    paths = []
    for spec in camp.runs:
        path = Path(results_dir) / camp.name / spec.run_id / "config.json"
        text = run_file(camp, spec).to_json()
        if not path.exists() or path.read_text() != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        paths.append(path)
    return paths


def check_fits(camp: Campaign, environ=None) -> list[resources.Estimate]:
    """The estimate of every run (resources.estimate, in campaign order); ConfigError naming
    the first run whose memory estimate exceeds what a device gives it (on gpu the share XLA's
    allocator takes: resources.memory_fraction, from ``environ``, default os.environ; the
    workflow adds its site's ``env``, which its jobs run with)."""
    hint = (
        "use more devices (base.parallel.pdims) or fewer particles (base.box.particles)"
        if camp.execution.platform == "gpu"
        else "on cpu all devices share one process: use fewer particles (base.box.particles) or "
        "raise execution.device_memory_gb if the machine has that memory"
    )
    try:
        fraction, source = resources.memory_fraction(camp.execution, environ)
    except ValueError as err:
        raise config.ConfigError(f"{err} (the memory a GPU run may use)") from None
    estimates = []
    for spec in camp.runs:
        estimates.append(resources.estimate(spec.run, camp.execution))
        need = estimates[-1].memory_per_device_bytes
        if need > fraction * camp.execution.device_memory_gb * 1e9:
            full_sky = need - _without_full_sky(spec.run, camp.execution)
            sky = (
                f"the full-sky maps take {full_sky / 1e9:.2f} GB of it (lower "
                "base.lensing.full_sky.nside); "
                if full_sky > 0.5 * need
                else ""
            )
            usable = (
                f"{fraction:.0%} of execution.device_memory_gb = "
                f"{camp.execution.device_memory_gb} ({source})"
                if fraction < 1
                else f"execution.device_memory_gb = {camp.execution.device_memory_gb}"
            )
            overlap = (
                "; or set execution.overlap: false (two runs at once)"
                if resources.overlaps(spec.run, camp.execution)
                else ""
            )
            raise config.ConfigError(
                f"run {spec.run_id} needs about {need / 1e9:.2f} GB per device but may use "
                f"{usable}; {sky}{hint}{overlap}"
            )
    return estimates


def _without_full_sky(run: config.Run, execution: resources.Execution) -> float:
    """The memory estimate of ``run`` without its full-sky maps (bytes per device)."""
    if run.lensing is None or run.lensing.full_sky is None:
        return resources.estimate(run, execution).memory_per_device_bytes
    lensing = run.lensing.model_copy(update={"full_sky": None})
    return resources.estimate(
        run.model_copy(update={"lensing": lensing}), execution
    ).memory_per_device_bytes


def job_ids(camp: Campaign) -> dict[str, list[str]]:
    """The run ids of each job of the campaign (:func:`job_groups`)."""
    groups = job_groups(camp.runs, camp.execution.job_size())
    return {name: [s.run_id for s in group] for name, group in groups.items()}


def job_groups(specs: Sequence[RunSpec], size: int) -> dict[str, list[RunSpec]]:
    """Runs packed into jobs of ``size`` by their position in the design: ``job0000`` holds
    runs 0 .. size - 1, and so on. Runs added at the end of a design join the last group or
    new ones; no earlier run changes group."""
    groups: dict[str, list[RunSpec]] = {}
    for spec in specs:
        groups.setdefault(job_name(spec, size), []).append(spec)
    return groups


def job_name(spec: RunSpec, size: int) -> str:
    """The name of the job of ``size`` runs that holds the run (:func:`job_groups`)."""
    return f"job{spec.index // size:04d}"


def campaign_schema() -> dict:
    """JSON schema (draft 2020-12) of campaign files."""
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        **Campaign.model_json_schema(),
    }


def write_schema(path: str | Path) -> None:
    """Write the campaign schema as JSON (indent 2, sorted keys, trailing newline)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(campaign_schema(), indent=2, sort_keys=True) + "\n")
