"""Linear theory from CAMB per run (power.kind 'camb'): the table against a direct CAMB call
set up here from the cosmology's definitions, σ8 <-> A_s both ways, the on-disk cache (same
bytes, no second CAMB call) and what the ic store keeps of it."""

import json

import camb
import numpy as np
import pytest
import zarr

from pmpipe.physics.theory import boltzmann
from pmpipe.run import config, derive
from pmpipe.stages import registry
from pmpipe.storage import power_cache

BOX = {"particles": 32, "box_size": 256.0}
COSMOLOGIES = {
    "lcdm_sigma8": {},
    "w0wa_A_s": {"Omega_m": 0.28, "w0": -0.9, "wa": -0.3, "A_s": 2.0e-9, "h": 0.7},
    "baryons_neff": {"Omega_b": 0.055, "h": 0.72, "n_s": 0.95, "N_eff": 3.5, "sigma8": 0.75},
    "neutrinos": {"m_nu": 0.1, "sigma8": 0.8},
}


def _run(cosmo: dict) -> config.Run:
    return config.Run.model_validate({"cosmology": cosmo, "power": {"kind": "camb"}, "box": BOX})


def _camb_direct(cosmo: config.Cosmology, A_s: float):
    """CAMB's results for pmpipe's definitions (Ω_m = CDM + baryons + massive neutrinos,
    whose density CAMB's own omnuh2 gives; flat), set up field by field through CAMBparams,
    with pmpipe's precision settings (no CMB spectra: they change CAMB's transfer functions
    by up to 1e-3 near k = 0.03 h/Mpc)."""
    params = camb.CAMBparams(WantCls=False)
    h = cosmo.h
    omega_nu_h2 = 0.0
    for _ in range(2):  # the second pass takes CAMB's neutrino density out of the CDM
        params.set_cosmology(
            H0=100 * h,
            ombh2=cosmo.Omega_b * h**2,
            omch2=(cosmo.Omega_m - cosmo.Omega_b) * h**2 - omega_nu_h2,
            mnu=cosmo.m_nu,
            num_massive_neutrinos=3 if cosmo.m_nu > 0 else 0,
            nnu=cosmo.N_eff,
            TCMB=cosmo.T_cmb,
            omk=0.0,
        )
        omega_nu_h2 = params.omnuh2
    params.InitPower.set_params(As=A_s, ns=cosmo.n_s)
    params.set_dark_energy(w=cosmo.w0, wa=cosmo.wa, dark_energy_model="ppf")
    params.set_matter_power(redshifts=[0.0], kmax=20.0)
    params.NonLinear = camb.model.NonLinear_none
    return camb.get_results(params)


@pytest.mark.parametrize("name", COSMOLOGIES)
def test_camb_power_of_a_run_equals_a_direct_camb_call(name):
    run = _run(COSMOLOGIES[name])
    setup = derive.setup(config.RunFile.build("c", name, 0, {}, run), None)
    table = setup.linear_table
    results = _camb_direct(run.cosmology, table.A_s)
    variable = "delta_nonu" if run.cosmology.m_nu > 0 else "delta_tot"  # the particles' power
    direct = results.get_matter_power_interpolator(
        nonlinear=False, hubble_units=True, k_hunit=True, var1=variable, var2=variable
    )
    k = np.geomspace(1e-3, 0.99 * table.k[-1], 400)
    ours = np.asarray(setup.power(k), np.float64)
    np.testing.assert_allclose(ours, direct.P(0.0, k), rtol=1e-4)
    assert table.sigma8 == pytest.approx(results.get_sigma8_0(), rel=1e-4)
    assert setup.cosmology.sigma8 == table.sigma8  # the physics' σ8 is the table's
    if run.cosmology.A_s is None:
        assert table.sigma8 == run.cosmology.sigma8
    else:
        assert table.A_s == run.cosmology.A_s


def test_sigma8_and_A_s_round_trip():
    by_sigma8 = boltzmann.camb_power(derive.boltzmann_inputs(_run({"sigma8": 0.78})))
    by_A_s = boltzmann.camb_power(derive.boltzmann_inputs(_run({"A_s": by_sigma8.A_s})))
    assert by_A_s.sigma8 == pytest.approx(0.78, rel=1e-4)
    np.testing.assert_allclose(by_A_s.p, by_sigma8.p, rtol=1e-4)
    back = boltzmann.camb_power(derive.boltzmann_inputs(_run({"sigma8": by_A_s.sigma8})))
    assert back.A_s == pytest.approx(by_sigma8.A_s, rel=1e-4)


@pytest.fixture
def counted(monkeypatch):
    """Calls of the Boltzmann code, counted."""
    calls = []
    original = boltzmann.camb_power

    def counting(spec):
        calls.append(spec)
        return original(spec)

    monkeypatch.setattr(boltzmann, "camb_power", counting)
    return calls


def test_cache_returns_the_same_bytes_and_is_made_again_when_damaged(tmp_path, counted, capfd):
    spec = derive.boltzmann_inputs(_run({}))
    first = power_cache.linear_table(spec, tmp_path)
    again = power_cache.linear_table(spec, tmp_path)
    assert len(counted) == 1
    assert again.k.tobytes() == first.k.tobytes() and again.p.tobytes() == first.p.tobytes()
    assert (again.sigma8, again.A_s, again.version) == (first.sigma8, first.A_s, camb.__version__)
    (cached,) = tmp_path.glob("*.npz")
    assert cached.name == power_cache.key(spec) + ".npz"
    cached.write_bytes(cached.read_bytes()[:-100])  # cut short: unreadable
    remade = power_cache.linear_table(spec, tmp_path)
    assert len(counted) == 2 and "unreadable" in capfd.readouterr().err
    assert remade.p.tobytes() == first.p.tobytes()  # CAMB repeats itself bit for bit
    cached.write_bytes(b"")  # a crash before the data reached the disk
    assert power_cache.linear_table(spec, tmp_path).p.tobytes() == first.p.tobytes()
    assert len(counted) == 3 and "EOFError" in capfd.readouterr().err
    other = power_cache.linear_table({**spec, "k_max": 4.0}, tmp_path)
    assert len(counted) == 4 and other.k[-1] == pytest.approx(4.0)
    blocked = tmp_path / "a file"
    blocked.write_text("")
    kept = power_cache.linear_table(spec, blocked / "cache")  # cannot be written: run goes on
    assert kept.p.tobytes() == first.p.tobytes() and "not written" in capfd.readouterr().err


def _write_run(results, name, cosmo):
    run_dir = results / "camp" / name
    run_dir.mkdir(parents=True)
    path = run_dir / "config.json"
    run = config.Run.model_validate(
        {"cosmology": cosmo, "power": {"kind": "camb"}, "box": {"particles": 16, "box_size": 64.0}}
    )
    path.write_text(config.RunFile.build("camp", name, 0, {}, run).to_json())
    return path


def test_ic_stage_keeps_its_linear_power_and_the_second_run_makes_no_camb_call(tmp_path, counted):
    a = registry.run_stage("ic", _write_run(tmp_path, "a", {"A_s": 2.2e-9}))
    b = registry.run_stage("ic", _write_run(tmp_path, "b", {"A_s": 2.2e-9}))  # other seed, same P
    assert len(counted) == 1
    assert len(list((tmp_path / power_cache.FOLDER).glob("*.npz"))) == 1
    stored = [zarr.open_group(p, mode="r") for p in (a, b)]
    for group in stored:
        source = group.attrs["linear_power"]
        assert (source["kind"], source["code"], source["version"]) == (
            "camb",
            "camb",
            camb.__version__,
        )
        assert source["A_s"] == 2.2e-9 and 0.7 < source["sigma8"] < 1.0
        assert json.dumps(source["inputs"]) == json.dumps(counted[0])
        assert group["linear_power"].attrs["units"] == "(Mpc/h)^3"
    assert stored[0]["linear_power"][:].tobytes() == stored[1]["linear_power"][:].tobytes()
    k = stored[0]["k_linear"][:]
    k_needed = np.sqrt(3) * 2 * np.pi / 64.0 * 8  # the 16^3 grid's largest |k|
    assert k[0] == boltzmann.K_MIN and k[-1] == pytest.approx(boltzmann.table_k_max(k_needed))


def test_ic_stage_of_an_eisenstein_hu_run_keeps_the_fit_it_drew_from(tmp_path):
    path = _write_run(tmp_path, "eh", {})
    data = json.loads(path.read_text())
    data["config"]["power"] = {"kind": "eisenstein_hu"}
    run = config.Run.model_validate(data["config"])
    path.write_text(config.RunFile.build("camp", "eh", 0, {}, run).to_json())
    group = zarr.open_group(registry.run_stage("ic", path), mode="r")
    assert group.attrs["linear_power"] == {"kind": "eisenstein_hu", "sigma8": run.cosmology.sigma8}
    setup = derive.setup(config.RunFile.build("camp", "eh", 0, {}, run), None)
    k = group["k_linear"][:]
    np.testing.assert_allclose(group["linear_power"][:], np.asarray(setup.power(k)), rtol=1e-6)
    assert not (tmp_path / power_cache.FOLDER).exists()  # no Boltzmann code for a fit


def test_normalisation_is_exactly_one_of_sigma8_and_A_s():
    with pytest.raises(ValueError, match=r"cosmology.sigma8 = 0.8 and cosmology.A_s = 2e-09"):
        config.Run.model_validate(
            {"power": {"kind": "camb"}, "cosmology": {"sigma8": 0.8, "A_s": 2e-9}}
        )
    with pytest.raises(ValueError, match=r"cosmology.A_s needs power.kind 'camb'"):
        config.Run.model_validate({"cosmology": {"A_s": 2e-9}})
    with pytest.raises(ValueError, match=r"sigma8 or cosmology.A_s must be given"):
        config.Run.model_validate({"cosmology": {"sigma8": None}})
    run = _run({"A_s": 2e-9})
    assert run.cosmology.sigma8 is None
    with pytest.raises(ValueError, match="Boltzmann table"):
        derive.cosmology_params(run)


def test_power_beyond_the_table_follows_camb_to_thirty_times_its_end():
    """Limber integrals and finer meshes ask for k beyond a run's table: its extrapolation
    (cosmology.interp_power) stays within 1 % of a table that reaches that far."""
    from pmpipe.physics.theory import cosmology

    spec = derive.boltzmann_inputs(_run({}))
    short, far = (boltzmann.camb_power({**spec, "k_max": k}) for k in (2.0, 64.0))
    k = np.geomspace(2.0, 60.0, 20)
    n_s = spec["cosmology"]["n_s"]
    extrapolated = np.asarray(cosmology.interp_power(k, short.k, short.p, n_s), np.float64)
    np.testing.assert_allclose(extrapolated, np.interp(k, far.k, far.p), rtol=0.01)
