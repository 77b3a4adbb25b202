import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import PDIMS_8, rel_diff

from pmpipe.physics.mesh import painting
from pmpipe.physics.mesh.domain import Grid
from pmpipe.runtime import parallel

N, L = 16, 64.0


def _disp(scale, n=N, seed=1):
    return scale * jax.random.normal(jax.random.key(seed), (n, n, n, 3))


@pytest.mark.parametrize("oversample", [1, 2])
@pytest.mark.parametrize("pdims", [(1, 1)] + PDIMS_8)
def test_paint_conserves_mass(pdims, oversample):
    mesh = parallel.make_mesh(pdims)
    disp = jax.device_put(_disp(1.0), parallel.field_sharding(mesh))
    halo = 2 * oversample
    rho, needed = painting.paint(disp, Grid(mesh, N, oversample, L, halo), mass=oversample**3)
    painting.check_halo(needed, halo)
    total = float(jnp.sum(rho.astype(jnp.float64) if jax.config.jax_enable_x64 else rho))
    assert total == pytest.approx(N**3 * oversample**3, rel=1e-6)
    assert float(jnp.min(rho)) >= 0


@pytest.mark.parametrize("pdims", [(1, 1), (2, 4), (8, 1)])
def test_reading_a_uniform_mesh_gives_one(pdims):
    mesh = parallel.make_mesh(pdims)
    disp = jax.device_put(_disp(1.0), parallel.field_sharding(mesh))
    ones = jax.device_put(jnp.ones((2 * N,) * 3), parallel.field_sharding(mesh))
    values, _ = painting.read(ones, disp, Grid(mesh, N, 2, L, halo=3))
    np.testing.assert_array_equal(np.asarray(values), 1.0)


def test_unperturbed_lattice_paints_uniform_density():
    mesh = parallel.make_mesh((1, 1))
    for b in (1, 2):  # sparser lattices leave empty cells under CIC
        rho, _ = painting.paint(jnp.zeros((N, N, N, 3)), Grid(mesh, N, b, L, 1), mass=b**3)
        np.testing.assert_allclose(np.asarray(rho), 1.0, rtol=1e-6)


def _cloud(u, m):
    """Reference CIC cloud on an m^3 periodic mesh of a unit mass at index-space position u."""
    out = np.zeros((m, m, m))
    i0 = np.floor(u).astype(int)
    f = u - i0
    for corner in np.ndindex(2, 2, 2):
        w = np.prod([f[d] if corner[d] else 1 - f[d] for d in range(3)])
        out[tuple((i0 + corner) % m)] += w
    return out


@pytest.mark.parametrize("oversample", [1, 2])
def test_single_particle_cloud(oversample):
    """Particle q sits at mesh index q B + (B - 1)/2, the centre of its B^3 block of force cells:
    on a mesh node for B = 1, between nodes for B = 2, so the lattice paints uniformly."""
    mesh = parallel.make_mesh((1, 1))
    n, b = 4, oversample
    disp = np.zeros((n, n, n, 3), np.float32)
    disp[1, 2, 3] = [0.25, 0.0, -0.5]  # in Lagrangian cells (box = n)
    rho, _ = painting.paint(jnp.asarray(disp), Grid(mesh, n, b, float(n), 1), float(b**3))
    q = np.array([1.0, 2.0, 3.0]) * b + 0.5 * (b - 1)
    moved = q + np.array([0.25, 0.0, -0.5]) * b
    expected = 1.0 + b**3 * (_cloud(moved, n * b) - _cloud(q, n * b))
    np.testing.assert_allclose(np.asarray(rho), expected, atol=1e-5)
    if b == 1:
        assert expected[1, 2, 3] == pytest.approx(1.0 + 0.75 * 0.5 - 1.0)


@pytest.mark.parametrize("pdims", PDIMS_8)
def test_distributed_paint_and_read_match_single_device(pdims):
    disp = _disp(1.0)
    ref_mesh = parallel.make_mesh((1, 1))
    ref_grid = Grid(ref_mesh, N, 2, L, 4)
    ref_rho, _ = painting.paint(disp, ref_grid, mass=8.0)
    ref_val, _ = painting.read(ref_rho, disp, ref_grid)
    mesh = parallel.make_mesh(pdims)
    d = jax.device_put(disp, parallel.field_sharding(mesh))
    grid = Grid(mesh, N, 2, L, 4)
    rho, needed = painting.paint(d, grid, mass=8.0)
    painting.check_halo(needed, 4)
    assert rho.sharding.is_equivalent_to(parallel.field_sharding(mesh), 3)
    val, _ = painting.read(rho, d, grid)
    assert rel_diff(rho, ref_rho) <= 1e-5
    assert rel_diff(val, ref_val) <= 1e-5


def test_particle_beyond_halo_raises_named_error():
    mesh = parallel.make_mesh((2, 4))
    disp = np.zeros((N, N, N, 3), np.float32)
    disp[7, 3, 3, 0] = 5 * L / N  # last row of the first x block, five cells on
    d = jax.device_put(jnp.asarray(disp), parallel.field_sharding(mesh))
    _, needed = painting.paint(d, Grid(mesh, N, 1, L, 2))
    with pytest.raises(painting.HaloError, match="parallel.halo_cells"):
        painting.check_halo(needed, 2)
    _, needed_read = painting.read(jnp.ones((N,) * 3), d, Grid(mesh, N, 1, L, 2))
    assert int(needed_read) == int(needed) >= 5


def test_halo_wider_than_block_is_rejected():
    mesh = parallel.make_mesh((1, 8))
    with pytest.raises(ValueError, match="parallel.halo_cells = 3"):
        painting.paint(jnp.zeros((N, N, N, 3)), Grid(mesh, N, 1, L, 3))


def test_cic_compensation_flattens_window():
    from pmpipe.physics.statistics import stats

    mesh = parallel.make_mesh((1, 1))
    n = 32
    # Poisson-like random particle positions: after compensation the shot noise is flat.
    disp = jax.random.uniform(jax.random.key(3), (n, n, n, 3), minval=0, maxval=L)
    rho, _ = painting.paint(disp, Grid(mesh, n, 1, L, 1))
    delta = rho - 1
    _, p_raw, _ = stats.power_spectrum(delta, mesh, L)
    _k, p_comp, _ = stats.power_spectrum(delta, mesh, L, compensate_cic=True)
    shot = L**3 / n**3
    mid = slice(2, n // 4)
    assert np.abs(p_comp[mid] / shot - 1).max() < 0.25
    assert p_raw[n // 4] < 0.85 * shot  # the uncompensated window suppresses it
