"""Stage ``lensing``: convergence and shear maps from the lightcone planes, Born or ray-traced
(lensing.method).

Reads ``nbody.zarr``; writes ``lensing.zarr`` (docs/outputs.md): per source (single redshifts,
then distributions) flat-sky ``kappa``, ``gamma1``, ``gamma2`` (source, theta_x, theta_y) and
full-sky ``kappa_healpix``, ``gamma1_healpix``, ``gamma2_healpix`` (source, pixel) with the
harmonic coefficients of κ and of the shear's E and B modes (source, alm); ``omega`` and
``omega_healpix`` when ray-traced, Born's maps beside them for method both (names with
``_born``), the reduced shear ``g1``, ``g2`` when asked; and every plane's weight in each
source's maps (its kernel with the nuisances, docs/lensing.md). With lensing.draws, the maps
and weights of every draw's nuisances from one pass over the planes, along a leading ``draw``
dimension.
"""

from __future__ import annotations

import sys
from pathlib import Path

import jax
import numpy as np

from pmpipe.physics.evolution import lightcone, sky
from pmpipe.physics.lensing import projection, raytrace_flat, raytrace_healpix
from pmpipe.physics.statistics import resolution
from pmpipe.run import derive
from pmpipe.run.setup_parts import FlatSkySetup, FullSkySetup
from pmpipe.stages import layout, plane_pass, store_path
from pmpipe.stages.inputs import Inputs
from pmpipe.stages.plane_pass import Pass
from pmpipe.stages.progress import Progress
from pmpipe.storage import provenance, store

SHELL_OVERSAMPLING = 4  # full-sky shells' rays see nearly every line-of-sight mode


def valid_ranges(setup: derive.RunSetup, chi_edges, shell_k_max=None) -> dict:
    """Per map ('' flat sky, '_healpix' full sky) the resolved multipoles of every source
    (pmpipe.physics.statistics.resolution.MultipoleRange), for planes of edges chi_edges (Mpc/h) and full-sky
    shells band-limited to shell_k_max (h/Mpc per plane; default: the run's)."""
    cone, lens = setup.lensed()
    cosmo, power, grid = setup.cosmology, setup.power, setup.grid

    thickness = cone.plane_thickness * cone.planes_per_copy  # contiguous in a copy

    def mesh(k, plane, oversampling=1):
        return resolution.power_transfer(
            k, grid.particles, grid.box_size, grid.oversample
        ) * resolution.thickness_transfer(k, thickness, grid.box_size, power, oversampling)

    maps: dict[str, tuple] = {}
    if lens.flat is not None:
        flat = lens.flat
        fundamental, nyquist = sky.flat_multipoles(flat.field_of_view, flat.pixels)
        maps[""] = (
            mesh,
            resolution.MultipoleRange(
                resolution.FLAT_FUNDAMENTALS * fundamental,
                nyquist,
                f"map: {resolution.FLAT_FUNDAMENTALS} times the fundamental multipole of its "
                f"{flat.field_of_view:g} deg field",
                f"map: the Nyquist multipole of its {flat.pixels} pixels",
            ),
        )
    if lens.full is not None:
        ell_max = sky.healpix_ell_max(lens.full.nside)
        band = np.asarray(lens.full.shell_k_max if shell_k_max is None else shell_k_max)

        def shell(k, plane):
            return np.where(k <= band[plane], mesh(k, plane, SHELL_OVERSAMPLING), 0.0)

        maps["_healpix"] = (
            shell,
            resolution.MultipoleRange(
                2.0,
                float(ell_max),
                "map: the lowest multipole fitted",
                f"map: its band limit 3 nside - 1 = {ell_max}",
            ),
        )
    return {
        suffix: [
            resolution.resolved_multipoles(
                cosmo, power, chi_edges, grid.box_size, transfer, source, held
            )
            for _, _, source in lens.sources
        ]
        for suffix, (transfer, held) in maps.items()
    }


def write_valid_ranges(group, ranges: dict) -> None:
    """:func:`valid_ranges` as arrays (source,): ell_min_valid and ell_max_valid (flat sky),
    ell_min_valid_healpix and ell_max_valid_healpix, with every source's reason in the
    attribute ``reasons``."""
    for suffix, rows in ranges.items():
        for end, long_name in (("min", "lowest"), ("max", "highest")):
            store.write_array(
                group,
                f"ell_{end}_valid{suffix}",
                np.array([getattr(r, f"ell_{end}") for r in rows]),
                ("source",),
                "1",
                f"{long_name} resolved multipole of the map (pmpipe.physics.statistics.resolution)",
                reasons=[getattr(r, f"{end}_reason") for r in rows],
            )


def run(setup: derive.RunSetup, inputs: Inputs, progress: Progress) -> Path:
    """Compute the run's lensing maps (kept for the summaries) and write them unless
    outputs.lightcone is off (the weights and geometry always); returns the path."""
    run_file, grid, kept = setup.run_file, setup.grid, setup.kept
    _, lens = setup.lensed()
    started = store.now()
    nb = inputs.store("nbody")
    cosmo, srcs = setup.cosmology, lens.sources
    chi = np.asarray(nb["plane"][:], np.float64)
    edges = np.append(nb["plane_chi_lo"][:], nb["plane_chi_hi"][-1])
    drawn = lens.draws
    sets = [srcs] if drawn is None else [found for _, found in drawn]
    weights = np.stack(
        [
            [projection.plane_weights(cosmo, edges, source) for _, _, source in found]
            for found in sets
        ]
    )
    z_source = np.array([[s[1] for s in found] for found in sets])
    if drawn is None:
        weights, z_source = weights[0], z_source[0]
    path = store_path(inputs.run_dir, "lensing")
    group = store.create(
        path,
        provenance.provenance(run_file, "lensing", grid.mesh, started, inputs.made_from("lensing"))
        | {"maps_kept": kept.lightcone, "method": lens.method},
        keepbits=kept.keepbits,
    )
    store.write_coordinate(
        group,
        "source",
        np.array([s[0] for s in srcs]),
        "1",
        "source: 'z=<z>' for a single redshift, else the n(z) name",
    )
    store.write_coordinate(group, "plane", chi, "Mpc/h", "comoving distance of the plane's centre")
    by = Pass(weights.reshape(-1, chi.size), setup.suppressions, weights.shape[:-1])
    store.write_array(
        group,
        "z_source",
        z_source,
        by.dims(),
        "1",
        "source redshift (mean redshift of a distribution, with its photo-z shift)",
    )
    store.write_array(
        group,
        "plane_weight",
        weights,
        (*by.dims(), "plane"),
        "h/Mpc",
        "weight of the plane in the source's maps: its kernel (lensing efficiency, plus the "
        "intrinsic alignment's, times 1 + shear bias) averaged over the plane's thickness",
    )
    if drawn is not None:
        layout.write_draw_axis(group, [values for values, _ in drawn])
    shell_k_max = nb["plane_k_max_healpix"][:] if "plane_k_max_healpix" in nb else None
    write_valid_ranges(group, valid_ranges(setup, edges, shell_k_max))
    group.attrs["k_max_valid"] = resolution.k_max_valid(
        grid.particles, grid.box_size, grid.oversample
    )
    if setup.baryons is not None:
        plane_pass.write_suppressions(group, by, setup.baryons)
    if lens.flat is not None:
        _flat_sky_maps(group, setup, lens.flat, inputs, progress, by)
    if lens.full is not None:
        _full_sky_maps(group, setup, lens.full, inputs, progress, by)
    store.mark_complete(group)
    return path


def _flat_sky_maps(
    group, setup: derive.RunSetup, flat: FlatSkySetup, inputs: Inputs, progress: Progress, by: Pass
):
    """κ, γ1, γ2 (and ω when ray-traced) of every map of ``by`` on the ``flat`` sky's pixels
    from the nbody store's planes, by lensing.method, a pass per baryons' filter: written
    unless outputs.lightcone is off, κ and ω kept for the summaries."""
    weights = by.weights
    _, lens = setup.lensed()
    theta = projection.pixel_centres(flat.field_of_view, flat.pixels)
    with progress.timed("lensing"):
        groups = by.groups()
        parts = [_flat_pass(setup, inputs, theta, weights[rows], s) for rows, s in groups]
        rows = [r for r, _ in groups]
        maps = {
            name: (by.in_row_order(rows, [part[name][0] for part in parts]), long_name)
            for name, (_, long_name) in parts[0].items()
        }
        if lens.reduced_shear:
            for c in ("1", "2"):
                maps[f"g{c}"] = (
                    maps[f"gamma{c}"][0] / (1 - maps["kappa"][0]),
                    f"reduced shear g{c} = gamma{c} / (1 - kappa)",
                )
        jax.block_until_ready([m for m, _ in maps.values()])
    progress(
        f"flat-sky maps ({lens.method}): {weights.shape[0]} maps, {flat.pixels}^2 pixels over "
        f"{flat.field_of_view} deg"
    )
    for axis in ("theta_x", "theta_y"):
        store.write_coordinate(
            group,
            axis,
            np.degrees(theta),
            "deg",
            f"angle of the pixel centre from the line of sight, {axis[-1]}",
        )
    if setup.kept.lightcone:
        for name, (data, long_name) in maps.items():
            dims = (*by.dims(), "theta_x", "theta_y")
            store.write_array(group, name, by.laid_out(data), dims, "1", long_name)
    for row in range(weights.shape[0]):
        for name in ("kappa", "omega", "kappa_born"):
            if name in maps:
                inputs.keep("lensing", name, maps[name][0][row], by.leading(row))


def _flat_pass(setup: derive.RunSetup, inputs: Inputs, theta, weights, suppression) -> dict:
    """The flat-sky maps (name: (maps (R, pixels, pixels), long name)) of plane ``weights``
    (R, P), by lensing.method, from one pass over the planes filtered by ``suppression``."""
    nb = inputs.store("nbody")
    chi = np.asarray(nb["plane"][:], np.float64)
    method = setup.lensed()[1].method
    offsets = [t["offsets"] for t in nb.attrs["plane_transforms"]]
    planes = plane_pass.filtered_planes(
        [lambda j=j: inputs.field("nbody", "lightcone_density", (j,)) for j in range(chi.size)],
        suppression,
        1.0 / np.asarray(nb["plane_a"][:], np.float64) - 1.0,
        setup.grid.box_size,
    )
    maps: dict[str, tuple] = {}
    if method != "raytrace":
        kappa = projection.flat_sky_convergence(planes, weights, chi, theta, offsets, setup.grid)
        shear = jax.block_until_ready(projection.shear_from_convergence(kappa))
        suffix = "_born" if method == "both" else ""
        maps |= {
            f"kappa{suffix}": (kappa, "Born convergence"),
            f"gamma1{suffix}": (shear[0], "Born shear, first component (Kaiser-Squires)"),
            f"gamma2{suffix}": (shear[1], "Born shear, second component (Kaiser-Squires)"),
        }
    if method != "born":
        factors = raytrace_flat.deflection_factors(setup.cosmology, chi)
        traced = raytrace_flat.trace(planes, weights, factors, chi, theta, offsets, setup.grid)
        maps |= {
            "kappa": (traced["kappa"], "ray-traced convergence"),
            "gamma1": (traced["gamma1"], "ray-traced shear, first component"),
            "gamma2": (traced["gamma2"], "ray-traced shear, second component"),
            "omega": (traced["omega"], "ray-traced rotation"),
        }
    return maps


def _full_sky_maps(
    group, setup: derive.RunSetup, full: FullSkySetup, inputs: Inputs, progress: Progress, by: Pass
):
    """κ, γ1, γ2 (and ω when ray-traced) of every map of ``by`` on the ``full`` sky's HEALPix
    maps from the shells' harmonic coefficients, by lensing.method, a pass per baryons'
    filter, with the coefficients of κ and of the shear's E and B modes: written unless
    outputs.lightcone is off, kept for the summaries."""
    _, lens = setup.lensed()
    shells = np.asarray(inputs.array("nbody", "lightcone_healpix_alm"), np.complex128)
    coefficients: dict[str, list[dict]] = {}
    with progress.timed("lensing"):
        groups = by.groups()
        for rows, suppression in groups:
            filtered = plane_pass.filtered_shells(shells, suppression, inputs.store("nbody"))
            if len(groups) == 1:
                shells = filtered  # one pass: one copy of the shells held
            found_alms = _full_sky_pass(setup, full, inputs, filtered, by.weights[rows])
            for suffix, alms in found_alms.items():
                found = coefficients.setdefault(suffix, [{}] * by.weights.shape[0])
                for row, alm in zip(rows, alms):
                    found[row] = alm
    progress(f"full-sky maps ({lens.method}): {by.weights.shape[0]} maps, nside {full.nside}")
    for suffix, alms in coefficients.items():
        _write_healpix_maps(group, setup, full.nside, inputs, alms, f"{suffix}_healpix", by)


def _full_sky_pass(
    setup: derive.RunSetup, full: FullSkySetup, inputs: Inputs, shells, weights
) -> dict:
    """Per method's suffix ('' the run's, '_born' Born's of method both) the coefficients of
    the ``full`` sky's maps of plane ``weights`` (R, P) through the ``shells`` (P, alm): dicts
    of kappa, e, b and, when ray-traced, omega."""
    _, lens = setup.lensed()
    nside = full.nside
    coefficients: dict[str, list[dict]] = {}
    if lens.method != "raytrace":
        born = []
        for kappa_alm in weights @ shells:
            e_alm, b_alm = projection.born_shear_alm(kappa_alm)
            born.append({"kappa": kappa_alm, "e": e_alm, "b": b_alm})
        coefficients["_born" if lens.method == "both" else ""] = born
    if lens.method != "born":
        chi = np.asarray(inputs.store("nbody")["plane"][:], np.float64)
        traced = raytrace_healpix.trace(
            [lambda i=i: shells[i] for i in range(chi.size)],
            weights,
            raytrace_flat.deflection_factors(setup.cosmology, chi),
            chi,
            sky.traced_rays_nside(nside),
        )
        coefficients[""] = [
            raytrace_healpix.analyse(
                traced["kappa"][i],
                traced["gamma1"][i],
                traced["gamma2"][i],
                traced["omega"][i],
                sky.healpix_ell_max(nside),
            )
            for i in range(weights.shape[0])
        ]
    return coefficients


def _write_healpix_maps(  # parameters: the stage's, then the maps' and how they are laid out
    group, setup: derive.RunSetup, nside: int, inputs: Inputs, alms, suffix: str, by: Pass
):
    """The HEALPix maps of ``nside`` of one method (``suffix`` '_healpix' the run's,
    '_born_healpix' Born's of method both) from every map's coefficients (dicts of kappa, e,
    b and, when ray-traced, omega; the rows of ``by``): κ, γ1, γ2 (ω) and with the run's maps
    the reduced shear, written unless outputs.lightcone is off; the coefficients written and
    kept for the summaries (per draw with lensing.draws)."""
    _, lens = setup.lensed()
    ell_max = sky.healpix_ell_max(nside)
    kind = "Born" if lens.method == "born" or "born" in suffix else "ray-traced"
    kappa = np.stack([lightcone.healpix_map(a["kappa"], nside) for a in alms])
    shear = [projection.healpix_spin2_maps(a["e"], a["b"], nside) for a in alms]
    maps = [(f"kappa{suffix}", kappa, f"{kind} convergence")] + [
        (f"gamma{c + 1}{suffix}", np.stack([g[c] for g in shear]), f"{kind} shear, {part}")
        for c, part in enumerate(("first component (healpy Q)", "second component (healpy U)"))
    ]
    if "omega" in alms[0]:
        omega = np.stack([lightcone.healpix_map(a["omega"], nside) for a in alms])
        maps.append((f"omega{suffix}", omega, "ray-traced rotation"))
    if lens.reduced_shear and suffix == "_healpix":
        maps += [
            (f"g{c}_healpix", maps[c][1] / (1 - kappa), f"reduced shear g{c} = gamma{c} / (1 - kappa)")
            for c in (1, 2)
        ]  # fmt: skip
    kept = setup.kept.lightcone
    attrs = {
        "grid_name": "HEALPix", "nside": nside, "nest": False, "ell_band_limit": ell_max,
        "pixel_window": "none",
    }  # fmt: skip
    for name, data, long_name in maps if kept else []:
        store.write_array(
            group, name, by.laid_out(data.astype(np.float32)), (*by.dims(), "pixel"), "1",
            long_name, **attrs,
        )  # fmt: skip
    modes = {
        f"kappa{suffix}_alm": (np.stack([a["kappa"] for a in alms]), f"the {kind} convergence"),
        f"gamma_e{suffix}_alm": (
            np.stack([a["e"] for a in alms]),
            f"the {kind} shear's E modes (of its spin-2 field)",
        ),
        f"gamma_b{suffix}_alm": (
            np.stack([a["b"] for a in alms]),
            f"the {kind} shear's B modes (of its spin-2 field)",
        ),
    }
    for name, (data, what) in modes.items() if kept else []:
        store.write_array(
            group, name, by.laid_out(data.astype(np.complex64)), (*by.dims(), "alm"), "1",
            f"harmonic coefficients of {what}, healpy's ordering",
            ell_max=ell_max,
            ordering="healpy",
        )  # fmt: skip
    kept_maps = {f"kappa{suffix}": kappa.astype(np.float32)} | {n: d for n, (d, _) in modes.items()}
    for name, data in kept_maps.items():
        if len(by.shape) == 1:
            inputs.keep("lensing", name, data)
        else:
            for d, per_draw in enumerate(by.laid_out(data)):
                inputs.keep("lensing", name, per_draw, (d,))


if __name__ == "__main__":
    from pmpipe.stages import runner

    sys.exit(runner.main("lensing", run))
