"""The masked-sky estimator (pmpipe.physics.statistics.pseudo_cl): its coupling matrices against sums of
Wigner 3j symbols (sympy), the full sky, and Gaussian realisations of a known spectrum."""

import healpy
import numpy as np
import pytest
import yaml
import zarr
from conftest import run_every_stage
from sympy.physics.wigner import wigner_3j

from pmpipe.bench.validation import pseudo_cl_gaussian as bench
from pmpipe.campaigns import campaign
from pmpipe.physics.statistics import pseudo_cl, pseudo_cl_flat, stats
from pmpipe.run import config, files


def _by_3j(mask_cl, ell, other, spin):
    """The couplings' sum over L (2L + 1) W_L (3j)², with (1 ± (-1)^(ℓ+ℓ'+L)) for spin 2."""
    if spin == 0:
        return (
            sum(
                (2 * big + 1) * w * float(wigner_3j(ell, other, big, 0, 0, 0)) ** 2
                for big, w in enumerate(mask_cl)
            )
            * (2 * other + 1)
            / (4 * np.pi)
        )
    terms = [
        (
            (2 * big + 1) * w * float(wigner_3j(ell, other, big, 2, -2, 0)) ** 2,
            (-1) ** (ell + other + big),
        )
        for big, w in enumerate(mask_cl)
    ]
    scale = (2 * other + 1) / (8 * np.pi)
    return scale * sum(t * (1 + s) for t, s in terms), scale * sum(t * (1 - s) for t, s in terms)


def test_couplings_equal_the_wigner_3j_sums():
    mask_cl = np.random.default_rng(1).uniform(0.0, 1.0, 13)
    spin0 = pseudo_cl.coupling_spin0(mask_cl, 6)
    plus, minus = pseudo_cl.coupling_spin2(mask_cl, 6)
    for ell in range(7):
        for other in range(7):
            assert spin0[ell, other] == pytest.approx(_by_3j(mask_cl, ell, other, 0), abs=1e-13)
            if min(ell, other) >= 2:
                expected = _by_3j(mask_cl, ell, other, 2)
                assert plus[ell, other] == pytest.approx(expected[0], abs=1e-13)
                assert minus[ell, other] == pytest.approx(expected[1], abs=1e-13)


def test_the_full_sky_couples_nothing():
    """To healpy's analysis of a uniform map (its monopole within 2e-5)."""
    mask_cl = pseudo_cl.mask_power(np.ones(healpy.nside2npix(16)), 95)
    spin0 = pseudo_cl.coupling_spin0(mask_cl, 47)
    plus, minus = pseudo_cl.coupling_spin2(mask_cl, 47)
    np.testing.assert_allclose(spin0, np.eye(48), atol=1e-4)
    np.testing.assert_allclose(plus[2:, 2:], np.eye(46), atol=1e-4)
    np.testing.assert_allclose(minus, 0.0, atol=1e-4)


def test_gaussian_realisations_are_recovered_through_the_windows():
    """100 realisations at nside 32 under a 20° band and ten 6° holes (64 % of the sky), bins
    of 16 from ℓ = 8: the mean estimate over the input seen through the bandpower windows
    within 1 % or 3 standard errors below ℓ = 40 and 2 % up to ℓ = 56 (1.75 nside, where the
    masked maps' analysis starts to alias); the plain bin mean is missed by more where C_ℓ
    is steep (the first bin); the E→B leakage is at most 3 % in the first bin and 1 % on."""
    record = bench.bench_pseudo_cl(32, 100)
    for part in ("scalar", "e"):
        bias = np.abs(record[f"{part}_over_windowed"])
        error = np.asarray(record[f"{part}_standard_error"])
        assert np.all(bias[:2] <= np.maximum(0.01, 3 * error[:2])), (part, bias, error)
        assert np.all(bias <= 0.02), (part, bias)
    assert abs(record["scalar_over_bin_mean"][0]) > 0.03
    leakage = np.abs(record["b_leakage"])
    assert leakage[0] < 0.03 and np.all(leakage[1:] < 0.01)


def test_a_mask_file_of_another_nside_is_refused_naming_it(tmp_path):
    path = tmp_path / "mask.npy"
    np.save(path, np.ones(healpy.nside2npix(16)))
    with pytest.raises(files.ConfigError, match=f"{path} has nside 16, not 32"):
        files.read_healpix_map(path, 32)
    assert files.read_healpix_map(path, 16).sum() == healpy.nside2npix(16)


def _masked_run(tmp_path, name: str, mask: np.ndarray, method: str = "born"):
    """Lensing and summaries of a 16^3 run with full-sky maps of nside 16 under ``mask``."""
    np.save(tmp_path / f"{name}.npy", mask)
    run = config.Run.model_validate(
        {
            "box": {"particles": 16, "box_size": 64.0},
            "nbody": {"steps": 3},
            "lightcone": {"z_max": 0.05, "plane_thickness": 32.0},
            "lensing": {
                "source_redshifts": [0.03, 0.05],
                "flat_sky": None,
                "full_sky": {"nside": 16, "mask": str(tmp_path / f"{name}.npy")},
                "method": method,
            },
            "summaries": {"smoothing_arcmin": [0], "kappa_range": [-0.01, 0.01]},
        }
    )
    run_dir = run_every_stage(tmp_path / name, run)
    return (
        zarr.open_group(run_dir / "lensing.zarr", mode="r"),
        zarr.open_group(run_dir / "summaries.zarr", mode="r"),
    )


@pytest.mark.slow
def test_the_summaries_decouple_the_spectra_of_masked_maps(tmp_path):
    """An all-ones mask gives the bins' mean of the full-sky spectra of every pair (κ and E,
    of the ray-traced maps and of Born's; Born's B 0); a band of |b| < 20° removed gives the
    highest bins' κ spectra within 35 % of the full sky's (the masked sky's own sample
    variance: one realisation)."""
    npix = healpy.nside2npix(16)
    lens, summ = _masked_run(tmp_path, "whole", np.ones(npix), method="both")
    edges = np.append(summ["ell_masked_healpix_lo"][:], summ["ell_masked_healpix_hi"][-1])
    average, _ = pseudo_cl._binning(edges, 32)
    for born in ("", "_born"):
        for name, alm in (("", "kappa"), ("_ee", "gamma_e")):
            coefficients = lens[f"{alm}{born}_healpix_alm"][:].astype(np.complex128)
            for i, j in ((0, 0), (0, 1), (1, 1)):
                full = average @ healpy.alm2cl(coefficients[i], coefficients[j])[:33]
                measured = summ[f"cl{name}{born}_masked_healpix"][i, j]
                np.testing.assert_allclose(measured, full, rtol=2e-3, atol=1e-4 * full.max())
        for name in ("peaks", "pdf"):  # nothing cut, smoothing 0: the full sky's own map
            np.testing.assert_array_equal(
                summ[f"{name}{born}_masked_healpix"][:], summ[f"{name}{born}_healpix"][:]
            )
    assert (
        np.abs(summ["cl_bb_born_masked_healpix"][:]).max()
        < 1e-3 * summ["cl_ee_born_masked_healpix"][:].max()
    )
    theta, _ = healpy.pix2ang(16, np.arange(npix))
    band = (np.abs(np.pi / 2 - theta) > np.radians(20)).astype(np.float64)
    _, masked = _masked_run(tmp_path, "band", band)
    ratio = masked["cl_masked_healpix"][1, 1] / summ["cl_masked_healpix"][1, 1]
    print("masked over full-sky kappa spectra:", ratio)
    np.testing.assert_allclose(ratio[-4:], 1.0, atol=0.35)  # one sky, 64 % of it: ℓ ≈ 15-33
    assert masked["cl_masked_healpix"].attrs["sky_fraction"] == pytest.approx(band.mean())
    counted = masked["peaks_masked_healpix"].attrs["counted_sky_fraction"]
    assert 0.3 < counted[0] < band.mean()
    assert 0 < masked["peaks_masked_healpix"][:].sum() < summ["peaks_masked_healpix"][:].sum()


def test_a_depth_map_scales_the_noise_by_the_local_galaxy_density():
    """Four times the galaxies on half the sky halve the noise there; none, no noise."""
    npix = healpy.nside2npix(32)
    depth = np.ones(npix)
    depth[: npix // 2] = 4.0
    depth[:100] = 0.0
    plain = stats.shape_noise_healpix(3, 32, 0.3, 10.0)
    deep = stats.shape_noise_healpix(3, 32, 0.3, 10.0, depth)
    np.testing.assert_allclose(deep[100 : npix // 2], plain[100 : npix // 2] / 2, rtol=1e-12)
    np.testing.assert_array_equal(deep[npix // 2 :], plain[npix // 2 :])
    assert not deep[:100].any()


def test_interior_pixels_keep_their_distance_from_the_cut():
    nside, radius = 64, np.radians(5.0)
    theta, _ = healpy.pix2ang(nside, np.arange(healpy.nside2npix(nside)))
    latitude = np.abs(np.pi / 2 - theta)
    band = (latitude > np.radians(20)).astype(np.float64)
    inside = stats.interior_healpix(band, radius)
    side = healpy.nside2resol(nside)
    assert np.all(latitude[inside] > np.radians(20) + radius - side)
    assert np.all(inside[latitude > np.radians(20) + radius + 2 * side])
    assert stats.interior_healpix(np.ones(band.size), radius).all()


@pytest.mark.parametrize(
    "field, values, message",
    [
        ("lensing.full_sky.mask", np.ones(healpy.nside2npix(8)), "has nside 8, not 16"),
        ("lensing.full_sky.mask", np.full(healpy.nside2npix(16), 2.0), "values from 0 to 1"),
        ("lensing.full_sky.mask", np.zeros(healpy.nside2npix(16)), "not all 0"),
        ("summaries.shape_noise.depth_map", np.ones(healpy.nside2npix(8)), "has nside 8"),
        ("summaries.shape_noise.depth_map", np.full(healpy.nside2npix(16), -1.0), "values >= 0"),
        ("lensing.flat_sky.mask", np.ones((16, 16)), "of shape (16, 16), not (32, 32)"),
        ("lensing.flat_sky.mask", np.full((32, 32), 2.0), "values from 0 to 1"),
    ],
)
def test_a_map_file_that_does_not_fit_is_refused_before_any_job(tmp_path, field, values, message):
    """A mask or depth map of another nside (a flat mask of another shape) or with values
    outside its range: the campaign
    does not load, and the error names the campaign file, the field and the map's file."""
    map_file = tmp_path / "map.npy"
    np.save(map_file, values)
    path = tmp_path / "masked.yaml"
    base = {
        "box": {"particles": 16, "box_size": 64.0},
        "lightcone": {"z_max": 0.05, "plane_thickness": 32.0},
        "lensing": {"source_redshifts": [0.03], "full_sky": {"nside": 16}},
    }
    if field == "lensing.full_sky.mask":
        base["lensing"]["full_sky"]["mask"] = str(map_file)
    elif field == "lensing.flat_sky.mask":
        base["lensing"]["flat_sky"] = {"pixels": 32, "mask": str(map_file)}
    else:
        base["summaries"] = {"shape_noise": {"depth_map": str(map_file)}}
    path.write_text(yaml.safe_dump({"name": "masked", "base": base, "realisations": 1}))
    with pytest.raises(config.ConfigError) as err:
        campaign.load(path)
    for expected in (str(path), field, str(map_file), message):
        assert expected in str(err.value), (expected, str(err.value))


def test_flat_gaussian_realisations_are_recovered_through_the_windows():
    """400 periodic realisations on 64^2 pixels over 10° under a cut edge and five holes (76 %
    of the map), 8 log bins: the mean estimate over the input seen through the windows within
    1 % or 3 standard errors, for κ and the shear's E modes; the windows (rings a quarter of the
    fundamental wide at low ℓ) within 0.5 % of the exact mean; the E→B leakage below 1 %."""
    record = bench.bench_pseudo_cl_flat(64, 400)
    for part in ("scalar", "e"):
        bias = np.abs(record[f"{part}_over_windowed"])
        error = np.asarray(record[f"{part}_standard_error"])
        assert np.all(bias <= np.maximum(0.01, 3 * error)), (part, bias, error)
    assert np.all(np.abs(record["windows_over_exact"]) < 5e-3)
    assert np.all(np.abs(record["b_leakage"]) < 0.01)


def test_a_whole_flat_mask_couples_nothing():
    """Without a cut the decoupled spectra are the plain ones, and the shear made from κ and ω
    has κ as its E modes and ω as its B modes (maps without modes on the Nyquist row and
    column, which the rotation leaves out)."""
    rng = np.random.default_rng(2)
    white = np.fft.fft2(rng.standard_normal((2, 32, 32)))
    white[:, 16, :] = white[:, :, 16] = 0.0
    kappa, omega = np.fft.ifft2(white).real
    edges = stats.log_bin_edges(36.0, 576.0, 6)
    coupled = pseudo_cl_flat.couplings(np.ones((32, 32)), 10.0, edges)
    np.testing.assert_allclose(coupled["spin0"], np.eye(6), atol=1e-12)
    maps = pseudo_cl_flat.masked_modes(
        kappa, pseudo_cl_flat.shear_of(kappa, omega), np.ones((32, 32))
    )
    for found, expected in zip(maps, (kappa, kappa, omega)):
        np.testing.assert_allclose(found, expected, atol=1e-12)
    plain = stats.flat_sky_cl(kappa, 10.0, edges)[1]
    np.testing.assert_allclose(pseudo_cl_flat.decoupled_spin0(plain, coupled), plain, rtol=1e-10)


@pytest.mark.slow
def test_the_summaries_decouple_the_spectra_of_masked_flat_maps(tmp_path):
    """Ray-traced flat-sky maps and Born's under an all-ones mask: the masked spectra are the
    plain ones (κ, E = κ, B = ω) and so are the peaks; under the bench's mask (81 % of a 32^2 map) fewer
    pixels and peaks are counted, and the spectra keep their shape."""
    out = {}
    for name, mask in (("whole", np.ones((32, 32))), ("cut", bench.default_flat_mask(32, 20.0))):
        np.save(tmp_path / f"{name}.npy", mask)
        run = config.Run.model_validate(
            {
                "box": {"particles": 16, "box_size": 64.0},
                "nbody": {"steps": 3},
                "lightcone": {"z_max": 0.05, "plane_thickness": 32.0},
                "lensing": {
                    "source_redshifts": [0.03, 0.05],
                    "flat_sky": {
                        "field_of_view": 20.0,
                        "pixels": 32,
                        "mask": str(tmp_path / f"{name}.npy"),
                    },
                    "method": "both",
                },
                "summaries": {"smoothing_arcmin": [0, 60], "kappa_range": [-0.01, 0.01]},
            }
        )
        run_dir = run_every_stage(tmp_path / name, run)
        out[name] = zarr.open_group(run_dir / "summaries.zarr", mode="r")
    whole, cut = out["whole"], out["cut"]
    for masked, plain in (
        ("cl_masked", "cl"), ("cl_ee_masked", "cl"), ("cl_bb_masked", "cl_bb"),
        ("cl_born_masked", "cl_born"), ("cl_ee_born_masked", "cl_born"),
    ):  # fmt: skip
        expected = whole[plain][:]
        finite = np.isfinite(expected)  # float32 maps, measured on the host and on the devices
        scale = np.abs(expected[finite]).max()
        np.testing.assert_allclose(
            whole[masked][:][finite], expected[finite], rtol=1e-4, atol=1e-4 * scale
        )
    np.testing.assert_array_equal(whole["peaks_masked"][:], whole["peaks"][:])
    np.testing.assert_array_equal(whole["peaks_born_masked"][:], whole["peaks_born"][:])
    bb, kappa = np.abs(whole["cl_bb_born_masked"][:]), np.abs(whole["cl_born"][:])
    assert np.nanmax(bb) < 1e-4 * np.nanmax(kappa)  # Born's maps have no rotation (empty bins NaN)
    assert whole["peaks_masked"].attrs["counted_sky_fraction"] == [1.0, 1.0]
    counted = cut["peaks_masked"].attrs["counted_sky_fraction"]
    assert counted[1] < counted[0] < cut["cl_masked"].attrs["sky_fraction"] < 0.85
    assert 0 < cut["peaks_masked"][:, 0].sum() < cut["peaks"][:, 0].sum()
    assert cut["windows_masked"].shape == (cut["ell"].shape[0], cut["multipole_flat"].shape[0])


def test_flat_interior_pixels_keep_their_distance_across_the_periodic_edge():
    """A cut first column: the interior starts 3 pixels from it on both sides, the map's
    opposite edge included (the map is smoothed as periodic)."""
    mask = np.ones((16, 16))
    mask[:, 0] = 0.0
    inside = stats.interior_flat(mask, 2.5)
    assert inside[:, 3:14].all() and not inside[:, :3].any() and not inside[:, 14:].any()
    assert stats.interior_flat(np.ones((16, 16)), 2.5).all()
