"""Estimators against fields of known spectrum, and the same statistics on 1 and 8 devices."""

import healpy
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from pmpipe.physics.evolution import sky
from pmpipe.physics.mesh import domain, painting
from pmpipe.physics.statistics import stats
from pmpipe.runtime import parallel


def gaussian_field(n, box, power, seed):
    """A real Gaussian field (n, n, n) with spectrum power(k) [(Mpc/h)^3]."""
    rng = np.random.default_rng(seed)
    k = 2 * np.pi * np.fft.fftfreq(n, d=box / n)
    kk = np.sqrt(k[:, None, None] ** 2 + k[None, :, None] ** 2 + k[None, None, :] ** 2)
    amp = np.sqrt(np.where(kk > 0, power(np.where(kk > 0, kk, 1)), 0) * n**3 / box**3)
    return np.fft.ifftn(np.fft.fftn(rng.normal(size=(n, n, n))) * amp).real.astype(np.float32)


def test_power_spectrum_of_a_gaussian_field_is_recovered_within_its_scatter():
    n, box = 48, 200.0
    power = lambda k: 1e3 * k**-1.5 * np.exp(-((k / 0.6) ** 2))
    field = gaussian_field(n, box, power, 0)
    k, pk, modes = stats.power_spectrum(jnp.asarray(field), parallel.make_mesh((1, 1)), box)
    ratio = pk / power(k)
    assert np.all(np.abs(ratio - 1) < 4 * np.sqrt(2 / modes))
    chi2 = np.sum((ratio - 1) ** 2 / (2 / modes)) / k.size
    assert 0.5 < chi2 < 1.6


def test_poisson_catalogue_gives_flat_shot_noise_after_compensation():
    n, box = 64, 200.0
    rng = np.random.default_rng(1)
    q = np.stack(np.meshgrid(*[np.arange(n) * box / n] * 3, indexing="ij"), axis=-1)
    disp = rng.uniform(0, box, size=(n, n, n, 3)) - q
    mesh = parallel.make_mesh((1, 1))
    rho, _ = painting.paint(jnp.asarray(disp, jnp.float32), domain.Grid(mesh, n, 1, box, 4))
    k, pk, modes = stats.power_spectrum(rho - 1.0, mesh, box, compensate_cic=True)
    shot = box**3 / n**3
    nyquist = np.pi * n / box
    lower, upper = k < 0.25 * nyquist, (k >= 0.25 * nyquist) & (k < 0.5 * nyquist)
    mean = lambda sel: np.sum(pk[sel] * modes[sel]) / np.sum(modes[sel]) / shot
    # dividing by the CIC window leaves the aliased images of the shot noise (Jing 2005): a few
    # per cent at half the Nyquist frequency
    assert abs(mean(lower | upper) - 1) < 0.05
    scatter = np.sqrt(2 / modes[lower].sum()) + np.sqrt(2 / modes[upper].sum())
    assert abs(mean(upper) - mean(lower)) < 3 * scatter  # flat up to half the Nyquist frequency
    _, raw, _ = stats.power_spectrum(rho - 1.0, mesh, box)
    assert np.mean(raw[upper]) < 0.9 * shot  # without compensation the window suppresses it


def test_cross_spectrum_of_a_field_with_itself_is_its_auto_spectrum():
    field = jnp.asarray(gaussian_field(32, 100.0, lambda k: k**-2, 2))
    mesh = parallel.make_mesh((1, 1))
    _, auto, _ = stats.power_spectrum(field, mesh, 100.0, compensate_cic=True)
    _, cross, _ = stats.power_spectrum(field, mesh, 100.0, field2=field, compensate_cic=True)
    np.testing.assert_allclose(cross, auto, rtol=1e-6)
    np.testing.assert_allclose(stats.correlation_coefficient(cross, auto, auto), 1.0, rtol=1e-6)


@pytest.mark.parametrize("pdims", [(1, 1), (2, 4)])
def test_auto_and_cross_spectra_from_one_program_are_those_measured_one_by_one(pdims):
    mesh = parallel.make_mesh(pdims)
    place = parallel.field_sharding(mesh)
    a = jax.device_put(gaussian_field(32, 100.0, lambda k: k**-2, 2), place)
    b = jax.device_put(gaussian_field(32, 100.0, lambda k: k**-1, 3), place)
    together = stats.auto_and_cross_spectra(a, b, mesh, 100.0, 16, compensate_cic=True)
    alone = [
        stats.power_spectrum(a, mesh, 100.0, 16, compensate_cic=True),
        stats.power_spectrum(b, mesh, 100.0, 16),
        stats.power_spectrum(a, mesh, 100.0, 16, b, compensate_cic=True, compensate_cic2=False),
    ]
    np.testing.assert_allclose(together[0], alone[0][0], rtol=1e-12)
    np.testing.assert_allclose(together[-1], alone[0][2], rtol=0)
    for found, (_, expected, _) in zip(together[1:4], alone):
        np.testing.assert_allclose(found, expected, rtol=1e-6, atol=1e-6 * np.abs(expected).max())
    assert np.all(together[3] != 0)


def flat_gaussian_map(n, fov_deg, cl, seed):
    """A flat-sky Gaussian map (n, n) with angular spectrum cl(ell)."""
    pixel = np.radians(fov_deg) / n
    ell = 2 * np.pi * np.fft.fftfreq(n, d=pixel)
    ll = np.hypot(ell[:, None], ell[None, :])
    amp = np.sqrt(np.where(ll > 0, cl(np.where(ll > 0, ll, 1)), 0) / pixel**2)
    noise = np.random.default_rng(seed).normal(size=(n, n))
    return np.fft.ifft2(np.fft.fft2(noise) * amp).real.astype(np.float32)


def test_flat_sky_cl_of_a_gaussian_map_is_recovered():
    n, fov = 128, 10.0
    cl = lambda ell: 1e-9 * (ell / 100.0) ** -1.2
    edges = stats.log_bin_edges(80, 2000, 8)
    ell, measured, modes = stats.flat_sky_cl(
        jnp.asarray(flat_gaussian_map(n, fov, cl, 4)), fov, edges
    )
    ratio = measured / cl(ell)
    assert np.all(np.abs(ratio - 1) < 4 * np.sqrt(2 / modes))
    sigma = 4.0
    smoothed = stats.smooth_flat(jnp.asarray(flat_gaussian_map(n, fov, cl, 4)), fov, sigma)
    _, after, _ = stats.flat_sky_cl(smoothed, fov, edges)
    window = np.exp(-((ell * np.radians(sigma / 60)) ** 2))
    resolved = window > 0.3  # where the bin-mean ℓ stands for the bin
    assert resolved.sum() >= 4
    np.testing.assert_allclose((after / measured)[resolved], window[resolved], rtol=0.05)


def test_flat_sky_cl_of_patches_cut_from_a_larger_field_is_unbiased():
    """Maps cut from a larger field are not periodic, as pmpipe's flat maps are not: the
    estimator still recovers C_ell in every bin from the map's fundamental multipole up, to
    4 sigma of the mean over 160 patches (16 from each of 10 fields of 4 x 4 map sizes) plus
    2 % (the patch's edges add 1.1-1.8 % above 10 fundamentals for this spectrum)."""
    n, fov, tiles = 64, 10.0, 4
    cl = lambda ell: 1e-9 * (ell / 100.0) ** -1.2
    edges = stats.log_bin_edges(2 * np.pi / np.radians(fov), np.pi * n / np.radians(fov), 12)
    ratios = []
    for seed in range(10):
        field = flat_gaussian_map(n * tiles, fov * tiles, cl, seed)
        for i in range(tiles):
            for j in range(tiles):
                ell, measured, _ = stats.flat_sky_cl(
                    field[i * n : (i + 1) * n, j * n : (j + 1) * n], fov, edges
                )
                ratios.append(measured / cl(ell))
    ratios = np.asarray(ratios)
    error = ratios.std(axis=0) / np.sqrt(len(ratios))
    assert np.all(np.abs(ratios.mean(axis=0) - 1) < 4 * error + 0.02), ratios.mean(axis=0)


def test_full_sky_cl_of_gaussian_coefficients_is_recovered_in_bins():
    """C_ℓ of Gaussian coefficients up to pmpipe's band limit, binned with weights 2ℓ + 1,
    within 5σ of the input spectrum; the cross spectrum of a map with itself is its C_ℓ and
    with an independent one is consistent with zero."""
    nside = 32
    ell = np.arange(sky.healpix_ell_max(nside) + 1)
    cl = np.where(ell > 1, 1e-8 / (ell + 1.0) ** 1.5, 0)
    np.random.seed(5)
    alm = healpy.synalm(cl, lmax=ell[-1], new=True)
    other = healpy.synalm(cl, lmax=ell[-1], new=True)
    edges = stats.log_bin_edges(4, ell[-1] + 1, 6)
    mean_ell, measured, modes = stats.full_sky_cl(alm, edges)
    expected = stats._bin(np.where(ell > 0, ell, -1), cl, 2 * ell + 1.0, edges)[1]
    assert np.all(np.abs(measured / expected - 1) < 5 * np.sqrt(2 / modes))
    assert np.all((mean_ell > edges[:-1]) & (mean_ell < edges[1:]))
    assert modes.sum() == np.sum(2 * ell[4:] + 1)
    np.testing.assert_allclose(stats.full_sky_cl(alm, edges, alm)[1], measured, rtol=1e-12)
    cross = stats.full_sky_cl(alm, edges, other)[1]
    assert np.all(np.abs(cross) < 5 * expected / np.sqrt(modes))


def test_shape_noise_has_the_requested_pixel_sigma():
    n, fov, sigma_e, n_gal = 128, 2.0, 0.3, 20.0
    noise = np.asarray(stats.shape_noise_flat((0, 0), n, fov, sigma_e, n_gal))
    expected = sigma_e / np.sqrt(n_gal * (fov * 60 / n) ** 2)
    assert abs(noise.std() / expected - 1) < 0.03
    hp = stats.shape_noise_healpix(1, 16, sigma_e, n_gal)
    expected_hp = sigma_e / np.sqrt(n_gal * healpy.nside2pixarea(16, degrees=True) * 3600)
    assert abs(hp.std() / expected_hp - 1) < 0.05


def test_peaks_and_pdf_on_maps_with_known_maxima():
    m = np.zeros((16, 16), np.float32)
    m[4, 4], m[10, 6], m[12, 12], m[0, 8] = 0.5, 1.5, 2.5, 9.0  # the last on the border
    counts = stats.peak_counts_flat(jnp.asarray(m), np.array([0.0, 1.0, 2.0, 3.0, 10.0]))
    np.testing.assert_array_equal(counts, [1, 1, 1, 0])
    values = np.random.default_rng(0).normal(size=1000)
    edges = np.linspace(-6, 6, 25)
    assert abs(np.sum(stats.pdf(values, edges) * np.diff(edges)) - 1) < 1e-12
    nside = 8
    hp = np.zeros(healpy.nside2npix(nside))
    hp[[10, 300, 700]] = [0.5, 1.5, 2.5]
    np.testing.assert_array_equal(
        stats.peak_counts_healpix(hp, np.array([0.25, 1.0, 2.0, 3.0])), [1, 1, 1]
    )


def test_healpix_smoothing_from_the_coefficients():
    """A Gaussian of σ multiplies a multipole ℓ by exp(-ℓ(ℓ + 1) σ² / 2): the smoothed map of a
    single multipole from its coefficients is that factor times its map; a band-limited
    field's smoothed map is healpy's smoothing of its map to within that map's analysis (0.5 %
    at nside 16); its peaks counted with a neighbour table made once equal those counted with
    their own."""
    nside, lmax, sigma = 16, 47, 120.0
    size = healpy.Alm.getsize(lmax)
    single = np.zeros(size, np.complex128)
    single[healpy.Alm.getidx(lmax, 10, 0)] = 1.0
    factor = np.exp(-10 * 11 * np.radians(sigma / 60) ** 2 / 2)
    np.testing.assert_allclose(
        stats.smooth_healpix_alm(single, nside, sigma),
        factor * healpy.alm2map(single, nside, lmax=lmax),
        atol=1e-12,
    )
    rng = np.random.default_rng(3)
    alm = healpy.almxfl(
        rng.normal(size=size) + 1j * rng.normal(size=size), np.arange(lmax + 1) < 17
    )
    alm[: lmax + 1] = alm[: lmax + 1].real  # m = 0
    field = healpy.alm2map(alm, nside, lmax=lmax)
    table, edges = stats.healpix_neighbours(nside), np.linspace(-4, 4, 9)
    for scale in (0.0, sigma, 300.0):
        smoothed = stats.smooth_healpix_alm(alm, nside, scale)
        np.testing.assert_allclose(
            smoothed, stats.smooth_healpix(field, scale), atol=5e-3 * np.abs(smoothed).max()
        )
        counts = stats.peak_counts_healpix(smoothed, edges, neighbours=table)
        np.testing.assert_array_equal(counts, stats.peak_counts_healpix(smoothed, edges))
        assert counts.sum() > 0


@pytest.mark.parametrize("pdims", [(2, 4), (8, 1)])
def test_statistics_on_8_devices_equal_one_device(pdims):
    field = gaussian_field(32, 100.0, lambda k: k**-2, 5)
    other = gaussian_field(32, 100.0, lambda k: k**-1, 6)
    kappa = flat_gaussian_map(64, 5.0, lambda ell: 1e-9 * (ell / 100) ** -1, 7)
    edges_ell = stats.log_bin_edges(72, 2300, 6)
    edges_kappa = np.linspace(-3e-4, 3e-4, 13)
    results = {}
    for p in [(1, 1), pdims]:
        mesh = parallel.make_mesh(p)
        f = jax.device_put(field, parallel.field_sharding(mesh))
        g = jax.device_put(other, parallel.field_sharding(mesh))
        k = jax.device_put(kappa, NamedSharding(mesh, P("x", "y")))
        smoothed = stats.smooth_flat(k, 5.0, 3.0)
        results[p] = [
            stats.power_spectrum(f, mesh, 100.0, compensate_cic=True)[1],
            stats.power_spectrum(
                f, mesh, 100.0, field2=g, compensate_cic=True, compensate_cic2=False
            )[1],
            stats.flat_sky_cl(k, 5.0, edges_ell)[1],
            stats.pdf(smoothed, edges_kappa),
            stats.peak_counts_flat(smoothed, edges_kappa),
        ]
    for single, sharded in zip(results[1, 1], results[pdims]):
        np.testing.assert_allclose(sharded, single, rtol=1e-5, atol=1e-5 * np.abs(single).max())


def test_the_power_of_one_mesh_in_two_boxes_is_one_program_scaled():
    """P(k) of one CIC-compensated 16³ field as a box of 64 and of 128 Mpc/h: the second
    compiles nothing; its k are half, its P eight times the first's."""
    from pmpipe.runtime import compilation

    mesh = parallel.make_mesh((1, 2))
    field = jax.device_put(
        np.random.default_rng(3).normal(size=(16, 16, 16)).astype(np.float32),
        parallel.field_sharding(mesh),
    )
    spectra, counts = [], []
    for box in (64.0, 128.0):
        with compilation.CompileCounter() as counter:
            spectra.append(stats.power_spectrum(field, mesh, box, compensate_cic=True))
        counts.append(counter.counts)
    assert counts[0].programs > 0 and counts[1].programs == 0, counts[1].names
    (k1, p1, n1), (k2, p2, n2) = spectra
    np.testing.assert_allclose(k2, k1 / 2, rtol=1e-6)
    np.testing.assert_allclose(p2, 8 * p1, rtol=1e-6)
    np.testing.assert_array_equal(n1, n2)
