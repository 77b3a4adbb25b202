"""power.kind 'class': CLASS's table against CAMB's at three cosmologies (the two codes are
independent: agreement checks both and pmpipe's translation of its cosmology into each), the
neutrino density CLASS is given, the error without classy, and what a run records of it."""

import functools
import types

import numpy as np
import pytest
from conftest import TABLES, linear_table

from pmpipe.physics.theory import background, boltzmann, class_power, neutrinos
from pmpipe.run import config, derive, validation
from pmpipe.runtime import versions
from pmpipe.storage import power_cache

COSMOLOGIES = {
    "lcdm_sigma8": {},
    "w0wa_A_s": {"Omega_m": 0.28, "w0": -0.9, "wa": -0.3, "A_s": 2.0e-9, "h": 0.7},
    "neutrinos_A_s": {"m_nu": 0.1, "A_s": 2.1e-9},
}
K_MAX = 1.0  # h/Mpc: the range docs/validation.md states


def _tables(fields: dict):
    parameters = config.Cosmology.model_validate(fields).model_dump()
    return tuple(
        linear_table(boltzmann.inputs(parameters, K_MAX, code)) for code in ("camb", "class")
    )


# the massive neutrinos' tables (10 s on 2 cores from CLASS) in the slow tier: the fast one
# stays within 3 minutes
@pytest.fixture(
    scope="module",
    params=[
        pytest.param(name, marks=pytest.mark.slow) if "m_nu" in fields else name
        for name, fields in COSMOLOGIES.items()
    ],
)
def both(request):
    return request.param, _tables(COSMOLOGIES[request.param])


def test_class_and_camb_agree_within_half_a_percent_and_on_sigma8(both):
    name, (camb, klass) = both
    assert (camb.code, klass.code) == ("camb", "class")
    np.testing.assert_allclose(klass.k, camb.k, rtol=1e-9)
    inside = (camb.k >= 1e-3) & (camb.k <= K_MAX)
    for field in ("p", "p_cb"):  # measured: within 0.30 % (0.11 % without neutrinos)
        ratio = getattr(klass, field)[inside] / getattr(camb, field)[inside]
        assert np.max(np.abs(ratio - 1.0)) < 5e-3, (name, field)
    if "A_s" in COSMOLOGIES[name]:  # σ8 of the same A_s; measured within 0.07 %
        assert klass.A_s == camb.A_s
        assert abs(klass.sigma8 / camb.sigma8 - 1.0) < 2e-3
        assert abs(klass.sigma8_cb / camb.sigma8_cb - 1.0) < 2e-3
    else:  # the A_s each infers from the same σ8 (σ8 ∝ √A_s)
        assert klass.sigma8 == camb.sigma8
        assert abs(klass.A_s / camb.A_s - 1.0) < 4e-3


def test_the_neutrino_response_of_class_is_camb_s(both):
    _, (camb, klass) = both
    if camb.neutrinos is None:
        assert klass.neutrinos is None
        return
    np.testing.assert_array_equal(camb.neutrinos.a, klass.neutrinos.a)
    k = np.geomspace(1e-3, K_MAX, 60)
    later = np.flatnonzero(camb.neutrinos.a >= 0.1)
    for field, tolerance in (("ratio", 0.015), ("growth_cb", 1e-3)):
        # measured: T_ν / T_cb within 0.008, T_cb(a) / T_cb(1) within 2e-4 (a >= 0.1)
        camb_rows, class_rows = (
            np.array([np.interp(np.log(k), np.log(t.k), row) for row in getattr(t, field)[later]])
            for t in (camb.neutrinos, klass.neutrinos)
        )
        if field == "ratio":
            assert np.max(np.abs(class_rows - camb_rows)) < tolerance
        else:
            assert np.max(np.abs(class_rows / camb_rows - 1.0)) < tolerance


def test_class_gets_pmpipe_s_neutrino_density_and_N_eff():
    import classy

    for fields in ({"m_nu": 0.06}, {"m_nu": 0.3, "N_eff": 3.5}, {"N_eff": 2.5}):
        parameters = config.Cosmology.model_validate(fields).model_dump()
        code = classy.Class()
        code.set(class_power.class_inputs(parameters, 2.1e-9, K_MAX))
        code.compute(level=["background"])  # the densities and N_eff need no perturbations
        cosmo = types.SimpleNamespace(**parameters)
        assert code.Omega_nu == pytest.approx(float(background.omega_nu(cosmo)), rel=1e-5)
        assert code.Neff() == pytest.approx(parameters["N_eff"], abs=2e-3)
        assert code.Omega_m() == pytest.approx(parameters["Omega_m"], rel=1e-5)
        code.struct_cleanup()


def test_without_classy_the_error_names_the_field_and_the_extra(monkeypatch, tmp_path):
    real = versions.installed
    monkeypatch.setattr(
        versions, "installed", lambda name: None if name == "classy" else real(name)
    )
    run = config.Run.model_validate({"power": {"kind": "class"}})
    with pytest.raises(ModuleNotFoundError, match=r"pmpipe\[class\]"):
        derive.boltzmann_inputs(run)
    source = tmp_path / "campaign.yaml"
    with pytest.raises(config.ConfigError, match=r"power.kind 'class'.*pmpipe\[class\]") as err:
        validation.checked(run, source)
    assert str(source) in str(err.value)


@pytest.mark.slow  # 9 s when the tests' tables lack it: a CLASS table of its own
def test_a_class_run_records_its_code_and_caches_apart_from_camb():
    fields = {"cosmology": {"m_nu": 0.1, "A_s": 2.1e-9}, "box": {"particles": 16}}
    runs = {
        kind: config.Run.model_validate({**fields, "power": {"kind": kind}})
        for kind in ("camb", "class")
    }
    keys = {kind: power_cache.key(derive.boltzmann_inputs(run)) for kind, run in runs.items()}
    assert keys["camb"] != keys["class"]
    # the tests' tables, made once: a job making CLASS tables anew is test_pipeline's
    tables = functools.partial(power_cache.linear_table, folder=TABLES)
    setup = derive.setup(config.RunFile.build("c", "r", 0, {}, runs["class"]), None, tables)
    source = derive.linear_power_source(setup)
    assert source["code"] == "class" and source["inputs"]["code"] == "class"
    assert source["version"] == versions.installed("classy")
    assert neutrinos.has_tables(setup.cosmology)
    assert (TABLES / f"{keys['class']}.npz").exists()
    again = power_cache.linear_table(derive.boltzmann_inputs(runs["class"]), TABLES)
    np.testing.assert_array_equal(again.p_cb, setup.linear_table.p_cb)
