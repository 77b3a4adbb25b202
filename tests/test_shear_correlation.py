"""Shear correlations ξ± from E and B spectra: the Wigner functions against sympy's, a Gaussian
C_ℓ against its analytic ξ+ and the Hankel transform of its ξ-, and a HEALPix shear map's
pixel pairs (TreeCorr) against the ξ± of its spectra."""

import healpy
import numpy as np
import pytest
from scipy import integrate, special

from pmpipe.physics.evolution import sky
from pmpipe.physics.statistics import shear_correlation


def test_wigner_functions_match_sympy():
    from sympy import N, S
    from sympy.physics.quantum.spin import Rotation

    theta = np.array([0.05, 0.7, 2.0, 3.1])
    d_plus, d_minus = shear_correlation.wigner_d2(9, theta)
    assert np.all(d_plus[:2] == 0) and np.all(d_minus[:2] == 0)
    for ell in (2, 3, 6, 9):
        for t, angle in enumerate(theta):
            for second, mine in ((2, d_plus), (-2, d_minus)):
                exact = complex(N(Rotation.d(ell, 2, second, S(float(angle))).doit(), 20))
                assert abs(mine[ell, t] - exact.real) < 1e-13 and abs(exact.imag) < 1e-13


def test_a_gaussian_spectrum_gives_its_analytic_correlations():
    """C^EE_ℓ = exp(-(ℓ + 1/2)² σ² / 2), σ = 10 arcmin, B = 0: ξ+ = exp(-θ²/2σ²) / 2πσ² and
    ξ- = ∫ ℓ C(ℓ) J4(ℓθ) dℓ / 2π (the flat-sky pair, which the sphere approaches as θ ≪ 1),
    within 1e-3 of ξ+(0) from 2 arcmin to 5 degrees."""
    sigma = np.radians(10 / 60)
    ell = np.arange(4001)
    cl = np.exp(-(((ell + 0.5) * sigma) ** 2) / 2)
    cl[:2] = 0
    theta = np.radians(np.geomspace(2, 300, 12) / 60)
    xi_plus, xi_minus = shear_correlation.shear_correlations(cl, np.zeros_like(cl), theta)
    peak = 1 / (2 * np.pi * sigma**2)
    np.testing.assert_allclose(
        xi_plus, peak * np.exp(-(theta**2) / (2 * sigma**2)), atol=1e-3 * peak
    )

    def hankel4(t):
        def integrand(x):
            return x * np.exp(-((x * sigma) ** 2) / 2) * special.jv(4, x * t)

        return integrate.quad(integrand, 0, 12 / sigma, limit=2000, epsabs=0, epsrel=1e-11)[0]

    expected = np.array([hankel4(t) for t in theta]) / (2 * np.pi)
    np.testing.assert_allclose(xi_minus, expected, atol=1e-3 * peak)
    assert np.abs(expected).max() > 0.1 * peak
    # B modes enter with opposite signs
    both = shear_correlation.shear_correlations(cl, cl, theta)
    np.testing.assert_allclose(both[0], 2 * xi_plus, rtol=1e-12)
    np.testing.assert_allclose(both[1], 0.0, atol=1e-12 * peak)
    # several pairs' spectra at once: each as alone
    stacked = shear_correlation.shear_correlations(
        np.stack([cl, 2 * cl]), np.stack([np.zeros_like(cl), cl]), theta
    )
    np.testing.assert_allclose(stacked[0][0], xi_plus, atol=1e-12 * peak)
    np.testing.assert_allclose(stacked[0][1], 3 * xi_plus, atol=1e-12 * peak)
    np.testing.assert_allclose(stacked[1][1], xi_minus, atol=1e-12 * peak)


@pytest.mark.slow
def test_the_correlations_of_a_healpix_shear_map_are_those_of_its_pixel_pairs():
    """An E-mode shear field (nside 128, coefficients to 3 nside - 1 with little power near
    that band limit) synthesised from known coefficients: TreeCorr's ξ± of its pixel centres
    (γ1, γ2 = healpy's Q, U are TreeCorr's g1, -g2) agree with pmpipe's ξ± of the coefficients'
    spectra within 2 % of ξ+(3 pixels), from 3 pixel sides to 10 degrees."""
    treecorr = pytest.importorskip("treecorr")
    nside = 128
    lmax = sky.healpix_ell_max(nside)
    ell = np.arange(lmax + 1)
    cl = np.where(ell >= 2, 1e-9 * (ell + 10.0) ** -1.2 * np.exp(-((ell / 150.0) ** 2)), 0.0)
    np.random.seed(4)  # healpy.synalm draws from numpy's global generator
    e_alm = healpy.synalm(cl, lmax=lmax, new=True)
    b_alm = np.zeros_like(e_alm)
    g1, g2 = healpy.alm2map_spin([e_alm, b_alm], nside, 2, lmax)
    theta_pix, phi = healpy.pix2ang(nside, np.arange(healpy.nside2npix(nside)))
    catalog = treecorr.Catalog(
        ra=np.degrees(phi), dec=90 - np.degrees(theta_pix), g1=g1, g2=-g2,
        ra_units="deg", dec_units="deg",
    )  # fmt: skip
    pixel = sky.pixel_arcmin(nside)
    pairs = treecorr.GGCorrelation(
        min_sep=3 * pixel, max_sep=600.0, nbins=10, sep_units="arcmin", bin_slop=0.0
    )
    pairs.process(catalog)
    plus, minus = shear_correlation.shear_correlations(
        healpy.alm2cl(e_alm), healpy.alm2cl(b_alm), np.radians(pairs.meanr / 60)
    )
    scale = abs(plus[0])
    assert np.abs(minus).max() > 0.2 * scale
    np.testing.assert_allclose(pairs.xip, plus, atol=0.02 * scale)
    np.testing.assert_allclose(pairs.xim, minus, atol=0.02 * scale)
