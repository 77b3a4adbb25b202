"""`pmpipe bench growth` and `pmpipe bench nonlinear`: the N-body's P(k), with and without
massive neutrinos, against CAMB's linear theory and HMcode-2020, as JSON.

Both run pairs of simulations with inverted phases (the partners of a pair; the mean of their
P(k) cancels the terms odd in the linear field, which in one realisation scatter its low-k power
by about a percent) at A_s = A_S, with power.kind camb, massless and at Σm_ν = ``m_nu``.

- growth: P(k, a) of the CDM + baryon particles over the power of the same realisation's
  linear field at a = 1, against CAMB's [T_cb(k, a) / T_cb(k, 1)]² (its ``delta_nonu``), in the
  lowest k bins at a = 0.5 and 1; and the neutrino suppression P(Σm_ν) / P(0) of the particles
  against CAMB's linear P_cb(Σm_ν) / P(0) at the same a.
- nonlinear: fixed-amplitude pairs (every |δ_k| at its mean), P(k) at a = 1 against HMcode-2020
  (CAMB's non-linear model) for total matter: the massless run's ratio, beside the PM's own
  deficit from its force resolution (:func:`pmpipe.physics.statistics.resolution.power_transfer`) and the
  Eisenstein-Hu fit's error on the linear P(k) at the same σ8; and the suppression of total
  matter, (f_cb + f_ν T_ν/T_cb)² P_cb(Σm_ν) / P(0) (the neutrinos' linear response, as the
  lightcone's planes hold it), against HMcode-2020's ratio.
"""

from __future__ import annotations

import time
import types

import numpy as np

A_S = 2.1e-9  # the amplitude of both runs of a comparison (same A_s: the suppression is physical)
SNAPSHOT = 0.5  # the earlier scale factor of the growth comparison
OVERSAMPLE = 2  # force mesh B of every run


def _run(particles: int, box: float, steps: int, a_init: float, m_nu: float):
    """The run of one side of a comparison: ``particles`` per side in ``box`` Mpc/h, Σm_ν =
    ``m_nu`` eV, A_S, CAMB, ``steps`` PM steps from ``a_init`` with a snapshot at SNAPSHOT."""
    from pmpipe.run import config

    return config.Run.model_validate(
        {
            "cosmology": {"m_nu": m_nu, "A_s": A_S},
            "power": {"kind": "camb"},
            "box": {"particles": particles, "box_size": box, "oversample": OVERSAMPLE},
            "ic": {"a_init": a_init},
            "nbody": {"steps": steps, "snapshots": [SNAPSHOT]},
        }
    )


def _pair(run, seed: int, fixed_amplitude: bool) -> dict:
    """P(k) of the particles at each snapshot (the pair's mean), the linear field's P(k) at
    a = 1, the bins' k, the run's setup and the seconds of the two simulations."""
    from pmpipe.physics.evolution import ics, simulation
    from pmpipe.physics.statistics import stats
    from pmpipe.run import config, derive
    from pmpipe.runtime import parallel

    mesh = parallel.make_mesh((1, 1))
    setup = derive.setup(config.RunFile.build("bench", f"m{run.cosmology.m_nu}", 0, {}, run), mesh)
    noise = ics.white_noise(seed, run.box.particles, mesh)
    box, bins = run.box.box_size, run.box.particles // 2
    power: dict[float, list[np.ndarray]] = {}
    start = time.perf_counter()
    for paired in (False, True):
        options = simulation.ICOptions(fixed_amplitude=fixed_amplitude, paired=paired)
        init, result = simulation.simulate(
            setup.cosmology, noise, setup.grid, setup.timeline, setup.power, options
        )
        k, p_linear, _ = stats.power_spectrum(init.delta_linear, mesh, box, bins)
        for a, rho in result.snapshots.items():
            _, p, _ = stats.power_spectrum(rho - 1.0, mesh, box, bins, compensate_cic=True)
            power.setdefault(float(a), []).append(np.asarray(p))
    return {
        "k": np.asarray(k),
        "p_linear": np.asarray(p_linear),
        "p": {a: np.mean(found, axis=0) for a, found in power.items()},
        "setup": setup,
        "seconds": time.perf_counter() - start,
    }


def _camb(run, nonlinear: bool, redshifts: list[float]):
    """CAMB's results for the run's cosmology at A_S (linear, or with HMcode-2020)."""
    import camb

    from pmpipe.physics.theory import boltzmann

    params = boltzmann.camb_params(run.cosmology.model_dump(), A_S, 20.0)
    params.set_matter_power(redshifts=redshifts, kmax=20.0)
    if nonlinear:
        params.NonLinear = camb.model.NonLinear_both
        params.NonLinearModel.set_params(halofit_version="mead2020")
    return camb.get_results(params)


def _cb_power(results, k, a: float):
    """CAMB's linear P(k) [(Mpc/h)^3] of CDM + baryons at scale factor a, k (K,) in h/Mpc."""
    interpolator = results.get_matter_power_interpolator(
        nonlinear=False, hubble_units=True, k_hunit=True, var1="delta_nonu", var2="delta_nonu"
    )
    return interpolator.P(1.0 / a - 1.0, k)


def bench_growth(
    particles: int, box: float, m_nu: float, steps: int, a_init: float, seed: int, bins: int
) -> dict:
    """The growth record of the module docstring, for the lowest ``bins`` k bins."""
    masses = (0.0, m_nu)
    runs = {m: _run(particles, box, steps, a_init, m) for m in masses}
    pairs = {m: _pair(run, seed, fixed_amplitude=False) for m, run in runs.items()}
    refs = {m: _camb(run, False, [1.0 / SNAPSHOT - 1.0, 0.0]) for m, run in runs.items()}
    k = pairs[0.0]["k"][:bins]
    record: dict = {
        "particles": particles,
        "box": box,
        "steps": steps,
        "a_init": a_init,
        "m_nu": m_nu,
        "k": k.tolist(),
        "growth": {},
        "suppression": {},
    }
    for a in (SNAPSHOT, 1.0):
        for m in masses:
            nbody = pairs[m]["p"][a][:bins] / pairs[m]["p_linear"][:bins]
            camb_growth = _cb_power(refs[m], k, a) / _cb_power(refs[m], k, 1.0)
            record["growth"].setdefault(str(m), {})[str(a)] = (nbody / camb_growth - 1.0).tolist()
        nbody = pairs[m_nu]["p"][a][:bins] / pairs[0.0]["p"][a][:bins]
        linear = _cb_power(refs[m_nu], k, a) / _cb_power(refs[0.0], k, a)
        record["suppression"][str(a)] = {
            "camb_linear": linear.tolist(),
            "nbody_over_camb": (nbody / linear - 1.0).tolist(),
        }
    record["seconds"] = {str(m): pair["seconds"] for m, pair in pairs.items()}
    return record


def _total_matter(pair: dict, k) -> np.ndarray:
    """The pair's total-matter P(k) at a = 1 from its CDM + baryon P(k): the neutrinos' linear
    response T_ν / T_cb of the run's table, weighted by Ω_ν / Ω_m."""
    from pmpipe.physics.theory import background, neutrinos

    setup = pair["setup"]
    p_cb = pair["p"][1.0][: len(k)]
    table = setup.linear_table.neutrinos
    if table is None:
        return p_cb
    cosmology = setup.config.cosmology
    f_nu = float(background.omega_nu(types.SimpleNamespace(**cosmology.model_dump())))
    f_nu /= cosmology.Omega_m
    ratio = np.interp(np.log(k), np.log(table.k), neutrinos.transfer_ratio(table, 1.0))
    return p_cb * (1.0 - f_nu + f_nu * ratio) ** 2


def bench_nonlinear(
    particles: int, box: float, m_nu: float, steps: int, a_init: float, seed: int, k_max: float
) -> dict:
    """The nonlinear record of the module docstring, for bins up to ``k_max`` (h/Mpc)."""
    from pmpipe.physics.evolution import simulation
    from pmpipe.physics.statistics import resolution
    from pmpipe.run import derive

    masses = (0.0, m_nu)
    runs = {m: _run(particles, box, steps, a_init, m) for m in masses}
    pairs = {m: _pair(run, seed, fixed_amplitude=True) for m, run in runs.items()}
    refs = {m: _camb(run, True, [0.0]) for m, run in runs.items()}
    k_all = pairs[0.0]["k"]
    k = k_all[k_all <= k_max]
    halofit = {
        m: ref.get_matter_power_interpolator(nonlinear=True, hubble_units=True, k_hunit=True).P(
            0.0, k
        )
        for m, ref in refs.items()
    }
    linear = refs[0.0].get_matter_power_interpolator(
        nonlinear=False, hubble_units=True, k_hunit=True
    )
    table = pairs[0.0]["setup"].linear_table
    section = runs[0.0].cosmology
    eh = simulation.power_function(derive.physics_cosmology(section, table.sigma8))
    totals = {m: _total_matter(pairs[m], k) for m in masses}
    suppression = totals[m_nu] / totals[0.0]
    hmcode_suppression = halofit[m_nu] / halofit[0.0]
    return {
        "particles": particles,
        "box": box,
        "oversample": OVERSAMPLE,
        "steps": steps,
        "a_init": a_init,
        "m_nu": m_nu,
        "sigma8": table.sigma8,
        "k": k.tolist(),
        "massless_over_hmcode": (totals[0.0] / halofit[0.0] - 1.0).tolist(),
        "pm_resolution_deficit": (
            np.asarray(resolution.power_transfer(k, particles, box, OVERSAMPLE)) - 1.0
        ).tolist(),
        "eisenstein_hu_linear_error": (
            np.asarray(eh(k), np.float64) / linear.P(0.0, k) - 1.0
        ).tolist(),
        "suppression_hmcode": hmcode_suppression.tolist(),
        "suppression_nbody_over_hmcode": (suppression / hmcode_suppression - 1.0).tolist(),
        "seconds": {str(m): pair["seconds"] for m, pair in pairs.items()},
    }
