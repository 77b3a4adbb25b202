"""``pmpipe bench nuisances``: the survey nuisances of resolved maps against pyccl's Limber
spectra (CAMB's HMcode-2020 power), as JSON.

Per seed, one N-body realisation (``particles``³ in a box of ``box`` Mpc/h (default 128),
force mesh B = 2, CAMB's linear power, ``steps`` steps (default 16), planes 32 Mpc/h thick to
z = 0.6, filling each copy of the box: lightcone.copy_every 'box') lenses two Gaussian n(z)
bins (:data:`SOURCES`) onto a flat map of ``pixels``², 4.5° per 128 Mpc/h of box (the field
the box spans at z = 0.6), with three draws of the nuisances (:data:`DRAWS`: none, NLA alignments,
a photo-z shift of both bins); for the first seed a second run of the same realisation adds
baryonic feedback (HMcode-2020, :data:`LOG_T_AGN`). Every comparison is paired (draws of one
N-body, or one seed with and without baryons), in the multipole bins inside both sources'
resolved range (``ell_min_valid`` to ``ell_max_valid``):

- plain: the maps' C_ij without nuisances over pyccl's, minus 1 (the N-body's power against
  HMcode-2020's, through the lensing kernels);
- alignments: the part of C_ij they add (draw 1 minus draw 0) over pyccl's NLA part, and the
  same relative to each realisation's own C_ij (``relative``: (ΔC / C)_maps over (ΔC / C)_pyccl,
  which cancels most of the cosmic variance and of the PM's deficit of power);
- photo_z_shift: C_ij(Δz) / C_ij - 1 over pyccl's;
- baryons: C_ij with feedback over C_ij without, and pyccl's ratio (HMcode-2020 with feedback
  over without, both through CAMB); ``worst`` their largest difference.

The others are averaged over seeds per bin, with their standard error; ``worst`` is the
largest deviation of a mean over bins and pairs. A 4.5° field holds tens of modes per bin, and
the alignments' part of C_ij is a few per cent of it: that part needs many seeds.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, NamedTuple, cast

import numpy as np

SOURCES = ((0.3, 0.06), (0.5, 0.06))  # Gaussian n(z) bins: centre, width
Z_TABLE = np.linspace(0.0, 0.56, 113)  # shifted by SHIFT, within z_max
FIELD_PER_BOX = 4.5 / 128.0  # degrees of the map per Mpc/h of box
A_IA = 1.0
SHIFT = 0.03
LOG_T_AGN = 8.0
DRAWS = [{"A_IA": 0.0}, {"A_IA": A_IA}, {"photo_z_shift": SHIFT}]


class Sizes(NamedTuple):
    """The benchmark's runs: particles per side, map pixels per side, PM steps, box (Mpc/h)."""

    particles: int
    pixels: int
    steps: int = 16
    box: float = 128.0


def bench_run(sizes: Sizes, seed: int, baryons: bool):
    """The benchmark's run (config.Run) of one seed, with or without baryonic feedback."""
    from pmpipe.run import config, outputs

    bins = [
        {"kind": "table", "name": f"bin{i}", "z": Z_TABLE.tolist(),
         "n": np.exp(-0.5 * ((Z_TABLE - centre) / width) ** 2).tolist()}
        for i, (centre, width) in enumerate(SOURCES)
    ]  # fmt: skip
    return config.Run.model_validate(
        {
            "box": {"particles": sizes.particles, "box_size": sizes.box, "oversample": 2},
            "power": {"kind": "camb"},
            "ic": {"seed": seed},
            "nbody": {"steps": sizes.steps},
            "lightcone": {"z_max": 0.6, "plane_thickness": 32.0, "copy_every": "box"},
            "lensing": {
                "source_redshifts": [],
                "distributions": bins,
                "intrinsic_alignment": {"A_IA": 0.0},
                "flat_sky": {"field_of_view": FIELD_PER_BOX * sizes.box, "pixels": sizes.pixels},
                "draws": {"kind": "list", "points": DRAWS},
            },
            "baryons": {"log_T_AGN": LOG_T_AGN} if baryons else None,
            "summaries": {"smoothing_arcmin": [0.0], "ell_bins": 24},
            "outputs": outputs.STAGES_ONE_BY_ONE,
        }
    )


def _pyccl_spectra(run, ell) -> dict[str, np.ndarray]:
    """pyccl's Limber C_ij (S, S, L) at ``ell``: plain, with the alignments, with the shift,
    and with baryonic feedback."""
    import pyccl

    from pmpipe.physics.lensing import intrinsic_alignment

    c = run.cosmology
    common = {
        "Omega_c": c.Omega_m - c.Omega_b, "Omega_b": c.Omega_b, "h": c.h, "n_s": c.n_s,
        "sigma8": c.sigma8, "T_CMB": c.T_cmb, "Neff": c.N_eff, "m_nu": 0.0,
        "transfer_function": "boltzmann_camb", "matter_power_spectrum": "camb",
    }  # fmt: skip
    models = {
        "gravity": {"halofit_version": "mead2020", "kmax": 20.0},
        "baryons": {
            "halofit_version": "mead2020_feedback", "HMCode_logT_AGN": LOG_T_AGN, "kmax": 20.0
        },
    }  # fmt: skip
    # pyccl's C1 ρ_crit is 5e-14 RHO_CRITICAL, pmpipe's 0.0134: its A_IA is scaled to match
    a_ia = A_IA * intrinsic_alignment.C1_RHO_CRIT / (5e-14 * pyccl.physical_constants.RHO_CRITICAL)
    # one cosmology per model: pyccl runs CAMB once for each, at its first spectrum
    cosmologies = {
        model: pyccl.Cosmology(**common, extra_parameters={"camb": extra})
        for model, extra in models.items()
    }
    out = {}
    for name, model, shift, ia in (
        ("plain", "gravity", 0.0, None),
        ("alignments", "gravity", 0.0, a_ia),
        ("photo_z_shift", "gravity", SHIFT, None),
        ("baryons", "baryons", 0.0, None),
    ):
        cosmo = cosmologies[model]
        tracers = []
        for centre, width in SOURCES:
            z = Z_TABLE + shift
            n = np.exp(-0.5 * ((Z_TABLE - centre) / width) ** 2)
            bias = None if ia is None else (z, np.full_like(z, ia))
            tracers.append(pyccl.WeakLensingTracer(cosmo, dndz=(z, n), ia_bias=bias))
        out[name] = np.array(
            [[pyccl.angular_cl(cosmo, a, b, ell) for b in tracers] for a in tracers]
        )
    return out


def _summaries(run, results: Path, name: str, seed: int) -> dict[str, np.ndarray]:
    """Every stage of ``run`` as the run ``name`` of the results folder ``results``; the
    summaries' C_ℓ (D, S, S, L), the bins' mean multipoles and the sources' resolved ranges."""
    import zarr

    from pmpipe.bench import in_process

    folder, _ = in_process.run_stages(run, results, "nuisances", name, seed)
    group = zarr.open_group(folder / "summaries.zarr", mode="r")
    names = ("cl", "ell_mean", "ell_lo", "ell_hi", "ell_min_valid", "ell_max_valid")
    return {name: np.asarray(cast(zarr.Array, group[name])[:]) for name in names}


def _upper(cl: np.ndarray) -> np.ndarray:
    """The pairs i <= j of C_ij (..., S, S, L) as (..., P, L)."""
    return cl[..., *np.triu_indices(cl.shape[-2]), :]


def _paired(cl: np.ndarray, theory: dict) -> dict[str, np.ndarray]:
    """Per comparison, the deviation (P, L) of one seed's draws' C_ij (D, S, S, L) from
    pyccl's (see the module)."""
    plain, ia, shifted = _upper(cl[0]), _upper(cl[1]), _upper(cl[2])
    th = {name: _upper(values) for name, values in theory.items()}
    part, th_part = ia - plain, th["alignments"] - th["plain"]
    return {
        "plain": plain / th["plain"] - 1,
        "alignments": part / th_part - 1,
        "alignments_relative": (part / plain) / (th_part / th["plain"]) - 1,
        "photo_z_shift": (shifted / plain - 1) / (th["photo_z_shift"] / th["plain"] - 1) - 1,
    }


def _baryons(plain: np.ndarray, with_baryons: np.ndarray, theory: dict) -> dict[str, Any]:
    """C_ij with feedback over without (S, S, L each), measured and pyccl's, per pair (P, L)."""
    measured = _upper(with_baryons) / _upper(plain)
    predicted = _upper(theory["baryons"]) / _upper(theory["plain"])
    return {
        "measured_ratio": measured.tolist(),
        "pyccl_ratio": predicted.tolist(),
        "worst": float(np.max(np.abs(measured - predicted))),
    }


def _resolved_bins(found: dict) -> np.ndarray:
    """The multipole bins inside every source's resolved range (mask (L,))."""
    low, high = float(np.max(found["ell_min_valid"])), float(np.min(found["ell_max_valid"]))
    from pmpipe.physics.statistics import resolution

    keep = resolution.bins_within(found["ell_lo"], found["ell_hi"], low, high)
    if not keep.any():
        raise ValueError(
            f"no multipole bin lies inside the resolved range {low:.0f}-{high:.0f}: "
            "raise --particles or --pixels"
        )
    return keep


def bench_nuisances(
    particles: int, pixels: int, seeds: int, steps: int = 16, box: float = 128.0
) -> dict[str, Any]:
    """The record of the module docstring."""
    sizes = Sizes(particles, pixels, steps, box)
    record: dict[str, Any] = {
        **sizes._asdict(),
        "field_of_view_deg": FIELD_PER_BOX * box,
        "sources": [list(s) for s in SOURCES],
        "draws": DRAWS,
        "log_T_AGN": LOG_T_AGN,
    }
    deviations: dict[str, list] = {}
    with tempfile.TemporaryDirectory() as tmp:
        keep, theory = None, {}
        for seed in range(seeds):
            plain = _summaries(bench_run(sizes, seed, False), Path(tmp), f"s{seed}", seed)
            if keep is None:
                keep = _resolved_bins(plain)
                record["ell"] = plain["ell_mean"][keep].tolist()
                theory = _pyccl_spectra(bench_run(sizes, 0, False), plain["ell_mean"][keep])
                baryons = _summaries(bench_run(sizes, seed, True), Path(tmp), "baryons", seed)
                record["baryons"] = _baryons(
                    plain["cl"][0][..., keep], baryons["cl"][0][..., keep], theory
                )
            for name, values in _paired(plain["cl"][..., keep], theory).items():
                deviations.setdefault(name, []).append(values)
    record["pairs"] = [[int(i), int(j)] for i, j in zip(*np.triu_indices(len(SOURCES)))]
    for name, per_seed in deviations.items():
        values = np.array(per_seed)  # (seeds, P, L)
        mean = values.mean(axis=0)
        error = values.std(axis=0, ddof=1) / np.sqrt(seeds) if seeds > 1 else np.zeros_like(mean)
        record[name] = {
            "per_seed": values.tolist(),
            "mean": mean.tolist(),
            "standard_error": error.tolist(),
            "worst": float(np.max(np.abs(mean))),
        }
    return record
