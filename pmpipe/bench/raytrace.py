"""`pmpipe bench raytrace`: the cost of flat-sky ray tracing per lens plane, against Born's on the
same planes, as JSON.

The planes are Gaussian random fields of the fiducial cosmology's linear power at their
distance (projected over their thickness: P_2D(k) = Δχ P_lin(k) D(a)²) on (M, M) grids of the
box, equally thick out to z = 1, read on a square map of ``pixels``² for one source at z = 1. Each
method runs once on two planes (its programs compile) and is then timed on all of them; the
record gives seconds per plane and the κ rms of both maps.
"""

from __future__ import annotations

import time

import numpy as np

Z_SOURCE = 1.0


def _slabs(setup, count: int):
    """(edges (P + 1,), centres (P,) Mpc/h, growth factors (P,) at the centres, source distance)
    of ``count`` equally thick slabs out to the source at Z_SOURCE."""
    from pmpipe.physics.theory import cosmology

    cosmo = setup.cosmology
    chi_s = float(cosmology.comoving_distance(cosmo, 1.0 / (1.0 + Z_SOURCE)))
    edges = np.linspace(0.0, chi_s, count + 1)
    centres = 0.5 * (edges[1:] + edges[:-1])
    growth = np.asarray(
        cosmology.growth_factor(
            cosmology.tabulated(cosmo),
            cosmology.on_host(cosmology.scale_factor_at_distance, cosmo, centres),
        )
    )
    return edges, centres, growth, chi_s


def _planes(setup, count: int, mesh_n: int, box: float, seed: int):
    """(edges (P + 1,), centres (P,) Mpc/h, planes (P, M, M)) out to the source."""
    from pmpipe.physics.mesh import fft

    edges, centres, growth, chi_s = _slabs(setup, count)
    k = fft.angular_frequencies(mesh_n, box / mesh_n)
    k = np.hypot(k[:, None], k[None, :])
    spectrum = np.where(k > 0, np.asarray(setup.power(np.maximum(k, 1e-6))), 0.0)
    rng = np.random.default_rng(seed)
    planes = []
    for i in range(count):
        p2d = (edges[i + 1] - edges[i]) * spectrum * growth[i] ** 2
        noise = np.fft.fft2(rng.normal(size=(mesh_n, mesh_n)))
        planes.append(np.fft.ifft2(noise * np.sqrt(p2d) * mesh_n / box).real)
    return edges, centres, np.asarray(planes, np.float32), chi_s


def bench_raytrace(pixels: int, planes: int, mesh_n: int, box: float, fov: float, seed: int):
    """The record of the module docstring."""
    import jax
    import jax.numpy as jnp

    from pmpipe.physics.lensing import projection, raytrace_flat
    from pmpipe.physics.mesh import domain
    from pmpipe.run import config, derive
    from pmpipe.runtime import parallel

    run = config.Run.model_validate({"box": {"box_size": box}})
    setup = derive.setup(config.RunFile.build("bench", "raytrace", 0, {}, run), None)
    edges, chi, fields, chi_s = _planes(setup, planes, mesh_n, box, seed)
    weights = projection.plane_weights(setup.cosmology, edges, projection.single_plane(chi_s))[
        None, :
    ]
    factors = raytrace_flat.deflection_factors(setup.cosmology, chi)
    theta = projection.pixel_centres(fov, pixels)
    offsets = np.zeros((planes, 2))
    grid = domain.Grid(parallel.make_mesh((1, 1)), mesh_n, box_size=box)
    methods = {
        "born": lambda p, n: projection.flat_sky_convergence(
            p, weights[:, :n], chi[:n], theta, offsets[:n], grid
        ),
        "raytrace": lambda p, n: raytrace_flat.trace(
            p, weights[:, :n], factors[:n], chi[:n], theta, offsets[:n], grid
        )["kappa"],
    }
    record: dict = {
        "pixels": pixels,
        "field_of_view_deg": fov,
        "planes": planes,
        "plane_mesh": mesh_n,
        "box": box,
        "z_source": Z_SOURCE,
        "ray_oversampling": raytrace_flat.RAY_OVERSAMPLING,
        "device": jax.devices()[0].device_kind,
        "seconds_per_plane": {},
        "first_two_planes_seconds": {},
        "kappa_rms": {},
    }
    on_device = [lambda f=f: jnp.asarray(f) for f in fields]
    for name, method in methods.items():
        start = time.perf_counter()
        jax.block_until_ready(method(on_device[:2], 2))
        record["first_two_planes_seconds"][name] = time.perf_counter() - start
        start = time.perf_counter()
        kappa = jax.block_until_ready(method(on_device, planes))
        record["seconds_per_plane"][name] = (time.perf_counter() - start) / planes
        record["kappa_rms"][name] = float(np.std(np.asarray(kappa)))
    return record


def _shells(setup, count: int, nside: int, seed: int):
    """(edges (P + 1,), centres (P,) Mpc/h, Σ_ℓm of each shell (P, n_alm), source distance):
    Gaussian shells with the Limber spectrum of their thickness, C_ℓ = Δχ P_lin((ℓ + ½)/χ)
    D(a)² / χ², up to ℓ = 3 nside - 1."""
    import healpy

    from pmpipe.physics.evolution import sky

    edges, centres, growth, chi_s = _slabs(setup, count)
    ell = np.arange(sky.healpix_ell_max(nside) + 1, dtype=np.float64)
    np.random.seed(seed)  # healpy.synalm draws from numpy's global generator
    shells = []
    for i in range(count):
        k = (ell + 0.5) / centres[i]
        cl = (edges[i + 1] - edges[i]) * np.asarray(setup.power(k)) * growth[i] ** 2
        cl = cl / centres[i] ** 2
        cl[0] = 0.0
        shells.append(healpy.synalm(cl, lmax=ell.size - 1, new=True))
    return edges, centres, np.asarray(shells), chi_s


def bench_raytrace_healpix(nside: int, planes: int, box: float, seed: int) -> dict:
    """Full-sky ray tracing against Born on the same Gaussian shells out to a source at z = 1,
    maps of ``nside``: seconds per shell of the tracing (rays on the grid of
    pmpipe.physics.evolution.sky.traced_rays_nside), seconds of the rays' analysis and of Born's
    coefficients and maps, the process's peak memory and the κ rms of both maps."""
    import resource

    import jax

    from pmpipe.physics.evolution import lightcone, sky
    from pmpipe.physics.lensing import projection, raytrace_flat, raytrace_healpix
    from pmpipe.run import config, derive

    run = config.Run.model_validate({"box": {"box_size": box}})
    setup = derive.setup(config.RunFile.build("bench", "raytrace", 0, {}, run), None)
    edges, chi, shells, chi_s = _shells(setup, planes, nside, seed)
    weights = projection.plane_weights(setup.cosmology, edges, projection.single_plane(chi_s))[
        None, :
    ]
    factors = raytrace_flat.deflection_factors(setup.cosmology, chi)
    rays = sky.traced_rays_nside(nside)
    record: dict = {
        "nside": nside,
        "planes": planes,
        "rays_nside": rays,
        "ell_max": sky.healpix_ell_max(nside),
        "z_source": Z_SOURCE,
        "device": jax.devices()[0].device_kind,
        "seconds": {},
        "kappa_rms": {},
    }
    start = time.perf_counter()
    kappa_alm = (weights @ shells)[0]
    born = lightcone.healpix_map(kappa_alm, nside)
    projection.healpix_shear(kappa_alm, nside)
    record["seconds"]["born"] = time.perf_counter() - start
    start = time.perf_counter()
    traced = raytrace_healpix.trace([lambda s=s: s for s in shells], weights, factors, chi, rays)
    record["seconds"]["raytrace"] = time.perf_counter() - start
    record["seconds_per_plane"] = {"raytrace": record["seconds"]["raytrace"] / planes}
    start = time.perf_counter()
    alm = raytrace_healpix.analyse(
        traced["kappa"][0],
        traced["gamma1"][0],
        traced["gamma2"][0],
        traced["omega"][0],
        sky.healpix_ell_max(nside),
    )
    kappa = lightcone.healpix_map(alm["kappa"], nside)
    projection.healpix_spin2_maps(alm["e"], alm["b"], nside)
    record["seconds"]["raytrace_analysis"] = time.perf_counter() - start
    record["kappa_rms"] = {"born": float(np.std(born)), "raytrace": float(np.std(kappa))}
    record["peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
    return record
