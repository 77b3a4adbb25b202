"""Stage ``summaries``: statistics of every N-body snapshot and of the lensing maps.

Reads ``ic.zarr``, ``nbody.zarr`` and (with lensing) ``lensing.zarr``; writes
``summaries.zarr`` (docs/outputs.md): the matter power spectrum ``pk`` (a, k) of ρ/ρ̄ with the
CIC window divided out (shot noise L³/N³ recorded, not subtracted), the mean wavenumber and
mode count per bin, linear theory D1(a)² P_lin(k), with baryons ``pk_baryons``, P(k) times
their suppression; at a_final the cross spectrum with the
initial (linear) field, the propagator and r(k); with lensing, the C_ell of every pair of sources
and per source and smoothing scale the peak counts and PDF of κ (pmpipe.stages.map_statistics).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from pmpipe.physics.mesh import painting
from pmpipe.physics.mesh.domain import Grid
from pmpipe.physics.statistics import resolution, stats
from pmpipe.physics.theory import baryons, cosmology, neutrinos
from pmpipe.run import derive
from pmpipe.run.setup_parts import BaryonsSetup
from pmpipe.stages import map_statistics, store_path
from pmpipe.stages.inputs import Inputs
from pmpipe.stages.progress import Progress
from pmpipe.storage import provenance, store


def run(setup: derive.RunSetup, inputs: Inputs, progress: Progress) -> Path:
    """Measure and write the summaries of the run's snapshots; returns the store's path."""
    mesh, cosmo = setup.grid.mesh, setup.cosmology
    started = store.now()
    a = np.asarray(inputs.store("nbody")["a"][:], dtype=np.float64)
    n_bins = setup.summaries.pk_bins
    measured = _measure_spectra(setup, inputs, progress, a, n_bins)
    path = store_path(inputs.run_dir, "summaries")
    group = store.create(
        path,
        provenance.provenance(
            setup.run_file, "summaries", mesh, started, inputs.made_from("summaries")
        ),
    )
    growth = _write_spectra(group, setup, a, n_bins, measured)
    if setup.baryons is not None:
        _write_baryon_spectra(group, setup, setup.baryons, a, measured)
    with progress.timed("statistics"):
        write_initial_correlation(
            group,
            setup.grid,
            inputs,
            n_bins,
            float(growth[-1]) / float(cosmology.growth_factor(cosmo, 1.0)),
        )
    progress("cross-correlation with the initial field")
    if setup.lensing is not None:
        with progress.timed("statistics"):
            map_statistics.write_lensing_statistics(group, setup, inputs)
        progress("lensing statistics")
    store.mark_complete(group)
    return path


def _measure_spectra(
    setup: derive.RunSetup, inputs: Inputs, progress: Progress, a, n_bins: int
) -> tuple:
    """(mean |k| per bin, P(k) (a, k), modes per bin) of every snapshot's density."""
    mesh, box_size = setup.grid.mesh, setup.grid.box_size
    spectra = []
    for i in range(a.size):
        field = inputs.field("nbody", "density", (i,))
        with progress.timed("statistics"):
            k_mean, pk, modes = stats.power_spectrum(
                field, mesh, box_size, n_bins, compensate_cic=setup.summaries.compensate_cic
            )
        spectra.append(pk)
        progress(f"P(k) at a = {a[i]:.4f}")
    return k_mean, np.asarray(spectra), modes


def _linear_theory(setup: derive.RunSetup, a, growth, k) -> np.ndarray:
    """Linear P(k) (a, k) of the particles: D1(a)² P_lin(k) from the scale-free ``growth`` D1
    at the snapshots ``a``; with massive neutrinos D_cb(k, a)² P_cb(k), the growth the run's
    ICs and force follow (:func:`pmpipe.physics.theory.neutrinos.cb_growth` from ic.a_init)."""
    power = np.asarray(setup.power(k), np.float64)[None, :]
    table = setup.linear_table
    if table is None or table.neutrinos is None:
        return growth[:, None] ** 2 * power
    nu = table.neutrinos
    scale_dependent = neutrinos.cb_growth(setup.cosmology, nu, setup.a_init, a)
    on_k = np.stack([np.interp(np.log(k), np.log(nu.k), row) for row in scale_dependent])
    return on_k**2 * power


def _write_baryon_spectra(
    group, setup: derive.RunSetup, feedback: BaryonsSetup, a, measured: tuple
) -> None:
    """P(k) of every snapshot times the baryons' S(k, z) at the bins' mean |k| (per draw when
    lensing.draws draws log_T_AGN; ``feedback``: the run's baryons)."""
    k_mean, spectra, _ = measured
    k = np.where(np.isfinite(k_mean), k_mean, 0.0)
    tables = setup.suppressions
    factors = np.stack(
        [[baryons.factor(table, k, 1.0 / a_i - 1.0) for a_i in a] for table in tables if table]
    )
    assert len(factors) == len(tables)  # the run has baryons
    per_draw = feedback.per_draw
    store.write_array(
        group,
        "pk_baryons",
        np.asarray(spectra) * (factors if per_draw else factors[0]),
        (*(("draw",) if per_draw else ()), "a", "k"),
        "(Mpc/h)^3",
        "pk times the baryonic feedback's S(k, z) at k_mean (pmpipe.physics.theory.baryons)",
        baryons=feedback.parameters,
    )


def _write_spectra(group, setup: derive.RunSetup, a, n_bins: int, measured: tuple) -> np.ndarray:
    """The k bins, P(k) per snapshot with linear theory and the resolved range; returns the
    growth factor D1 at each snapshot."""
    cosmo, grid, box_size = setup.cosmology, setup.grid, setup.grid.box_size
    compensated = setup.summaries.compensate_cic
    k_mean, spectra, modes = measured
    growth = np.asarray(cosmology.growth_factor(cosmo, a), np.float64)
    k_centre = np.arange(1, n_bins + 1) * (2 * np.pi / box_size)
    k_eval = np.where(np.isfinite(k_mean), k_mean, k_centre)
    linear = _linear_theory(setup, a, growth, k_eval)
    shot_noise = box_size**3 / grid.particles**3
    store.write_coordinate(group, "a", a, "1", "scale factor of the snapshot")
    store.write_coordinate(
        group, "k", k_centre, "h/Mpc", "centre of the |k| bin (bins of width 2 pi / L from 0)"
    )
    store.write_array(
        group,
        "pk",
        np.asarray(spectra),
        ("a", "k"),
        "(Mpc/h)^3",
        "matter power spectrum of rho / rho_mean, CIC window divided out"
        if compensated
        else "matter power spectrum of rho / rho_mean",
        shot_noise=shot_noise,
        shot_noise_subtracted=False,
        compensated=compensated,
    )
    store.write_array(
        group, "k_lo", k_centre - np.pi / box_size, ("k",), "h/Mpc", "lower edge of the |k| bin"
    )
    store.write_array(
        group, "k_hi", k_centre + np.pi / box_size, ("k",), "h/Mpc", "upper edge of the |k| bin"
    )
    store.write_array(group, "k_mean", k_mean, ("k",), "h/Mpc", "mean |k| of the modes in the bin")
    store.write_array(group, "modes", modes, ("k",), "1", "number of Fourier modes in the bin")
    store.write_array(
        group,
        "pk_linear",
        linear,
        ("a", "k"),
        "(Mpc/h)^3",
        "linear theory at k_mean: D1(a)^2 P_lin(k), with massive neutrinos the CDM + baryon "
        "power with its scale-dependent growth, D_cb(k, a)^2 P_cb(k)",
    )
    k_valid = resolution.k_max_valid(grid.particles, box_size, grid.oversample)
    store.write_array(
        group,
        "k_max_valid",
        np.full(a.size, k_valid),
        ("a",),
        "h/Mpc",
        "highest wavenumber at which the particle grid and force mesh give "
        f"P(k) within {resolution.POWER_TOLERANCE:.0%} of a run with twice the particles per side "
        "(pmpipe.physics.statistics.resolution)",
    )
    group.attrs["shot_noise"] = shot_noise
    return growth


def write_initial_correlation(
    group, grid: Grid, inputs: Inputs, n_bins: int, growth_final: float
) -> None:
    """At a_final: the final particles painted on the particle grid of the run's ``grid`` (CIC
    compensated) against the initial linear density: P_cross, P_initial, P_final, propagator
    P_cross / (D P_initial) and r = P_cross / sqrt(P_final P_initial)."""
    mesh = grid.mesh
    linear = inputs.field("ic", "linear_density")
    disp = inputs.field("nbody", "displacement")
    n, box_size = grid.particles, grid.box_size
    halo = max(1, grid.halo // grid.oversample)
    rho, needed = painting.paint(disp, Grid(mesh, n, 1, box_size, halo, grid.dtype))
    painting.check_halo(needed, halo)
    _, p_final, p_initial, p_cross, _ = stats.auto_and_cross_spectra(
        rho - 1.0, linear, mesh, box_size, n_bins, compensate_cic=True
    )
    k_centre = np.arange(1, n_bins + 1) * (2 * np.pi / box_size)
    beyond = k_centre > np.pi * n / box_size  # past the particle grid's Nyquist frequency
    mask = lambda x: np.where(beyond, np.nan, x)
    dims = ("k",)
    store.write_array(
        group,
        "pk_final_particles",
        mask(p_final),
        dims,
        "(Mpc/h)^3",
        "P(k) at a_final of the particles painted on the particle grid, CIC divided out",
    )
    store.write_array(
        group,
        "pk_initial",
        mask(p_initial),
        dims,
        "(Mpc/h)^3",
        "P(k) of the initial linear density (at a = 1)",
    )
    store.write_array(
        group,
        "pk_cross_initial",
        mask(p_cross),
        dims,
        "(Mpc/h)^3",
        "cross P(k) of the final and the initial linear density",
    )
    store.write_array(
        group,
        "propagator",
        mask(p_cross / (growth_final * p_initial)),
        dims,
        "1",
        "propagator G(k) = P_cross / (D(a_final) P_initial)",
    )
    store.write_array(
        group,
        "r_initial",
        mask(stats.correlation_coefficient(p_cross, p_final, p_initial)),
        dims,
        "1",
        "correlation coefficient r(k) of the final and initial density",
    )


if __name__ == "__main__":
    from pmpipe.stages import runner

    sys.exit(runner.main("summaries", run))
