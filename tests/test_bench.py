import numpy as np
import pytest

from pmpipe import bench, ics, parallel, simulation


def _final_like(n=16):
    """A 2LPT displacement field at a = 0.5: structure on all scales, no PM needed."""
    mesh = parallel.make_mesh((1, 1))
    noise = ics.white_noise(3, n, mesh)
    init = simulation.initial_conditions(bench.COSMOLOGY, noise, bench.POWER, mesh,
                                         bench.BOX_SIZE, 0.5)
    return np.asarray(init.disp), mesh


def test_accuracy_of_a_run_against_itself_is_perfect():
    disp, mesh = _final_like()
    acc = bench.accuracy(disp, disp, mesh, halo=4)
    assert acc["pk_rel_diff_lowk"] == pytest.approx(0.0, abs=1e-6)
    assert acc["pk_rel_diff"] == pytest.approx(0.0, abs=1e-6)
    assert acc["r_min"] == pytest.approx(1.0, abs=1e-6)


def test_accuracy_sees_amplitude_and_phase_errors():
    disp, mesh = _final_like()
    scaled = bench.accuracy(1.05 * disp, disp, mesh, halo=4)
    assert 0.05 < scaled["pk_rel_diff_lowk"] < 0.15  # ≈ 1.05² - 1 in the linear regime
    assert scaled["r_min"] > 0.999
    rng = np.random.default_rng(0)
    noisy = disp + rng.normal(0.0, 2.0 * disp.std(), disp.shape).astype(disp.dtype)
    assert bench.accuracy(noisy, disp, mesh, halo=4)["r_min"] < 0.999
