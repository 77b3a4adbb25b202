"""Survey nuisances of the lensing maps: intrinsic alignments (NLA), photometric-redshift shifts
and multiplicative shear biases per source. Their Limber spectra against pyccl's; off, they
leave a run's maps bit for bit; out of range, they are refused naming the field."""

import numpy as np
import pyccl
import pytest
import zarr
from conftest import run_every_stage

from pmpipe.physics.lensing import intrinsic_alignment, projection
from pmpipe.run import config, derive

Z = np.linspace(0.0, 1.9, 400)
CENTRES = (0.5, 1.0)
NLA = {"A_IA": 1.5, "eta_IA": 1.2, "z_pivot": 0.62}
PYCCL_C1_RHO_CRIT = 5e-14 * pyccl.physical_constants.RHO_CRITICAL  # 0.01388


def _bins(centres=CENTRES) -> list[dict]:
    """Gaussian n(z) bins of width 0.15 as tables."""
    return [
        {
            "kind": "table",
            "name": f"bin{i}",
            "z": Z.tolist(),
            "n": np.exp(-0.5 * ((Z - c) / 0.15) ** 2).tolist(),
        }
        for i, c in enumerate(centres)
    ]


def _run(**lensing_fields) -> config.Run:
    return config.Run.model_validate(
        {
            "box": {"particles": 16, "box_size": 64.0},
            "lightcone": {"z_max": 2.0, "plane_thickness": 32.0},
            "lensing": {"source_redshifts": [], "distributions": _bins(), **lensing_fields},
        }
    )


def _ccl(run: config.Run) -> pyccl.Cosmology:
    c = run.cosmology
    return pyccl.Cosmology(
        Omega_c=c.Omega_m - c.Omega_b, Omega_b=c.Omega_b, h=c.h, n_s=c.n_s, sigma8=c.sigma8,
        T_CMB=c.T_cmb, Neff=c.N_eff, m_nu=0.0, transfer_function="eisenstein_hu",
        matter_power_spectrum="linear",
    )  # fmt: skip


def _limber(run: config.Run, ell) -> np.ndarray:
    """pmpipe's Limber C_ij (S, S, L) of the run's sources, with their nuisances."""
    cosmo, power = derive.cosmology_params(run), derive.linear_power(run)
    srcs = [s for _, _, s in derive.sources(run, cosmo)]
    return np.array(
        [
            [
                projection.limber_convergence_cl(cosmo, ell, a, power, samples=2048, other=b)
                for b in srcs
            ]
            for a in srcs
        ]
    )


def _ccl_limber(run: config.Run, ell, shifts=(0.0, 0.0), nla=None) -> np.ndarray:
    ccl = _ccl(run)
    tracers = []
    for b, dz in zip(_bins(), shifts):
        z = Z + dz
        n, z = np.array(b["n"])[z >= 0], z[z >= 0]  # the points moved below z = 0 dropped
        ia = None
        if nla is not None:  # pyccl's C1 rho_crit is 5e-14 RHO_CRITICAL, not pmpipe's 0.0134
            a_ia = nla["A_IA"] * intrinsic_alignment.C1_RHO_CRIT / PYCCL_C1_RHO_CRIT
            ia = (z, a_ia * ((1 + z) / (1 + nla["z_pivot"])) ** nla["eta_IA"])
        tracers.append(pyccl.WeakLensingTracer(ccl, dndz=(z, n), ia_bias=ia))
    return np.array([[pyccl.angular_cl(ccl, a, b, ell) for b in tracers] for a in tracers])


ELL = np.array([30.0, 100.0, 300.0, 1000.0])


def test_intrinsic_alignment_spectra_match_pyccl_nla():
    """Every pair's C_ℓ with NLA alignments (A_IA = 1.5, η = 1.2) against pyccl's, and the
    alignments' part (GI + II) alone: its sign (negative: GI dominates) and size."""
    mine, mine_gg = _limber(_run(intrinsic_alignment=NLA), ELL), _limber(_run(), ELL)
    ccl, ccl_gg = _ccl_limber(_run(), ELL, nla=NLA), _ccl_limber(_run(), ELL)
    np.testing.assert_allclose(mine / ccl, 1.0, atol=0.005)
    part, ccl_part = mine - mine_gg, ccl - ccl_gg
    assert np.all(ccl_part[0, 0] < 0) and np.all(part[0, 0] < 0)
    np.testing.assert_allclose(part / ccl_part, 1.0, atol=0.015)
    assert np.all(np.abs(part[0, 0] / mine_gg[0, 0]) > 0.05)  # a change worth testing


def test_photo_z_shifts_move_spectra_as_pyccl_does():
    """Δz = (0.05, -0.1) shifts the bins' n(z) to n(z - Δz): the nearer bin's power rises, the
    farther's falls, as in pyccl with the shifted tables."""
    shifts = (0.05, -0.1)
    mine, before = _limber(_run(photo_z_shift=list(shifts)), ELL), _limber(_run(), ELL)
    ccl = _ccl_limber(_run(), ELL, shifts)
    np.testing.assert_allclose(mine / ccl, 1.0, atol=0.01)
    assert np.all(mine[0, 0] > 1.05 * before[0, 0]) and np.all(mine[1, 1] < 0.9 * before[1, 1])


def test_shear_bias_scales_each_pair_by_its_two_biases():
    m = (0.02, -0.03)
    mine, before = _limber(_run(shear_bias=list(m)), ELL), _limber(_run(), ELL)
    expected = np.outer(np.add(1, m), np.add(1, m))[:, :, None] * before
    np.testing.assert_allclose(mine, expected, rtol=1e-12)


def test_alignment_kernel_follows_the_source_density():
    """n(χ) spreads each sample's weight over its cell: it integrates to 1, and a single
    source plane has none."""
    chi = np.linspace(100.0, 2000.0, 50)
    weights = np.full(50, 1 / 50)
    fine = np.linspace(0.0, 2100.0, 200_001)
    density = intrinsic_alignment.source_density(fine, chi, weights)
    assert np.sum(density) * (fine[1] - fine[0]) == pytest.approx(1.0, rel=1e-3)
    assert not np.any(intrinsic_alignment.source_density(fine, [1000.0], [1.0]))


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"intrinsic_alignment": {"A_IA": 11.0}}, "A_IA"),
        ({"intrinsic_alignment": {"A_IA": 1.0, "z_pivot": -1}}, "z_pivot"),
        ({"photo_z_shift": [0.1, 0.2, 0.3]}, "lensing.photo_z_shift lists 3 values"),
        ({"photo_z_shift": 0.6}, "lensing.photo_z_shift values must lie from -0.5 to 0.5"),
        ({"shear_bias": [0.0, -0.7]}, "lensing.shear_bias values must lie from -0.5 to 0.5"),
    ],
)
def test_nuisances_out_of_range_are_refused_naming_the_field(fields, message):
    with pytest.raises(ValueError, match=message):
        _run(**fields)


def test_alignments_need_planes_that_resolve_the_distributions():
    data = _run().model_dump()
    data["lightcone"]["plane_thickness"] = 128.0
    data["box"]["box_size"] = 128.0
    data["lensing"]["intrinsic_alignment"] = {"A_IA": 1.0}
    with pytest.raises(ValueError, match="lightcone.plane_thickness of at most 100 Mpc/h"):
        config.Run.model_validate(data)


def test_shifts_that_leave_no_sources_and_alignments_without_distributions_are_refused():
    data = _run().model_dump()
    data["lensing"]["distributions"] = [
        {"kind": "smail", "name": "smail", "z0": 0.5},
        {"kind": "table", "name": "two", "z": [0.1, 0.2], "n": [1.0, 1.0]},
    ]
    data["lensing"]["photo_z_shift"] = [0.0, -0.15]
    with pytest.raises(ValueError, match="leaves 'two' without sources at z >= 0"):
        config.Run.model_validate(data)
    data["lightcone"]["z_max"] = 0.4
    data["lensing"]["photo_z_shift"] = [0.45, 0.0]
    with pytest.raises(ValueError, match="moves all of 'smail' beyond the lightcone"):
        config.Run.model_validate(data)
    data["lensing"] |= {"distributions": [], "source_redshifts": [0.3], "photo_z_shift": 0.0}
    data["lensing"]["intrinsic_alignment"] = {"A_IA": 1.0}
    with pytest.raises(ValueError, match="acts on lensing.distributions, and there are none"):
        config.Run.model_validate(data)


def test_a_shift_may_not_carry_sources_beyond_the_lightcone():
    data = _run().model_dump()
    data["lightcone"]["z_max"] = 1.95
    data["lensing"]["photo_z_shift"] = [0.0, 0.1]
    with pytest.raises(ValueError, match="'bin1' has sources beyond the lightcone"):
        config.Run.model_validate(data)


def _lensing_maps(tmp_path, name: str, **lensing_fields) -> dict:
    run = config.Run.model_validate(
        {
            "box": {"particles": 16, "box_size": 64.0},
            "nbody": {"steps": 3},
            "lightcone": {"z_max": 0.05, "plane_thickness": 32.0},
            "lensing": {
                "source_redshifts": [0.04],
                "distributions": [
                    {"kind": "table", "name": "wide", "z": [0.01, 0.03, 0.05], "n": [1, 2, 1]}
                ],
                "flat_sky": {"field_of_view": 20.0, "pixels": 32},
                "full_sky": {"nside": 8},
                **lensing_fields,
            },
        }
    )
    run_dir = run_every_stage(tmp_path / name, run)
    group = zarr.open_group(run_dir / "lensing.zarr", mode="r")
    return {name: np.asarray(group[name][:]) for name, _ in group.arrays()}


@pytest.mark.slow
def test_nuisances_set_to_nothing_leave_the_maps_bit_for_bit(tmp_path):
    """A_IA = 0, Δz = 0 and m = 0 given explicitly make the maps of a run without them."""
    plain = _lensing_maps(tmp_path, "plain")
    zeros = _lensing_maps(
        tmp_path,
        "zeros",
        intrinsic_alignment={"A_IA": 0.0},
        photo_z_shift=[0.0, 0.0],
        shear_bias=0.0,
    )
    assert plain.keys() == zeros.keys() and {"kappa", "kappa_healpix"} <= plain.keys()
    for name, values in plain.items():
        assert np.array_equal(values, zeros[name]), name


MAPS_RUN = {
    "box": {"particles": 32, "box_size": 128.0},
    "nbody": {"steps": 8},
    "lightcone": {"z_max": 0.5, "plane_thickness": 32.0},
    "lensing": {
        "source_redshifts": [],
        "distributions": [
            {
                "kind": "table",
                "name": name,
                "z": z.tolist(),
                "n": np.exp(-0.5 * ((z - 0.3) / 0.1) ** 2).tolist(),
            }
            for name in ("plain", "shifted", "biased")
            for z in [np.linspace(0.0, 0.45, 90)]
        ],
        "photo_z_shift": [0.0, 0.04, 0.0],
        "shear_bias": [0.0, 0.0, 0.1],
        "flat_sky": {"field_of_view": 5.0, "pixels": 64},
    },
    "summaries": {"smoothing_arcmin": [0], "ell_bins": 6},
}


@pytest.fixture(scope="module")
def paired_summaries(tmp_path_factory):
    """The summaries of two runs of one seed, with intrinsic alignments (A_IA = 0.5) and without:
    their N-body is the same; their sources are one n(z) plain, shifted by Δz = 0.04 and
    with m = 0.1."""
    out = {}
    for name, ia in (("without", None), ("with", {"A_IA": 0.5})):
        data = {**MAPS_RUN, "lensing": {**MAPS_RUN["lensing"], "intrinsic_alignment": ia}}
        run_dir = run_every_stage(tmp_path_factory.mktemp(name), config.Run.model_validate(data))
        out[name] = zarr.open_group(run_dir / "summaries.zarr", mode="r")
    return out


@pytest.mark.slow
def test_each_nuisance_moves_the_maps_spectra_as_limber_predicts(paired_summaries):
    """Measured C_ℓ ratios of paired maps (one N-body, so cosmic variance mostly cancels)
    against the ratios of the Limber spectra of the same kernels (cl_linear, whose nuisances
    pyccl confirms above). m scales a map exactly. Δz and the alignments change which planes
    a map weights; at 32^3 particles in 128 Mpc/h the planes resolve k ≲ 0.13 h/Mpc only, so
    the two lowest multipole bins are compared, Δz's change within 30 % and the alignments'
    within 60 % (their II part is not paired: it carries its own realisation's variance)."""
    without, with_ia = paired_summaries["without"], paired_summaries["with"]
    cl, theory = without["cl"][:], without["cl_linear"][:]
    keep = slice(0, 2)  # the two lowest multipole bins, ℓ < 230
    np.testing.assert_allclose(cl[2, 2] / cl[0, 0], 1.1**2, rtol=1e-4)  # m = 0.1
    np.testing.assert_allclose(cl[0, 2] / cl[0, 0], 1.1, rtol=1e-4)
    for i, measured, predicted in (
        (1, cl[1, 1] / cl[0, 0], theory[1, 1] / theory[0, 0]),  # Δz = 0.04: more power
        (0, with_ia["cl"][0, 0] / cl[0, 0], with_ia["cl_linear"][0, 0] / theory[0, 0]),
    ):
        change, expected = measured[keep] - 1, predicted[keep] - 1
        print(f"source {i}: C_ell ratio - 1 measured {change}, Limber {expected}")
        assert np.all(np.abs(expected) > 0.05)
        np.testing.assert_allclose(change, expected, rtol=0.3 if i else 0.6)
