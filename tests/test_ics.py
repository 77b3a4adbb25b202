import jax
import numpy as np
import pytest
from conftest import PDIMS_8, rel_diff

from pmpipe.physics.evolution import ics
from pmpipe.physics.mesh import fft
from pmpipe.physics.statistics import stats
from pmpipe.physics.theory import cosmology as C
from pmpipe.runtime import parallel

N, L = 32, 256.0
COSMO = C.Cosmology()


def power(k):
    return C.linear_power_eisenstein_hu(COSMO, k)


def _mode_averaged_input(mesh, modes):
    """Input P(k) averaged over the very modes of each bin (what a perfect field gives)."""
    k = fft.wavenumber(modes, mesh, L)
    w = np.broadcast_to(np.asarray(fft.mode_weights(modes, mesh)), modes.shape).ravel()
    kk = np.asarray(k).ravel()
    idx = np.floor(kk / (2 * np.pi / L) + 0.5).astype(int)
    pk = np.asarray(power(kk))
    n_bins = N // 2
    num = np.bincount(idx, w * pk, minlength=n_bins + 1)[1 : n_bins + 1]
    den = np.bincount(idx, w, minlength=n_bins + 1)[1 : n_bins + 1]
    return num / den


def test_fixed_amplitude_field_reproduces_input_power():
    mesh = parallel.make_mesh((1, 1))
    noise = ics.white_noise(7, N, mesh)
    delta = ics.linear_density(noise, power, L, mesh, fixed_amplitude=True)
    _k, pk, count = stats.power_spectrum(delta, mesh, L)
    expected = _mode_averaged_input(mesh, ics.linear_modes(noise, power, L, mesh))
    assert np.all(count > 0)
    np.testing.assert_allclose(pk, expected, rtol=1e-3)


def test_random_field_power_within_cosmic_variance():
    mesh = parallel.make_mesh((1, 1))
    delta = ics.linear_density(ics.white_noise(3, N, mesh), power, L, mesh)
    k, pk, count = stats.power_spectrum(delta, mesh, L)
    expected = np.asarray(power(k))
    sigma = np.sqrt(2 / count)  # relative scatter of a Gaussian band power
    pull = (pk / expected - 1) / sigma
    # finite bins: power varies inside a bin, so allow for that in the widest low-k bins
    assert np.mean(np.abs(pull[2:]) < 3) > 0.9


def test_paired_field_is_exactly_inverted():
    mesh = parallel.make_mesh((1, 1))
    noise = ics.white_noise(11, N, mesh)
    a = ics.linear_density(noise, power, L, mesh, fixed_amplitude=True)
    b = ics.linear_density(noise, power, L, mesh, fixed_amplitude=True, paired=True)
    np.testing.assert_allclose(np.asarray(a), -np.asarray(b), atol=1e-6)


def test_white_noise_is_standard_normal():
    noise = np.asarray(ics.white_noise(5, N, parallel.make_mesh((1, 1))))
    assert abs(noise.mean()) < 5 / np.sqrt(noise.size)
    assert noise.std() == pytest.approx(1.0, abs=0.02)


@pytest.mark.parametrize("pdims", PDIMS_8)
def test_noise_and_field_do_not_depend_on_decomposition(pdims):
    ref_mesh = parallel.make_mesh((1, 1))
    ref_noise = ics.white_noise(42, N, ref_mesh)
    ref = ics.linear_density(ref_noise, power, L, ref_mesh)
    mesh = parallel.make_mesh(pdims)
    noise = ics.white_noise(42, N, mesh)
    assert noise.sharding.is_equivalent_to(parallel.field_sharding(mesh), 3)
    assert len(noise.addressable_shards) == 8
    np.testing.assert_array_equal(np.asarray(noise), np.asarray(ref_noise))
    delta = jax.jit(lambda w: ics.linear_density(w, power, L, mesh))(noise)
    assert rel_diff(delta, ref) <= 1e-5


def test_different_seeds_differ():
    mesh = parallel.make_mesh((1, 1))
    a, b = (np.asarray(ics.white_noise(s, N, mesh)) for s in (1, 2))
    assert abs(np.corrcoef(a.ravel(), b.ravel())[0, 1]) < 0.02


def test_ics_of_grids_that_differ_in_force_mesh_and_halo_are_one_program():
    """initial_conditions on 16³ particles with B = 2 and an 8-cell halo, then with B = 1 and a
    2-cell halo: the second compiles nothing and gives the same fields (the ICs read the
    particle grid alone)."""
    from pmpipe.physics.evolution import simulation
    from pmpipe.physics.mesh import domain
    from pmpipe.runtime import compilation

    mesh = parallel.make_mesh((1, 2))
    cosmo = C.tabulated(C.Cosmology())
    noise = ics.white_noise(5, 16, mesh)
    fields, counts = [], []
    for oversample, halo in ((2, 8), (1, 2)):
        grid = domain.Grid(mesh, 16, oversample, 64.0, halo)
        with compilation.CompileCounter() as counter:
            made = simulation.initial_conditions(
                cosmo, noise, simulation.power_function(cosmo), grid, 0.1
            )
            fields.append(jax.block_until_ready(made.disp))
        counts.append(counter.counts)
    assert counts[0].programs > 0 and counts[1].programs == 0, counts[1].names
    np.testing.assert_array_equal(np.asarray(fields[0]), np.asarray(fields[1]))
