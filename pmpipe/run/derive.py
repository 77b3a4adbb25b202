"""The adapter between configuration and physics: the frozen :class:`RunSetup` of a validated
run (its cosmology with growth and distance tables, linear P(k), grid, time steps, lightcone
planes, lensing maps with their sources, summaries' bins; :mod:`pmpipe.run.setup_parts`),
derived once per run and handed to every stage, and the run's ICs made from it."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from functools import partial

import numpy as np

from pmpipe.physics.evolution import ics, simulation, timesteps
from pmpipe.physics.lensing import intrinsic_alignment, projection
from pmpipe.physics.mesh import domain
from pmpipe.physics.theory import baryons, boltzmann, cosmology, neutrinos
from pmpipe.physics.theory.baryons import Suppression
from pmpipe.physics.theory.boltzmann_tables import LinearTable, table_wavenumbers
from pmpipe.physics.theory.cosmology import Cosmology, LinearPower
from pmpipe.physics.theory.power_table import BOLTZMANN_KINDS
from pmpipe.run import config, ghost_cells, setup_parts, validation
from pmpipe.run import draws as nuisance_draws
from pmpipe.run.setup_parts import (
    BaryonsSetup,
    Checkpointing,
    Kept,
    LensingSetup,
    LightconeSetup,
    SummariesSetup,
)
from pmpipe.run.validation import k_range

REDSHIFT_SAMPLES = 512  # redshifts at which a parametric n(z) is tabulated


@dataclasses.dataclass(frozen=True, eq=False)
class RunSetup:
    """Everything a run's stages need that follows from its configuration, computed once
    (:func:`setup`); the stages read it, never the configuration. The validated run file (the
    stores' provenance and hash); the grid on the device mesh; the cosmology carrying its
    growth and distance tables (a pytree whose parameters and tables are traced leaves: runs
    of one size share their compiled programs); the linear P(k) at a = 1; the N-body's steps
    and snapshots; ic.seed, a_init and a_final; how the ICs are drawn (LPT order, fixed
    amplitude, paired); what the stores keep; the N-body's checkpoints (None: none); the
    summaries' bins; with a lightcone its planes, with lensing its maps, sources and draws,
    with baryons their section (each None without; :mod:`pmpipe.run.setup_parts`); with
    power.kind 'camb' or 'class' the Boltzmann code's table (its σ8 and A_s, code and
    version); the baryons' S(k, z) per draw (one without draws; None without baryons; empty
    in a setup that only plans, :func:`planning_setup`, or is for stages that do not read
    them)."""

    run_file: config.RunFile
    grid: domain.Grid
    cosmology: Cosmology
    power: LinearPower
    timeline: timesteps.Timeline
    seed: int
    a_init: float
    a_final: float
    ic: simulation.ICOptions
    kept: Kept
    checkpoints: Checkpointing | None
    summaries: SummariesSetup
    lightcone: LightconeSetup | None = None
    lensing: LensingSetup | None = None
    baryons: BaryonsSetup | None = None
    linear_table: LinearTable | None = None
    suppressions: tuple[Suppression | None, ...] = ()

    @property
    def config(self) -> config.Run:
        """The run's resolved configuration (for what reads a run beside its stages)."""
        return self.run_file.config

    def lensed(self) -> tuple[LightconeSetup, LensingSetup]:
        """The lightcone and lensing setups of a run with lensing (which needs a lightcone);
        ValueError naming the run when it has none."""
        if self.lightcone is None or self.lensing is None:
            raise ValueError(
                f"run {self.run_file.run_id} has no lensing section (add lightcone and lensing "
                "sections to its campaign's base)"
            )
        return self.lightcone, self.lensing


def setup(
    run_file: config.RunFile,
    mesh,
    tables: Callable[[dict], LinearTable] = boltzmann.linear_table,
    feedback: Callable[..., tuple[Suppression, ...]] | None = baryons.suppressions,
) -> RunSetup:
    """The setup of a run checked by :mod:`pmpipe.run.validation`, on the device mesh
    ``mesh`` (made for run.parallel.pdims; None: its grid holds no devices). ``tables``: a
    Boltzmann code's table from its inputs (:func:`pmpipe.physics.theory.boltzmann.inputs`),
    for power.kind 'camb' and 'class'. ``feedback``: the baryons' S(k, z) tables, called as
    :func:`pmpipe.physics.theory.baryons.suppressions`, for every draw; None: the setup holds
    none, for stages that do not read them. The stages pass pmpipe.storage.power_cache's
    functions, which cache both. Everything is made once: the stages share it."""
    made = planning_setup(run_file, tables, mesh)
    if feedback is None:
        return made
    suppressions = draw_suppressions(run_file.config, made.linear_table, feedback)
    return dataclasses.replace(made, suppressions=suppressions)


def planning_setup(
    run_file: config.RunFile,
    tables: Callable[[dict], LinearTable] = boltzmann.linear_table,
    mesh=None,
) -> RunSetup:
    """:func:`setup` without the baryons' tables (CAMB's HMcode, about 3.5 s), for plans
    that look at a run's sizes, planes and sources (the masks and depth map it names, small
    files, are read)."""
    run = run_file.config
    table = tables(boltzmann_inputs(run)) if run.power.kind in BOLTZMANN_KINDS else None
    cosmo = cosmology.tabulated(cosmology_params(run, None if table is None else table.sigma8))
    if table is not None and table.neutrinos is not None:
        cosmo = neutrinos.run_tables(cosmo, table.neutrinos, run.ic.a_init)
    planes = validation.planes(run) if run.lightcone is not None else None
    lensing = None
    if run.lensing is not None and planes is not None:  # lensing needs a lightcone
        lensing = setup_parts.lensing(run, planes, sources(run, cosmo), draw_sources(run, cosmo))
    return RunSetup(
        run_file,
        grid(run, mesh),
        cosmo,
        linear_power(run, table),
        timeline(run, cosmo),
        run.ic.seed,
        run.ic.a_init,
        run.nbody.a_final,
        simulation.ICOptions(run.ic.lpt_order, run.ic.fixed_amplitude, run.ic.paired),
        setup_parts.kept(run),
        setup_parts.checkpointing(run),
        setup_parts.summaries(run),
        None if planes is None else setup_parts.lightcone(run, planes),
        lensing,
        setup_parts.baryons_setup(run),
        table,
    )


def cosmology_params(run: config.Run, sigma8: float | None = None) -> cosmology.Cosmology:
    """The run's cosmological parameters as the physics' pytree (no tables); ``sigma8``: the
    one a Boltzmann code derived from the run's A_s (required for such a run)."""
    return physics_cosmology(run.cosmology, sigma8)


def physics_cosmology(
    section: config.Cosmology, sigma8: float | None = None
) -> cosmology.Cosmology:
    """A cosmology section as the physics' pytree (no tables); ``sigma8`` as in
    :func:`cosmology_params`."""
    fields = section.model_dump(exclude={"A_s"})
    if sigma8 is not None:
        fields["sigma8"] = sigma8
    if fields["sigma8"] is None:
        raise ValueError(
            "cosmology.A_s is given: sigma8 comes from the run's Boltzmann table (derive.setup)"
        )
    return cosmology.Cosmology(**fields)


def force_mesh_k_max(run: config.Run) -> float:
    """The force mesh's largest |k| (h/Mpc): the summaries' P(k) bins reach it."""
    return float(np.sqrt(3.0) * 2.0 * np.pi / run.box.box_size * (run.force_cells() // 2))


def boltzmann_inputs(run: config.Run) -> dict:
    """The inputs of the run's Boltzmann table (:func:`pmpipe.physics.theory.boltzmann.inputs`): its
    cosmology, and wavenumbers up to :func:`force_mesh_k_max` (beyond the table the power is
    extrapolated, :func:`pmpipe.physics.theory.cosmology.interp_power`)."""
    return boltzmann.inputs(run.cosmology.model_dump(), force_mesh_k_max(run), run.power.kind)


def grid(run: config.Run, mesh) -> domain.Grid:
    """The run's particles, force-mesh oversampling, box, halo and dtype on the device mesh
    ``mesh`` (made for run.parallel.pdims)."""
    return domain.Grid(
        mesh,
        run.box.particles,
        run.box.oversample,
        run.box.box_size,
        ghost_cells.cells(run),
        run.nbody.dtype,
    )


def linear_power(run: config.Run, table: LinearTable | None = None) -> cosmology.LinearPower:
    """Linear P(k) at a = 1 [(Mpc/h)^3] of the particles as a callable of k [h/Mpc]:
    power.kind 'camb' or 'class' from the run's Boltzmann ``table`` (CDM + baryons; total matter
    without massive neutrinos), 'table' from its file (read here)."""
    if run.power.kind in BOLTZMANN_KINDS:
        if table is None:
            raise ValueError(f"power.kind {run.power.kind!r} needs the run's Boltzmann table")
        cosmo = cosmology_params(run, table.sigma8)
        return simulation.power_function(cosmo, run.power.kind, (table.k, table.p_cb))
    found = None
    if run.power.kind == "table":
        found = validation.load_power_table(run.power.table, *k_range(run))
    return simulation.power_function(cosmology_params(run), run.power.kind, found)


def linear_power_source(run_setup: RunSetup) -> dict:
    """Where the run's linear P(k) comes from, for the ic store's provenance: the kind and
    σ8; for power.kind 'camb' and 'class' also A_s, σ8 of CDM + baryons, the code, its version and the
    table's inputs
    (:func:`boltzmann_inputs`); for 'table' the file (σ8 null: the table is not normalised)."""
    run, table = run_setup.config, run_setup.linear_table
    if table is not None:
        return {
            "kind": run.power.kind,
            "sigma8": table.sigma8,
            "A_s": table.A_s,
            "sigma8_cb": table.sigma8_cb,
            "code": table.code,
            "version": table.version,
            "inputs": boltzmann_inputs(run),
        }
    if run.power.kind == "table":  # taken as it is: cosmology.sigma8 does not normalise it
        return {"kind": "table", "sigma8": None, "table": str(run.power.table)}
    return {"kind": run.power.kind, "sigma8": run.cosmology.sigma8}


def linear_power_table(run_setup: RunSetup) -> tuple[np.ndarray, np.ndarray]:
    """(k [h/Mpc], P [(Mpc/h)^3]) of the run's linear P(k) at a = 1: a tabulated kind's own
    table, else the power on the grid of a Boltzmann table for this run
    (:func:`pmpipe.physics.theory.boltzmann.table_k_max`, boltzmann.POINTS_PER_DECADE)."""
    power = run_setup.power
    if power.k_table is not None:
        return np.asarray(power.k_table, np.float64), np.asarray(power.p_table, np.float64)
    k_max = boltzmann.table_k_max(force_mesh_k_max(run_setup.config))
    k = table_wavenumbers(boltzmann.K_MIN, k_max, boltzmann.POINTS_PER_DECADE)
    return k, np.asarray(power(k), np.float64)


def timeline(run: config.Run, cosmo: cosmology.Cosmology) -> timesteps.Timeline:
    """The N-body's steps with its snapshots, a_final among them (spacing 'growth' inverts
    the growth factor of ``cosmo``)."""
    growth = None
    if run.nbody.spacing == "growth" and isinstance(run.nbody.steps, int):
        growth = partial(cosmology.on_host, cosmology.growth_factor, cosmo)
    return timesteps.timeline(
        run.ic.a_init,
        run.nbody.a_final,
        run.nbody.steps,
        run.nbody.snapshots,
        run.nbody.spacing,
        growth,
    )


def sources(run: config.Run, cosmo: cosmology.Cosmology) -> tuple[tuple, ...]:
    """(label, mean redshift, :class:`pmpipe.physics.lensing.projection.Source`) of every source of the
    run's lensing section, in store order, with its nuisances: n(z) shifted by its
    photo_z_shift Δz (n(z - Δz); a parametric n(z) still cut at lightcone.z_max, a table's
    points moved below z = 0 dropped), its shear bias and, for a distribution, the intrinsic
    alignment."""
    lens, z_max = (
        config.section(run.lensing, "lensing"),
        config.section(run.lightcone, "lightcone").z_max,
    )
    shifts, biases = lens.per_source("photo_z_shift"), lens.per_source("shear_bias")
    ia = lens.intrinsic_alignment
    alignment = None if ia is None else intrinsic_alignment.NLA(ia.A_IA, ia.eta_IA, ia.z_pivot)
    out = []
    for z_s, dz, m in zip(lens.source_redshifts, shifts, biases):
        chi = np.asarray(cosmology.comoving_distance(cosmo, 1.0 / (1.0 + z_s + dz)), np.float64)
        source = projection.Source(np.atleast_1d(chi), np.ones(1), shear_bias=m)
        out.append((f"z={z_s:g}", z_s + dz, source))
    first = len(lens.source_redshifts)
    for dist, dz, m in zip(lens.distributions, shifts[first:], biases[first:]):
        if isinstance(dist, config.SmailSources):
            z = np.linspace(0.0, z_max, REDSHIFT_SAMPLES)
            n = projection.smail(np.maximum(z - dz, 0.0), dist.z0, dist.alpha, dist.beta)
            n = np.where(z - dz >= 0.0, n, 0.0)
        else:
            z, n = np.asarray(dist.z) + dz, np.asarray(dist.n)
            n, z = n[z >= 0.0], z[z >= 0.0]
        chi, weights = projection.source_distribution(cosmo, z, n)
        source = projection.Source(chi, weights, alignment, m)
        out.append((dist.name, float(np.sum(weights * z)), source))
    return tuple(out)


def draw_sources(run: config.Run, cosmo: Cosmology) -> tuple[tuple[dict, tuple], ...] | None:
    """Per draw of lensing.draws (None without draws): its values
    (:func:`pmpipe.run.draws.filled_points`) and the sources as :func:`sources` makes them for the
    run as the draw sees it."""
    found = run.lensing.draws if run.lensing is not None else None
    if found is None:
        return None
    return tuple(
        (filled, sources(nuisance_draws.draw_run(run, values), cosmo))
        for values, filled in zip(
            nuisance_draws.points(found, run.ic.seed), nuisance_draws.filled_points(run)
        )
    )


def draw_suppressions(
    run: config.Run, table: LinearTable | None, feedback: Callable = baryons.suppressions
) -> tuple[Suppression | None, ...]:
    """S(k, z) of the run's baryons section as each draw of lensing.draws sees it, all made by
    one call of ``feedback`` (:func:`pmpipe.physics.theory.baryons.suppressions` or a cache of
    it: one CAMB run, HMcode-2020 once per distinct log_T_AGN); of the run alone, one, without
    draws or when they leave the baryons as they are; (None,) without a baryons section. From
    z = 0 to the farther of the lightcone's z_max and the earliest snapshot, at the run's A_s
    (its Boltzmann ``table``'s when it has one)."""
    drawn = nuisance_draws.baryon_values(run)
    if run.baryons is None:
        return (None,)
    temperatures = [run.baryons.log_T_AGN] if drawn is None else [v["log_T_AGN"] for v in drawn]
    distinct = sorted(set(temperatures))
    z_top = max([1.0 / a - 1.0 for a in run.nbody.snapshots] + [0.0])
    if run.lightcone is not None:
        z_top = max(z_top, run.lightcone.z_max)
    made = feedback(
        run.cosmology.model_dump(),
        table.A_s if table is not None else run.cosmology.A_s,
        distinct,
        z_top,
    )
    return tuple(made[distinct.index(t)] for t in temperatures)


def initial_conditions(run_setup: RunSetup, timed=None) -> simulation.Initial:
    """The run's ICs on the devices of its grid: white noise, linear density at a = 1 and the
    LPT particle state at a_init. ``timed(phase)``, a context manager, times the phases
    'white_noise' and 'lpt' (pmpipe.stages.progress.Progress.timed); each waits for its
    results."""
    import jax

    grid = run_setup.grid
    timed = timed or (lambda _: contextlib.nullcontext())
    with timed("white_noise"):
        noise = jax.block_until_ready(
            ics.white_noise(run_setup.seed, grid.particles, grid.mesh, np.dtype(grid.dtype))
        )
    with timed("lpt"):
        init = simulation.initial_conditions(
            run_setup.cosmology,
            noise,
            run_setup.power,
            grid,
            run_setup.a_init,
            run_setup.ic,
        )
        jax.block_until_ready((init.delta_linear, init.disp, init.mom))
    return init
