"""``pmpipe bench draws``: what an extra draw of the lensing nuisances (lensing.draws) costs.

One run (two tomographic n(z) bins with intrinsic alignments and shape noise, flat- and
full-sky maps) is made with every stage, in this process, without draws and with ``draws``
draws on a Latin hypercube of A_IA, Δz and m, after a run without draws that compiles the
programs every run shares (not recorded); each twice: "first" (the programs of the maps of
every draw compiled on the way, as in a campaign's first job) and "again" (all compiled). The
record gives each stage's seconds per run, and per extra draw the lensing + summaries seconds
it adds ((T_draws - T_1) / (draws - 1)) over the lensing + summaries seconds of the run
without draws: at most 1 is the aim, and no N-body is repeated.
"""

from __future__ import annotations

import tempfile

import numpy as np

from pmpipe.bench import in_process
from pmpipe.run import config, outputs


def bench_run(particles: int, pixels: int, nside: int, draws: int | None) -> config.Run:
    """The benchmark's run: ``particles``³ in max(4 particles, 128) Mpc/h (the 5° field fits
    it to z_max = 0.5), planes of 32 Mpc/h; ``draws`` draws (None: none)."""
    z = np.linspace(0.0, 0.45, 46)
    bins = [
        {"kind": "table", "name": f"bin{i}", "z": z.tolist(),
         "n": np.exp(-0.5 * ((z - centre) / 0.08) ** 2).tolist()}
        for i, centre in enumerate((0.2, 0.3))
    ]  # fmt: skip
    drawn = None
    if draws is not None:
        ranges = {"A_IA": [-1.0, 2.0], "photo_z_shift": [-0.02, 0.02], "shear_bias": [-0.02, 0.02]}
        drawn = {"kind": "latin_hypercube", "count": draws, "parameters": ranges}
    return config.Run.model_validate(
        {
            "box": {"particles": particles, "box_size": max(4.0 * particles, 128.0)},
            "nbody": {"steps": 8},
            "lightcone": {"z_max": 0.5, "plane_thickness": 32.0},
            "lensing": {
                "source_redshifts": [],
                "distributions": bins,
                "intrinsic_alignment": {"A_IA": 0.5},
                "flat_sky": {"field_of_view": 5.0, "pixels": pixels},
                "full_sky": {"nside": nside},
                "draws": drawn,
            },
            "summaries": {"shape_noise": {}, "smoothing_arcmin": [2.0]},
            "outputs": outputs.STAGES_ONE_BY_ONE,
        }
    )


def bench_draws(particles: int, pixels: int, nside: int, draws: int) -> dict:
    """The record of the module docstring."""
    if draws < 2:
        raise ValueError(f"--draws must be at least 2, got {draws}")
    record: dict = {"particles": particles, "pixels": pixels, "nside": nside, "draws": draws}
    with tempfile.TemporaryDirectory() as tmp:
        in_process.run_stages(bench_run(particles, pixels, nside, None), tmp, "draws", "compile")
        for attempt in ("first", "again"):
            for count in (None, draws):
                run = bench_run(particles, pixels, nside, count)
                name = f"{attempt}_{count or 1}_draws"
                record[name] = in_process.run_stages(run, tmp, "draws", name)[1]
        for attempt in ("first", "again"):
            one, many = record[f"{attempt}_1_draws"], record[f"{attempt}_{draws}_draws"]
            first = one["lensing"] + one["summaries"]
            extra = (many["lensing"] + many["summaries"] - first) / (draws - 1)
            record[f"{attempt}_extra_draw_over_first"] = extra / first
    return record
