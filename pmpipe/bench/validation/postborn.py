"""`pmpipe bench postborn`: ray-traced against Born lensing of the same N-body planes, as JSON.

Runs the ic, nbody and lensing stages (lensing.method both) of ``seeds`` realisations of a
run (``particles``³, 256 Mpc/h, force mesh B = 2, ``steps`` steps, planes 64 Mpc/h thick to
z = 1, a 6° flat map of ``pixels``² for sources at z = 0.7 and 1) in a temporary folder, and
records per seed and source, in three logarithmic bins from ell_min_valid to the multipole at
which the source's mid-way plane reaches k_max_valid: the ray-traced κ's C_ℓ over Born's minus
1 and the rotation's C_ℓ^ωω over Born's C_ℓ^κκ; for the whole map the rms of the κ difference
over Born's rms and the skewness of both κ maps; and for both maps smoothed by a Gaussian of
``smoothing`` arcmin: skewness, excess kurtosis and the counts of peaks in bins of height
ν = κ/σ, σ the smoothed Born map's rms (the same thresholds in κ for both maps).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import cast

import numpy as np

SOURCES = (0.7, 1.0)
FIELD_OF_VIEW = 6.0
PEAK_HEIGHTS = (-2.0, 0.0, 1.0, 2.0, 3.0, 4.0, np.inf)


def _run(particles: int, pixels: int, seed: int, steps: int = 10):
    from pmpipe.run import config, outputs

    return config.Run.model_validate(
        {
            "box": {"particles": particles, "box_size": 256.0, "oversample": 2},
            "ic": {"seed": seed},
            "nbody": {"steps": steps},
            "lightcone": {"z_max": 1.0, "plane_thickness": 64.0},
            "lensing": {
                "source_redshifts": list(SOURCES),
                "flat_sky": {"field_of_view": FIELD_OF_VIEW, "pixels": pixels},
                "method": "both",
            },
            "summaries": {"kappa_range": [-0.05, 0.05]},
            "outputs": outputs.STAGES_ONE_BY_ONE,
        }
    )


def _skewness(x) -> float:
    x = np.asarray(x, np.float64) - np.mean(x)
    return float(np.mean(x**3) / np.mean(x**2) ** 1.5)


def _kurtosis(x) -> float:
    x = np.asarray(x, np.float64) - np.mean(x)
    return float(np.mean(x**4) / np.mean(x**2) ** 2 - 3)


def smoothed_statistics(traced, born, smoothing: float) -> dict:
    """Skewness, excess kurtosis and peak counts (bins PEAK_HEIGHTS of ν = κ/σ_Born) of the
    ray-traced and Born maps (n, n) smoothed by a Gaussian of ``smoothing`` arcmin."""
    from pmpipe.physics.statistics import stats

    maps = {
        "raytrace": np.asarray(stats.smooth_flat(traced, FIELD_OF_VIEW, smoothing)),
        "born": np.asarray(stats.smooth_flat(born, FIELD_OF_VIEW, smoothing)),
    }
    sigma = float(np.std(maps["born"], dtype=np.float64))
    edges = np.asarray(PEAK_HEIGHTS) * sigma + float(np.mean(maps["born"], dtype=np.float64))
    record: dict = {}
    for name, m in maps.items():
        record[f"skewness_{name}_smoothed"] = _skewness(m)
        record[f"kurtosis_{name}_smoothed"] = _kurtosis(m)
        record[f"peaks_{name}"] = stats.peak_counts_flat(m, edges).tolist()
    return record


def bench_postborn(
    particles: int, pixels: int, seeds: int, steps: int = 10, smoothing: float = 2.0
) -> dict:
    """The record of the module docstring."""
    import zarr

    from pmpipe.bench import in_process
    from pmpipe.physics.lensing import projection
    from pmpipe.physics.statistics import stats
    from pmpipe.run import derive

    record: dict = {
        "particles": particles,
        "pixels": pixels,
        "field_of_view_deg": FIELD_OF_VIEW,
        "z_source": list(SOURCES),
        "steps": steps,
        "smoothing_arcmin": smoothing,
        "peak_heights_nu": [float(v) for v in PEAK_HEIGHTS],
        "runs": [],
    }
    with tempfile.TemporaryDirectory() as folder:
        for seed in range(seeds):
            run = _run(particles, pixels, seed, steps)
            run_dir, _ = in_process.run_stages(run, Path(folder), "postborn", f"s{seed}", seed, 3)
            lens = zarr.open_group(run_dir / "lensing.zarr", mode="r")
            stored = {
                name: np.asarray(cast(zarr.Array, lens[name])[:])
                for name in ("kappa", "kappa_born", "omega", "ell_min_valid")
            }
            cosmo = derive.cosmology_params(run)
            chi_s = projection.source_distribution(cosmo, list(SOURCES), [1.0, 1.0])[0]
            k_max = float(cast(float, lens.attrs["k_max_valid"]))
            for s, z in enumerate(SOURCES):
                traced, born = stored["kappa"][s], stored["kappa_born"][s]
                low = float(stored["ell_min_valid"][s])
                edges = np.geomspace(low, k_max * chi_s[s] / 2, 4)

                def cl(a, edges=edges):
                    return stats.flat_sky_cl(a, FIELD_OF_VIEW, edges)[1]

                cl_born = cl(born)
                record["runs"].append(
                    {
                        "seed": seed,
                        "z_source": z,
                        "ell_edges": edges.tolist(),
                        "cl_raytrace_over_born_minus_1": (cl(traced) / cl_born - 1).tolist(),
                        "cl_omega_over_cl_kappa": (cl(stored["omega"][s]) / cl_born).tolist(),
                        "rms_difference_over_rms": float(np.std(traced - born) / np.std(born)),
                        "skewness_born": _skewness(born),
                        "skewness_raytrace": _skewness(traced),
                    }
                    | smoothed_statistics(traced, born, smoothing)
                )
    worst = max(abs(v) for r in record["runs"] for v in r["cl_raytrace_over_born_minus_1"])
    record["largest_cl_difference"] = worst
    return record
