"""Baryonic feedback (HMcode-2020 through CAMB) as a filter of the lightcone planes: the table,
the filters of flat planes and full-sky shells, and paired runs whose spectra it suppresses as
Limber's projection of the model predicts."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml
import zarr
from conftest import TABLES, run_every_stage
from jax.sharding import NamedSharding

from pmpipe.campaigns import campaign
from pmpipe.physics.lensing import projection
from pmpipe.physics.theory import baryons, cosmology
from pmpipe.run import config, derive
from pmpipe.runtime import parallel
from pmpipe.runtime.parallel import FIELD_SPEC
from pmpipe.storage import power_cache

COSMOLOGY = config.Cosmology().model_dump()


@pytest.fixture(scope="module")
def tables():
    """S(k, z) to z = 1 of log T_AGN 7.6 and 8.0 (CAMB's, through the tests' power cache)."""
    made = power_cache.suppressions(COSMOLOGY, None, (7.6, 8.0), 1.0, TABLES)
    return dict(zip((7.6, 8.0), made))


def test_the_tables_are_cached_per_temperature_and_made_again_when_damaged(tables, tmp_path, capfd):
    calls = []

    def computed(cosmology, A_s, temperatures, z_max):  # the fixture's CAMB tables, counted
        calls.append(list(temperatures))
        return tuple(tables[t] for t in temperatures)

    def cached(temperatures, A_s=None, z_max=1.0, folder=tmp_path):
        return power_cache.suppressions(COSMOLOGY, A_s, temperatures, z_max, folder, computed)

    (hot,) = cached([8.0])
    both = cached([7.6, 8.0, 7.6])
    assert calls == [[8.0], [7.6]]  # the temperature not cached yet, alone
    for found, t in zip(both, (7.6, 8.0, 7.6)):
        for name in ("k", "z", "ratio"):  # read back bit for bit
            assert getattr(found, name).tobytes() == getattr(tables[t], name).tobytes()
    spec = {**baryons.inputs(COSMOLOGY, None, 1.0), "log_T_AGN": 8.0}
    path = tmp_path / f"{power_cache.key(spec)}.npz"
    assert sorted(tmp_path.glob("*.npz")) == sorted(
        [path, tmp_path / f"{power_cache.key({**spec, 'log_T_AGN': 7.6})}.npz"]
    )
    path.write_bytes(path.read_bytes()[:-50])  # cut short
    assert cached([8.0])[0].ratio.tobytes() == hot.ratio.tobytes() and calls[-1] == [8.0]
    assert "unreadable" in capfd.readouterr().err
    cached([8.0], z_max=0.9)  # another grid of redshifts
    cached([8.0], A_s=2.1e-9)  # another amplitude
    cached([8.0], folder=None)  # no cache
    assert calls[-3:] == [[8.0]] * 3 and len(list(tmp_path.glob("*.npz"))) == 4
    blocked = tmp_path / "a file"
    blocked.write_text("")
    cached([7.6], folder=blocked / "cache")  # cannot be written: the run goes on
    assert "not written" in capfd.readouterr().err


def test_feedback_suppresses_small_scales_more_the_hotter_the_agn(tables):
    weak, strong = tables[7.6], tables[8.0]
    k = np.array([0.01, 1.0, 5.0])
    for z in (0.0, 0.5):
        s_weak, s_strong = baryons.factor(weak, k, z), baryons.factor(strong, k, z)
        assert abs(s_strong[0] - 1) < 1e-3 and s_strong[1] < s_weak[1] < 1
        assert s_strong[2] < 0.9
    assert baryons.factor(strong, [1e-4], 0.3)[0] == 1.0  # below the table: no suppression
    row = strong.ratio[0]
    np.testing.assert_allclose(baryons.factor(strong, strong.k, strong.z[0]), row, rtol=1e-12)


def test_a_plane_mode_is_scaled_by_the_square_root_of_the_suppression(tables):
    """One cosine mode of a (32, 32) plane of 128 Mpc/h, sharded over 8 devices and not: its
    amplitude becomes sqrt(S(k)), the rest of the plane stays 0."""
    table, m, box, z = tables[8.0], 32, 128.0, 0.4
    x = np.arange(m) * box / m
    plane = np.cos(2 * np.pi * 5 * x[:, None] / box + 2 * np.pi * 3 * x[None, :] / box)
    kernel = baryons.plane_kernel(table, m, box, z)
    k = 2 * np.pi / box * np.hypot(5, 3)
    expected = np.sqrt(baryons.factor(table, [k], z)[0]) * plane
    mesh = parallel.make_mesh((2, 4))
    sharded = jax.device_put(plane, NamedSharding(mesh, FIELD_SPEC))
    for values in (jnp.asarray(plane), sharded):
        filtered = np.asarray(baryons.filter_plane(values, kernel))
        np.testing.assert_allclose(filtered, expected, atol=2e-6)  # float32
    assert expected.max() < 0.99 * plane.max()


def test_a_shell_is_filtered_per_multipole(tables):
    table, chi, z = tables[8.0], 1500.0, 0.55
    kernel = baryons.shell_kernel(table, 767, chi, z)
    ell = np.array([10, 300, 767])
    np.testing.assert_allclose(
        kernel[ell], np.sqrt(baryons.factor(table, (ell + 0.5) / chi, z)), rtol=1e-12
    )


def test_feedback_outside_the_fitted_range_is_refused_before_any_job(tmp_path):
    path = tmp_path / "hot.yaml"
    path.write_text(
        yaml.safe_dump({"name": "hot", "base": {"baryons": {"log_T_AGN": 8.3}}, "realisations": 1})
    )
    with pytest.raises(config.ConfigError) as err:
        campaign.load(path)
    assert str(path) in str(err.value) and "baryons.log_T_AGN" in str(err.value)
    assert "8" in str(err.value)


RUN = {
    "box": {"particles": 32, "box_size": 128.0},
    "nbody": {"steps": 8, "snapshots": [0.5]},
    "lightcone": {"z_max": 0.8, "plane_thickness": 64.0},
    "lensing": {
        "source_redshifts": [0.8],
        "flat_sky": {"field_of_view": 3.5, "pixels": 64},
        "full_sky": {"nside": 32},
    },
    "summaries": {"smoothing_arcmin": [0], "ell_bins": 6},
}


@pytest.fixture(scope="module")
def paired(tmp_path_factory):
    """The summaries of two 32^3 runs of one seed, with feedback (log T_AGN = 8.0) and
    without (S(k, z) made once, in the tests' power cache)."""
    out = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(power_cache, "folder_of", lambda _: TABLES)
        for name, feedback in (("without", None), ("with", {"log_T_AGN": 8.0})):
            run = config.Run.model_validate({**RUN, "baryons": feedback})
            run_dir = run_every_stage(tmp_path_factory.mktemp(name), run)
            out[name] = (run_dir, zarr.open_group(run_dir / "summaries.zarr", mode="r"))
    return out


def _limber_suppression(run: config.Run, table, ell) -> np.ndarray:
    """Limber's C_ℓ with the suppression over that without, for the run's source."""
    cosmo, power = derive.cosmology_params(run), derive.linear_power(run)
    ((_, _, source),) = derive.sources(run, cosmo)
    chi, integrand, _ = projection.limber_integrand(cosmo, ell, source, power, samples=1024)
    z = 1.0 / cosmology.on_host(cosmology.scale_factor_at_distance, cosmo, chi) - 1.0
    k = (np.asarray(ell)[:, None] + 0.5) / chi[None, :]
    s = np.stack([baryons.factor(table, k[:, i], z[i]) for i in range(chi.size)], axis=1)
    return np.sum(integrand * s, axis=1) / np.sum(integrand, axis=1)


@pytest.mark.slow
def test_paired_runs_follow_the_model(paired):
    """P(k) with feedback is the N-body's times S exactly. The flat maps' C_ℓ over those
    without feedback (one N-body: cosmic variance cancels) against Limber's projection of S
    with the linear power, in the four lowest bins (ℓ < 1200): within 0.03 of the ratio, and
    where it predicts more than 2 %, between half and 1.25 times the predicted suppression. A plane's modes are filtered
    exactly, but 32^3 particles in 128 Mpc/h lack the power at k > 0.13 h/Mpc where S is
    smallest, so the maps are suppressed less than the projection of the model's power.
    Full sky at nside 32 (ℓ < 96) the suppression is below 0.5 %, within 0.2 % as predicted."""
    (_, without), (run_dir, with_feedback) = paired["without"], paired["with"]
    np.testing.assert_array_equal(without["pk"][:], with_feedback["pk"][:])
    lens = zarr.open_group(run_dir / "lensing.zarr", mode="r")
    table = baryons.Suppression(
        lens["k_baryons"][:], lens["z_baryons"][:], lens["baryon_suppression"][:]
    )
    a, k = with_feedback["a"][:], with_feedback["k_mean"][:]
    expected = np.stack([baryons.factor(table, k, 1 / a_i - 1) for a_i in a])
    np.testing.assert_allclose(
        with_feedback["pk_baryons"][:], with_feedback["pk"][:] * expected, rtol=1e-6
    )
    run = config.Run.model_validate({**RUN, "baryons": {"log_T_AGN": 8.0}})
    results = {}
    for suffix in ("", "_healpix"):
        ell = with_feedback[f"ell{suffix}_mean"][:]
        measured = with_feedback[f"cl{suffix}"][0, 0] / without[f"cl{suffix}"][0, 0]
        results[suffix] = measured, _limber_suppression(run, table, ell)
        print(f"maps{suffix}: C_ell ratio {measured}, Limber {results[suffix][1]}")
    measured, predicted = (r[:4] for r in results[""])
    assert np.all(np.diff(measured) < 0)  # more suppression at higher multipoles
    assert np.all(np.abs(measured - predicted) <= 0.03)
    strong = predicted < 0.98
    ratio = (1 - measured[strong]) / (1 - predicted[strong])
    assert strong.sum() >= 2 and np.all((ratio > 0.5) & (ratio < 1.25))
    measured, predicted = results["_healpix"]
    assert np.all(np.abs(measured - predicted) < 0.002) and measured[-1] < 0.998  # filtered
