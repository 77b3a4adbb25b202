"""The evolution as one compiled program: no compilation for a second run of the same sizes,
the same results as a step-by-step loop of separately dispatched kicks, drifts and lightcone
captures, and the program's own memory analysis."""

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import references
from conftest import rel_diff

from pmpipe.physics.evolution import (
    ics,
    lightcone,
    particle_mesh,
    schedule,
    simulation,
    sky,
    timesteps,
)
from pmpipe.physics.mesh import domain, fft, painting
from pmpipe.physics.theory import cosmology
from pmpipe.runtime import compilation, parallel

N, BOX, OBSERVER = 16, 64.0, (32.0, 32.0, 32.0)
GRID_SIZES = {"particles": N, "oversample": 2, "box_size": BOX, "halo": 8}
RAYS_NSIDE = 2
SNAPSHOTS = (0.5, 1.0)
K_MAX = 0.5


def _setup(mesh, cosmo, seed, z_max=0.05):
    cosmo = cosmology.tabulated(cosmo)
    init = simulation.initial_conditions(
        cosmo,
        ics.white_noise(seed, N, mesh),
        simulation.power_function(cosmo),
        domain.Grid(mesh, **GRID_SIZES),
        0.1,
    )
    planes = references.plane_geometry(cosmo, z_max, 32.0)
    transforms = lightcone.plane_transforms(seed, len(planes), 2 * N, True)
    times = timesteps.timeline(0.1, 1.0, 3, SNAPSHOTS)
    return cosmo, init, planes, transforms, times


@partial(jax.jit, static_argnames="mesh")
def _forces(disp, omega_m, mesh):
    """The PM force (N, N, N, 3) and density, a program of its own (dispatched op by op, the
    distributed FFTs on XLA's CPU devices have aborted the process now and then)."""
    grid = domain.Grid(mesh, **GRID_SIZES)
    rho, _ = painting.paint(disp, grid, mass=8.0)
    pot_k = 1.5 * omega_m * fft.inverse_laplacian(fft.r2c(rho, mesh), mesh, BOX)
    force = -fft.gradient(pot_k, mesh, BOX, fft.finite_difference_kernels(pot_k, mesh, BOX))
    return painting.read(force, disp, grid)[0], rho


def _step_by_step(cosmo, init, planes, transforms, times, mesh):
    """FastPM kick-drift-kick from Python, one step (and one plane) at a time, with both half
    kicks of every step and the planes made by the public single-plane functions."""
    bounds = times.bounds
    kick1, drift, kick2 = (
        np.asarray(f)
        for f in particle_mesh.kdk_coefficients(cosmo, jnp.asarray(bounds, jnp.float32))
    )
    disp, mom = init.disp, init.mom
    acc, rho = _forces(disp, cosmo.Omega_m, mesh)
    snaps, flat, shells = {}, {}, {}
    for i in range(len(bounds) - 1):
        mom = mom + kick1[i] * acc
        for j in np.flatnonzero((planes.a > bounds[i]) & (planes.a <= bounds[i + 1])):
            factor = particle_mesh.partial_drift(cosmo, bounds[i], bounds[i + 1], planes.a[j])
            rho_j, _ = painting.paint(
                disp + jnp.float32(factor) * mom, domain.Grid(mesh, **GRID_SIZES), mass=8.0
            )
            flat[j] = lightcone.flat_plane(rho_j, mesh, BOX, 16, transforms[j])
            delta = lightcone.band_limited_overdensity(rho_j, mesh, BOX, K_MAX)
            shells[j] = references.shell_healpix(
                delta,
                mesh,
                BOX,
                RAYS_NSIDE,
                planes.chi_edges[j],
                planes.chi_edges[j + 1],
                OBSERVER,
                transforms[j],
                K_MAX,
            )
        disp = disp + drift[i] * mom
        acc, rho = _forces(disp, cosmo.Omega_m, mesh)
        mom = mom + kick2[i] * acc
        for a in SNAPSHOTS:
            if abs(a - bounds[i + 1]) < 1e-9:
                snaps[a] = rho
    return {
        "disp": disp,
        "mom": mom,
        "snap_0.5": snaps[0.5],
        "snap_1.0": snaps[1.0],
        "planes": jnp.stack([flat[j] for j in range(len(planes))]),
        "shells": jnp.stack([shells[j] for j in range(len(planes))]),
    }


def _one_program(cosmo, init, planes, transforms, times, mesh):
    grid = domain.Grid(mesh, **GRID_SIZES)
    capture = lightcone.capture_plan(planes, transforms, OBSERVER, grid, 16, RAYS_NSIDE, K_MAX)
    res = particle_mesh.evolve(
        cosmo,
        init.disp,
        init.mom,
        times,
        domain.Grid(mesh, **GRID_SIZES),
        capture,
    )
    return {
        "disp": res.disp,
        "mom": res.mom,
        "snap_0.5": res.snapshots[0.5],
        "snap_1.0": res.snapshots[1.0],
        "planes": res.planes,
        "shells": res.shells,
    }


@pytest.mark.slow
@pytest.mark.parametrize("pdims", [(1, 1), (2, 4)])
def test_evolution_is_one_program_equal_to_step_by_step(pdims):
    mesh = parallel.make_mesh(pdims)
    warm = cosmology.Cosmology(Omega_m=0.28, sigma8=0.75, h=0.7)
    warm_setup = _setup(mesh, warm, 2, z_max=0.06)  # another run of the same sizes, one more plane
    _one_program(*warm_setup, mesh)
    setup = _setup(mesh, cosmology.Cosmology(), 1)
    with compilation.CompileCounter() as counter:
        ours = _one_program(*setup, mesh)
        jax.block_until_ready(ours)
    assert counter.counts.programs == 0, counter.counts.names
    reference = _step_by_step(*setup, mesh)
    real = len(setup[2])
    assert 3 <= real < len(warm_setup[2]) and ours["planes"].shape[0] % sky.PLANE_BUCKET == 0
    assert float(jnp.max(jnp.abs(ours["planes"][real:]))) == 0.0  # padding planes never crossed
    ours.update(planes=ours["planes"][:real], shells=ours["shells"][:real])
    for key, expected in reference.items():
        assert float(jnp.std(expected)) > 0, key
        assert rel_diff(ours[key], expected) <= 1e-5, key


def test_memory_of_the_evolution_per_particle():
    """64^3 particles, B = 1, on CPU: the compiled evolution's arguments plus temporaries."""
    n, steps = 64, 10
    mesh = parallel.make_mesh((1, 1))
    grid = domain.Grid(mesh, n, 1, 256.0, 4)
    cosmo = cosmology.Cosmology()
    plan = schedule.build(timesteps.timeline(0.1, 1.0, steps), None, np.float32)
    state = jax.ShapeDtypeStruct((n, n, n, 3), jnp.float32)
    compiled = particle_mesh.evolution.lower(
        cosmology.tabulated(cosmo), state, state, plan, None, grid=grid
    ).compile()
    stats = compiled.memory_analysis()
    per_particle = (stats.argument_size_in_bytes + stats.temp_size_in_bytes) / n**3
    assert 24 <= per_particle <= 80, per_particle  # the state alone is 24 bytes


def test_stepwise_runs_whose_step_counts_share_a_bucket_share_its_programs():
    """The step-by-step evolution (the nbody stage's) of 3 steps, then of 5 from the same ICs:
    the second compiles nothing (both schedules are padded to one bucket), and the first ends
    where the one-program evolution of its steps does."""
    mesh = parallel.make_mesh((1, 1))
    cosmo, init, *_ = _setup(mesh, cosmology.Cosmology(), 1)
    grid = domain.Grid(mesh, **GRID_SIZES)
    counts = {}
    for steps in (3, 5):
        times = timesteps.timeline(0.1, 1.0, steps, SNAPSHOTS)
        with compilation.CompileCounter() as counter:
            state = particle_mesh.start_state(cosmo, init.disp, init.mom, times, grid)
            stepwise = particle_mesh.evolve_stepwise(cosmo, state, 0, times, grid)
        counts[steps] = counter.counts
        if steps == 3:
            whole = particle_mesh.evolve(cosmo, init.disp, init.mom, times, grid)
            for a in SNAPSHOTS:
                assert rel_diff(stepwise.snapshots[a], whole.snapshots[a]) < 1e-5, a
            assert rel_diff(stepwise.disp, whole.disp) < 1e-5
    assert len(times.bounds) - 1 < schedule.STEPS_BUCKET
    assert counts[3].programs > 0 and counts[5].programs == 0, counts[5].names
