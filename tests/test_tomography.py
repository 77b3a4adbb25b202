"""Tomography: the C_ℓ of every pair of sources against the stored maps, shape noise per source in
the auto-spectra only, the shear's E and B modes, and the Limber prediction of every pair
against pyccl's."""

import healpy
import numpy as np
import pyccl
import pytest
import references
import zarr

from pmpipe import stages
from pmpipe.physics.lensing import projection
from pmpipe.physics.statistics import shear_correlation, stats
from pmpipe.physics.theory import cosmology
from pmpipe.run import config, derive
from pmpipe.stages import registry

RUN = {
    "box": {"particles": 16, "box_size": 64.0},
    "nbody": {"steps": 3},
    "lightcone": {"z_max": 0.05, "plane_thickness": 32.0},
    "lensing": {
        "source_redshifts": [0.03, 0.05],
        "distributions": [
            {"kind": "table", "name": "wide", "z": [0.01, 0.03, 0.05], "n": [1, 2, 1]}
        ],
        "flat_sky": {"field_of_view": 20.0, "pixels": 32},
        "full_sky": {"nside": 8},
    },
    "summaries": {
        "shape_noise": {"sigma_e": [0.2, 0.25, 0.3], "n_gal": 0.5},
        "smoothing_arcmin": [0],
        "kappa_range": [-0.01, 0.01],
    },
}


# A run through every stage (20 s on 2 cores with no compiled program cached): the tests of its
# stores are in the slow tier, which keeps the fast one within 3 minutes
@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("tomography")
    run = config.Run.model_validate(RUN)
    path = run_dir / "config.json"
    path.write_text(config.RunFile.build("test", "tomo", 0, {}, run).to_json())
    for stage in stages.run_stages(run):
        registry.run_stage(stage, path)
    return (
        zarr.open_group(run_dir / "lensing.zarr", mode="r"),
        zarr.open_group(run_dir / "summaries.zarr", mode="r"),
    )


@pytest.mark.slow
def test_every_pair_is_the_cross_spectrum_of_the_stored_maps(stores):
    lens, summ = stores
    assert summ["cl"].metadata.dimension_names == ("source", "source2", "ell")
    assert list(summ["source2"][:]) == list(summ["source"][:]) == ["z=0.03", "z=0.05", "wide"]
    edges = np.append(summ["ell_lo"][:], summ["ell_hi"][-1])
    cl, cl_hp = summ["cl"][:], summ["cl_healpix"][:]
    ell = np.arange(24)
    for i in range(3):
        for j in range(3):
            expected = stats.flat_sky_cl(lens["kappa"][i], 20.0, edges, lens["kappa"][j])[1]
            np.testing.assert_allclose(cl[i, j], expected, rtol=1e-5)
            full = healpy.alm2cl(
                lens["kappa_healpix_alm"][i].astype(np.complex128),
                lens["kappa_healpix_alm"][j].astype(np.complex128),
            )
            for b, (lo, hi) in enumerate(zip(summ["ell_healpix_lo"][:], summ["ell_healpix_hi"][:])):
                inside = (ell >= lo) & (ell < hi) & (ell > 0)
                if inside.any():
                    weights = 2 * ell[inside] + 1
                    want = full[inside] @ weights / weights.sum()
                    np.testing.assert_allclose(cl_hp[i, j, b], want, rtol=1e-4, atol=1e-30)
    assert np.all(cl[0, 1][np.isfinite(cl[0, 1])] != 0)
    np.testing.assert_array_equal(cl_hp[0, 1], cl_hp[1, 0])
    theory = summ["cl_linear"][:]
    np.testing.assert_array_equal(theory, np.swapaxes(theory, 0, 1))
    assert np.all(theory[0, 1] > 0) and np.all(theory[0, 1] < theory[1, 1])


@pytest.mark.slow
def test_shape_noise_of_each_source_enters_its_auto_spectrum_only(stores):
    _, summ = stores
    for suffix in ("", "_healpix"):
        cl, noisy = summ["cl" + suffix][:], summ["cl_noisy" + suffix][:]
        off = ~np.eye(3, dtype=bool)
        np.testing.assert_array_equal(noisy[off], cl[off])
        noise = np.diagonal(noisy - cl).T  # (source, ell): mostly the noise power
        assert np.all(np.nanmedian(noise, axis=1) > 0)
        # white noise of σ_e² / n_gal per steradian-arcmin²: the ratios follow σ_e²
        level = np.nanmedian(noise, axis=1)
        np.testing.assert_allclose(
            level / level[0], [1.0, 0.25**2 / 0.2**2, 0.3**2 / 0.2**2], rtol=0.35
        )


@pytest.mark.slow
def test_born_shear_has_the_convergence_as_its_e_modes_and_no_b_modes(stores):
    _, summ = stores
    cl, ee, bb = summ["cl"][:], summ["cl_ee"][:], summ["cl_bb"][:]
    print(f"flat-sky Born shear: E / kappa - 1 at most {np.nanmax(np.abs(ee / cl - 1)):.1e}")
    np.testing.assert_allclose(ee, cl, rtol=1e-4, atol=1e-6 * np.nanmax(np.abs(cl)))
    assert np.nanmax(np.abs(bb)) < 1e-8 * np.nanmax(np.abs(cl))
    # full sky: the E modes the stage keeps are those of its shear maps (healpy's analysis of
    # them, within its accuracy below 2 nside), and B = 0
    lens = stores[0]
    ee, bb = summ["cl_ee_healpix"][:], summ["cl_bb_healpix"][:]
    edges = np.append(summ["ell_healpix_lo"][:], summ["ell_healpix_hi"][-1])
    analysed = [
        healpy.map2alm_spin([g1.astype(np.float64), g2.astype(np.float64)], 2, lmax=23)[0]
        for g1, g2 in zip(lens["gamma1_healpix"][:], lens["gamma2_healpix"][:])
    ]
    low = summ["ell_healpix_hi"][:] <= 16
    for i in range(3):
        for j in range(3):
            expected = stats.full_sky_cl(analysed[i], edges, analysed[j])[1]
            np.testing.assert_allclose(ee[i, j, low], expected[low], rtol=0.03)
    assert np.nanmax(np.abs(ee)) > 0


@pytest.mark.slow
def test_full_sky_shear_correlations_of_every_pair(stores):
    lens, summ = stores
    theta = summ["theta"][:]
    assert summ["xi_plus_healpix"].metadata.dimension_names == ("source", "source2", "theta")
    assert theta[0] == pytest.approx(3 * np.degrees(np.sqrt(4 * np.pi / 768)) * 60)
    e = lens["gamma_e_healpix_alm"][:].astype(np.complex128)
    for i in range(3):
        for j in range(3):
            plus, minus = shear_correlation.shear_correlations(
                healpy.alm2cl(e[i], e[j]), np.zeros(24), np.radians(theta / 60)
            )
            np.testing.assert_allclose(summ["xi_plus_healpix"][i, j], plus, rtol=1e-5)
            np.testing.assert_allclose(summ["xi_minus_healpix"][i, j], minus, rtol=1e-5)
    assert summ["xi_plus_healpix"][2, 2, 0] > 0


def test_limber_cross_spectra_match_pyccl():
    """Two single sources (z = 0.5, 1): every pair's Limber C_ℓ with the linear P(k) against
    pyccl's (the same Eisenstein-Hu linear power)."""
    run = config.Run()
    cosmo = derive.cosmology_params(run)
    c = run.cosmology
    ccl = pyccl.Cosmology(
        Omega_c=c.Omega_m - c.Omega_b, Omega_b=c.Omega_b, h=c.h, n_s=c.n_s, sigma8=c.sigma8,
        T_CMB=c.T_cmb, Neff=c.N_eff, m_nu=0.0, transfer_function="eisenstein_hu",
        matter_power_spectrum="linear",
    )  # fmt: skip
    power = derive.linear_power(run)
    ell = np.array([30.0, 100.0, 300.0, 1000.0])
    z = np.linspace(0.001, 1.5, 3000)
    sources, tracers = [], []
    for z_s in (0.5, 1.0):
        chi = float(cosmology.on_host(cosmology.comoving_distance, cosmo, 1 / (1 + z_s)))
        sources.append(projection.single_plane(chi))
        nz = np.exp(-0.5 * ((z - z_s) / 0.002) ** 2)
        tracers.append(pyccl.WeakLensingTracer(ccl, dndz=(z, nz)))
    for i, j in ((0, 0), (0, 1), (1, 1)):
        mine = projection.limber_convergence_cl(
            cosmo, ell, sources[i], power, samples=1024, other=sources[j]
        )
        ratio = mine / pyccl.angular_cl(ccl, tracers[i], tracers[j], ell)
        print(f"Limber C_ell of sources {i},{j} / pyccl's: {np.round(ratio, 4).tolist()}")
        np.testing.assert_allclose(ratio, 1.0, atol=0.005)


def test_a_shape_noise_list_needs_one_value_per_source(tmp_path):
    import yaml

    data = dict(RUN, summaries={"shape_noise": {"sigma_e": [0.2, 0.3], "n_gal": 0.5}})
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(config.ConfigError) as err:
        references.load_run(path)
    message = str(err.value)
    assert "summaries.shape_noise.sigma_e lists 2 values" in message and "3 sources" in message


@pytest.mark.slow
def test_a_store_of_an_older_layout_is_stale(stores, tmp_path):
    """A summaries store written before its layout held every pair (root attribute 'layout'
    absent, read as 1) is stale for this pmpipe, and made again by its stage."""
    import json
    import shutil

    from pmpipe.storage import store

    _, summ = stores
    assert summ.attrs["layout"] == 3
    old = tmp_path / "summaries.zarr"
    shutil.copytree(str(summ.store_path).removeprefix("file://"), old)
    meta_path = old / "zarr.json"
    meta = json.loads(meta_path.read_text())
    del meta["attributes"]["layout"]
    meta_path.write_text(json.dumps(meta))
    found = store.problems(old, config_hash=summ.attrs["config_hash"])
    assert "is stale: a summaries store of layout 1, this pmpipe writes 3" in found, found
