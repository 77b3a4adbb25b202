"""Accuracy of the time stepping and of the force mesh against converged references, and the
resolved ranges pmpipe derives from them (pmpipe.bench.validation.accuracy, pmpipe.physics.statistics.resolution)."""

import math

import numpy as np
import pytest

from pmpipe.bench.validation import accuracy
from pmpipe.physics.evolution import simulation, timesteps
from pmpipe.physics.lensing import projection
from pmpipe.physics.statistics import resolution
from pmpipe.physics.theory import cosmology

STEP_TOLERANCE = 0.01  # docs/validation.md: measured 0.37-0.56 % for 10 steps at 32^3, 128 Mpc/h


def test_step_spacings_are_equal_in_their_variable():
    log_a = timesteps.step_boundaries(0.1, 1.0, 5, spacing="log_a")
    np.testing.assert_allclose(np.diff(np.log(log_a)), math.log(10) / 5, rtol=1e-12)
    cosmo = cosmology.Cosmology()
    cosmo = cosmology.tabulated(cosmo)

    def growth(a):
        return cosmology.on_host(cosmology.growth_factor, cosmo, a)

    bounds = timesteps.step_boundaries(0.1, 1.0, 8, (0.5,), spacing="growth", growth=growth)
    d1 = growth(np.delete(bounds, np.flatnonzero(np.isclose(bounds, 0.5))))
    np.testing.assert_allclose(np.diff(d1), (d1[-1] - d1[0]) / 8, rtol=1e-4)
    assert np.isclose(bounds, 0.5).any()  # the snapshot became a boundary
    with pytest.raises(ValueError, match="nbody.spacing must be one of a, log_a, growth"):
        timesteps.step_boundaries(0.1, 1.0, 5, spacing="sqrt_a")
    with pytest.raises(ValueError, match="needs the run's growth factor"):
        timesteps.step_boundaries(0.1, 1.0, 5, spacing="growth")


@pytest.mark.slow
def test_ten_steps_of_every_spacing_match_a_converged_reference():
    record = accuracy.bench_steps(32, 128.0, 10, 64)
    assert record["reference_error"]["pk_rel_diff"] < 0.1 * STEP_TOLERANCE  # converged
    for spacing, acc in record["spacings"].items():
        assert acc["pk_rel_diff"] < STEP_TOLERANCE, (spacing, acc)
        assert acc["r_min"] > 0.999, (spacing, acc)


def test_k_max_valid_follows_the_measured_power_transfer():
    for box, oversample in ((256.0, 1), (256.0, 2), (512.0, 2), (128.0, 1)):
        k_nyquist = math.pi * 64 / box
        k_valid = resolution.k_max_valid(64, box, oversample)
        assert 0 < k_valid <= k_nyquist
        k = np.linspace(0, k_valid, 50)
        assert np.all(np.abs(resolution.power_transfer(k, 64, box, oversample) - 1) <= 0.05 + 1e-9)
        if k_valid < k_nyquist:
            off = abs(resolution.power_transfer(k_valid, 64, box, oversample) - 1)
            assert off == pytest.approx(0.05)
        assert resolution.power_transfer(1.01 * k_nyquist, 64, box, oversample) == 0.0
    # a finer force mesh resolves more; between measured spacings the transfer lies between theirs
    assert resolution.k_max_valid(64, 256.0, 2) > resolution.k_max_valid(64, 256.0, 1)
    t = [
        float(resolution.power_transfer(0.5 * math.pi * 64 / box, 64, box, 1))
        for box in (128, 181, 256)
    ]
    assert min(t[0], t[2]) <= t[1] <= max(t[0], t[2])


def test_resolved_multipoles_shrink_with_the_force_resolution():
    cosmo = cosmology.Cosmology()
    cosmo = cosmology.tabulated(cosmo)
    power = simulation.power_function(cosmo)
    chi_s = float(cosmology.comoving_distance(cosmo, 0.5))
    edges = np.linspace(0, chi_s, 9)

    def ranges(k_high, box):
        def transfer(k, plane):
            return (k <= k_high).astype(float)

        return resolution.resolved_multipoles(
            cosmo,
            power,
            edges,
            box,
            transfer,
            projection.single_plane(chi_s),
            resolution.MultipoleRange(10, 3000, "lo", "hi"),
        )

    everything = ranges(1e3, 1e5)
    assert (everything.ell_min, everything.ell_max) == (10, 3000)
    assert (everything.min_reason, everything.max_reason) == ("lo", "hi")
    coarse, fine = ranges(0.2, 1e5), ranges(0.4, 1e5)
    assert coarse.ell_max < fine.ell_max < 3000 and coarse.max_reason.startswith("resolution:")
    # at ell_max the modes above k_high carry at most LIMBER_TOLERANCE of the integral
    chi, integrand, _ = projection.limber_integrand(
        cosmo, [fine.ell_max], projection.single_plane(chi_s), power
    )
    above = (fine.ell_max + 0.5) / chi > 0.4
    assert integrand[0, above].sum() / integrand.sum() <= resolution.LIMBER_TOLERANCE
    small_box = ranges(1e3, 256.0)
    assert small_box.ell_min > 10 and small_box.min_reason.startswith("geometry:")
    assert ranges(1e-3, 1e5).ell_max == 0.0  # nothing resolved: an empty range


def test_thin_planes_lose_power_at_low_multipoles_and_box_thick_slabs_none():
    power = simulation.power_function(cosmology.Cosmology())
    k = np.array([0.02, 0.05, 0.1, 0.3])
    slab = resolution.thickness_transfer(k, 256.0, 256.0, power)
    np.testing.assert_allclose(slab, 1.0, rtol=1e-12)  # only the box's k_par = 0 modes
    half = resolution.thickness_transfer(k, 128.0, 256.0, power)
    shell = resolution.thickness_transfer(k, 256.0, 256.0, power, oversampling=4)
    for t in (half, shell):
        assert np.all(t < 1) and np.all(np.diff(t) > 0)  # the shortfall shrinks with k
    assert np.all(half < shell)


def test_the_step_benchmark_compares_every_spacing_with_its_reference_at_tiny_sizes():
    """`pmpipe bench steps` at 16^3: a record per spacing; 2 steps equal in ln a are the
    reference's own half, so their error is the reference's."""
    record = accuracy.bench_steps(16, 128.0, 2, 4)
    assert set(record["spacings"]) == set(timesteps.STEP_SPACINGS)
    assert all(math.isfinite(acc["pk_rel_diff"]) for acc in record["spacings"].values())
    same = record["spacings"]["log_a"]["pk_rel_diff"]
    assert same == pytest.approx(record["reference_error"]["pk_rel_diff"], rel=1e-6)
