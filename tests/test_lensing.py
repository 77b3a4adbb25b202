"""Lensing: Born weights against an independent distance calculation (pyccl), Fourier
interpolation of planes, Kaiser-Squires, full-sky shear, plane capture on any device mesh,
and bad lensing input."""

import dataclasses
import math

import healpy
import jax
import jax.numpy as jnp
import numpy as np
import pyccl
import pytest
import references

from pmpipe.physics.evolution import lightcone, sky
from pmpipe.physics.lensing import projection
from pmpipe.physics.mesh import domain, painting
from pmpipe.physics.theory import cosmology
from pmpipe.run import config, derive, validation
from pmpipe.runtime import parallel

C_KM_S = 299792.458


def ccl_cosmology(c: config.Cosmology):
    return pyccl.Cosmology(
        Omega_c=c.Omega_m - c.Omega_b,
        Omega_b=c.Omega_b,
        h=c.h,
        n_s=c.n_s,
        sigma8=c.sigma8,
        T_CMB=c.T_cmb,
        Neff=c.N_eff,
        m_nu=0.0,
        transfer_function="eisenstein_hu",
        matter_power_spectrum="halofit",
    )


def test_thin_plane_matches_the_born_formula():
    """A plane 1 Mpc/h thick with a sinusoidal surface density: κ = 3/2 Ω_m (H0/c)^2
    χ_p (χ_s - χ_p) / (χ_s a_p) Σ(χ_p θ), distances from pyccl."""
    cfg = config.Cosmology()
    cosmo, ccl = derive.cosmology_params(config.Run(cosmology=cfg)), ccl_cosmology(cfg)
    z_s, chi_p, box, m = 1.0, 1000.0, 400.0, 64
    chi_s = float(cosmology.comoving_distance(cosmo, 1 / (1 + z_s)))
    assert abs(chi_s / (pyccl.comoving_radial_distance(ccl, 1 / (1 + z_s)) * cfg.h) - 1) < 1e-4
    weights = projection.plane_weights(
        cosmo, [chi_p - 0.5, chi_p + 0.5], projection.single_plane(chi_s)
    )[None, :]
    x = np.arange(m) * box / m
    sigma = (
        3.0 * np.cos(2 * np.pi * 2 * x[:, None] / box) * np.sin(2 * np.pi * x[None, :] / box) + 1.5
    )
    theta = projection.pixel_centres(10.0, 48)
    offsets = (17.0, -5.0)
    mesh = parallel.make_mesh((1, 1))
    kappa = projection.flat_sky_convergence(
        [lambda: jnp.asarray(sigma)],
        weights,
        [chi_p],
        theta,
        [offsets],
        domain.Grid(
            mesh, m, box_size=box, dtype="float64" if jax.config.jax_enable_x64 else "float32"
        ),
    )
    chi_s_ccl = pyccl.comoving_radial_distance(ccl, 1 / (1 + z_s)) * cfg.h
    a_p = float(pyccl.scale_factor_of_chi(ccl, chi_p / cfg.h))
    born = 1.5 * cfg.Omega_m * (100 / C_KM_S) ** 2 * chi_p * (chi_s_ccl - chi_p) / (chi_s_ccl * a_p)
    px, py = chi_p * theta + offsets[0], chi_p * theta + offsets[1]
    exact = (
        3.0 * np.cos(2 * np.pi * 2 * px[:, None] / box) * np.sin(2 * np.pi * py[None, :] / box)
        + 1.5
    )
    # the plane is read with its CIC window divided out; a pure sinusoid is scaled by 1/W(k)
    window = np.sinc(2 / m) ** 2 * np.sinc(1 / m) ** 2
    expected = born * (1.5 + (exact - 1.5) / window)
    assert np.abs(np.asarray(kappa[0]) - expected).max() <= 1e-3 * np.abs(expected).max()


def test_source_distributions_weight_planes_by_lensing_efficiency():
    cosmo = derive.cosmology_params(config.Run())
    edges = np.linspace(0, 2400, 13)
    z = np.linspace(0, 1.2, 400)
    chi, w = projection.source_distribution(cosmo, z, projection.smail(z, 0.5, 2.0, 1.5))
    assert abs(w.sum() - 1) < 1e-12 and np.all(w >= 0)
    nz = projection.plane_weights(cosmo, edges, projection.Source(chi, w))
    chi_1 = float(cosmology.comoving_distance(cosmo, 0.7))
    single = projection.plane_weights(cosmo, edges, projection.single_plane(chi_1))
    assert single[edges[1:] > chi_1 + 200].max() == 0  # no lensing by matter behind the source
    assert np.all(nz > 0) and np.argmax(nz) < np.argmax(single) + 2


@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_sources_at_the_observer_lens_nothing_and_warn_nothing():
    cosmo = derive.cosmology_params(config.Run())
    chi = np.array([0.0, 500.0, 1500.0])
    q_both = projection.lensing_efficiency(cosmo, chi, [0.0, 1000.0], [0.5, 0.5])
    q_far = projection.lensing_efficiency(cosmo, chi, [1000.0], [1.0])
    np.testing.assert_allclose(q_both, 0.5 * q_far, rtol=1e-12)
    assert q_far[1] > 0 and q_far[2] == 0 and q_far[0] == 0


def test_kaiser_squires_round_trip_and_sign():
    rng = np.random.default_rng(3)
    n = 128
    ell = np.hypot(np.fft.fftfreq(n)[:, None], np.fft.fftfreq(n)[None, :])
    kappa = np.fft.ifft2(np.fft.fft2(rng.normal(size=(n, n))) * np.exp(-((ell * 20) ** 2))).real
    kappa = jnp.asarray(kappa - kappa.mean(), jnp.float32)
    g1, g2 = projection.shear_from_convergence(kappa)
    back = references.convergence_from_shear(g1, g2)
    inner = slice(8, n - 8)
    assert np.abs(np.asarray(back - kappa)[inner, inner]).max() <= 1e-4 * np.abs(kappa).max()
    x = np.arange(n)
    mode = jnp.asarray(np.cos(2 * np.pi * 4 * x / n)[:, None] * np.ones(n)[None, :])
    g1, g2 = projection.shear_from_convergence(mode)  # a mode along x: γ1 = κ, γ2 = 0
    np.testing.assert_allclose(np.asarray(g1), np.asarray(mode), atol=1e-5)
    assert np.abs(np.asarray(g2)).max() < 1e-5


def test_full_sky_shear_round_trip():
    """κ → (γ1, γ2) maps → κ from the shear's E modes returns κ's coefficients for ℓ ≥ 2, and
    a κ of a single (ℓ, m = 0) mode gives γ2 = 0 (healpy's U)."""
    nside = 32
    lmax = sky.healpix_ell_max(nside)
    cl = np.where(np.arange(lmax + 1) >= 2, 1.0 / (np.arange(lmax + 1) + 10.0) ** 2, 0.0)
    np.random.seed(2)
    alm = healpy.synalm(cl, lmax=lmax, new=True)
    g1, g2 = projection.healpix_shear(alm, nside)
    back = references.healpix_convergence_from_shear(g1, g2, lmax)
    ell = healpy.Alm.getlm(lmax)[0]
    low = ell <= 2 * nside  # a map's analysis is exact enough only there
    assert np.abs(back - alm)[low].max() < 0.02 * np.abs(alm[low]).max()
    zonal = np.zeros_like(alm)
    zonal[healpy.Alm.getidx(lmax, 10, 0)] = 1.0
    _, g2 = projection.healpix_shear(zonal, nside)
    assert np.abs(g2).max() < 1e-6


@pytest.mark.parametrize("pdims", [(2, 4), pytest.param((4, 2), marks=pytest.mark.slow)])
def test_planes_and_shells_do_not_depend_on_the_device_mesh(pdims):
    m, box = 32, 128.0
    rng = np.random.default_rng(1)
    rho = jnp.asarray(1 + 0.3 * rng.normal(size=(m, m, m)), jnp.float32)
    transform = lightcone.plane_transforms(7, 3, m, True)[2]
    out = {}
    for p in [(1, 1), pdims]:
        mesh = parallel.make_mesh(p)
        field = jax.device_put(rho, parallel.field_sharding(mesh))
        flat = lightcone.flat_plane(field - 1, mesh, box, 8, transform)
        delta = lightcone.band_limited_overdensity(field, mesh, box, 1.0)
        shell = references.shell_healpix(
            delta, mesh, box, 8, 100.0, 140.0, (3.0, 5.0, 7.0), transform
        )
        out[p] = np.asarray(flat), np.asarray(shell)
    for a, b in zip(out[1, 1], out[pdims]):
        assert np.abs(a - b).max() <= 1e-5 * np.abs(a).max()
    assert abs(out[1, 1][1].mean()) < 1e-6 * np.abs(out[1, 1][1]).max()  # sphere mean removed


def test_flat_plane_is_the_slab_of_the_rotated_box():
    m, box = 16, 16.0
    delta = np.random.default_rng(2).normal(size=(m, m, m)).astype(np.float32)
    t = lightcone.PlaneTransform(axes=(2, 0, 1), flips=(True, False, False), shift=(3, 5, 7))
    plane = np.asarray(
        lightcone.flat_plane(jnp.asarray(delta), parallel.make_mesh((1, 1)), box, 4, t)
    )
    # observer axes (u, v, los) = box axes (z, x, y); u reversed; box cell = shift ± index
    slab = delta[:, (5 + np.arange(4)) % m, :].sum(axis=1)  # (x, z) summed over y
    i, j = np.meshgrid(np.arange(m), np.arange(m), indexing="ij")
    expected = slab[(3 + j) % m, (7 - i) % m]
    np.testing.assert_allclose(plane, expected - expected.mean(), atol=1e-4)


@pytest.mark.parametrize("flip", [False, True])
def test_planes_of_one_copy_tile_it_slab_after_slab(flip):
    """lightcone.copy_every 'box': three 4-cell planes of one copy share its rotation and
    shift, their slabs follow each other outwards (down the box axis when the line of sight is
    reversed) and together make the copy's 12-cell slab; the next copy is drawn afresh."""
    m, box = 16, 16.0
    delta = jnp.asarray(np.random.default_rng(3).normal(size=(m, m, m)), jnp.float32)
    mesh = parallel.make_mesh((1, 1))
    transforms = lightcone.plane_transforms(5, 6, m, True, per_copy=3, n_cells=4)
    first = transforms[0]
    assert all(t.shift == first.shift and t.axes == first.axes for t in transforms[:3])
    assert [t.slab for t in transforms] == [0, 4, 8] * 2
    assert transforms[3].shift != first.shift
    assert lightcone.plane_transforms(5, 1, m, True)[0] == first  # copy 0: plane 0's own
    base = dataclasses.replace(first, flips=(*first.flips[:2], flip))
    los = base.axes[2]

    def slab_from(cell, cells, slab=0):
        """The flat plane of ``cells`` cells from box cell ``cell`` up the line-of-sight axis."""
        shift = tuple(cell if b == los else c for b, c in enumerate(base.shift))
        t = dataclasses.replace(base, shift=shift, flips=(*base.flips[:2], False), slab=slab)
        return np.asarray(lightcone.flat_plane(delta, mesh, box, cells, t))

    planes = [
        np.asarray(lightcone.flat_plane(delta, mesh, box, 4, dataclasses.replace(base, slab=s)))
        for s in (0, 4, 8)
    ]
    s0 = base.shift[los]
    if not flip:
        np.testing.assert_allclose(planes[1], slab_from(s0 + 4, 4), atol=1e-5)
        np.testing.assert_allclose(np.sum(planes, axis=0), slab_from(s0, 12), atol=1e-4)
    else:  # the slabs step down the box axis: [s0, s0 + 4), [s0 - 4, s0), [s0 - 8, s0 - 4)
        for s in (0, 4, 8):
            np.testing.assert_allclose(planes[s // 4], slab_from(s0, 4, slab=-s), atol=1e-5)


def _trilinear(f, pts):
    """Reference: periodic trilinear interpolation of f (m, m, m) at pts (n, 3) in cells."""
    m = f.shape[0]
    i0 = np.floor(pts).astype(int)
    fr = pts - i0
    out = 0
    for c in np.ndindex(2, 2, 2):
        w = np.prod([fr[:, d] if c[d] else 1 - fr[:, d] for d in range(3)], axis=0)
        out = out + w * f[tuple((i0[:, d] + c[d]) % m for d in range(3))]
    return out


def test_reading_owned_points_on_every_device_reads_each_point_once():
    m = 16
    rng = np.random.default_rng(0)
    f = rng.normal(size=(m, m, m)).astype(np.float32)
    pts = rng.uniform(0, m, size=(500, 3)).astype(np.float32)
    pts[:50, :2] = np.floor(pts[:50, :2])  # on block edges of every mesh below
    for pdims in [(1, 1), (2, 4), (8, 1)]:
        mesh = parallel.make_mesh(pdims)

        def local(block, p, pdims=pdims):
            values = painting.read_owned(
                painting.pad_for_reading(block, pdims), tuple(p.T), m, pdims
            )
            return jax.lax.psum(values, parallel.AXES)

        read = jax.jit(
            jax.shard_map(
                local, mesh=mesh, in_specs=(parallel.FIELD_SPEC, jax.P()), out_specs=jax.P()
            )
        )
        v = read(jax.device_put(f, parallel.field_sharding(mesh)), jnp.asarray(pts))
        assert np.abs(np.asarray(v) - _trilinear(f, pts)).max() < 1e-5


def test_shell_is_the_field_summed_along_rays_through_the_rotated_box():
    m, box = 16, 64.0
    cell = box / m
    delta = np.random.default_rng(4).normal(size=(m, m, m)).astype(np.float32)
    directions = np.stack(healpy.pix2vec(4, np.arange(healpy.nside2npix(4))), axis=-1)
    t = lightcone.PlaneTransform(axes=(2, 0, 1), flips=(True, False, True), shift=(3, 5, 7))
    observer = (10.0, 20.0, 30.0)
    shell = references.shell_healpix(
        jnp.asarray(delta), parallel.make_mesh((1, 1)), box, 4, 50.0, 70.0, observer, t
    )
    # 5 samples of 4 Mpc/h per ray; observer axis j is box axis t.axes[j], reversed if flipped
    ref = 0
    for r in 52.0 + 4.0 * np.arange(5):
        x = r * directions
        cells = np.empty_like(x)
        for j, b in enumerate(t.axes):
            cells[:, b] = ((-x[:, j] if t.flips[j] else x[:, j]) + observer[b]) / cell + t.shift[b]
        ref = ref + _trilinear(delta, np.mod(cells, m)) * 4.0
    np.testing.assert_allclose(shell, ref - ref.mean(), atol=1e-4 * np.abs(ref).max())


BASE = {"box": {"box_size": 256.0, "particles": 32}, "lightcone": {"z_max": 1.0}}


@pytest.mark.parametrize(
    "lens, field, words",
    [
        ({"source_redshifts": [1.5]}, "source_redshifts", "beyond the lightcone"),
        ({"flat_sky": {"field_of_view": 8.0}}, "field_of_view", "wider than the box allows"),
        ({"full_sky": {"nside": 48}}, "nside", "power of two"),
        (
            {"distributions": [{"kind": "table", "name": "empty", "z": [], "n": []}]},
            "distributions",
            "empty",
        ),
        (
            {"distributions": [{"kind": "table", "name": "zero", "z": [0.1, 0.5], "n": [0, 0]}]},
            "distributions",
            "empty",
        ),
        (
            {"distributions": [{"kind": "table", "name": "far", "z": [0.5, 1.4], "n": [1, 1]}]},
            "distributions",
            "beyond the lightcone",
        ),
        ({"source_redshifts": [], "distributions": []}, "lensing", "no sources"),
        ({"method": "curved"}, "method", "'born', 'raytrace' or 'both'"),
    ],
)
def test_bad_lensing_input_is_rejected_naming_the_field(tmp_path, lens, field, words):
    path = tmp_path / "run.yaml"
    import yaml

    path.write_text(yaml.safe_dump(BASE | {"lensing": lens}))
    with pytest.raises(config.ConfigError) as err:
        references.load_run(path)
    message = str(err.value)
    assert str(path) in message and field in message and words in message


def test_lightcone_geometry_is_checked():
    with pytest.raises(config.ConfigError, match="whole number of force-mesh cells"):
        validation.validate_run(BASE | {"lightcone": {"plane_thickness": 10.0}}, "x.yaml")
    with pytest.raises(config.ConfigError, match="before the initial"):
        validation.validate_run(BASE | {"lightcone": {"z_max": 12.0}}, "x.yaml")
    with pytest.raises(config.ConfigError, match="needs lightcone"):
        validation.validate_run({"lensing": {}}, "x.yaml")
    run = validation.validate_run(BASE | {"lensing": {}}, "x.yaml")
    cosmo = cosmology.tabulated(derive.cosmology_params(run))
    planes = validation.planes(run)
    assert planes.chi_edges[-1] >= float(cosmology.comoving_distance(cosmo, 0.5))
    thickness = run.box.box_size  # the default: one box
    assert np.all(np.diff(planes.a) < 0) and len(planes) == math.ceil(
        planes.chi_edges[-1] / thickness
    )


@pytest.mark.slow
def test_full_sky_shells_recover_the_field_up_to_their_band_limit():
    """A Gaussian density (the linear field of a 64^3 mesh in 256 Mpc/h) through the shell
    pipeline (band limit per shell, rays on a grid of 4 nside, harmonic coefficients up to
    3 nside - 1): C_ℓ of the nside-32 shell at 1150 and at 2180 Mpc/h, where the shell holds
    multipoles up to about 900, within 4σ (cosmic variance of the bin) and 3 % of the same
    shell sampled on an nside-512 grid that resolves all of them, in every bin up to the band
    limit ℓ = 95."""
    from pmpipe.physics.evolution import ics, simulation
    from pmpipe.physics.statistics import stats

    n, box, nside = 64, 256.0, 32
    mesh = parallel.make_mesh((1, 1))
    cosmo = cosmology.Cosmology()
    delta = ics.linear_density(
        ics.white_noise(3, n, mesh), simulation.power_function(cosmo), box, mesh
    )
    k_mesh = sky.shell_k_max(n, n, box)
    transform = lightcone.PlaneTransform((0, 1, 2), (False,) * 3, (0, 0, 0))
    observer = (0.3 * box, 0.5 * box, 0.7 * box)
    edges = np.array([2, 8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96])

    def rays(k_max, ray_nside, lo, hi):
        field = lightcone.band_limited_overdensity(delta, mesh, box, k_max)
        return np.asarray(
            references.shell_healpix(field, mesh, box, ray_nside, lo, hi, observer, transform),
            np.float64,
        )

    for lo, hi in ((1152.0, 1280.0), (2176.0, 2304.0)):
        ray_nside = nside * sky.RAYS_PER_PIXEL_SIDE
        k_shell = float(sky.shell_band_limits([hi], k_mesh, ray_nside)[0])
        assert k_shell < k_mesh  # the shell's own band limit is what is tested
        alm = lightcone.shell_alm(rays(k_shell, ray_nside, lo, hi), nside)
        ell, cl, modes = stats.full_sky_cl(alm, edges)
        ell_max = sky.healpix_ell_max(nside)
        assert edges[-1] == ell_max + 1
        reference = healpy.alm2cl(healpy.map2alm(rays(k_mesh, 512, lo, hi), lmax=ell_max, iter=3))
        ell_all = np.arange(ell_max + 1, dtype=float)
        expected = stats._bin(ell_all, reference, 2 * ell_all + 1, edges)[1]
        sigma = expected * np.sqrt(2 / modes)
        assert np.all(np.abs(cl - expected) < 4 * sigma), (lo, ell, cl / expected)
        assert np.all(np.abs(cl / expected - 1) < 0.03), (lo, ell, cl / expected)


@pytest.mark.parametrize("mesh_n", [63, 512, 8192, 65536])
def test_fourier_matrix_on_the_device_matches_float64_phases(mesh_n):
    """exp(i k x) from the float32 phase split, for positions far outside the box, is within
    1e-6 of numpy's in float64 at any grid size (float32 phases k x alone are off by up to
    1.4e-2 at M = 8192)."""
    from pmpipe.physics.mesh import fft

    x = np.random.default_rng(1).uniform(-5000.0, 5000.0, 200)
    k = fft.angular_frequencies(mesh_n, 1000.0 / mesh_n)
    phases = projection.fourier_phases(x, mesh_n, 1000.0, np.float32)
    matrix = jax.jit(projection.fourier_matrix, static_argnums=1)(phases, mesh_n)
    assert matrix.dtype == jnp.complex64
    np.testing.assert_allclose(np.asarray(matrix), np.exp(1j * x[:, None] * k), rtol=0, atol=1e-6)


def test_flat_maps_hold_no_plane_modes_above_their_nyquist_multipole():
    """A plane of two waves along x, one below and one above what a 16-pixel, 5 degree map
    holds at 1000 Mpc/h (k = ℓ_Nyquist / χ = 0.58 h/Mpc): the map is the first wave alone,
    not the second folded onto a lower multipole."""
    n, box, chi = 64, 256.0, 1000.0
    mesh = parallel.make_mesh((1, 1))
    x = np.arange(n) * box / n
    k_low, k_high = 2 * np.pi * 10 / box, 2 * np.pi * 30 / box
    theta = projection.pixel_centres(5.0, 16)
    assert k_low < np.pi / (theta[1] - theta[0]) / chi < k_high
    plane = (np.cos(k_low * x) + np.cos(k_high * x))[:, None] * np.ones(n)[None, :]
    window = projection._cic_window_2d(n, box)  # the planes carry it; the map divides it out
    painted = np.fft.ifft2(np.fft.fft2(plane) * window).real
    kappa = projection.flat_sky_convergence(
        [lambda: jnp.asarray(painted)],
        np.ones((1, 1)),
        [chi],
        theta,
        [(0.0, 0.0)],
        domain.Grid(mesh, n, box_size=box, dtype="float64"),
    )
    expected = np.cos(k_low * chi * theta)[:, None] * np.ones(16)[None, :]
    np.testing.assert_allclose(np.asarray(kappa[0]), expected, atol=1e-6)


def test_each_shell_is_sampled_at_its_own_band_limit():
    """capture_plan: a shell's samples span its thickness (samples × dr), one per Nyquist
    spacing of its own band limit (fewer for a lower one), at most one per cell; padding
    planes have none."""
    grid = domain.Grid(parallel.make_mesh((1, 1)), 16, 2, 64.0)
    planes = sky.planes(192.0, 64.0, lambda chi: 1.0 / (1.0 + chi / 3000.0))
    transforms = lightcone.plane_transforms(0, len(planes), 32, False)
    k_max = np.array([np.inf, 0.5, 0.2])
    capture = lightcone.capture_plan(planes, transforms, (0.0, 0.0, 0.0), grid, 4, 8, k_max)
    samples, dr = np.asarray(capture.samples), np.asarray(capture.dr)
    assert samples.shape == (sky.PLANE_BUCKET,) and not samples[3:].any()
    assert samples[:3].tolist() == [32, 11, 5]  # 64 Mpc/h: every 2 Mpc/h cell, π/0.5, π/0.2
    np.testing.assert_allclose(samples[:3] * dr[:3], 64.0, rtol=1e-6)
