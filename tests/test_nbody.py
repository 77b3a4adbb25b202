import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import PDIMS_8, rel_diff

from pmpipe.physics.evolution import ics, lpt, particle_mesh, schedule, simulation, timesteps
from pmpipe.physics.mesh import domain, painting
from pmpipe.physics.statistics import stats
from pmpipe.physics.theory import cosmology as C
from pmpipe.runtime import parallel

COSMO = C.Cosmology()


def _run(
    n,
    box,
    oversample,
    a_init,
    a_final,
    steps,
    pdims=(1, 1),
    seed=1,
    fixed=False,
    snapshots=(),
    halo=4,
    cosmo=COSMO,
):
    mesh = parallel.make_mesh(pdims)
    noise = ics.white_noise(seed, n, mesh)
    grid = domain.Grid(mesh, n, oversample, box, halo)
    init, res = simulation.simulate(
        cosmo,
        noise,
        grid,
        timesteps.timeline(a_init, a_final, steps, snapshots),
        options=simulation.ICOptions(fixed_amplitude=fixed),
    )
    return mesh, grid, init, res


@pytest.mark.slow
def test_linear_growth_in_a_gigaparsec_box():
    a0, a1 = 0.1, 1.0
    mesh, grid, _init, res = _run(64, 1000.0, 2, a0, a1, 10, fixed=True, snapshots=(a0,))
    _k, p_init, _ = stats.power_spectrum(res.snapshots[a0] - 1, mesh, grid.box_size)
    _, p_final, _ = stats.power_spectrum(res.snapshots[a1] - 1, mesh, grid.box_size)
    growth = (C.growth_factor(COSMO, a1) / C.growth_factor(COSMO, a0)) ** 2
    ratio = p_final / (float(growth) * p_init)
    assert np.all(np.abs(ratio[:3] - 1) < 0.01), ratio[:6]


@pytest.mark.slow
def test_pm_agrees_with_2lpt_at_early_times():
    """In the regime PM resolves: B = 2 and initial modes below a third of the particle
    Nyquist frequency (grid-scale modes grow too slowly under any PM force)."""
    a0, a1 = 0.02, 0.05
    n, box = 32, 256.0
    k_cut = np.pi * n / box / 3
    mesh = parallel.make_mesh((1, 1))
    power = lambda k: C.linear_power_eisenstein_hu(COSMO, k) * (k < k_cut)
    init, res = simulation.simulate(
        COSMO,
        ics.white_noise(1, n, mesh),
        domain.Grid(mesh, n, 2, box, 4),
        timesteps.timeline(a0, a1, 10),
        power=power,
    )
    disp_lpt, _ = lpt.lpt_state(COSMO, init.s1, init.s2, a1)
    rms = float(jnp.sqrt(jnp.mean(disp_lpt**2)))
    diff = float(jnp.sqrt(jnp.mean((res.disp - disp_lpt) ** 2)))
    assert diff < 0.01 * rms, (diff, rms)


@pytest.mark.slow
def test_step_convergence_10_vs_40_steps():
    box, n = 256.0, 32
    _, _grid, _, r10 = _run(n, box, 2, 0.1, 1.0, 10)
    mesh, _, _, r40 = _run(n, box, 2, 0.1, 1.0, 40)
    k, p10, _ = stats.power_spectrum(r10.snapshots[1.0] - 1, mesh, box)
    _, p40, _ = stats.power_spectrum(r40.snapshots[1.0] - 1, mesh, box)
    k_nyq = np.pi * n / box
    sel = k < k_nyq / 2
    assert np.all(np.abs(p10[sel] / p40[sel] - 1) < 0.02), p10[sel] / p40[sel]


@pytest.fixture(scope="module")
def single_device_run():
    return _run(32, 256.0, 1, 0.1, 1.0, 10, halo=4)


@pytest.mark.slow
@pytest.mark.parametrize("pdims", PDIMS_8)
def test_same_universe_on_8_devices(pdims, single_device_run):
    _, _, init1, res1 = single_device_run
    _mesh, _, init8, res8 = _run(32, 256.0, 1, 0.1, 1.0, 10, pdims=pdims, halo=4)
    assert len(res8.disp.addressable_shards) == 8
    assert rel_diff(init8.delta_linear, init1.delta_linear) <= 1e-5
    assert rel_diff(init8.disp, init1.disp) <= 1e-5
    assert rel_diff(res8.snapshots[1.0], res1.snapshots[1.0]) <= 1e-5
    assert rel_diff(res8.disp, res1.disp) <= 1e-5


@pytest.mark.slow
def test_halo_shortfall_raises_during_evolution():
    with pytest.raises(painting.HaloError, match=r"at step \d of 3 \(a = .*parallel.halo_cells"):
        _run(32, 64.0, 1, 0.1, 1.0, 3, pdims=(2, 4), halo=1)


@pytest.mark.slow
def test_nan_in_the_state_stops_the_run_naming_step_and_a():
    """A momentum that turns NaN is reported at the first step it reaches the state, with
    its a and the fields to change."""
    n, box = 16, 64.0
    mesh = parallel.make_mesh((2, 4))
    grid = domain.Grid(mesh, n, 1, box, 4)
    disp = jnp.zeros((n, n, n, 3), jnp.float32)
    mom = disp.at[3, 4, 5, 0].set(jnp.nan)
    bounds = timesteps.step_boundaries(0.1, 1.0, 3)
    with pytest.raises(
        particle_mesh.NumericalError, match=r"after step 0 of 3 \(a = 0\.1\).*nbody\.steps"
    ):
        particle_mesh.evolve(COSMO, disp, mom, timesteps.Timeline(bounds), grid)
    trouble = np.array([2, -1])  # a halo shortfall first, then nothing else
    with pytest.raises(painting.HaloError, match=r"at step 2 of 3 \(a = 0\.7\)"):
        particle_mesh.check_state(trouble, 9, bounds, 4)
    particle_mesh.check_state(np.array([-1, -1]), 3, bounds, 4)  # nothing went wrong


def test_step_boundaries():
    b = timesteps.step_boundaries(0.1, 1.0, 9, snapshots=(0.5, 0.55))
    assert b[0] == 0.1 and b[-1] == 1.0 and 0.5 in b and 0.55 in b and len(b) == 11
    np.testing.assert_allclose(
        timesteps.step_boundaries(0.1, 0.5, [0.1, 0.2, 0.5]), [0.1, 0.2, 0.5]
    )
    with pytest.raises(ValueError, match="nbody.a_final"):
        timesteps.step_boundaries(0.5, 0.5, 10)
    with pytest.raises(ValueError, match="strictly increasing"):
        timesteps.step_boundaries(0.1, 0.5, [0.1, 0.3, 0.2, 0.5])
    with pytest.raises(ValueError, match="nbody.snapshots"):
        timesteps.step_boundaries(0.1, 0.5, 4, snapshots=(0.7,))


def test_fastpm_factors_exact_for_linear_growth():
    """One KDK step of a pure growing mode with the exact linear force reproduces D1."""
    cosmo = C.tabulated(COSMO)
    a = jnp.array([0.1, 0.6])
    k1, dr, _k2 = particle_mesh.kdk_coefficients(cosmo, a)
    d = lambda x: C.growth_factor(cosmo, x)
    s = 1.0
    x = d(0.1) * s
    p = a[0] ** 2 * C.E(cosmo, a[0]) * C.growth_factor_derivative(cosmo, a[0]) * s
    p = p + k1[0] * 1.5 * COSMO.Omega_m * x
    x = x + dr[0] * p
    assert float(x) == pytest.approx(float(d(0.6)), rel=1e-5)


def _loss_setup():
    n, box = 8, 64.0
    mesh = parallel.make_mesh((1, 1))
    grid = domain.Grid(mesh, n, 1, box, 2)

    def loss(noise, omega_m):
        cosmo = C.Cosmology(Omega_m=omega_m)
        _, res = simulation.simulate(cosmo, noise, grid, timesteps.timeline(0.1, 1.0, 3))
        return jnp.mean((res.snapshots[1.0] - 1) ** 2)

    return n, mesh, jax.jit(loss)


@pytest.mark.slow
def test_gradients_match_finite_differences_float64():
    with jax.enable_x64(True):
        n, mesh, loss = _loss_setup()
        noise = ics.white_noise(3, n, mesh, dtype=jnp.float64)
        om = jnp.float64(0.3)
        g_noise, g_om = jax.jit(jax.grad(loss, argnums=(0, 1)))(noise, om)
        assert g_noise.dtype == jnp.float64
        eps = 1e-5
        fd_om = (loss(noise, om + eps) - loss(noise, om - eps)) / (2 * eps)
        assert float(g_om) == pytest.approx(float(fd_om), rel=1e-2)
        v = jax.random.normal(jax.random.key(9), noise.shape, jnp.float64)
        fd_v = (loss(noise + eps * v, om) - loss(noise - eps * v, om)) / (2 * eps)
        assert float(jnp.sum(g_noise * v)) == pytest.approx(float(fd_v), rel=1e-2)
        assert abs(float(fd_v)) > 0 and abs(float(fd_om)) > 0


@pytest.mark.slow
def test_evolution_leaves_the_initial_state_valid():
    """The steps update the particle state in place (donated buffers), never the caller's."""
    _mesh, _, init, res = _run(8, 64.0, 1, 0.1, 1.0, 2, halo=2)
    assert not init.disp.is_deleted() and not init.mom.is_deleted()
    assert float(jnp.abs(res.disp - init.disp).max()) > 0


@pytest.mark.slow
def test_a_halo_overflow_stops_the_evolution_at_its_step():
    """A stage's compiled evolution (stop_early) does no work after the step whose particles left
    the halo: its final state is the state after that step, and the error names it."""
    mesh = parallel.make_mesh((2, 4))
    n, box, steps = 32, 64.0, 8
    grid = domain.Grid(mesh, n, 1, box, 1)
    noise = ics.white_noise(1, n, mesh)
    init = simulation.initial_conditions(COSMO, noise, simulation.power_function(COSMO), grid, 0.1)
    disp, mom = init.disp, init.mom
    bounds = timesteps.step_boundaries(0.1, 1.0, steps)
    plan = schedule.build(timesteps.Timeline(bounds), None, np.float32)
    # both programs take the same tables (each computing its own may round differently)
    cosmo = C.tabulated(COSMO)
    state = particle_mesh.evolution(cosmo, disp, mom, plan, None, grid=grid, stop_early=True)
    beyond = int(state.trouble[0])
    assert 0 < beyond < steps - 1  # stopped before the end
    shorter = bounds[: beyond + 1]
    plan = schedule.build(timesteps.Timeline(shorter), None, np.float32)
    upto = particle_mesh.evolution(cosmo, disp, mom, plan, None, grid=grid)
    np.testing.assert_array_equal(np.asarray(state.disp), np.asarray(upto.disp))
    with pytest.raises(painting.HaloError, match=rf"at step {beyond} of {steps} \(a = "):
        particle_mesh.check_state(state.trouble, state.needed, bounds, grid.halo)
