"""The OpenMP threads a job process leaves its host libraries (pmpipe.runtime.openmp)."""

import pytest

from pmpipe.runtime import openmp


@pytest.mark.parametrize(
    ("cpus", "threads"), [(1, 1), (2, 2), (3, 3), (4, 3), (8, 6), (16, 12), (72, 54)]
)
def test_a_team_leaves_a_quarter_of_the_cores_to_the_job_s_other_work(cpus, threads):
    assert openmp.threads_for(cpus) == threads


def test_the_thread_count_is_set_from_the_usable_cores_unless_the_user_set_one():
    environ: dict[str, str] = {}
    assert openmp.leave_spare_cores(environ) == openmp.threads_for(openmp.usable_cores())
    assert environ["OMP_NUM_THREADS"] == str(openmp.threads_for(openmp.usable_cores()))
    chosen = {"OMP_NUM_THREADS": "5"}
    assert openmp.leave_spare_cores(chosen) == 5 and chosen == {"OMP_NUM_THREADS": "5"}
    assert openmp.threads_in_force(chosen) == "5" and openmp.threads_in_force({}) is None
