"""Massive neutrinos in the background and in linear theory, against CAMB: their density
today (Ω_ν h²), H(a) from z = 0 to 10⁴, d ln H / d ln a, the Fermi-Dirac integrals against
direct quadrature, CAMB tables (total and cb power, σ8_cb, T_ν / T_cb) against direct CAMB
calls, the transfer-ratio scheme's cb growth against CAMB's, the cache, and the
configuration's checks."""

import math

import camb
import numpy as np
import pytest
import zarr
from conftest import TABLES, linear_table, rel_diff
from scipy import integrate

from pmpipe.physics.evolution import ics, simulation
from pmpipe.physics.statistics import stats
from pmpipe.physics.theory import background, boltzmann, neutrinos
from pmpipe.physics.theory import cosmology as C
from pmpipe.run import config, derive
from pmpipe.runtime import parallel
from pmpipe.stages import registry
from pmpipe.storage import power_cache

MASSES = (0.0, 0.06, 0.1, 0.3, 1.0)
Z = np.array([0.0, 0.3, 1.0, 3.0, 10.0, 100.0, 1000.0, 1e4])


def _camb_background(cosmo: C.Cosmology, omch2: float):
    params = camb.CAMBparams(WantCls=False)
    params.set_cosmology(
        H0=100 * cosmo.h,
        ombh2=cosmo.Omega_b * cosmo.h**2,
        omch2=omch2,
        mnu=cosmo.m_nu,
        num_massive_neutrinos=3 if cosmo.m_nu > 0 else 0,
        nnu=cosmo.N_eff,
        TCMB=cosmo.T_cmb,
        omk=0.0,
    )
    return params


def _camb_params_at_total_matter(cosmo: C.Cosmology):
    """CAMB's parameters with CDM chosen so that CAMB's own Ω_m (ω_b + ω_c + its ω_ν) is
    cosmo.Omega_m: CAMB's neutrino density, not pmpipe's, fixes the CDM."""
    h2 = cosmo.h**2
    first = _camb_background(cosmo, (cosmo.Omega_m - cosmo.Omega_b) * h2)
    return _camb_background(cosmo, (cosmo.Omega_m - cosmo.Omega_b) * h2 - first.omnuh2)


@pytest.mark.parametrize("m_nu", MASSES)
@pytest.mark.parametrize("N_eff", (3.046, 2.5))
def test_neutrino_density_and_expansion_match_camb(m_nu, N_eff):
    cosmo = C.Cosmology(m_nu=m_nu, N_eff=N_eff)
    params = _camb_params_at_total_matter(cosmo)
    assert background.omega_nu(cosmo) * cosmo.h**2 == pytest.approx(
        params.omnuh2, rel=1e-7, abs=1e-12
    )
    assert params.omegam == pytest.approx(cosmo.Omega_m, rel=1e-8)
    camb_E = camb.get_background(params).hubble_parameter(Z) / (100 * cosmo.h)
    np.testing.assert_allclose(np.sqrt(background.E2(cosmo, 1 / (1 + Z))), camb_E, rtol=1e-5)


def test_no_radiation_means_no_neutrino_density():
    cosmo = C.Cosmology(T_cmb=0.0, m_nu=0.1)
    assert background.omega_nu(cosmo) == 0.0
    assert np.isfinite(C.dlnE_dlna(cosmo, np.geomspace(1e-5, 1, 9))).all()


def test_massless_limit_is_radiation():
    """Ω_m counts the massive species' whole density today, relativistic part included, so
    the limit m_nu -> 0 is the massless cosmology with Ω_m raised by that density."""
    massless = C.Cosmology()
    tiny = background.omega_nu(C.Cosmology(m_nu=1e-6))
    assert 3e-5 < tiny < 4e-5  # three species' radiation today
    light = C.Cosmology(m_nu=1e-6, Omega_m=massless.Omega_m + tiny)
    a = np.geomspace(1e-5, 1.0, 50)
    np.testing.assert_allclose(background.E2(light, a), background.E2(massless, a), rtol=1e-6)
    assert background.omega_nu(massless) == 0.0
    assert background.omega_cb(massless) == massless.Omega_m


@pytest.mark.parametrize("y", (1e-6, 0.3, 3.0, 30.0, 3000.0))
def test_fermi_dirac_integrals_against_quadrature(y):
    cosmo = C.Cosmology(m_nu=1.0)
    a = y / background._neutrino_mass_ratio(cosmo, cosmo.m_nu / background.NEUTRINO_SPECIES, 1.0)
    rho, pressure = background.neutrino_density_pressure(cosmo, a)
    scale = (
        background.omega_photons(cosmo)
        * 7
        / 8
        * (4 / 11) ** (4 / 3)
        * background.massive_neutrino_number(cosmo)
        / a**4
        / (7 * math.pi**4 / 120)
    )
    energy = integrate.quad(lambda x: x * x * math.sqrt(x * x + y * y) / (math.exp(x) + 1), 0, 200)[
        0
    ]
    press = integrate.quad(
        lambda x: x**4 / (3 * math.sqrt(x * x + y * y)) / (math.exp(x) + 1), 0, 200
    )[0]
    assert rho == pytest.approx(scale * energy, rel=1e-7)
    assert pressure == pytest.approx(scale * press, rel=1e-7)


@pytest.mark.parametrize("m_nu", (0.0, 0.3))
def test_dlnE_dlna_is_the_derivative_of_E(m_nu):
    cosmo = C.Cosmology(m_nu=m_nu, w0=-0.9, wa=0.2)
    lna = np.linspace(np.log(1e-4), 0.0, 40)
    step = 1e-5
    numeric = (
        np.log(background.E2(cosmo, np.exp(lna + step)))
        - np.log(background.E2(cosmo, np.exp(lna - step)))
    ) / (4 * step)
    exact = C.dlnE_dlna(cosmo, np.exp(lna))  # arithmetic only: numpy in float64
    np.testing.assert_allclose(exact, numeric, rtol=1e-6, atol=1e-9)


def test_camb_table_with_massive_neutrinos_equals_a_direct_camb_call():
    section = config.Cosmology(m_nu=0.1, sigma8=0.8)
    spec = boltzmann.inputs(section.model_dump(), 1.0)
    assert spec["cosmology"]["m_nu"] == 0.1
    assert "m_nu" not in boltzmann.inputs(config.Cosmology().model_dump(), 1.0)["cosmology"]
    table = boltzmann.camb_power(spec)
    params = _camb_params_at_total_matter(C.Cosmology(m_nu=0.1))
    params.InitPower.set_params(As=table.A_s, ns=section.n_s)
    params.set_dark_energy(w=section.w0, wa=section.wa, dark_energy_model="ppf")
    params.set_matter_power(redshifts=[0.0], kmax=20.0)
    params.NonLinear = camb.model.NonLinear_none
    results = camb.get_results(params)
    direct = results.get_matter_power_interpolator(nonlinear=False, hubble_units=True, k_hunit=True)
    k = np.geomspace(1e-3, 0.99, 300)
    ours = np.exp(np.interp(np.log(k), np.log(table.k), np.log(table.p)))
    np.testing.assert_allclose(ours, direct.P(0.0, k), rtol=1e-4)
    assert results.get_sigma8_0() == pytest.approx(0.8, rel=1e-4)
    massless = boltzmann.camb_power(
        boltzmann.inputs(config.Cosmology(sigma8=0.8).model_dump(), 1.0)
    )
    small = (table.k > 0.5) & (table.k < 1.0)  # below the free-streaming scale, at equal σ8
    assert np.all(table.p[small] < massless.p[small])


@pytest.mark.parametrize(
    "cosmology, message",
    [
        ({"m_nu": -0.1}, "m_nu"),
        ({"m_nu": 4.0}, "m_nu"),
        ({"m_nu": 3.0, "Omega_m": 0.1}, "no CDM below cosmology.Omega_m"),
        ({"m_nu": 0.1, "T_cmb": 0.0}, "needs relic neutrinos"),
    ],
)
def test_bad_neutrino_masses_name_the_field(cosmology, message):
    with pytest.raises(config.ConfigError, match=message):
        config.validate(config.Cosmology, cosmology, "cosmology")


@pytest.mark.parametrize(
    "run, message",
    [
        ({}, "needs power.kind 'camb' or 'class' \\(not 'eisenstein_hu'\\)"),
        ({"power": {"kind": "camb"}, "ic": {"a_init": 0.005}}, "needs ic.a_init >= 0.01"),
    ],
)
def test_runs_with_massive_neutrinos_name_what_they_need(run, message):
    data = {"cosmology": {"m_nu": 0.1}, **run}
    with pytest.raises(config.ConfigError, match="cosmology.m_nu = 0.1 eV " + message):
        config.validate(config.Run, data, "run")


def test_massless_runs_keep_their_hash():
    explicit = config.Run.model_validate({"cosmology": {"m_nu": 0.0}})
    assert config.config_hash(explicit) == config.config_hash(config.Run())


@pytest.fixture(scope="module")
def heavy():
    """The CAMB table at Σm_ν = 0.3 eV (σ8 = 0.8 of total matter) and its direct CAMB call."""
    section = config.Cosmology(m_nu=0.3, sigma8=0.8)
    table = boltzmann.camb_power(boltzmann.inputs(section.model_dump(), 1.0))
    params = _camb_params_at_total_matter(C.Cosmology(m_nu=0.3))
    params.InitPower.set_params(As=table.A_s, ns=section.n_s)
    params.set_matter_power(redshifts=[1.0, 0.0], kmax=20.0)
    params.NonLinear = camb.model.NonLinear_none
    return table, camb.get_results(params)


def test_cb_power_sigma8_cb_and_transfer_ratio_equal_a_direct_camb_call(heavy):
    table, results = heavy
    k = np.geomspace(1e-3, 0.99, 200)
    cb = results.get_matter_power_interpolator(
        nonlinear=False, hubble_units=True, k_hunit=True, var1="delta_nonu", var2="delta_nonu"
    )
    ours = np.exp(np.interp(np.log(k), np.log(table.k), np.log(table.p_cb)))
    np.testing.assert_allclose(ours, cb.P(0.0, k), rtol=1e-4)
    sigma = results.get_sigmaR(8.0, var1="delta_nonu", var2="delta_nonu")[-1]
    assert table.sigma8_cb == pytest.approx(sigma * 0.8 / results.get_sigmaR(8.0)[-1], rel=1e-4)
    assert table.sigma8_cb > table.sigma8  # the neutrinos cluster less than CDM + baryons
    transfer = results.get_matter_transfer_data().transfer_data
    nu = table.neutrinos
    for z_index, a in ((-1, 1.0), (0, 0.5)):  # CAMB's redshifts 1 and 0
        direct = (
            transfer[camb.model.Transfer_nu - 1, :, z_index]
            / transfer[camb.model.Transfer_nonu - 1, :, z_index]
        )
        kh = transfer[camb.model.Transfer_kh - 1, :, z_index]
        inside = (kh > 1e-3) & (kh < 2.0)
        np.testing.assert_allclose(
            np.interp(kh[inside], nu.k, neutrinos.transfer_ratio(nu, a)), direct[inside], atol=2e-3
        )


def test_transfer_ratio_scheme_reproduces_the_cb_growth_of_camb(heavy):
    """D_cb(k, a) from the transfer-ratio equation, started where CAMB gives the growth rate,
    against CAMB's T_cb(k, a) / T_cb(k, 1): within 0.2 % from a = 0.01, 0.05 % from a = 0.02,
    for 0.01 < k < 2 h/Mpc."""
    table, _ = heavy
    nu, cosmo = table.neutrinos, C.Cosmology(m_nu=0.3)
    inside = (nu.k > 0.01) & (nu.k < 2.0)
    for a_start, tolerance in ((0.01, 2e-3), (0.02, 5e-4)):
        later = nu.a >= a_start * (1 - 1e-9)
        growth = neutrinos.cb_growth(cosmo, nu, a_start, nu.a[later])
        np.testing.assert_allclose(
            growth[:, inside], nu.growth_cb[later][:, inside], rtol=tolerance
        )
    # scale-dependent: the suppression of growth since a = 0.02 grows with k
    assert growth[0, inside][-1] > growth[0, inside][0] * 1.02


def test_neutrino_tables_round_trip_through_the_cache(tmp_path):
    spec = boltzmann.inputs(config.Cosmology(m_nu=0.3).model_dump(), 1.0)
    first = power_cache.linear_table(spec, tmp_path)
    again = power_cache.linear_table(spec, tmp_path)
    assert again.sigma8_cb == first.sigma8_cb
    for name in ("a", "k", "ratio", "growth_cb"):
        assert getattr(again.neutrinos, name).tobytes() == getattr(first.neutrinos, name).tobytes()
    assert again.p_cb.tobytes() == first.p_cb.tobytes()
    massless = power_cache.linear_table(
        boltzmann.inputs(config.Cosmology().model_dump(), 1.0), tmp_path
    )
    assert massless.neutrinos is None and massless.p_cb is massless.p
    assert massless.sigma8_cb == massless.sigma8


def _neutrino_run(m_nu: float, pdims=(1, 1), box=1000.0, oversample=2, a_init=0.02, steps=20):
    """A run's setup and its evolution (32³ particles, ICs and 2LPT at a_init, PM steps to
    a = 1, a snapshot at 0.5) at A_s = 2.1e-9 on the device mesh pdims."""
    run = config.Run.model_validate(
        {
            "cosmology": {"m_nu": m_nu, "A_s": 2.1e-9},
            "power": {"kind": "camb"},
            "box": {"particles": 32, "box_size": box, "oversample": oversample},
            "ic": {"a_init": a_init, "seed": 3},
            "nbody": {"steps": steps, "snapshots": [0.5]},
            "parallel": {"pdims": list(pdims)},
        }
    )
    mesh = parallel.make_mesh(pdims)
    setup = derive.setup(config.RunFile.build("nu", f"m{m_nu}", 0, {}, run), mesh, linear_table)
    noise = ics.white_noise(run.ic.seed, 32, mesh)
    init, result = simulation.simulate(
        setup.cosmology, noise, setup.grid, setup.timeline, setup.power
    )
    return setup, init, result


@pytest.fixture(scope="module")
def paired():
    return {m: _neutrino_run(m) for m in (0.0, 0.3)}


@pytest.mark.slow
def test_paired_runs_suppress_power_as_linear_theory_says(paired):
    """Σm_ν = 0.3 eV against massless neutrinos, same A_s and seed, 32³ in 1 Gpc/h: the ratio
    of the CDM + baryon power to the massless run's matches CAMB's linear ratio within 1 % at
    a = 0.5 and 1 wherever the suppression is at least 5 % (k <= 0.05 h/Mpc: linear scales).
    Left out of the force, the neutrinos would change the ratio by several per cent."""
    direct = {}
    for m_nu, variable in ((0.0, "delta_tot"), (0.3, "delta_nonu")):
        params = _camb_params_at_total_matter(C.Cosmology(m_nu=m_nu))
        params.InitPower.set_params(As=2.1e-9, ns=C.Cosmology().n_s)
        params.set_matter_power(redshifts=[1.0, 0.0], kmax=10.0)
        params.NonLinear = camb.model.NonLinear_none
        direct[m_nu] = camb.get_results(params).get_matter_power_interpolator(
            nonlinear=False, hubble_units=True, k_hunit=True, var1=variable, var2=variable
        )
    box = 1000.0
    mesh = paired[0.0][0].grid.mesh
    for a in (0.5, 1.0):
        spectra = {}
        for m_nu, (_, _, result) in paired.items():
            k, spectra[m_nu], _ = stats.power_spectrum(result.snapshots[a] - 1.0, mesh, box)
        linear = direct[0.3].P(1 / a - 1, k) / direct[0.0].P(1 / a - 1, k)
        inside = (linear <= 0.95) & (k <= 0.05)
        assert inside.sum() >= 4, (k, linear)
        measured = spectra[0.3] / spectra[0.0]
        np.testing.assert_allclose(measured[inside], linear[inside], rtol=0.01)


@pytest.mark.slow
def test_neutrino_run_is_the_same_universe_on_8_devices():
    """As the massless runs of tests/test_nbody.py: 256 Mpc/h, B = 1, 10 steps from a = 0.1
    (float32 rounding, which differs between decompositions, grows with the steps)."""
    sizes = {"box": 256.0, "oversample": 1, "a_init": 0.1, "steps": 10}
    _, init1, result1 = _neutrino_run(0.3, **sizes)
    _, init8, result8 = _neutrino_run(0.3, pdims=(2, 4), **sizes)
    assert len(result8.disp.addressable_shards) == 8
    assert rel_diff(init8.disp, init1.disp) <= 1e-5
    assert rel_diff(init8.mom, init1.mom) <= 1e-5
    for a in (0.5, 1.0):
        assert rel_diff(result8.snapshots[a], result1.snapshots[a]) <= 1e-5
    assert rel_diff(result8.disp, result1.disp) <= 1e-5


def _with_ratio(value: float) -> C.Cosmology:
    """The fiducial cosmology at Σm_ν = 0.3 eV carrying a transfer ratio R = value at every
    k and a (the tables total_matter and force_factor read)."""
    cosmo = C.tabulated(C.Cosmology(m_nu=0.3))
    a = np.geomspace(0.01, 1.0, 4)
    tables = {
        "nu_lna": np.log(a),
        "nu_ratio": np.full((a.size, neutrinos.K_GRID.size), value),
    }
    return C.Cosmology(m_nu=0.3, tables={**cosmo.tables, **tables})


@pytest.mark.parametrize("pdims", [(1, 1), (2, 4)])
def test_planes_hold_the_total_matter(pdims):
    """δ_m = (Ω_cb + a³ρ_ν R) / (Ω_cb + a³ρ_ν) δ_cb: the particles' density itself where the
    neutrinos cluster like CDM (R = 1), scaled by their share where they do not (R = 0)."""
    mesh = parallel.make_mesh(pdims)
    rho = 1.0 + 0.3 * ics.white_noise(5, 16, mesh)
    a = 0.6
    same = neutrinos.total_matter(_with_ratio(1.0), a, rho, mesh, 100.0)
    assert rel_diff(same, rho) < 1e-6
    smooth = neutrinos.total_matter(_with_ratio(0.0), a, rho, mesh, 100.0)
    cosmo = C.Cosmology(m_nu=0.3)
    neutrino = a**3 * background.neutrino_density_pressure(cosmo, a)[0]
    share = background.omega_cb(cosmo) / (background.omega_cb(cosmo) + neutrino)
    assert 0.97 < share < 0.98
    assert rel_diff(smooth - 1.0, share * (rho - 1.0)) < 1e-6


@pytest.mark.slow  # 14-17 s: the fast tier stays within 3 minutes
def test_a_neutrino_run_with_lensing_runs_every_stage(tmp_path, monkeypatch):
    """A 16³ run at Σm_ν = 0.2 eV with a lightcone and flat-sky lensing through the ic, nbody,
    lensing and summaries stages: finite maps, and linear theory in the summaries that follows
    CAMB's scale-dependent growth of CDM + baryons, T_cb(k, a)² / T_cb(k, 1)², to 0.5 %."""
    run = config.Run.model_validate(
        {
            "cosmology": {"m_nu": 0.2},
            "power": {"kind": "camb"},
            "box": {"box_size": 64.0, "particles": 16},
            "nbody": {"steps": 3, "snapshots": [0.5]},
            "lightcone": {"z_max": 0.05, "plane_thickness": 32.0},
            "lensing": {
                "source_redshifts": [0.05],
                "flat_sky": {"field_of_view": 20.0, "pixels": 32},
            },
            "summaries": {"kappa_range": [-0.01, 0.01]},
        }
    )
    run_dir = tmp_path / "nu" / "nu-r0"
    run_dir.mkdir(parents=True)
    path = run_dir / "config.json"
    path.write_text(config.RunFile.build("nu", "nu-r0", 0, {"m_nu": 0.2}, run).to_json())
    monkeypatch.setattr(power_cache, "folder_of", lambda _: TABLES)  # CAMB's table made once
    for stage in ("ic", "nbody", "lensing", "summaries"):
        registry.run_stage(stage, path)
    maps = zarr.open_group(run_dir / "lensing.zarr", mode="r")
    kappa = np.asarray(maps["kappa"][:])
    assert np.all(np.isfinite(kappa)) and np.std(kappa) > 0
    summaries = zarr.open_group(run_dir / "summaries.zarr", mode="r")
    assert list(summaries["a"][:]) == [0.5, 1.0]
    k, linear = np.asarray(summaries["k_mean"][:]), np.asarray(summaries["pk_linear"][:])
    params = boltzmann.camb_params(run.cosmology.model_dump(), 2.1e-9, 20.0)
    params.set_matter_power(redshifts=[1.0, 0.0], kmax=20.0)
    cb = camb.get_results(params).get_matter_power_interpolator(
        nonlinear=False, hubble_units=True, k_hunit=True, var1="delta_nonu", var2="delta_nonu"
    )
    camb_growth = cb.P(1.0, k) / cb.P(0.0, k)
    np.testing.assert_allclose(linear[0] / linear[1], camb_growth, rtol=5e-3)
