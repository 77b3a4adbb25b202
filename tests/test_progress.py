"""Progress a user sees: the N-body's line at a fixed interval (step, a, time, time left) and
a packed job's line per finished run (runs done and left, time left, the log's path)."""

from pathlib import Path

import pytest

from pmpipe.job import outcomes
from pmpipe.stages import progress
from pmpipe.stages.progress import StepClock


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_the_evolution_reports_at_most_once_an_interval_with_the_time_left():
    lines, clock = [], FakeClock()
    bounds = [0.1 * (i + 1) for i in range(11)]  # 10 steps
    steps = StepClock(lines.append, bounds, done=0, interval=30.0, clock=clock)
    for step, seconds in zip(range(1, 11), [25, 10, 10, 10, 10, 10, 10, 10, 10, 10], strict=True):
        clock.now += seconds  # the first step compiles
        steps.after(step)
    assert lines == [
        "step 2 of 10 (a = 0.3), about 80 s left",
        "step 5 of 10 (a = 0.6), about 50 s left",
        "step 8 of 10 (a = 0.9), about 20 s left",
    ]


def test_a_resumed_evolution_counts_its_steps_from_the_checkpoint():
    lines, clock = [], FakeClock()
    steps = StepClock(lines.append, [0.1, 0.4, 0.7, 1.0], done=2, interval=0.0, clock=clock)
    clock.now = 4.0
    steps.after(3)  # the last step: nothing left to report
    assert lines == []
    steps = StepClock(lines.append, [0.1, 0.4, 0.7, 1.0], done=1, interval=0.0, clock=clock)
    clock.now += 6.0
    steps.after(2)
    assert lines == ["step 2 of 3 (a = 0.7), about 6 s left"]


def outcome(run_id: str, seconds: float, error: str | None = None, made: bool = True):
    """A run's outcome: its stages computed here (``made``), in ``seconds``, or failed."""
    stage = "nbody" if error else None
    records = (outcomes.StageRecord("ic", seconds, {}, {}, {}, 0, {}),) if made else ()
    return outcomes.Outcome(
        Path(f"{run_id}/config.json"), run_id, records, (), seconds, error, stage
    )


def test_the_job_line_after_each_run_says_what_is_left_and_where_the_log_is():
    done = [outcome("a-r0", 40.0), outcome("a-r1", 12.0)]
    line = progress.job_line(done, 6, "results/a/logs/job0000.log", bar=False)
    assert line == (
        "a-r1 done in 12.0 s; 2 of 6 runs, 4 left, about 48 s more "
        "(log: results/a/logs/job0000.log)"
    )
    done.append(outcome("a-r2", 3.0, error="boom"))
    line = progress.job_line(done, 3, "job.log", bar=True)
    assert (
        line
        == "[####################] a-r2 FAILED in nbody; 3 of 3 runs, 1 failed, 0 left (log: job.log)"
    )


def test_complete_and_failed_runs_do_not_lower_the_time_left():
    done = [
        outcome("a", 30.0),
        outcome("b", 0.1, made=False),
        outcome("c", 10.0),
        outcome("d", 1.0, error="boom"),
    ]
    assert "2 left, about 20 s more" in progress.job_line(done, 6, "log", bar=False)


@pytest.mark.parametrize(("seconds", "said"), [(45, "45 s"), (200, "3.3 min"), (9000, "2.5 h")])
def test_durations_read_in_their_unit(seconds, said):
    done = [outcome("a", 1.0), outcome("b", seconds)]
    assert f"about {said} more" in progress.job_line(done, 3, "log", bar=False)
