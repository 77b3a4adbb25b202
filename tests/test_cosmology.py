import os
from pathlib import Path

import astropy.units as u
import numpy as np
import pytest
from astropy.cosmology import FlatLambdaCDM, Flatw0waCDM

from pmpipe.physics.theory import cosmology as C
from pmpipe.physics.theory import power_table
from pmpipe.run import config, files, validation

PLANCK = C.Cosmology()
A = np.array([0.02, 0.05, 0.1, 0.2, 0.35, 0.5, 0.7, 0.85, 1.0])


def _astropy(c: C.Cosmology):
    kw = {
        "H0": 100 * c.h,
        "Om0": c.Omega_m,
        "Tcmb0": c.T_cmb,
        "Neff": c.N_eff,
        "m_nu": 0 * u.eV,
        "Ob0": c.Omega_b,
    }
    if c.w0 == -1 and c.wa == 0:
        return FlatLambdaCDM(**kw)
    return Flatw0waCDM(w0=c.w0, wa=c.wa, **kw)


@pytest.mark.parametrize("cosmo", [PLANCK, C.Cosmology(Omega_m=0.25, w0=-0.9, wa=0.2)])
def test_background_matches_astropy(cosmo):
    ref = _astropy(cosmo)
    z = 1 / A - 1
    np.testing.assert_allclose(np.asarray(C.E(cosmo, A)), ref.efunc(z), rtol=1e-4)
    cosmo = C.tabulated(cosmo)
    chi = np.asarray(C.comoving_distance(cosmo, A))
    chi_ref = ref.comoving_distance(z).to_value(u.Mpc) * cosmo.h
    np.testing.assert_allclose(chi[:-1], chi_ref[:-1], rtol=1e-4)
    assert abs(chi[-1]) < 1e-3
    a_back = np.asarray(C.scale_factor_at_distance(cosmo, chi[:-1]))
    np.testing.assert_allclose(a_back, A[:-1], rtol=1e-4)


def test_growth_matches_camb():
    camb = pytest.importorskip("camb")
    c = PLANCK
    z = [float(x) for x in sorted(1 / A[A >= 0.1] - 1, reverse=True)]
    pars = camb.set_params(
        H0=100 * c.h,
        ombh2=c.Omega_b * c.h**2,
        omch2=(c.Omega_m - c.Omega_b) * c.h**2,
        mnu=0.0,
        num_massive_neutrinos=0,
        nnu=c.N_eff,
        TCMB=c.T_cmb,
        ns=c.n_s,
        As=2e-9,
        omk=0.0,
        WantTransfer=True,
    )
    pars.set_matter_power(redshifts=z, kmax=2.0)
    res = camb.get_results(pars)
    zs = np.array(pars.Transfer.PK_redshifts[: pars.Transfer.PK_num_redshifts])
    s8, fs8 = res.get_sigma8(), res.get_fsigma8()
    a = 1 / (1 + zs)
    c = C.tabulated(c)
    d1 = np.asarray(C.growth_factor(c, a))
    f1 = np.asarray(C.growth_rate(c, a))
    np.testing.assert_allclose(d1, s8 / s8[np.argmin(zs)], rtol=2e-3)
    np.testing.assert_allclose(f1, fs8 / s8, rtol=2e-3)


@pytest.mark.parametrize("cosmo", [PLANCK, C.Cosmology(Omega_m=0.2), C.Cosmology(T_cmb=0.0)])
def test_second_order_growth_matches_lcdm_approximation(cosmo):
    a = A[A >= 0.1]
    cosmo = C.tabulated(cosmo)
    d1 = np.asarray(C.growth_factor(cosmo, a))
    d2 = np.asarray(C.growth_factor_2(cosmo, a))
    approx = -3 / 7 * d1**2 * np.asarray(C.omega_m_of_a(cosmo, a)) ** (-1 / 143)
    np.testing.assert_allclose(d2, approx, rtol=1e-2)
    f2 = np.asarray(C.growth_rate_2(cosmo, a))
    np.testing.assert_allclose(f2, 2 * np.asarray(C.omega_m_of_a(cosmo, a)) ** (6 / 11), rtol=2e-2)


def test_einstein_de_sitter_growth_is_a():
    eds = C.Cosmology(Omega_m=1.0, T_cmb=0.0)
    a = np.array([0.1, 0.3, 1.0])
    np.testing.assert_allclose(np.asarray(C.growth_factor(eds, a)), a, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(C.growth_rate(eds, a)), 1.0, rtol=1e-5)


@pytest.mark.parametrize("wiggles", [True, False])
def test_eisenstein_hu_is_normalised_to_sigma8(wiggles):
    k = np.logspace(-5, 2, 4096)
    pk = C.linear_power_eisenstein_hu(PLANCK, k, wiggles)
    assert float(C.sigma_r(k, pk, 8.0)) == pytest.approx(PLANCK.sigma8, rel=1e-4)


def test_eisenstein_hu_close_to_camb():
    camb = pytest.importorskip("camb")
    c = PLANCK
    pars = camb.set_params(
        H0=100 * c.h,
        ombh2=c.Omega_b * c.h**2,
        omch2=(c.Omega_m - c.Omega_b) * c.h**2,
        mnu=0.0,
        num_massive_neutrinos=0,
        nnu=c.N_eff,
        TCMB=c.T_cmb,
        ns=c.n_s,
        As=2.1e-9,
        WantTransfer=True,
    )
    pars.set_matter_power(redshifts=[0.0], kmax=5.0)
    res = camb.get_results(pars)
    k = np.logspace(-3, 0.3, 50)
    pk_camb = res.get_matter_power_interpolator(nonlinear=False).P(0.0, k)
    c8 = C.Cosmology(sigma8=float(res.get_sigma8_0()))
    ratio = np.asarray(C.linear_power_eisenstein_hu(c8, k)) / pk_camb
    assert np.all(np.abs(ratio - 1) < 0.05), ratio  # the fit's documented accuracy is a few %


def _write(tmp_path, rows, name="pk.txt"):
    path = tmp_path / name
    path.write_text("# k [h/Mpc]  P [(Mpc/h)^3]\n" + "\n".join(" ".join(map(str, r)) for r in rows))
    return path


def _good_rows():
    k = np.logspace(-4, 1, 200)
    return np.c_[k, np.asarray(C.linear_power_eisenstein_hu(PLANCK, k))]


def test_power_table_roundtrip(tmp_path):
    rows = _good_rows()
    k, pk = validation.load_power_table(_write(tmp_path, rows), 1e-3, 5.0)
    kq = np.array([0.01, 0.1, 1.0])
    got = np.asarray(C.interp_power(kq, k, pk, PLANCK.n_s))
    np.testing.assert_allclose(got, np.asarray(C.linear_power_eisenstein_hu(PLANCK, kq)), rtol=2e-3)


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda r: r[::-1], "strictly increasing"),
        (lambda r: np.where(np.arange(len(r))[:, None] == 5, [[r[5, 0], -1.0]], r), "must be > 0"),
        (lambda r: np.where(np.arange(len(r))[:, None] == 7, [[r[7, 0], np.nan]], r), "non-finite"),
        (lambda r: r[r[:, 0] < 0.1], "covers k"),
        (lambda r: r[:2], "at least 4 rows"),
    ],
)
def test_bad_power_tables_are_rejected(tmp_path, mutate, message):
    path = _write(tmp_path, mutate(_good_rows()))
    with pytest.raises(power_table.PowerTableError, match=message) as err:
        validation.load_power_table(path, 1e-3, 5.0)
    assert str(path) in str(err.value)


def test_unreadable_power_table_is_refused_without_echoing_it(tmp_path):
    path = tmp_path / "pk.txt"
    path.write_text("# k P\n0.1 1.0\nroot:x:0:0:secret\n")
    with pytest.raises(config.ConfigError, match="line 3 is not numbers") as err:
        validation.load_power_table(path, 1e-3, 5.0)
    assert "secret" not in str(err.value) and str(path) in str(err.value)


@pytest.mark.parametrize("device", ["/dev/zero", "fifo", "folder"])
def test_a_power_table_that_is_no_regular_file_is_refused_before_reading(tmp_path, device):
    path = {"fifo": tmp_path / "fifo", "folder": tmp_path}.get(device, Path(device))
    if device == "fifo":
        os.mkfifo(path)  # opening it for reading would wait for a writer
    with pytest.raises(config.ConfigError, match="not a regular file"):
        validation.load_power_table(path, 1e-3, 5.0)


def test_a_power_table_over_the_size_limit_is_refused_unread(tmp_path):
    path = tmp_path / "pk.txt"
    with open(path, "wb") as fh:  # sparse: nothing to read beyond the limit
        fh.truncate(files.MAX_TABLE_BYTES + 1)
    with pytest.raises(config.ConfigError, match=f"larger than {files.MAX_TABLE_BYTES} bytes"):
        validation.load_power_table(path, 1e-3, 5.0)
