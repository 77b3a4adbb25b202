"""Full-sky ray tracing: two masses near the pole against rays traced exactly through them in
three dimensions, a Gaussian shell's convergence against its Legendre series, and one shell
against Born."""

import healpy
import numpy as np
import pytest
from scipy.special import eval_legendre

from pmpipe.physics.evolution import sky
from pmpipe.physics.lensing import projection, raytrace_healpix


def _mass_alm(mass, colatitude, longitude, lmax: int, sigma_deg=1.0) -> np.ndarray:
    """Σ_ℓm of a Gaussian (heat-kernel) mass of ``mass`` (its integral over the sphere) and width
    sigma_deg centred at the given angles, band limit lmax, monopole removed: the mass on a
    uniform negative sheet."""
    ell, sigma = np.arange(lmax + 1.0), np.radians(sigma_deg)
    alm = np.zeros(healpy.Alm.getsize(lmax), np.complex128)
    alm[: lmax + 1] = (
        mass * np.exp(-ell * (ell + 1) * sigma**2 / 2) * np.sqrt((2 * ell + 1) / (4 * np.pi))
    )
    healpy.rotate_alm(alm, 0.0, colatitude, longitude, lmax=lmax)
    alm[0] = 0.0
    return alm


def _unit(colatitude, longitude):
    return np.stack(
        [
            np.sin(colatitude) * np.cos(longitude),
            np.sin(colatitude) * np.sin(longitude),
            np.cos(colatitude) * np.ones_like(longitude),
        ]
    )


def _basis(colatitude, longitude):
    e_theta = np.stack(
        [
            np.cos(colatitude) * np.cos(longitude),
            np.cos(colatitude) * np.sin(longitude),
            -np.sin(colatitude),
        ]
    )
    return e_theta, np.stack([-np.sin(longitude), np.cos(longitude), 0 * longitude])


def _point_mass_gradient(beta, centre, mass):
    """∇φ (3, N) at the unit vectors beta of a point mass on the sphere with its monopole removed
    (∇²φ = 2Σ): (M / 2π) cot(ϑ/2) along the great circle away from the centre; with the angle ϑ."""
    cos = np.clip(centre @ beta, -1.0, 1.0)
    sin = np.sqrt(1 - cos**2)
    away = (beta * cos - centre[:, None]) / sin
    return mass / (2 * np.pi) * (1 + cos) / sin * away, np.arccos(cos)


def _shoot(u, chi, factors, masses, centres, chi_source):
    """Directions (3, N) at chi_source of rays leaving the observer along u (3, N): straight lines
    in comoving space, turned at the spheres of radius chi by -c χ ∇φ of point masses; with
    the smallest angle from a mass at which a ray crossed its sphere."""
    x, nearest = np.zeros_like(u), np.full(u.shape[1], np.pi)
    for radius, factor, mass, centre in (*zip(chi, factors, masses, centres), (chi_source,) * 4):
        b = np.sum(x * u, axis=0)
        x = x + (-b + np.sqrt(b * b - np.sum(x * x, axis=0) + radius**2)) * u
        if radius == chi_source:
            break
        grad, angle = _point_mass_gradient(x / np.linalg.norm(x, axis=0), centre, mass)
        nearest = np.minimum(nearest, angle)
        u = u - factor * radius * grad
        u = u / np.linalg.norm(u, axis=0)
    return x / np.linalg.norm(x, axis=0), nearest


def _log(n, e_theta, e_phi, beta):
    """Components on (e_θ, e_φ) at n of the tangent vector whose great circle ends at beta."""
    cos = np.clip(np.sum(n * beta, axis=0), -1.0, 1.0)
    tangent = beta - cos * n
    scale = np.arccos(cos) / np.linalg.norm(tangent, axis=0)
    return np.stack([scale * np.sum(tangent * e_theta, 0), scale * np.sum(tangent * e_phi, 0)])


def test_two_masses_near_the_pole_lens_as_rays_traced_exactly_through_them():
    """Two masses 15 deg from the pole, 90 deg apart in longitude, on shells at 1000 and 2000
    Mpc/h, a source at 3000 Mpc/h: at the rays within 6 deg of the pole (at least 9 deg from
    either mass, where a Gaussian mass lenses as a point mass), the deflection, κ, γ and ω
    match rays shot through point masses in three dimensions, their distortion matrix by
    finite differences. The rays nearest the pole are deflected across meridians, so their
    carried bases turn by tens of degrees from the local ones. The exact rays are not the
    tangent-plane recursion: they differ by the square of the deflection (14 arcmin: 2e-5)."""
    nside, lmax = 128, 3 * 128 - 1
    chi, chi_source = np.array([1000.0, 2000.0]), 3000.0
    factors, masses = np.array([1e-7, 1e-7]), np.array([30.0, 30.0])
    places = [(np.radians(15.0), 0.0), (np.radians(15.0), np.pi / 2)]
    shells = [_mass_alm(m, *p, lmax) for m, p in zip(masses, places)]
    weights = (factors * chi * (chi_source - chi) / chi_source)[None]
    maps = raytrace_healpix.trace([lambda s=s: s for s in shells], weights, factors, chi, nside)

    colatitude, longitude = healpy.pix2ang(nside, np.arange(healpy.nside2npix(nside)))
    near = np.flatnonzero(colatitude < np.radians(6.0))
    n, (e_theta, e_phi) = (
        _unit(colatitude[near], longitude[near]),
        _basis(colatitude[near], longitude[near]),
    )
    centres = [_unit(*p) for p in places]

    def source_offsets(dx, dy):
        a = np.hypot(dx, dy)
        u = n * np.cos(a) + (dx * e_theta + dy * e_phi) * np.sinc(a / np.pi)
        beta, nearest = _shoot(u, chi, factors, masses, centres, chi_source)
        return _log(n, e_theta, e_phi, beta), nearest

    offsets, nearest = source_offsets(0.0, 0.0)
    assert np.degrees(nearest.min()) > 9.0
    _, cos, sin = raytrace_healpix.along_great_circles(colatitude[near], longitude[near], -offsets)
    turn = np.degrees(np.abs(np.arctan2(sin, cos))).max()
    print(f"bases turned by up to {turn:.0f} deg")
    assert turn > 20.0  # rays a few arcminutes from the pole: their bases turn
    step = 1e-5
    jacobian = np.stack(
        [
            (source_offsets(step * ox, step * oy)[0] - source_offsets(-step * ox, -step * oy)[0])
            / (2 * step)
            for ox, oy in ((1, 0), (0, 1))
        ],
        axis=1,
    )
    m = np.eye(2)[:, :, None] - jacobian
    expected = {
        "kappa": 0.5 * (m[0, 0] + m[1, 1]),
        "gamma1": 0.5 * (m[0, 0] - m[1, 1]),
        "gamma2": 0.5 * (m[0, 1] + m[1, 0]),
        "omega": 0.5 * (m[0, 1] - m[1, 0]),
    }
    deflection = np.asarray(maps["deflection"][0])[:, near]
    size = np.abs(offsets).max()
    print(
        f"deflection {np.degrees(size) * 60:.2f} arcmin, off by",
        np.abs(deflection + offsets).max() / size,
    )
    np.testing.assert_allclose(deflection, -offsets, atol=1e-4 * size)
    shear = np.abs(expected["gamma1"]).max()
    assert shear > 0.01
    for name, values in expected.items():
        got = np.asarray(maps[name][0])[near]
        print(
            name, np.abs(values).max(), "off by", np.abs(got - values).max() / shear, "of the shear"
        )
        np.testing.assert_allclose(got, values, atol=3e-4 * shear, err_msg=name)
    omega = expected["omega"]  # lens-lens coupling, which rays near the pole carry in turned bases
    assert np.abs(omega).max() > 1e-3 * shear
    got = np.asarray(maps["omega"][0])[near]
    print("omega off by", np.abs(got - omega).max() / np.abs(omega).max(), "of its largest")
    np.testing.assert_allclose(got, omega, atol=0.05 * np.abs(omega).max())


def test_a_gaussian_shell_has_the_convergence_of_its_legendre_series():
    """One shell holding a Gaussian mass: κ = w Σ at every ray, Σ the mass's Legendre series
    (2ℓ+1)/4π M e^(-ℓ(ℓ+1)σ²/2) P_ℓ(cos ϑ) less its mean, within 1e-5 of the peak (the
    single-precision synthesis), and far from the mass the uniform sheet's -w M / 4π."""
    nside, lmax, mass, weight, sigma = 64, 3 * 64 - 1, 2.0, 1e-3, np.radians(3.0)
    place = (np.radians(60.0), 1.0)
    shell = _mass_alm(mass, *place, lmax, np.degrees(sigma))
    maps = raytrace_healpix.trace([lambda: shell], [[weight]], [1e-7], [1000.0], nside)
    colatitude, longitude = healpy.pix2ang(nside, np.arange(healpy.nside2npix(nside)))
    cos = _unit(*place) @ _unit(colatitude, longitude)
    ell = np.arange(1, lmax + 1)[:, None]
    series = np.sum(
        (2 * ell + 1) / (4 * np.pi) * mass * np.exp(-ell * (ell + 1) * sigma**2 / 2)
        * eval_legendre(ell, cos[None]),
        axis=0,
    )  # fmt: skip
    kappa = weight * series
    print("kappa off by", np.abs(maps["kappa"][0] - kappa).max() / kappa.max(), "of its peak")
    np.testing.assert_allclose(maps["kappa"][0], kappa, atol=1e-5 * kappa.max())
    far = cos < np.cos(10 * sigma)
    np.testing.assert_allclose(
        np.asarray(maps["kappa"][0])[far], -weight * mass / (4 * np.pi), rtol=1e-3
    )


def test_one_shell_is_born_exactly():
    """A single shell of a Gaussian random field: the coefficients analysed from the rays (a grid
    of 2 nside) are Born's — κ = w Σ, the shear's E modes those of κ, no B modes — within 1e-5
    of their amplitude (the rotation of one shell is zero by construction: T is symmetric and
    the rays undeflected)."""
    nside = 16
    lmax = 3 * nside - 1
    rng = np.random.default_rng(5)
    ell, _ = healpy.Alm.getlm(lmax)
    sigma = 30.0 / (ell + 5.0) * (rng.normal(size=ell.size) + 1j * rng.normal(size=ell.size))
    sigma[: lmax + 1] = sigma[: lmax + 1].real  # m = 0: real
    sigma[0] = 0.0
    weight = 2e-3
    rays = sky.traced_rays_nside(nside)
    maps = raytrace_healpix.trace([lambda: sigma], [[weight]], [1e-6], [800.0], rays)
    alm = raytrace_healpix.analyse(
        *(np.asarray(maps[k][0]) for k in ("kappa", "gamma1", "gamma2", "omega")), lmax=lmax
    )
    born = weight * sigma
    e_born, _ = projection.born_shear_alm(born)
    scale = np.abs(born).max()
    for name, expected in (("kappa", born), ("e", e_born), ("b", 0.0)):
        print(name, "off by", np.abs(alm[name] - expected).max() / scale)
    np.testing.assert_allclose(alm["kappa"], born, atol=1e-5 * scale)
    np.testing.assert_allclose(alm["e"], e_born, atol=1e-5 * scale)
    np.testing.assert_allclose(alm["b"], 0.0, atol=1e-5 * scale)


@pytest.mark.parametrize("colatitude", [1e-3, 0.7, np.pi - 0.2])
def test_great_circles_end_where_rotations_take_them(colatitude):
    """The end of a great circle and the basis carried along it, at the pole and elsewhere:
    rotating the start about the circle's axis by its length gives both."""
    rng = np.random.default_rng(3)
    longitude = rng.uniform(0, 2 * np.pi, 50)
    theta = np.full(50, colatitude)
    delta = rng.normal(size=(2, 50)) * np.array([[1e-2], [3e-3]])
    delta[:, :5] *= 1e-5  # the short arcs' series
    loc, cos, sin = raytrace_healpix.along_great_circles(theta, longitude, delta)
    n = _unit(theta, longitude)
    e_theta, e_phi = _basis(theta, longitude)
    tangent = delta[0] * e_theta + delta[1] * e_phi
    arc = np.linalg.norm(tangent, axis=0)
    axis = np.cross(n.T, tangent.T).T / arc
    for k in range(50):  # Rodrigues' rotation by the arc about the axis
        k_cross = np.array(
            [
                [0, -axis[2, k], axis[1, k]],
                [axis[2, k], 0, -axis[0, k]],
                [-axis[1, k], axis[0, k], 0],
            ]
        )
        rotation = np.eye(3) + np.sin(arc[k]) * k_cross + (1 - np.cos(arc[k])) * k_cross @ k_cross
        end = _unit(*loc[k])
        np.testing.assert_allclose(end, rotation @ n[:, k], atol=1e-12)
        end_theta, end_phi = _basis(*loc[k])
        carried = rotation @ e_theta[:, k]
        np.testing.assert_allclose(carried, cos[k] * end_theta + sin[k] * end_phi, atol=1e-12)
