"""Named neutrino hierarchies (cosmology.neutrino_hierarchy): the three masses, the background
against CLASS given those masses directly and against CAMB as pmpipe configures it, the
Boltzmann tables' inputs, the configuration, and a run that evolves with one."""

import math
import types

import camb
import jax
import numpy as np
import pytest
from conftest import linear_table
from scipy import optimize

from pmpipe.physics.evolution import ics, simulation
from pmpipe.physics.statistics import stats
from pmpipe.physics.theory import background, boltzmann
from pmpipe.physics.theory import cosmology as C
from pmpipe.run import config, derive
from pmpipe.runtime import parallel

NAMED = ("normal", "inverted")
Z = np.array([0.0, 0.5, 1.0, 3.0, 10.0, 100.0, 1000.0, 1e4])


def _cosmo(m_nu: float, hierarchy: str):
    return types.SimpleNamespace(
        **{**background.FIDUCIAL, "m_nu": m_nu, "neutrino_hierarchy": hierarchy}
    )


def _masses_by_bisection(total: float, hierarchy: str) -> list[float]:
    """The three masses (eV, ascending) from the oscillations' splittings, solved here
    independently: Brent's method on the lightest mass, written out per ordering."""
    solar, atmospheric = background.DM2_SOLAR, background.DM2_ATMOSPHERIC

    def heavier(m):
        if hierarchy == "normal":  # m1 < m2 < m3
            return [math.sqrt(m * m + solar), math.sqrt(m * m + atmospheric)]
        m2 = math.sqrt(m * m + atmospheric)  # m3 < m1 < m2
        return [math.sqrt(m2 * m2 - solar), m2]

    light = optimize.brentq(lambda m: m + sum(heavier(m)) - total, 0.0, total, xtol=1e-15)
    return [light, *heavier(light)]


@pytest.mark.parametrize("hierarchy", NAMED)
@pytest.mark.parametrize("above_minimum", (1e-6, 0.01, 0.2, 1.0))
def test_the_masses_sum_to_m_nu_with_the_oscillations_splittings(hierarchy, above_minimum):
    total = background.minimum_mass_sum(hierarchy) + above_minimum
    masses = [float(m) for m in background.neutrino_masses(_cosmo(total, hierarchy))]
    assert sum(masses) == pytest.approx(total, rel=1e-13)
    assert masses == sorted(masses)
    np.testing.assert_allclose(masses, _masses_by_bisection(total, hierarchy), rtol=0, atol=1e-12)


def test_the_smallest_sums_are_the_splittings_lightest_massless():
    assert background.minimum_mass_sum("degenerate") == 0.0
    assert background.minimum_mass_sum("normal") == pytest.approx(0.05866, abs=1e-5)
    assert background.minimum_mass_sum("inverted") == pytest.approx(0.09924, abs=1e-5)
    at_minimum = background.neutrino_masses(_cosmo(background.minimum_mass_sum("normal"), "normal"))
    assert float(at_minimum[0]) == pytest.approx(0.0, abs=1e-12)


def test_degenerate_masses_are_a_third_each():
    assert background.neutrino_masses(_cosmo(0.3, "degenerate")) == (0.3 / 3,) * 3


@pytest.mark.parametrize(
    ("hierarchy", "m_nu"), [("normal", 0.06), ("normal", 0.3), ("inverted", 0.1)]
)
def test_background_matches_class_given_the_three_masses(hierarchy, m_nu):
    """CLASS with the three masses as three species of their own (solved in this test), at the
    temperature that gives the massive species 3.044 of N_eff: its Ω_ν today and H(z) equal
    pmpipe's (the Fermi-Dirac sum over the species)."""
    from classy import Class

    fid = background.FIDUCIAL
    masses = _masses_by_bisection(m_nu, hierarchy)
    temperature = (4 / 11) ** (1 / 3) * (3.044 / 3) ** 0.25
    code = Class()
    code.set(
        {
            "h": fid["h"],
            "omega_b": 0.022,
            "omega_cdm": 0.12,
            "T_cmb": fid["T_cmb"],
            "N_ur": fid["N_eff"] - 3.044,
            "N_ncdm": 3,
            "m_ncdm": ",".join(f"{m:.17g}" for m in masses),
            "deg_ncdm": "1,1,1",
            "T_ncdm": ",".join([f"{temperature:.17g}"] * 3),
        }
    )
    code.compute()
    try:
        omega_nu = code.Omega_nu  # the species' full density today
        hubble = np.array([code.Hubble(z) for z in Z]) / code.Hubble(0.0)
    finally:
        code.struct_cleanup()
    omega_m = (0.022 + 0.12) / fid["h"] ** 2 + omega_nu  # pmpipe's Ω_m counts all of Ω_ν
    cosmo = types.SimpleNamespace(**{**_cosmo(m_nu, hierarchy).__dict__, "Omega_m": omega_m})
    assert background.omega_nu(cosmo) == pytest.approx(omega_nu, rel=5e-6)
    np.testing.assert_allclose(np.sqrt(background.E2(cosmo, 1 / (1 + Z))), hubble, rtol=5e-6)


@pytest.mark.parametrize(
    ("hierarchy", "m_nu"), [("normal", 0.0587), ("normal", 0.3), ("inverted", 0.1)]
)
def test_camb_is_given_the_three_masses(hierarchy, m_nu):
    """CAMB as pmpipe configures it (three eigenstates, each given its density today, from
    which CAMB finds its mass) has the three masses, also with the lightest neutrino
    semi-relativistic today, and pmpipe's H(z)."""
    parameters = {**_cosmo(m_nu, hierarchy).__dict__}
    parameters.pop("sigma8")
    params = boltzmann.camb_params(parameters, 2.1e-9, 10.0)
    assert params.nu_mass_eigenstates == 3
    results = camb.get_background(params)
    cosmo = _cosmo(m_nu, hierarchy)
    # CAMB's nu_masses are m / (k_B T_ν) at the massive species' temperature
    t_nu = (4 / 11) ** (1 / 3) * (3.044 / 3) ** 0.25 * cosmo.T_cmb
    masses = np.asarray(results.nu_masses[:3]) * 8.617333262e-5 * t_nu
    # (a lightest mass of 4e-5 eV, relativistic, hardly changes its density: 1e-7 eV absolute)
    expected = _masses_by_bisection(m_nu, hierarchy)
    np.testing.assert_allclose(masses, expected, rtol=1e-5, atol=1e-7)
    hubble = results.hubble_parameter(Z) / (100 * cosmo.h)
    np.testing.assert_allclose(np.sqrt(background.E2(cosmo, 1 / (1 + Z))), hubble, rtol=2e-6)


def test_a_named_hierarchy_is_part_of_the_tables_inputs_and_degenerate_keeps_its_key():
    parameters = {**background.FIDUCIAL, "m_nu": 0.1}
    plain = boltzmann.inputs(parameters, 1.0)
    degenerate = boltzmann.inputs({**parameters, "neutrino_hierarchy": "degenerate"}, 1.0)
    normal = boltzmann.inputs({**parameters, "neutrino_hierarchy": "normal"}, 1.0)
    assert degenerate == plain and "neutrino_hierarchy" not in plain["cosmology"]
    assert normal["cosmology"]["neutrino_hierarchy"] == "normal"
    assert normal["settings"]["mass_squared_differences"] == {
        "solar": background.DM2_SOLAR,
        "atmospheric": background.DM2_ATMOSPHERIC,
    }


@pytest.mark.parametrize(
    ("hierarchy", "m_nu"), [("normal", 0.05), ("inverted", 0.09), ("normal", 0.0)]
)
def test_a_sum_below_the_hierarchy_s_smallest_is_refused(hierarchy, m_nu):
    smallest = f"{background.minimum_mass_sum(hierarchy):.7f}"
    with pytest.raises(
        config.ConfigError,
        match=f"cosmology.m_nu = {m_nu} eV is below the {hierarchy} hierarchy's smallest sum, {smallest}",
    ):
        config.validate(
            config.Cosmology, {"m_nu": m_nu, "neutrino_hierarchy": hierarchy}, "cosmology"
        )


@pytest.mark.parametrize(("hierarchy", "m_nu"), [("normal", 0.0586603), ("inverted", 0.0992443)])
def test_the_smallest_sums_are_accepted(hierarchy, m_nu):
    section = config.validate(
        config.Cosmology, {"m_nu": m_nu, "neutrino_hierarchy": hierarchy}, "cosmology"
    )
    assert float(background.neutrino_masses(section)[0]) < 2e-4


def test_an_unknown_hierarchy_is_refused_with_the_allowed_names():
    with pytest.raises(
        config.ConfigError, match="neutrino_hierarchy.*'degenerate', 'normal' or 'inverted'"
    ):
        config.validate(
            config.Cosmology, {"m_nu": 0.1, "neutrino_hierarchy": "ordered"}, "cosmology"
        )


def test_degenerate_runs_keep_their_hash_and_a_hierarchy_changes_it():
    def run(**cosmology):
        data = {"cosmology": {"m_nu": 0.1, **cosmology}, "power": {"kind": "camb"}}
        return config.config_hash(config.Run.model_validate(data))

    assert run(neutrino_hierarchy="degenerate") == run()
    assert run(neutrino_hierarchy="normal") not in (run(), run(neutrino_hierarchy="inverted"))


def test_the_physics_cosmology_carries_the_hierarchy_through_jit_and_gradients():
    """The hierarchy is static in the pytree (jit specialises on it); m_nu stays a leaf with
    a gradient."""
    normal = C.Cosmology(m_nu=0.06, neutrino_hierarchy="normal")
    assert len(jax.tree_util.tree_leaves(normal)) == len(
        jax.tree_util.tree_leaves(C.Cosmology(m_nu=0.06))
    )

    @jax.jit
    def omega_nu(cosmo):
        return background.omega_nu(cosmo)

    # at 0.06 eV the normal ordering's Ω_ν is 0.2 % above the degenerate one's (its lightest
    # neutrino is semi-relativistic); float32 under jit is good to 2e-7
    expected = background.omega_nu(_cosmo(0.06, "normal"))
    assert float(omega_nu(normal)) == pytest.approx(expected, rel=1e-6)
    assert float(omega_nu(C.Cosmology(m_nu=0.06))) == pytest.approx(expected / 1.00217, rel=1e-5)
    slope = jax.grad(lambda m: omega_nu(C.Cosmology(m_nu=m, neutrino_hierarchy="normal")))(0.06)
    step = 1e-4
    difference = (
        background.omega_nu(_cosmo(0.06 + step, "normal"))
        - background.omega_nu(_cosmo(0.06 - step, "normal"))
    ) / (2 * step)
    assert float(slope) == pytest.approx(difference, rel=1e-3)


def _evolved_power(hierarchy: str):
    """k, P(k) at a = 1 of a 16³ run in 500 Mpc/h with Σm_ν = 0.1 eV split by ``hierarchy``,
    and its Boltzmann table."""
    run = config.Run.model_validate(
        {
            "cosmology": {"m_nu": 0.1, "A_s": 2.1e-9, "neutrino_hierarchy": hierarchy},
            "power": {"kind": "camb"},
            "box": {"particles": 16, "box_size": 500.0, "oversample": 2},
            "ic": {"a_init": 0.05, "seed": 4},
            "nbody": {"steps": 8},
        }
    )
    mesh = parallel.make_mesh((1, 1))
    setup = derive.setup(config.RunFile.build("nu", hierarchy, 0, {}, run), mesh, linear_table)
    assert setup.cosmology.neutrino_hierarchy == hierarchy
    noise = ics.white_noise(run.ic.seed, 16, mesh)
    _, result = simulation.simulate(setup.cosmology, noise, setup.grid, setup.timeline, setup.power)
    k, p, _ = stats.power_spectrum(result.snapshots[1.0] - 1.0, mesh, 500.0)
    return np.asarray(k), np.asarray(p), setup.linear_table


@pytest.mark.slow
def test_a_run_with_a_hierarchy_evolves_as_its_linear_theory_says():
    """The same seed and Σm_ν = 0.1 eV: the normal ordering's P(k) over the degenerate
    masses' follows CAMB's linear ratio of their cb power (up to 0.07 % lower) within 0.02 %
    up to the particles' Nyquist k (measured: 0.01 %; 0.09 % up to the force mesh's)."""
    k, normal, table = _evolved_power("normal")
    _, degenerate, table_degenerate = _evolved_power("degenerate")
    linear = np.interp(k, table.k, table.p_cb) / np.interp(
        k, table_degenerate.k, table_degenerate.p_cb
    )
    assert linear.min() < 1 - 5e-4  # the hierarchy changes the cb power
    low = k <= np.pi * 16 / 500.0  # the particles' Nyquist k
    assert low.sum() >= 7
    np.testing.assert_allclose((normal / degenerate)[low], linear[low], rtol=2e-4)


@pytest.mark.slow
def test_class_and_camb_tables_agree_for_a_named_hierarchy():
    """CLASS (three species) against CAMB (three eigenstates), Σm_ν = 0.1 eV, normal ordering:
    P(k) within 0.5 % for k <= 1 h/Mpc and σ8 within 0.2 %, as for degenerate masses; and the
    neutrinos' transfer ratio T_ν / T_cb at a = 1 over the degenerate masses' (up to 1.6 at
    1 h/Mpc: the heaviest species clusters most) within 3 % of CAMB's, CLASS's T_ν being the
    species' density-weighted mean."""
    tables = {}
    for hierarchy in ("normal", "degenerate"):
        parameters = {**_cosmo(0.1, hierarchy).__dict__, "A_s": 2.1e-9}
        parameters.pop("sigma8")
        for code in ("camb", "class"):
            spec = boltzmann.inputs(parameters, 1.0, code)
            tables[hierarchy, code] = linear_table(spec)
    camb_table, class_table = tables["normal", "camb"], tables["normal", "class"]
    inside = camb_table.k <= 1.0
    np.testing.assert_allclose(class_table.p[inside], camb_table.p[inside], rtol=0.005)
    assert class_table.sigma8 == pytest.approx(camb_table.sigma8, rel=0.002)
    k = np.geomspace(0.005, 1.0, 12)
    change = {}
    for code in ("camb", "class"):
        normal, degenerate = (tables[h, code].neutrinos for h in ("normal", "degenerate"))
        change[code] = np.interp(k, normal.k, normal.ratio[-1]) / np.interp(
            k, degenerate.k, degenerate.ratio[-1]
        )
    assert change["camb"][-1] > 1.5
    np.testing.assert_allclose(change["class"], change["camb"], rtol=0.03)
