"""The Snakemake workflow end to end on a tiny campaign: every store, the manifest and the
report; a second run does nothing; a deleted or incomplete store is recomputed, alone."""

import csv
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import zarr
from conftest import CAMPAIGN_FIGURES, COLLECT, REPO, RUN_FIGURES, TINY, finished, run_snakemake
from conftest import snakemake_tiny as snakemake

from pmpipe.storage import store

STAGES = ("ic", "nbody", "lensing", "summaries")
# what a rerun leaves out when no assertion reads the figures it would draw again
NO_FIGURES = ("--omit-from", RUN_FIGURES, CAMPAIGN_FIGURES)


def stamps(runs_dir):
    """Completion time of every stage store of every run."""
    return {
        (run.name, s): (
            finished(run / f"{s}.zarr"),
            (run / f"{s}.zarr" / "zarr.json").stat().st_mtime_ns,
        )
        for run in sorted(runs_dir.iterdir())
        if (run / "config.json").exists()
        for s in STAGES
    }


@pytest.fixture(scope="module")
def campaign(tiny_local, tmp_path_factory):
    """A copy of the tiny workflow's folder (its results and Snakemake's records) that this
    module's tests change; the session's own stays the reference of the others."""
    return shutil.copytree(tiny_local, tmp_path_factory.mktemp("campaign") / "workflow")


@pytest.mark.slow
def test_first_run_writes_every_store_manifest_and_figures(campaign):
    results = campaign / "results" / "tiny"
    runs = ["tiny-fiducial-r0", "tiny-fiducial-r1"]
    for run in runs:
        for stage in STAGES:
            assert store.is_complete(results / run / f"{stage}.zarr"), (run, stage)
        assert (results / "report" / run / "pk.png").stat().st_size > 1000
        assert (results / "report" / run / "slice.png").stat().st_size > 1000
        assert (results / "report" / run / "kappa.png").stat().st_size > 1000
        assert (results / "report" / run / "cl.png").stat().st_size > 1000
    assert (results / "benchmarks" / "job0000.tsv").exists()  # both runs in one job
    assert store.is_complete(results / "summaries.zarr")
    assert (results / "report" / "pk_ratio.png").exists()
    assert (results / "report" / "peaks.png").exists()
    assert (results / "report" / "cl_ratio.png").stat().st_size > 10_000
    rows = list(csv.DictReader((results / "manifest.csv").open()))
    assert [r["run_id"] for r in rows] == runs
    assert all(r["status"] == "done" for r in rows)
    assert rows[0]["seed"] != rows[1]["seed"]
    import xarray as xr

    ds = xr.open_zarr(results / "summaries.zarr")
    assert ds.pk.dims == ("run", "a", "k") and list(ds.run.values) == runs
    assert "seed" in ds.pk.coords
    assert ds.cl.dims == ("run", "source", "source2", "ell") and ds.peaks.dims == (
        "run",
        "source",
        "smoothing",
        "kappa",
    )


@pytest.mark.slow
def test_second_run_does_nothing(campaign):
    before = stamps(campaign / "results" / "tiny")
    out = snakemake(campaign)
    assert "Nothing to be done" in out.stdout + out.stderr
    assert stamps(campaign / "results" / "tiny") == before


@pytest.mark.slow
def test_a_deleted_store_and_a_store_without_marker_are_recomputed_alone(campaign):
    """One run's N-body store deleted, the other run's summaries stripped of its marker: the
    next snakemake makes those stores and the stores after them, nothing else (the figures,
    which no assertion here reads, left out)."""
    runs_dir = campaign / "results" / "tiny"
    before = stamps(runs_dir)
    shutil.rmtree(runs_dir / "tiny-fiducial-r0" / "nbody.zarr")
    target = runs_dir / "tiny-fiducial-r1" / "summaries.zarr"
    del zarr.open_group(target, mode="r+").attrs[store.COMPLETE]
    out = snakemake(campaign, *NO_FIGURES)
    assert "no completion marker" in out.stderr
    assert store.is_complete(target)
    after = stamps(runs_dir)
    changed = {key for key in before if before[key] != after[key]}
    assert changed == {
        ("tiny-fiducial-r0", "nbody"),
        ("tiny-fiducial-r0", "lensing"),
        ("tiny-fiducial-r0", "summaries"),
        ("tiny-fiducial-r1", "summaries"),
    }


@pytest.mark.slow
def test_damaged_stores_are_found_by_verify_and_recomputed(campaign, capsys):
    """A deleted chunk is found when the workflow plans; a changed byte by `pmpipe verify`,
    which takes the store's marker off: the next snakemake makes both stores again, alone."""
    from pmpipe import cli

    runs_dir = campaign / "results" / "tiny"
    deleted = runs_dir / "tiny-fiducial-r0" / "lensing.zarr"
    changed = runs_dir / "tiny-fiducial-r1" / "summaries.zarr"
    next(f for f in (deleted / "kappa" / "c").rglob("*") if f.is_file()).unlink()
    chunk = next(f for f in (changed / "pk" / "c").rglob("*") if f.is_file())
    data = chunk.read_bytes()
    chunk.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))
    before = stamps(runs_dir)
    assert cli.main(["verify", str(runs_dir)]) == 1
    out = snakemake(campaign, *NO_FIGURES)
    assert "shard kappa/c/" in out.stderr and "is missing" in out.stderr
    assert cli.main(["verify", str(runs_dir)]) == 0
    after = stamps(runs_dir)
    assert {key for key in before if before[key] != after[key]} == {
        ("tiny-fiducial-r0", "lensing"),
        ("tiny-fiducial-r0", "summaries"),
        ("tiny-fiducial-r1", "summaries"),
    }
    part = runs_dir / "parts" / "job0000.zarr"  # verify reads a job's part whole
    chunk = next(f for f in (part / "pk" / "c").rglob("*") if f.is_file())
    chunk.write_bytes(b"x" * chunk.stat().st_size)
    capsys.readouterr()
    assert cli.main(["verify", "--report-only", str(part)]) == 1
    assert "does not read as a job's part of the campaign summaries" in capsys.readouterr().out
    shutil.rmtree(part)  # collection reads the runs' own stores


@pytest.mark.slow
def test_a_foreign_store_and_an_edited_zarr_json_are_made_again(campaign):
    """Another run's nbody.zarr copied over this run's (another config hash) and an array's
    zarr.json edited to big-endian: the workflow finds both when it plans and makes them (and
    the stores after them) again."""
    import json

    from pmpipe import cli

    runs_dir = campaign / "results" / "tiny"
    r0, r1 = runs_dir / "tiny-fiducial-r0", runs_dir / "tiny-fiducial-r1"
    shutil.rmtree(r0 / "nbody.zarr")
    shutil.copytree(r1 / "nbody.zarr", r0 / "nbody.zarr")
    meta_path = r1 / "summaries.zarr" / "pk" / "zarr.json"
    meta = json.loads(meta_path.read_text())
    (sharding,) = meta["codecs"]  # the chunks' byte order, inside the shards
    inner = sharding["configuration"]["codecs"]
    next(c for c in inner if c["name"] == "bytes")["configuration"]["endian"] = "big"
    meta_path.write_text(json.dumps(meta))
    before = stamps(runs_dir)
    out = snakemake(campaign, *NO_FIGURES)
    assert "nbody.zarr is stale: made from config" in out.stderr, out.stderr[-3000:]
    assert "lensing.zarr is stale: made from another nbody.zarr" in out.stderr
    assert "pk/zarr.json was changed" in out.stderr
    assert cli.main(["verify", str(runs_dir)]) == 0
    after = stamps(runs_dir)
    assert {key for key in before if before[key] != after[key]} == {
        ("tiny-fiducial-r0", "nbody"),
        ("tiny-fiducial-r0", "lensing"),
        ("tiny-fiducial-r0", "summaries"),
        ("tiny-fiducial-r1", "summaries"),
    }


@pytest.mark.slow
def test_report(campaign):
    before = sorted(p.relative_to(campaign) for p in (campaign / "results").rglob("*"))
    out = snakemake(campaign, "--report", "report.html")
    assert sorted(p.relative_to(campaign) for p in (campaign / "results").rglob("*")) == before
    html = (campaign / "report.html").read_text()
    assert "Power spectra" in html and "Density slices" in html, out.stderr[-2000:]
    assert "Convergence maps" in html and "Convergence C_ell" in html


def test_bad_campaign_stops_before_any_job(tmp_path):
    (tmp_path / "tiny.yaml").write_text(TINY.replace("box_size: 64.0", "box_size: -64.0"))
    out = snakemake(tmp_path, check=False, share_programs=False)  # no results/.jax_cache made
    assert out.returncode != 0
    assert "tiny.yaml" in out.stderr and "base.box.box_size" in out.stderr
    assert not (tmp_path / "results").exists()


# the quick start in the fast tier, the examples in the slow one
CAMPAIGNS = [
    path if path.name == "quickstart.yaml" else pytest.param(path, marks=pytest.mark.slow)
    for path in sorted((REPO / "config").glob("*.yaml"))
    + sorted((REPO / "config/examples").glob("*.yaml"))
]


@pytest.mark.parametrize("path", CAMPAIGNS, ids=lambda p: getattr(p, "name", None))
def test_every_documented_campaign_dry_runs(path, tmp_path):
    """`snakemake -n` through the real Snakefile: the campaign loads, every job and its
    resources are planned (with and without lensing, on cpu and gpu). A GPU campaign is
    planned with the slurm profile's site settings, as for a cluster: on a machine without
    GPUs the local profile refuses it (tests/test_failures.py)."""
    site = []
    if "platform: gpu" in Path(path).read_text():
        site = ["--configfile", str(REPO / "profiles/slurm/site.yaml")]
    out = run_snakemake(
        tmp_path,
        "--profile",
        str(REPO / "profiles/local"),
        *site,
        "-n",
        "--config",
        f"campaign={path}",
        check=False,
        share_programs=False,  # no results/.jax_cache made beforehand
    )
    text = out.stdout + out.stderr
    assert not (tmp_path / "results").exists()  # planning writes nothing
    assert out.returncode == 0, text[-3000:]  # whatever the room on this disk: checked by a run
    assert "prepare" in text and "runs_job0000" in text, text[-2000:]
    assert "collect" in text


# a campaign file whose path a shell would run or split if a rule left it unquoted
HOSTILE_NAME = "a dir; x/in j$(touch PWNED) `touch PWNED` 'q\" é;.yaml"


def _hostile_campaign(workdir) -> Path:
    path = workdir / HOSTILE_NAME
    path.parent.mkdir()
    shutil.copy(REPO / "config/examples/list.yaml", path)
    return path


def test_every_shell_command_quotes_the_campaign_path(tmp_path):
    """The commands the rules would run (snakemake -n -p) take a campaign path of spaces,
    quotes, $(), backquotes, ; and unicode as one argument, and nothing runs."""
    path = _hostile_campaign(tmp_path)
    out = run_snakemake(
        tmp_path,
        "--profile",
        str(REPO / "profiles/local"),
        "-n",
        "-p",
        "--config",
        f"campaign={path}",
        share_programs=False,
    )
    text = out.stdout + out.stderr
    commands = [c for c in re.findall(r"^Shell command: (.+)$", text, re.MULTILINE) if c != "None"]
    assert len(commands) == 5, commands  # prepare, the job, collect, two figure rules
    for command in commands:  # the path is never split into words nor left to the shell
        assert all("PWNED" not in w or w == str(path) for w in shlex.split(command)), command
    with_path = [shlex.split(c) for c in commands if str(path) in shlex.split(c)]
    assert len(with_path) == 2  # prepare and collect, the path one argument of each
    assert not list(tmp_path.rglob("PWNED"))


def test_a_campaign_path_with_a_newline_is_refused_naming_it(tmp_path):
    (tmp_path / "new\nline.yaml").write_text((REPO / "config/examples/list.yaml").read_text())
    out = run_snakemake(
        tmp_path,
        "--profile",
        str(REPO / "profiles/local"),
        "-n",
        "--config",
        f"campaign={tmp_path / 'new'}\nline.yaml",
        share_programs=False,
        check=False,
    )
    assert out.returncode != 0
    assert "line.yaml: cannot be read" in out.stdout + out.stderr, out.stdout[-2000:]
    assert not (tmp_path / "results").exists()


@pytest.mark.slow
def test_list_example_runs_to_the_end(tmp_path):
    """A documented example (no lightcone, 2 runs of 32^3) from the campaign file to the
    runs' figures and the campaign's store, from a file whose path a shell would run or split
    if a rule left it unquoted."""
    run_snakemake(
        tmp_path,
        "--profile",
        str(REPO / "profiles/local"),
        "--cores",
        "2",
        "--config",
        f"campaign={_hostile_campaign(tmp_path)}",
        "--omit-from",  # the runs' figures are read, the campaign's are not
        CAMPAIGN_FIGURES,
    )
    assert not list(tmp_path.rglob("PWNED"))
    results = tmp_path / "results" / "list"
    for run in ("list-planck-r0", "list-lowS8-r0"):
        for stage in ("ic", "nbody", "summaries"):
            assert store.is_complete(results / run / f"{stage}.zarr"), (run, stage)
        assert not (results / run / "lensing.zarr").exists()
        assert (results / "report" / run / "pk.png").stat().st_size > 1000
    assert store.is_complete(results / "summaries.zarr")


def test_listing_and_linting_write_nothing_and_lint_is_clean(tmp_path):
    """`snakemake --list-rules`, `--lint` and `-n` plan a campaign without writing a file under
    results/, and the linter finds nothing to say of the workflow but what the Snakefile's
    header justifies."""
    (tmp_path / "tiny.yaml").write_text(TINY)
    listed = snakemake(tmp_path, "--list-rules", share_programs=False)
    assert "runs_job0000" in listed.stdout and "prepare" in listed.stdout, listed.stdout
    assert {RUN_FIGURES, CAMPAIGN_FIGURES, COLLECT} <= set(listed.stdout.split())  # --omit-from
    linted = snakemake(tmp_path, "--lint", share_programs=False, check=False)
    text = linted.stdout + linted.stderr
    # the one finding the Snakefile's header justifies: no conda environment or container
    assert set(re.findall(r"^    \* (.+)$", text, re.MULTILINE)) == {
        "Specify a conda environment or container for each rule.:"
    }, text[-3000:]
    assert "`snakemake --lint` asks for a conda environment" in (REPO / "Snakefile").read_text()
    snakemake(tmp_path, "-n", share_programs=False)
    assert not (tmp_path / "results").exists()


AMPLITUDES = """\
name: amp
seed: 4
common_seeds: true
base:
  power: {kind: camb}
  box: {box_size: 128.0, particles: 16}
  parallel: {pdims: [1, 2], halo_cells: 4}
  nbody: {steps: 4}
design: {kind: grid, parameters: {A_s: [1.8e-9, 2.4e-9], m_nu: [0.0, 0.2]}}
execution: {platform: cpu, devices_per_node: 2, cpus_per_task: 1, device_memory_gb: 2}
"""


@pytest.mark.slow
def test_a_campaign_over_A_s_and_m_nu_runs_on_camb_power_with_sigma8_derived(tmp_path):
    """A grid over A_s and the neutrino mass (base σ8 left to its default, replaced by the
    design) with CAMB's P(k), same seed at every point: planned by `snakemake -n`, then run.
    σ8 derived as √A_s, one cached table per point, the final P(k) at the largest scales in
    the ratio of the amplitudes, and massive neutrinos lowering it at equal A_s; σ8_cb and
    Ω_cb in the manifest and the campaign's summaries."""
    (tmp_path / "amp.yaml").write_text(AMPLITUDES)
    planned = run_snakemake(
        tmp_path, "-n", "--cores", "2", "--config", "campaign=amp.yaml", share_programs=False
    )
    assert "runs_job0000" in planned.stdout and not (tmp_path / "results").exists()
    run_snakemake(
        tmp_path, "--profile", str(REPO / "profiles/local"), "--cores", "2", "--config",
        "campaign=amp.yaml", *NO_FIGURES,
    )  # fmt: skip
    results = tmp_path / "results" / "amp"
    rows = list(csv.DictReader((results / "manifest.csv").open()))
    point = {(float(r["A_s"]), float(r["m_nu"])): r for r in rows}
    source, pk = {}, {}
    for key, row in point.items():
        run_dir = tmp_path / row["run_dir"]
        source[key] = zarr.open_group(run_dir / "ic.zarr", mode="r").attrs["linear_power"]
        pk[key] = zarr.open_group(run_dir / "summaries.zarr", mode="r")["pk"][-1, 0]
        assert source[key]["A_s"] == key[0]
        assert float(row["sigma8"]) == source[key]["sigma8"]
        assert float(row["sigma8_cb"]) == source[key]["sigma8_cb"]
        assert float(row["S8"]) == pytest.approx(source[key]["sigma8"] * (0.3111 / 0.3) ** 0.5)
    low, high = (1.8e-9, 0.0), (2.4e-9, 0.0)
    ratio = source[high]["sigma8"] / source[low]["sigma8"]
    assert ratio == pytest.approx((2.4 / 1.8) ** 0.5, rel=1e-4)
    assert len(list((tmp_path / "results" / ".power_cache").glob("*.npz"))) == 4
    assert pk[high] / pk[low] == pytest.approx(2.4 / 1.8, rel=0.02)
    for A_s in (1.8e-9, 2.4e-9):
        massless, massive = point[A_s, 0.0], point[A_s, 0.2]
        assert float(massless["Omega_cb"]) == 0.3111 and float(massive["Omega_cb"]) < 0.3071
        assert float(massless["sigma8_cb"]) == float(massless["sigma8"])
        assert float(massive["sigma8_cb"]) > float(massive["sigma8"])
        assert pk[A_s, 0.2] < 0.97 * pk[A_s, 0.0]  # free streaming suppresses the growth
    stacked = zarr.open_group(results / "summaries.zarr", mode="r")
    assert list(stacked["sigma8"][:]) == [float(r["sigma8"]) for r in rows]
    assert list(stacked["Omega_cb"][:]) == [float(r["Omega_cb"]) for r in rows]
    assert "sigma8" in stacked["pk"].attrs["coordinates"].split()
    plan = subprocess.run(
        [sys.executable, "-m", "pmpipe.cli", "plan", "amp.yaml"],
        cwd=tmp_path, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert "linear P(k): 4 CAMB tables for 4 runs, 4 of them cached" in plan.stdout
