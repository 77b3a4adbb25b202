"""Flat-sky ray tracing: lens planes with known solutions (a Gaussian mass and its periodic
images, a uniform sheet in front of a wave), one plane against Born, and the same maps on any
device mesh."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import zarr

from pmpipe import stages
from pmpipe.physics.evolution import sky
from pmpipe.physics.lensing import projection, raytrace_flat
from pmpipe.physics.mesh import domain
from pmpipe.physics.statistics import stats
from pmpipe.run import config, derive
from pmpipe.runtime import parallel
from pmpipe.stages import registry


def _painted(plane, box):
    """A plane as the lightcone holds it: its CIC window applied (the maps divide it out)."""
    window = projection._cic_window_2d(plane.shape[0], box)
    return np.fft.ifft2(np.fft.fft2(plane) * window).real


def _grid(mesh_n, box, pdims=(1, 1), dtype="float64"):
    return domain.Grid(parallel.make_mesh(pdims), mesh_n, box_size=box, dtype=dtype)


def _trace(planes, weights, lens, chi, theta, offsets, grid):
    out = raytrace_flat.trace(
        [lambda p=p: jnp.asarray(p) for p in planes], weights, lens, chi, theta, offsets, grid
    )
    return {k: np.asarray(v) for k, v in out.items()}


def _gaussian_lens(x, y, mass, sigma):
    """Σ, α (2, ...) and T (2, 2, ...) of an isolated Gaussian mass (∇²ψ = 2Σ) at the origin."""
    r2 = x**2 + y**2
    sig = mass / (2 * np.pi * sigma**2) * np.exp(-r2 / (2 * sigma**2))
    enclosed_over_r2 = mass * -np.expm1(-r2 / (2 * sigma**2)) / (np.pi * r2)  # f / r
    alpha = enclosed_over_r2 * np.stack([x, y])
    rr = np.array([[x * x, x * y], [x * y, y * y]]) / r2
    eye = np.eye(2)[:, :, None, None]
    tidal = enclosed_over_r2 * eye + (2 * sig - 2 * enclosed_over_r2) * rr
    return sig, alpha, tidal


def test_a_gaussian_mass_and_its_periodic_images_deflect_and_shear_as_analytic():
    """One plane, a Gaussian of mass m (σ = 2 cells) on the line of sight: κ = wΣ everywhere;
    away from the centre the deflection (w/χ) α and the shear w (T_xx - T_yy)/2, w T_xy match
    the sum over the periodic images within 1 %."""
    jax.config.update("jax_enable_x64", True)
    try:
        mesh_n, box, chi, mass, sigma, w = 64, 100.0, 1000.0, 50.0, 100.0 / 32, 0.4
        axis = np.array([37.5, 61.25])  # where the line of sight crosses the plane
        cells = np.arange(mesh_n) * box / mesh_n
        gx, gy = np.meshgrid(cells - axis[0], cells - axis[1], indexing="ij")
        plane = _gaussian_lens(
            (gx + box / 2) % box - box / 2, (gy + box / 2) % box - box / 2, mass, sigma
        )[0]
        theta = projection.pixel_centres(4.0, 48)
        maps = _trace(
            [_painted(plane, box)], [[w]], [1e-5], [chi], theta, [axis], _grid(mesh_n, box)
        )
        x, y = np.meshgrid(chi * theta, chi * theta, indexing="ij")
        sig, alpha, tidal = _gaussian_lens(x, y, mass, sigma)
        alone = w / chi * alpha  # the mass without its images
        for i in range(-30, 31):  # images in a square: their sum converges to the periodic
            for j in range(-30, 31):  # field plus a sheet of the plane's mean about the axis
                if i or j:
                    _, a, t = _gaussian_lens(x - i * box, y - j * box, mass, sigma)
                    alpha, tidal = alpha + a, tidal + t
        kappa_error = np.abs(maps["kappa"][0] - w * sig).max() / (w * sig.max())
        far = np.hypot(x, y) > 5 * sigma
        expected = w / chi * alpha  # θ - β points away from the mass
        size = np.hypot(*expected)[far]
        deflection_error = np.max(np.hypot(*(maps["deflection"][0] - expected))[far] / size)
        without_images = np.max(np.hypot(*(maps["deflection"][0] - alone))[far] / size)
        shear = (w * 0.5 * (tidal[0, 0] - tidal[1, 1]), w * tidal[0, 1])
        size = np.hypot(*shear)[far]
        shear_error = max(
            np.max(np.abs(got[far] - want[far]) / size)
            for got, want in zip((maps["gamma1"][0], maps["gamma2"][0]), shear)
        )
        print(
            f"Gaussian lens: kappa {kappa_error:.1e} of its peak; beyond 5 sigma deflection "
            f"{deflection_error:.1e}, shear {shear_error:.1e}; without the images the "
            f"deflection is off by {without_images:.2f}"
        )
        assert kappa_error < 1e-3 and deflection_error < 0.01 and shear_error < 0.01
        assert without_images > 0.05  # the images matter at this size: the test sees them
    finally:
        jax.config.update("jax_enable_x64", False)


def test_one_plane_is_born_exactly():
    rng = np.random.default_rng(5)
    mesh_n, box = 32, 128.0
    plane = rng.normal(size=(mesh_n, mesh_n)) * 20.0
    theta = projection.pixel_centres(5.0, 32)
    grid = _grid(mesh_n, box, dtype="float32")
    weights = np.array([[3e-4], [1e-4]])
    born = projection.flat_sky_convergence(
        [lambda: jnp.asarray(plane, jnp.float32)], weights, [900.0], theta, [(3.0, 50.0)], grid
    )
    maps = _trace([plane.astype(np.float32)], weights, [2e-5], [900.0], theta, [(3.0, 50.0)], grid)
    np.testing.assert_allclose(maps["kappa"], np.asarray(born), atol=2e-6 * np.abs(born).max())


def test_a_sheet_focuses_the_rays_that_read_a_wave_behind_it():
    """A uniform sheet Σ̄ at χ1 makes the rays converge: at χ2 they sit at s χ2 θ with
    s = 1 - c1 Σ̄ χ1 (χ2 - χ1) / χ2 (here 0.98, up to 6 pixels from their line of sight), and a
    wave Σ2 there adds w2 s Σ2(s χ2 θ) to κ (the Jacobian A at χ2 is s I)."""
    mesh_n, box, chi1, chi2, mean, lens1 = 64, 200.0, 500.0, 1000.0, 8.0, 1e-5
    cells = np.arange(mesh_n) * box / mesh_n
    k = 2 * np.pi * 3 / box
    wave = np.cos(k * cells)[:, None] * np.cos(2 * k * cells)[None, :]
    theta = projection.pixel_centres(5.0, 32)
    w1, w2 = 2e-4, 3e-4
    maps = _trace(
        [np.full((mesh_n, mesh_n), mean), _painted(wave, box)],
        [[w1, w2]],
        [lens1, 1e-5],
        [chi1, chi2],
        theta,
        [(0.0, 0.0), (0.0, 0.0)],
        _grid(mesh_n, box, dtype="float32"),
    )
    s = 1 - lens1 * mean * chi1 * (chi2 - chi1) / chi2

    def wave_read_at(scale):
        at = scale * chi2 * theta
        return w1 * mean + w2 * scale * np.cos(k * at)[:, None] * np.cos(2 * k * at)[None, :]

    error = np.abs(maps["kappa"][0] - wave_read_at(s)).max() / w2
    unfocused = np.abs(maps["kappa"][0] - wave_read_at(1.0)).max() / w2
    print(f"focusing sheet: kappa within {error:.1e} of w2; read unfocused, off by {unfocused:.2f}")
    assert error < 2e-3 and unfocused > 0.05
    # the rays' deflection: the sheet's w1 Σ̄ θ plus the wave's, which is small
    assert np.allclose(
        maps["deflection"][0][0], w1 * mean * theta[:, None], atol=0.1 * w1 * mean * theta.max()
    )


@pytest.mark.parametrize("pdims", [(2, 4), (8, 1)])
def test_ray_traced_maps_do_not_depend_on_the_device_mesh(pdims):
    rng = np.random.default_rng(11)
    mesh_n, box = 32, 128.0
    planes = [rng.normal(size=(mesh_n, mesh_n)).astype(np.float32) * 30 for _ in range(4)]
    chi = np.array([200.0, 400.0, 600.0, 800.0])
    weights = np.array([[3e-4, 4e-4, 3e-4, 0.0], [2e-4, 4e-4, 5e-4, 4e-4]])
    lens = np.full(4, 1.5e-5)
    offsets = rng.uniform(0, box, size=(4, 2))
    theta = projection.pixel_centres(6.0, 32)
    one = _trace(planes, weights, lens, chi, theta, offsets, _grid(mesh_n, box, (1, 1), "float32"))
    many = _trace(planes, weights, lens, chi, theta, offsets, _grid(mesh_n, box, pdims, "float32"))
    for name in ("kappa", "gamma1", "gamma2", "omega", "deflection"):
        scale = np.abs(one[name]).max()
        assert scale > 0, name
        np.testing.assert_allclose(many[name], one[name], atol=1e-5 * scale, err_msg=name)
    born = np.asarray(
        projection.flat_sky_convergence(
            [lambda p=p: jnp.asarray(p) for p in planes],
            weights,
            chi,
            theta,
            offsets,
            _grid(mesh_n, box, (1, 1), "float32"),
        )
    )
    difference = one["kappa"] - born
    assert np.abs(difference).max() > 1e-3 * np.abs(born).max()  # lens-lens coupling
    assert np.abs(one["omega"]).max() > 1e-4 * np.abs(born).max()  # and rotation


@pytest.mark.slow  # 14-17 s: the fast tier stays within 3 minutes
def test_a_run_writes_ray_traced_and_born_maps_of_the_same_planes(tmp_path):
    """A 32³ run (256 Mpc/h, force mesh 64³, planes 64 Mpc/h thick to z = 1), lensing.method
    both: the ray-traced κ differs from Born's but its C_ℓ agrees within 2 % over the multipoles
    the run resolves (from ell_min_valid to where the source's mid-way plane reaches
    k_max_valid); ω is written, the reduced shear is γ / (1 - κ), and the summaries hold the
    statistics of both maps. Likewise on the full sky (nside 16, every multipole to the band
    limit)."""
    run = config.Run.model_validate(
        {
            "box": {"particles": 32, "box_size": 256.0, "oversample": 2},
            "nbody": {"steps": 10},
            "lightcone": {"z_max": 1.0, "plane_thickness": 64.0},
            "lensing": {
                "source_redshifts": [0.7, 1.0],
                "flat_sky": {"field_of_view": 6.0, "pixels": 64},
                "full_sky": {"nside": 16},
                "method": "both",
                "reduced_shear": True,
            },
            "summaries": {"kappa_range": [-0.05, 0.05]},
        }
    )
    path = tmp_path / "config.json"
    path.write_text(config.RunFile.build("test", "r0", 0, {}, run).to_json())
    for stage in stages.run_stages(run):
        registry.run_stage(stage, path)
    lens = zarr.open_group(tmp_path / "lensing.zarr", mode="r")
    assert lens.attrs["method"] == "both"
    summ = zarr.open_group(tmp_path / "summaries.zarr", mode="r")  # Born's too, same bins
    edges = np.append(summ["ell_lo"][:], summ["ell_hi"][-1])
    for name, suffix in (("kappa", ""), ("kappa_born", "_born")):
        np.testing.assert_allclose(
            summ["cl" + suffix][1, 1], stats.flat_sky_cl(lens[name][1], 6.0, edges)[1], rtol=1e-5
        )
    assert summ["peaks_born"].shape == summ["peaks"].shape
    # flat sky: the shear's E and B spectra are those of κ and ω (Born's B = 0)
    np.testing.assert_array_equal(summ["cl_ee"][:], summ["cl"][:])
    omega_cl = stats.flat_sky_cl(lens["omega"][1], 6.0, edges)[1]
    np.testing.assert_allclose(summ["cl_bb"][1, 1], omega_cl, rtol=1e-5)
    assert np.all(summ["cl_bb"][1, 1] > 0) and not np.any(summ["cl_bb_born"][:])
    chi_s = projection.source_distribution(derive.cosmology_params(run), [0.7, 1.0], [1.0, 1.0])[0]
    for s in range(2):
        kappa, born = np.asarray(lens["kappa"][s]), np.asarray(lens["kappa_born"][s])
        assert np.std(kappa - born) > 0.01 * np.std(born)
        lo, hi = float(lens["ell_min_valid"][s]), lens.attrs["k_max_valid"] * chi_s[s] / 2
        assert hi > 1.5 * lo
        edges = np.geomspace(lo, hi, 4)
        ratio = stats.flat_sky_cl(kappa, 6.0, edges)[1] / stats.flat_sky_cl(born, 6.0, edges)[1]
        assert np.all(np.abs(ratio - 1) < 0.02), (s, ratio)
        assert np.abs(np.asarray(lens["omega"][s])).max() > 0
        for c in ("1", "2"):
            np.testing.assert_allclose(
                lens[f"g{c}"][s], np.asarray(lens[f"gamma{c}"][s]) / (1 - kappa), rtol=1e-5
            )
        kappa, born = (
            np.asarray(lens["kappa_healpix"][s]),
            np.asarray(lens["kappa_born_healpix"][s]),
        )
        assert np.std(kappa - born) > 1e-3 * np.std(born)
        ratio = summ["cl_healpix"][s, s] / summ["cl_born_healpix"][s, s]
        print(f"full sky, source {s}: C_l ratio {ratio.min():.5f} to {ratio.max():.5f}, maps "
              f"differ by {np.std(kappa - born) / np.std(born):.4f} of Born's rms")  # fmt: skip
        assert np.all(np.abs(ratio - 1) < 0.02), (s, ratio)
        assert np.abs(np.asarray(lens["omega_healpix"][s])).max() > 0
        assert np.abs(summ["cl_bb_healpix"][s, s]).max() > 0
        assert np.abs(summ["cl_bb_born_healpix"][s, s]).max() == 0
        np.testing.assert_allclose(
            lens["g1_healpix"][s], np.asarray(lens["gamma1_healpix"][s]) / (1 - kappa), rtol=1e-5
        )
    assert summ["peaks_born_healpix"].shape == summ["peaks_healpix"].shape
    _full_sky_b_modes_are_the_rotation_above_the_floor(tmp_path, run, lens)


def _full_sky_b_modes_are_the_rotation_above_the_floor(run_dir, run, lens):
    """The run's full-sky shear B modes against the floor of the same code with lens-lens
    coupling switched off (every c_i = 0: the rays stay on their lines of sight and Born's
    sums go through the same synthesis at the rays and analysis): at least 10³ times above
    it; and to second order the rotation's, C^BB / C^ωω within 15 % of 1 beyond ℓ = 8."""
    import healpy

    from pmpipe.physics.lensing import raytrace_healpix

    nb = zarr.open_group(run_dir / "nbody.zarr", mode="r")
    shells = nb["lightcone_healpix_alm"][:].astype(np.complex128)
    chi = nb["plane"][:].astype(np.float64)
    weights = lens["plane_weight"][:].astype(np.float64)
    factors = raytrace_flat.deflection_factors(derive.cosmology_params(run), chi)
    nside = run.lensing.full_sky.nside
    rays, ell_max = sky.traced_rays_nside(nside), sky.healpix_ell_max(nside)
    spectra = {}
    for name, scale in (("coupled", 1.0), ("floor", 0.0)):
        maps = raytrace_healpix.trace(
            [lambda i=i: shells[i] for i in range(chi.size)],
            weights,
            scale * factors,
            chi,
            rays,
        )
        spectra[name] = [
            {
                k: healpy.alm2cl(v)
                for k, v in raytrace_healpix.analyse(
                    *(maps[k][s] for k in ("kappa", "gamma1", "gamma2", "omega")), ell_max
                ).items()
            }
            for s in range(weights.shape[0])
        ]
    for s in range(weights.shape[0]):
        b = healpy.alm2cl(lens["gamma_b_healpix_alm"][s].astype(np.complex128))
        np.testing.assert_allclose(spectra["coupled"][s]["b"], b, rtol=1e-3)
        above = b[2:].sum() / spectra["floor"][s]["b"][2:].sum()
        ratio = b[8:].sum() / spectra["coupled"][s]["omega"][8:].sum()
        print(f"source {s}: C_BB {above:.3g} times its floor, C_BB / C_omega {ratio:.3f}")
        assert above > 1e3 and abs(ratio - 1) < 0.15


def test_rays_deflected_beyond_the_fields_grid_stop_the_tracing():
    """An underdense sheet that spreads the rays to s = 1.4 times their angles at the second
    plane (up to 1° from their lines of sight, beyond the 4-pixel margin of 0.62°): they leave
    the grid that plane's fields are read on, and the tracing says so instead of reading
    clipped values."""
    mesh_n, box = 32, 400.0
    plane = np.full((mesh_n, mesh_n), -160.0)
    theta = projection.pixel_centres(5.0, 32)
    with pytest.raises(ValueError, match="beyond the margin"):
        _trace(
            [plane, plane], [[1e-4, 1e-4]], [1e-5, 1e-5], [500.0, 1000.0], theta,
            [(0.0, 0.0), (0.0, 0.0)], _grid(mesh_n, box, dtype="float32"),
        )  # fmt: skip


def _plane_spectrum(planes, box):
    """Mean 2D power spectrum (k (B,) h/Mpc, P (B,) (Mpc/h)²) of planes (R, M, M) of projected
    overdensity (Mpc/h), CIC window divided out, in rings of |k|."""
    mesh_n = planes.shape[-1]
    k = np.fft.fftfreq(mesh_n, box / mesh_n) * 2 * np.pi
    ring = np.hypot(k[:, None], k[None, :]).ravel()
    modes = np.fft.fft2(planes) / projection._cic_window_2d(mesh_n, box)
    power = (np.abs(modes) ** 2).mean(axis=0).ravel() * box**2 / mesh_n**4
    edges = np.linspace(0, ring.max() + 1e-9, 61)
    index = np.digitize(ring, edges) - 1
    counts = np.bincount(index, minlength=60)[:60]
    mean = np.bincount(index, power, minlength=60)[:60] / np.maximum(counts, 1)
    return 0.5 * (edges[1:] + edges[:-1]), mean


@pytest.mark.slow
def test_the_rotation_power_is_the_lens_lens_coupling_of_the_planes(tmp_path):
    """The rotation ω of ray-traced maps (the configuration of `pmpipe bench postborn`, seeds
    0-2) against its second-order prediction for thin planes: ω = -Σ_{i>j} w_i W_ji
    (γ1_i γ2_j - γ2_i γ1_j), with W_ji = c_j χ_j (χ_i - χ_j) / χ_i and γ_i the shear of plane
    i's tidal field, so for independent Gaussian planes

        C^ωω(L) = Σ_{i>j} (w_i W_ji)² ∫ d²l/(2π)² C_i(l) C_j(|L - l|) sin²(2(φ_{L-l} - φ_l)),

    with C_i(l) = P_Σi(l / χ_i) / χ_i² from the planes' own measured power, band-limited as
    the maps read them. Asserted within a factor 2 in the resolved bins."""
    from pmpipe.bench.validation import postborn

    seeds, edges = 3, np.array([180.0, 250.0, 350.0, 450.0])
    runs = []
    for seed in range(seeds):
        run = postborn._run(32, 64, seed)
        path = tmp_path / f"s{seed}" / "config.json"
        path.parent.mkdir()
        path.write_text(config.RunFile.build("omega", f"s{seed}", seed, {}, run).to_json())
        for stage in stages.run_stages(run)[:3]:
            registry.run_stage(stage, path)
        runs.append(path.parent)
    nb = zarr.open_group(runs[0] / "nbody.zarr", mode="r")
    lens = zarr.open_group(runs[0] / "lensing.zarr", mode="r")
    chi, box = np.asarray(nb["plane"][:]), run.box.box_size
    weights = np.asarray(lens["plane_weight"][:])
    factors = raytrace_flat.deflection_factors(derive.cosmology_params(run), chi)
    spectra = [
        _plane_spectrum(
            np.stack(
                [zarr.open_group(r / "nbody.zarr", mode="r")["lightcone_density"][i] for r in runs]
            ),
            box,
        )
        for i in range(chi.size)
    ]
    nyquist_map = np.pi / np.radians(postborn.FIELD_OF_VIEW / 64)
    nyquist_mesh = np.pi * run.force_cells() / box
    grid = np.linspace(-nyquist_map, nyquist_map, 321)
    step = grid[1] - grid[0]
    lx, ly = np.meshgrid(grid, grid, indexing="ij")

    def plane_cl(i, x, y):
        """C_i at (x, y) as the map reads plane i: modes of the box, under both Nyquists."""
        k = np.hypot(x, y) / chi[i]
        inside = (np.maximum(abs(x), abs(y)) <= nyquist_map) & (k >= 2 * np.pi / box * 0.99)
        inside &= np.maximum(abs(x), abs(y)) / chi[i] <= nyquist_mesh
        return np.where(inside, np.interp(k, *spectra[i]) / chi[i] ** 2, 0.0)

    pairs = np.zeros((chi.size, chi.size))  # W_ji for a source at plane i's distance
    for i in range(chi.size):
        pairs[i, :i] = factors[:i] * chi[:i] * (chi[i] - chi[:i]) / chi[i]
    for s in range(2):
        measured = np.mean(
            [
                stats.flat_sky_cl(
                    zarr.open_group(r / "lensing.zarr", mode="r")["omega"][s],
                    postborn.FIELD_OF_VIEW,
                    edges,
                )[1]
                for r in runs
            ],
            axis=0,
        )
        coupling = (weights[s][:, None] * pairs) ** 2
        predicted = []
        for L in np.sqrt(edges[1:] * edges[:-1]):
            near = np.stack([plane_cl(i, lx, ly) for i in range(chi.size)])
            far = np.stack([plane_cl(j, L - lx, -ly) for j in range(chi.size)])
            angle = np.sin(2 * (np.arctan2(-ly, L - lx) - np.arctan2(ly, lx))) ** 2
            total = np.einsum("ixy,ij,jxy,xy->", near, coupling, far, angle)
            predicted.append(total * step**2 / (2 * np.pi) ** 2)
        ratio = measured / np.array(predicted)
        print(f"source {s}: C^ww measured / second-order prediction {np.round(ratio, 3)}")
        assert np.all((ratio > 0.5) & (ratio < 2.0)), ratio
