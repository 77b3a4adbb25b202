"""`pmpipe bench linear`: a run's linear P(k) at a = 1 against CAMB at high precision, as JSON.

For one cosmology (the fiducial, or the fields given), at the same A_s:
- ``camb``: the run's CAMB table (power.kind camb: pmpipe's CAMB settings, interpolated as the
  ICs use it) against a reference CAMB call with AccuracyBoost 3 and CMB spectra on: the
  largest |P / P_ref − 1| for 10⁻³ ≤ k ≤ k_max and where it is;
- ``class``: CLASS's table at pmpipe's settings (power.kind class) at the same A_s against the
  same reference, and its σ8 (when classy is installed);
- ``eisenstein_hu`` and ``eisenstein_hu_nowiggle``: the fits at the table's σ8 against the same
  reference;
- the mean and the largest |P / P_ref − 1| of each in k bands, and the seconds of one CAMB call at pmpipe's
  settings and of the reference.
"""

from __future__ import annotations

import time

import numpy as np

BANDS = ((0.001, 0.01), (0.01, 0.02), (0.02, 0.05), (0.05, 0.2), (0.2, 0.5), (0.5, 1.0))
REFERENCE_ACCURACY = 3.0  # CAMB's AccuracyBoost of the reference
KINDS = ("camb", "class", "eisenstein_hu", "eisenstein_hu_nowiggle")


def bench_linear(fields: dict, k_max: float = 1.0) -> dict:
    """The record of the module docstring for the cosmology ``fields`` (pmpipe's Cosmology
    fields; the rest fiducial) up to ``k_max`` (h/Mpc)."""
    import camb

    from pmpipe.physics.evolution import simulation
    from pmpipe.physics.theory import boltzmann
    from pmpipe.run import config, derive
    from pmpipe.runtime import versions

    section = config.Cosmology.model_validate(fields)
    spec = boltzmann.inputs(section.model_dump(), k_max)
    start = time.perf_counter()
    table = boltzmann.camb_power(spec)
    seconds = time.perf_counter() - start

    kmax = max(boltzmann.TRANSFER_KMAX_FLOOR, 2.0 * k_max * section.h)  # 1/Mpc
    params = boltzmann.camb_params(spec["cosmology"], table.A_s, kmax)
    params.WantCls = True
    params.set_accuracy(AccuracyBoost=REFERENCE_ACCURACY)
    start = time.perf_counter()
    results = camb.get_results(params)
    reference_seconds = time.perf_counter() - start
    reference = results.get_matter_power_interpolator(
        nonlinear=False, hubble_units=True, k_hunit=True
    )

    tables = {"camb": table}
    if versions.installed("classy") is not None:  # at CAMB's A_s: σ8 is the code's own
        same_A_s = {**spec["cosmology"], "A_s": table.A_s}
        same_A_s.pop("sigma8", None)
        start = time.perf_counter()
        tables["class"] = boltzmann.linear_table(boltzmann.inputs(same_A_s, k_max, "class"))
        class_seconds = time.perf_counter() - start

    k = np.geomspace(BANDS[0][0], k_max, 600)
    p_ref = reference.P(0.0, k)
    cosmo = derive.physics_cosmology(section, table.sigma8)
    ratios = {}
    for kind in KINDS:
        if kind == "class" and kind not in tables:
            continue
        found = (tables[kind].k, tables[kind].p) if kind in tables else None
        power = simulation.power_function(cosmo, kind, found)
        ratios[kind] = np.asarray(power(k), np.float64) / p_ref - 1.0
    worst = int(np.argmax(np.abs(ratios["camb"])))
    timings = {"camb": seconds, "reference": reference_seconds}
    codes = {}
    if "class" in tables:
        timings["class"] = class_seconds
        codes = {"class_version": tables["class"].version, "sigma8_class": tables["class"].sigma8}
    return {
        "cosmology": spec["cosmology"],
        "camb_version": table.version,
        "sigma8": table.sigma8,
        "A_s": table.A_s,
        "sigma8_reference": float(results.get_sigma8_0()),
        **codes,
        "k_max": k_max,
        "seconds": timings,
        "camb_max_abs_error": float(abs(ratios["camb"][worst])),
        "camb_max_error_at_k": float(k[worst]),
        "bands": [_band(k, ratios, lo, hi) for lo, hi in BANDS if hi <= k_max],
    }


def _band(k, ratios: dict, lo: float, hi: float) -> dict:
    """Mean and largest |P / P_ref − 1| of each kind for lo <= k <= hi."""
    inside = (k >= lo) & (k <= hi)
    return {
        "k": [lo, hi],
        **{
            kind: {
                "mean": float(np.mean(ratio[inside])),
                "max_abs": float(np.max(np.abs(ratio[inside]))),
            }
            for kind, ratio in ratios.items()
        },
    }
