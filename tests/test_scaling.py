"""`pmpipe bench scaling` on 8 fake CPU devices in one process and on 2 processes under
mpiexec: the record's structure, equal results across device counts, the bytes model against
the compiled step and the trace (structure and results only: fake devices measure no speed)."""

import json
import os
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest
from conftest import job_env

from pmpipe import cli
from pmpipe.bench import collectives, scaling, trace
from pmpipe.campaigns import step_timing
from pmpipe.physics.mesh import domain
from pmpipe.runtime import parallel

N, HALO = 16, 2
ARGS = ["bench", "scaling", "--particles", str(N), "--halo", str(HALO), "--repeat", "1"]


def _bench(tmp_path, launcher=(), extra=()):
    env = job_env()  # the bench asks for its own
    out = subprocess.run(
        [
            *launcher,
            sys.executable,
            "-m",
            "pmpipe.cli",
            *ARGS,
            "--json",
            str(tmp_path / "scaling.json"),
            *extra,
        ],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads((tmp_path / "scaling.json").read_text()), out.stdout


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("scaling")
    record, table = _bench(  # 4 devices: under mpiexec below
        tmp,
        extra=[
            "--devices",
            "1",
            "8",
            "--plot",
            str(tmp / "scaling.png"),
            "--trace",
            str(tmp / "trace"),
        ],
    )
    return tmp, record, table


def _permutes_per_step(pdims):
    """Collective-permutes of one step: two halo slabs per split axis in painting, and for each
    of the three force components in reading."""
    return 2 * (1 + collectives.FORCE_COMPONENTS) * sum(p > 1 for p in pdims)


@pytest.mark.slow
def test_strong_and_weak_rows_on_1_and_8_devices(one_process):
    tmp, record, table = one_process
    assert (record["benchmark"], record["processes"], record["devices"]) == (
        "scaling",
        1,
        [1, 8],
    )
    strong = [(r["devices"], tuple(r["pdims"]), r["decomposition"]) for r in record["strong"]]
    assert strong == [(1, (1, 1), "single"), (8, (8, 1), "slab"), (8, (2, 4), "pencil")]
    for row in record["strong"] + record["weak"]:
        assert all(row[part] > 0 for part in scaling.PARTS), row
        assert row["efficiency"] > 0
        model, compiled = row["bytes_model"], row["bytes_compiled"]
        assert model["fft"] == compiled.get("all-to-all", 0)
        assert model["halo"] == compiled.get("collective-permute", 0)
    base = record["strong"][0]
    assert base["efficiency"] == 1.0 and base["result"]["max_rel_diff"] == 0.0
    for row in record["strong"][1:]:  # the same particles after one step on every device count
        assert row["particles"] == N and row["result"]["max_rel_diff"] <= 1e-5, row
        assert row["efficiency"] == pytest.approx(base["step_s"] / row["step_s"] / row["devices"])
    cells = [r["cells_per_device"] for r in record["weak"]]
    assert [r["particles"] for r in record["weak"]][-1] == 2 * N  # 8 devices: (2N)^3
    assert max(cells) / min(cells) < 1.3, cells
    assert table.splitlines()[0].split()[:3] == ["scaling", "devices", "pdims"]
    rows = [
        line.split()[0] for line in table.splitlines()[1:] if line.split()[0] in scaling.SCALINGS
    ]
    assert rows == ["strong"] * len(record["strong"]) + ["weak"] * len(record["weak"])
    assert (tmp / "scaling.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_trace_of_the_most_devices_and_its_summary(one_process):
    tmp, record, table = one_process
    summary = record["trace"]
    assert (summary["devices"], summary["pdims"]) == (8, [8, 1])
    assert os.path.getsize(summary["path"]) > 0 and summary["path"].startswith(str(tmp / "trace"))
    assert set(summary["seconds_per_step"]) == set(trace.CATEGORIES)
    seconds = summary["seconds_per_step"]
    for category in ("fft", "collectives", "painting", "reading"):
        assert seconds[category] > 0, seconds
    # per step and device: no more than the wall time of a step, give or take the overlaps
    assert sum(seconds.values()) <= 3 * summary["wall_s_per_step"]
    # the trace runs the collectives that the bytes model counts
    counts = summary["collectives_per_step"]
    assert counts["all-to-all"] == collectives.TRANSFORMS_PER_STEP * len(
        collectives.transposes((8, 1))
    )
    assert counts["collective-permute"] == _permutes_per_step((8, 1))
    assert "collectives a step and device: 4 all-to-all, 8 collective-permute" in table


@pytest.mark.slow
def test_two_processes_under_mpiexec_give_the_results_of_one(one_process, tmp_path):
    assert shutil.which("mpiexec"), "mpiexec missing: pip install mpich mpi4py (the [test] extra)"
    record, _ = _bench(
        tmp_path,
        [shutil.which("mpiexec"), "-n", "2"],
        ["--devices", "4", "--scaling", "strong"],  # a slab and a pencil across the processes
    )
    assert (record["processes"], record["launcher"], record["devices"]) == (2, "mpi", [4])
    rows = [(r["devices"], tuple(r["pdims"])) for r in record["strong"]]
    assert rows == [(4, (4, 1)), (4, (2, 2))]
    one = one_process[1]["strong"][0]["result"]  # one device of one process
    for row in record["strong"]:
        assert row["result"]["max_rel_diff"] <= 1e-5
        for key in ("disp_rms", "mom_rms"):
            assert row["result"][key] == pytest.approx(one[key], rel=1e-5)
        assert row["bytes_model"]["fft"] == row["bytes_compiled"]["all-to-all"]


@pytest.mark.parametrize(
    "pdims,oversample",
    [
        ((8, 1), 1),
        ((2, 4), 1),
        ((1, 1), 1),
        pytest.param((1, 8), 1, marks=pytest.mark.slow),
        pytest.param((4, 2), 2, marks=pytest.mark.slow),
        pytest.param((2, 1), 1, marks=pytest.mark.slow),
    ],
)
def test_bytes_model_equals_the_collectives_of_the_compiled_step(pdims, oversample):
    mesh = parallel.make_mesh(pdims)
    grid = domain.Grid(mesh, N, oversample, step_timing.BOX_SIZE, HALO)
    field = jax.ShapeDtypeStruct((N, N, N, 3), np.float32, sharding=parallel.field_sharding(mesh))
    program = step_timing.pm_step.lower(field, field, 0.3, grid=grid).compile().as_text()
    found = collectives.bytes_by_kind(program)
    model = collectives.bytes_per_step(grid.force_cells, pdims, HALO)
    assert found.get("all-to-all", 0) == model["fft"]
    assert found.get("collective-permute", 0) == model["halo"]
    assert found.get("all-reduce", 0) <= 64  # the halo check: one integer
    assert set(found) <= {"all-to-all", "collective-permute", "all-reduce"}
    assert model["fft_sent"] <= model["fft"] and model["halo_sent"] == model["halo"]
    kinds = [kind for kind, _, _ in collectives.in_program(program)]
    assert kinds.count("collective-permute") == _permutes_per_step(pdims)
    categories = set(trace.categories(program).values())
    assert {"fft", "painting", "reading"} <= categories
    assert ("collectives" in categories) == (pdims != (1, 1))


def test_decompositions_and_weak_grids():
    assert scaling.decompositions_of(1, 32, 1, 4) == {"single": (1, 1)}
    assert scaling.decompositions_of(8, 32, 1, 4) == {"slab": (8, 1), "pencil": (2, 4)}
    assert scaling.decompositions_of(8, 16, 1, 4) == {"pencil": (2, 4)}  # slabs 2 cells wide
    assert scaling.decompositions_of(2, 32, 1, 4) == {"slab": (2, 1)}
    assert scaling.decompositions_of(8, 32, 1, 4, ["slab"]) == {"slab": (8, 1)}
    assert [
        scaling.weak_particles(32, 1, d, p)
        for d, p in [(1, (1, 1)), (2, (2, 1)), (4, (4, 1)), (4, (2, 2)), (8, (8, 1))]
    ] == [32, 40, 52, 50, 64]


def test_options_that_split_nothing_are_refused_before_jax_starts(capsys):
    code = cli.main(
        [
            "bench",
            "scaling",
            "--particles",
            "16",
            "--halo",
            "4",
            "--devices",
            "8",
            "--decompositions",
            "slab",
        ]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert "--devices 8" in err and "--halo 4" in err and "--particles 16" in err
