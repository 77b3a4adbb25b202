"""Checks of a run that need its physics: the device split, the step times, the P(k) table
and the lightcone's distances. Made on the host without JAX, so that a campaign is checked
whole before any work starts; errors name the file and the field."""

from __future__ import annotations

import math
from functools import partial
from pathlib import Path

import numpy as np

from pmpipe.physics.evolution import sky, timesteps
from pmpipe.physics.mesh import domain
from pmpipe.physics.theory import background, boltzmann, power_table
from pmpipe.run import config, draws, files, ghost_cells
from pmpipe.runtime import backend


def k_range(run: config.Run) -> tuple[float, float]:
    """Smallest and largest |k| (h/Mpc) of the particle grid's modes."""
    k_f = 2 * math.pi / run.box.box_size
    return k_f, math.sqrt(3) * k_f * (run.box.particles // 2)


def planes(run: config.Run) -> sky.Planes:
    """The lightcone's planes from host distances: the one geometry of the plan (resources,
    checks) and of the job (:func:`pmpipe.run.derive.setup`)."""
    z_max = config.section(run.lightcone, "lightcone").z_max
    return sky.planes(
        float(background.comoving_distance(run.cosmology, 1.0 / (1.0 + z_max))),
        run.plane_thickness(),
        partial(background.scale_factor_at_distance, run.cosmology),
    )


def step_count(run: config.Run) -> int:
    """The N-body's steps, snapshots included; with spacing 'growth' counted as if equal in a
    (a snapshot may then add one step more or less)."""
    return len(_step_boundaries(run)) - 1


def _step_boundaries(run: config.Run):
    spacing = run.nbody.spacing
    if spacing == "growth" and isinstance(run.nbody.steps, int):
        spacing = "a"  # D1 needs the growth table; the checks do not depend on the spacing
    return timesteps.step_boundaries(
        run.ic.a_init, run.nbody.a_final, run.nbody.steps, run.nbody.snapshots, spacing
    )


def load_power_table(path, k_min: float, k_max: float):
    """(k [h/Mpc], P [(Mpc/h)^3]) of the P(k) table file at path, read within
    files.MAX_TABLE_BYTES and checked to cover [k_min, k_max]
    (:func:`pmpipe.physics.theory.power_table.check_power_table`); ConfigError or PowerTableError
    naming the file."""
    data = files.read_columns(path, "P(k) table")
    return power_table.check_power_table(data, path, k_min, k_max)


def check_run(run: config.Run) -> None:
    """Raise ValueError, naming the fields, when the run cannot be simulated as configured."""
    n, pdims = run.box.particles, run.parallel.pdims
    domain.check_divisible(n, pdims)
    try:
        domain.check_halo_fits(run.force_cells(), pdims, ghost_cells.cells(run))
    except ValueError as err:
        if run.parallel.halo_cells != "auto":
            raise
        raise ValueError(
            f"{err}: the halo 'auto' chose for the run's displacements; use fewer devices "
            "along that axis, more particles, or set parallel.halo_cells"
        ) from None
    if run.parallel.backend == "cudecomp":
        raise ValueError(f"parallel.backend 'cudecomp': {backend.cudecomp_refusal()}")
    _step_boundaries(run)
    if run.power.kind == "table":
        load_power_table(run.power.table, *k_range(run))
    if run.power.kind in power_table.BOLTZMANN_KINDS:
        try:
            boltzmann.code_version(run.power.kind)
        except ModuleNotFoundError as err:
            raise ValueError(str(err)) from None
    if run.lightcone is not None:
        _check_planes(run)
    full = run.lensing.full_sky if run.lensing is not None else None
    if full is not None and full.mask is not None:
        load_mask(full.mask, full.nside)
    flat = run.lensing.flat_sky if run.lensing is not None else None
    if flat is not None and flat.mask is not None:
        load_flat_mask(flat.mask, flat.pixels)
    if flat is not None:
        sky.clipped_multipoles(
            sky.flat_multipoles(flat.field_of_view, flat.pixels), run.summaries.ell_range
        )
    if full is not None:
        sky.clipped_multipoles(sky.healpix_multipoles(full.nside), run.summaries.ell_range)
    noise = run.summaries.shape_noise
    if noise is not None and noise.depth_map is not None:
        load_depth(noise.depth_map, run)
    if run.lensing is not None:
        draws.check(run)


def load_depth(path, run: config.Run) -> np.ndarray:
    """The depth map at path for the run's full-sky maps, checked (values >= 0, finite, not
    all 0); ValueError naming summaries.shape_noise.depth_map."""
    full = run.lensing.full_sky if run.lensing is not None else None
    if full is None:
        raise ValueError(
            "summaries.shape_noise.depth_map needs full-sky maps (lensing.full_sky): it is a "
            "HEALPix map"
        )
    return _healpix_file(
        path, full.nside, "summaries.shape_noise.depth_map", (0.0, math.inf), "finite values >= 0"
    )


def load_mask(path, nside: int) -> np.ndarray:
    """The HEALPix mask at path of ``nside``, checked to hold values from 0 to 1, not all 0;
    ValueError naming lensing.full_sky.mask."""
    return _healpix_file(path, nside, "lensing.full_sky.mask", (0.0, 1.0), "values from 0 to 1")


def load_flat_mask(path, pixels: int) -> np.ndarray:
    """The flat-sky mask at path, an image of ``pixels`` per side checked to hold values from
    0 to 1, not all 0; ValueError naming lensing.flat_sky.mask."""
    return _map_file(
        path, partial(files.read_flat_map, pixels=pixels), "lensing.flat_sky.mask",
        (0.0, 1.0), "values from 0 to 1",
    )  # fmt: skip


def _healpix_file(path, nside: int, field: str, bounds: tuple, allowed: str) -> np.ndarray:
    """The HEALPix map at path (:func:`pmpipe.run.files.read_healpix_map`) of ``nside``,
    checked by :func:`_map_file`."""
    return _map_file(path, partial(files.read_healpix_map, nside=nside), field, bounds, allowed)


def _map_file(path, read, field: str, bounds: tuple, allowed: str) -> np.ndarray:
    """The map ``read(path)`` reads, its values within ``bounds`` and not all 0; ValueError
    naming ``field`` (``allowed`` says what the values may be)."""
    try:
        values = read(path)
    except files.ConfigError as err:
        raise ValueError(f"{field}: {err}") from None
    inside = np.isfinite(values) & (values >= bounds[0]) & (values <= bounds[1])
    if not np.all(inside) or values.max() <= 0:
        raise ValueError(
            f"{field}: {path} must hold {allowed}, not all 0 "
            f"(found {values.min():g} to {values.max():g})"
        )
    return values


def _check_planes(run: config.Run) -> None:
    """The planes reach back no further than the ICs, and flat maps fit in the box."""
    found = planes(run)
    chi_far, box = float(found.chi_edges[-1]), run.box.box_size
    if float(found.a[-1]) <= run.ic.a_init:
        raise ValueError(
            f"lightcone.z_max = {config.section(run.lightcone, 'lightcone').z_max} reaches back before the initial "
            f"conditions (ic.a_init = {run.ic.a_init}); lower z_max or a_init"
        )
    flat = run.lensing.flat_sky if run.lensing is not None else None
    if flat is not None and chi_far * math.radians(flat.field_of_view) > box:
        widest = math.degrees(box / chi_far)
        raise ValueError(
            f"lensing.flat_sky.field_of_view = {flat.field_of_view} deg is wider than the "
            f"box allows: at the first plane the light cone crosses (the farthest, chi = "
            f"{chi_far:.0f} Mpc/h) it spans {chi_far * math.radians(flat.field_of_view):.0f} "
            f"Mpc/h > box.box_size = {box}; use at most {widest:.2f} deg, a larger box or a "
            "lower lightcone.z_max"
        )


def checked(run: config.Run, source: str | Path, field: str = "") -> config.Run:
    """run, once :func:`check_run` passes; else a ConfigError naming source and field."""
    try:
        check_run(run)
    except ValueError as err:
        raise config.invalid(str(source), field, str(err)) from None
    return run


def validate_run(data: dict, source: str | Path) -> config.Run:
    """A run configuration validated and checked (ConfigError naming source and fields)."""
    return checked(config.validate(config.Run, data, source), source)


def read_run_file(path: str | Path) -> config.RunFile:
    """A run's config.json as written for a campaign, read and validated but not checked: for
    its sizes, kind of power and hash (the job that computes the run loads it with
    :func:`load_run_file`)."""
    return config.validate(config.RunFile, config.read_mapping(path), path)


def load_run_file(path: str | Path) -> config.RunFile:
    """Read, validate and check a run's config.json as written for a campaign."""
    run_file = read_run_file(path)
    checked(run_file.config, path, "config")
    return run_file
