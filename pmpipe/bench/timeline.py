"""A campaign's timeline: when each run's stages, their physics phases and the writes of their
stores ran, from the records its jobs write (pmpipe.job.pipeline.job_record), as data and as a
figure (``pmpipe bench campaign``)."""

from __future__ import annotations

from pathlib import Path

from pmpipe.storage.writes import covered

STAGE_COLOURS = {"ic": "#c7dcef", "nbody": "#fdd0a2", "lensing": "#c7e9c0", "summaries": "#dadaeb"}
PHASE_COLOURS = {
    "white_noise": "#6baed6",
    "lpt": "#2171b5",
    "pm_steps": "#e6550d",
    "lensing": "#31a354",
    "statistics": "#756bb1",
}


def busy(stages: list[dict]) -> dict:
    """Seconds of the stages' records (their ``timeline``s) inside some physics phase, inside
    some write of their stores, and inside both: spans that overlap (the tail of one run and
    the N-body of the next, in an overlapped job) count once."""
    physics = [span for s in stages for _, *span in s["timeline"]["phases"]]
    writes = [span for s in stages for span in s["timeline"]["writes"]]
    physics_s, write_s = covered(physics), covered(writes)
    return {
        "physics_s": physics_s,
        "write_s": write_s,
        "physics_while_writing_s": physics_s + write_s - covered(physics + writes),
    }


def runs_timeline(jobs: list[dict]) -> list[dict]:
    """Every run of the jobs with its stages, in seconds from the first stage's start (of any
    job), and its :func:`busy` seconds: ``{"job", "run_id", "physics_s", "write_s",
    "physics_while_writing_s", "stages": [{"stage", "start", "end", "phases": [[phase, start,
    end]], "writes": [[start, end]]}]}``."""
    starts = [s["timeline"]["start"] for job in jobs for run in job["runs"] for s in run["stages"]]
    origin = min(starts, default=0.0)

    def shifted(span):
        return [round(t - origin, 3) for t in span]

    return [
        {
            "job": index,
            "run_id": run["run_id"],
            **{name: round(seconds, 3) for name, seconds in busy(run["stages"]).items()},
            "stages": [
                {
                    "stage": stage["stage"],
                    "start": round(stage["timeline"]["start"] - origin, 3),
                    "end": round(stage["timeline"]["end"] - origin, 3),
                    "phases": [[p, *shifted(span)] for p, *span in stage["timeline"]["phases"]],
                    "writes": [shifted(span) for span in stage["timeline"]["writes"]],
                }
                for stage in run["stages"]
            ],
        }
        for index, job in enumerate(jobs)
        for run in job["runs"]
    ]


def draw(timeline: list[dict], path: str | Path, title: str) -> None:
    """The timeline as a PNG: a row per run, each stage a pale bar, its physics phases bars of
    their colour over it, its writes (its store's, checkpoints') black bars under it."""
    from pmpipe.results.plotting import pyplot, save_figure

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(11, 2.4 + 0.45 * len(timeline)))
    for row, run in enumerate(timeline):
        for stage in run["stages"]:
            width = stage["end"] - stage["start"]
            ax.barh(
                row, width, left=stage["start"], height=0.8, color=STAGE_COLOURS[stage["stage"]]
            )
            for phase, start, end in stage["phases"]:
                ax.barh(row, end - start, left=start, height=0.5, color=PHASE_COLOURS[phase])
            for start, end in stage["writes"]:
                ax.barh(row + 0.32, end - start, left=start, height=0.12, color="black")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in STAGE_COLOURS.values()]
    handles += [plt.Rectangle((0, 0), 1, 1, color=c) for c in PHASE_COLOURS.values()]
    handles.append(plt.Rectangle((0, 0), 1, 1, color="black"))
    labels = [*STAGE_COLOURS, *PHASE_COLOURS, "writes"]
    ax.legend(handles, labels, fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_yticks(range(len(timeline)), [f"{r['run_id']} (job {r['job']})" for r in timeline])
    ax.invert_yaxis()
    ax.set_xlabel("seconds from the first stage's start")
    ax.set_title(title)
    save_figure(fig, path)
