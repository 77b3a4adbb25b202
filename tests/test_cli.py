"""The pmpipe command: plan, show, run, collect."""

import shutil
from pathlib import Path

import pytest
import yaml

from pmpipe import cli, stages
from pmpipe.run import validation
from pmpipe.storage import store

CAMPAIGN = {
    "name": "cli",
    "seed": 4,
    "base": {"box": {"particles": 16, "box_size": 64.0}, "nbody": {"steps": 2}},
    "realisations": 2,
    "execution": {"device_memory_gb": 2},
}


def test_plan_prints_a_table_and_fails_early_when_a_run_does_not_fit(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(CAMPAIGN))
    assert cli.main(["plan", str(path)]) == 0
    out = capsys.readouterr().out
    assert "cli-fiducial-r1" in out and "GB/device" in out
    path.write_text(yaml.safe_dump({**CAMPAIGN, "execution": {"device_memory_gb": 0.1}}))
    assert cli.main(["plan", str(path)]) == 2
    err = capsys.readouterr().err
    assert "cli-fiducial-r0 needs about" in err and "execution.device_memory_gb = 0.1" in err


def test_run_collect_and_show(tmp_path, capsys, monkeypatch):
    from pmpipe.campaigns import campaign

    monkeypatch.chdir(tmp_path)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(CAMPAIGN))
    configs = campaign.write_run_files(campaign.load(path), tmp_path / "results")
    for cfg in configs:
        for stage in stages.run_stages(validation.load_run_file(cfg).config):
            assert cli.main(["run", stage, str(cfg)]) == 0
    assert cli.main(["run", "lensing", str(cfg)]) == 2  # this campaign has no lensing
    assert "has no lensing section" in capsys.readouterr().err
    assert cli.main(["collect", str(path), "--results", str(tmp_path / "results")]) == 0
    capsys.readouterr()
    assert cli.main(["show", str(tmp_path / "results/cli/summaries.zarr")]) == 0
    out = capsys.readouterr().out
    assert "collect store, complete" in out and "pk (run, a, k) [2 x 1 x 8]" in out
    manifest = (tmp_path / "results/cli/manifest.csv").read_text()
    assert manifest.count(",done\n") == 2
    # the report's figures of a run and of the campaign, as the workflow's rules draw them
    from pmpipe.results import report

    campaign_dir = tmp_path / "results/cli"
    drawn = [campaign_dir / "report/cli-fiducial-r0/pk.png", campaign_dir / "report/pk_ratio.png"]
    assert report.main([str(campaign_dir), *map(str, drawn)]) == 0
    assert all(path.stat().st_size > 1000 for path in drawn)
    assert cli.main(["show", str(tmp_path / "nothing.zarr")]) == 2
    # submit: complete runs are not submitted, the runs of an edited campaign are
    capsys.readouterr()
    assert cli.main(["submit", str(path), "--dry-run"]) == 0
    captured = capsys.readouterr()
    assert "2 run(s) complete, not submitted: cli-fiducial-r0, cli-fiducial-r1" in captured.out
    assert "no SLURM partition is set" in captured.err
    edited = {**CAMPAIGN, "base": {**CAMPAIGN["base"], "cosmology": {"Omega_m": 0.25}}}
    (tmp_path / "edited.yaml").write_text(yaml.safe_dump(edited))
    assert cli.main(["submit", str(tmp_path / "edited.yaml"), "--dry-run"]) == 0
    captured = capsys.readouterr()
    assert "2 runs packed into 1 task(s) of at most 8 runs" in captured.err
    out = captured.out
    assert "complete, not submitted" not in out and "#SBATCH --array=0-0" in out, out
    # a store of another run copied over this run's is stale; a truncated chunk is damaged
    mine, other = (cfg.parent / "nbody.zarr" for cfg in configs)
    capsys.readouterr()
    shutil.rmtree(mine)
    shutil.copytree(other, mine)
    assert cli.main(["show", str(mine)]) == 0
    assert "nbody store, STALE: is stale: made from config" in capsys.readouterr().out
    stale_slice = campaign_dir / f"report/{mine.parent.name}/slice.png"  # not drawn from it
    assert report.main([str(campaign_dir), str(stale_slice)]) == 2
    assert "is stale: made from config" in capsys.readouterr().err
    assert not stale_slice.exists()
    chunk = next(f for f in sorted((other / "density").rglob("*")) if f.is_file())
    chunk.write_bytes(chunk.read_bytes()[:10])
    assert cli.main(["show", str(other)]) == 0
    assert "nbody store, DAMAGED: shard density/" in capsys.readouterr().out
    assert cli.main(["verify", str(tmp_path / "results")]) == 1
    out = capsys.readouterr().out
    assert f"FAILED  {mine}: is stale" in out and f"FAILED  {other}: shard" in out
    assert not store.has_marker(mine) and not store.has_marker(other)


def test_plan_warns_when_the_maps_ask_for_multipoles_the_mesh_does_not_resolve(tmp_path, capsys):
    quickstart = Path(__file__).resolve().parent.parent / "config" / "quickstart.yaml"
    campaign = yaml.safe_load(quickstart.read_text())
    campaign["base"]["lightcone"] = {"z_max": 0.5}  # the box then holds a 9-degree map
    campaign["base"]["lensing"] |= {
        "source_redshifts": [0.5],
        "flat_sky": {"field_of_view": 9.0, "pixels": 128},
    }
    campaign["base"]["summaries"] |= {"ell_range": [120, 200]}
    path = tmp_path / "fine.yaml"
    path.write_text(yaml.safe_dump(campaign))
    assert cli.main(["plan", str(path), "--results", str(tmp_path / "results")]) == 0
    err = capsys.readouterr().err
    assert "warning: lensing.flat_sky.pixels = 128 (9 deg) reaches multipole 2560" in err
    assert "lower lensing.flat_sky.pixels to about 11" in err and "box.oversample" in err
    assert "no C_ell bin" not in err  # its bins are resolved: fewer pixels are the change
    campaign["base"]["summaries"] |= {"ell_range": None}  # 12 bins from 40 to 2560
    path.write_text(yaml.safe_dump(campaign))
    assert cli.main(["plan", str(path), "--results", str(tmp_path / "results")]) == 0
    err = capsys.readouterr().err
    assert "warning: lensing.flat_sky: no C_ell bin of the map (40-2560)" in err
    assert "summaries.ell_range" in err and "reaches multipole" not in err


# A newcomer's first own campaign: two tomographic bins, Born and ray tracing, alignments drawn 4
# times, 32^3 particles in 200 Mpc/h, full-sky maps of nside 32, a flat 4-degree map of 32
# pixels, smoothing wider than that map: every map resolves no C_ell bin of its own
NEWCOMER = """
name: newcomer
seed: 7
base:
  box: {box_size: 200.0, particles: 32, oversample: 2}
  nbody: {steps: 10}
  lightcone: {z_max: 1.0, plane_thickness: 100.0, copy_every: box}
  lensing:
    source_redshifts: []
    distributions:
      - {kind: smail, name: bin1, z0: 0.3, alpha: 2.0, beta: 1.5}
      - {kind: smail, name: bin2, z0: 0.6, alpha: 2.0, beta: 1.5}
    flat_sky: {field_of_view: 4.0, pixels: 32}
    full_sky: {nside: 32}
    method: both
    intrinsic_alignment: {A_IA: 1.0, eta_IA: 0.0, z_pivot: 0.62}
    draws: {kind: latin_hypercube, count: 4, parameters: {A_IA: [-1, 2]}}
  summaries: {smoothing_arcmin: [240.0]}
design: {kind: fiducial}
execution: {platform: cpu, device_memory_gb: 4}
"""


def test_plan_warns_of_maps_that_resolve_no_bin_and_of_smoothing_that_leaves_nothing(
    tmp_path, capsys
):
    path = tmp_path / "newcomer.yaml"
    path.write_text(NEWCOMER)
    assert cli.main(["plan", str(path), "--results", str(tmp_path / "results")]) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    full = [w for w in warnings if w.startswith("warning: lensing.full_sky: no C_ell bin")]
    assert len(full) == 1 and "bin1 (none)" in full[0] and "box.particles" in full[0], warnings
    assert any(w.startswith("warning: lensing.flat_sky: no C_ell bin") for w in warnings)
    smoothing = [w for w in warnings if "summaries.smoothing_arcmin = 240 (flat sky)" in w]
    assert len(smoothing) == 1 and "use at most 30 arcmin" in smoothing[0], warnings
    assert not any("about 1" in w for w in warnings), warnings
    small = NEWCOMER.replace("[240.0]", "[20.0]").replace("particles: 32", "particles: 64")
    path.write_text(small)
    assert cli.main(["plan", str(path), "--results", str(tmp_path / "results")]) == 0
    err = capsys.readouterr().err
    assert "smoothing_arcmin = 20 (flat sky)" not in err  # 20' on 7.5' pixels of a 4° map
    assert "smoothing_arcmin = 20 (full sky) is below half the full-sky map's pixel side" in err
    defaults = yaml.safe_load(NEWCOMER.replace("particles: 32", "particles: 64"))
    defaults["base"]["lensing"] |= {"flat_sky": {}, "full_sky": None}  # 5°, 128 pixels
    defaults["base"]["lightcone"]["z_max"] = 0.8  # where the box holds a 5° map
    defaults["base"]["summaries"] = {}  # smoothing 2' and 5'
    path.write_text(yaml.safe_dump(defaults))
    assert cli.main(["plan", str(path), "--results", str(tmp_path / "results")]) == 0
    assert "smoothing_arcmin" not in capsys.readouterr().err  # the defaults warn of nothing


def test_plan_warns_when_ray_tracing_planes_are_too_thick(tmp_path, capsys):
    quickstart = Path(__file__).resolve().parent.parent / "config" / "quickstart.yaml"
    campaign = yaml.safe_load(quickstart.read_text())
    campaign["base"]["lensing"] |= {
        "method": "raytrace",
        "full_sky": None,
        "flat_sky": {"field_of_view": 5.0, "pixels": 32},
    }
    path = tmp_path / "raytrace.yaml"
    path.write_text(yaml.safe_dump(campaign))
    assert cli.main(["plan", str(path), "--results", str(tmp_path / "results")]) == 0
    err = capsys.readouterr().err
    assert "lightcone.plane_thickness = 256 Mpc/h is too thick for ray tracing" in err
    assert "at most 100 Mpc/h" in err
    assert "lightcone.copy_every = plane" not in err  # one-box planes: nothing to keep
    campaign["base"]["lightcone"] |= {"plane_thickness": 64.0}
    path.write_text(yaml.safe_dump(campaign))
    assert cli.main(["plan", str(path), "--results", str(tmp_path / "results")]) == 0
    err = capsys.readouterr().err
    assert "too thick for ray tracing" not in err
    assert "lightcone.copy_every = plane: each plane of 64 Mpc/h sees its own copy" in err
    campaign["base"]["lightcone"] |= {"copy_every": "box"}
    path.write_text(yaml.safe_dump(campaign))
    assert cli.main(["plan", str(path), "--results", str(tmp_path / "results")]) == 0
    assert "lightcone.copy_every = plane" not in capsys.readouterr().err


def test_version_names_the_release_and_the_commit_of_a_checkout(capsys):
    """``pmpipe --version`` prints the installed version and, from this checkout, the commit
    that provenance records; exit status 0."""
    from pmpipe.storage import provenance

    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("pmpipe 0.") and f"(commit {provenance.git_commit()})" in out


def test_an_unknown_key_is_named_with_the_closest_allowed_one(tmp_path, capsys):
    """A typo'd key deep in a campaign's base gets the key it was likely meant to be; a key
    like none gets no guess; exit status 2 and no traceback."""
    path = tmp_path / "typo.yaml"
    path.write_text(
        "name: typo\nbase:\n  nbody: {step: 4}\n  lensing:\n    source_redshifts: [1.0]\n"
        "    flat_sky: {field_of_veiw: 5.0, colour: red}\n"
    )
    assert cli.main(["plan", str(path)]) == 2
    text = capsys.readouterr().err
    assert "base.nbody.step: unknown key; did you mean 'steps'? (got 4)" in text
    assert "base.lensing.flat_sky.field_of_veiw: unknown key; did you mean 'field_of_view'?" in text
    assert "base.lensing.flat_sky.colour: unknown key (got 'red')" in text
    assert "Traceback" not in text
    path.write_text("name: typo\ndesign: {kind: fiducial, parameters: {}}\n")
    assert cli.main(["plan", str(path)]) == 2  # only the grid and sampled kinds have parameters
    assert "design.parameters: unknown key\n" in capsys.readouterr().err + "\n"


def test_campaigns_without_a_seed_get_their_names_and_plan_warns_of_shared_seeds(tmp_path, capsys):
    """Two campaigns that differ only in name get different run seeds; plan says where the
    seed came from and warns when another campaign's runs in the results folder share seeds,
    unless the file says it means it."""
    from pmpipe.campaigns import campaign
    from pmpipe.results import manifest

    def write(name: str, **extra) -> Path:
        data = {"name": name, "base": {"box": {"particles": 16}}, "realisations": 2, **extra}
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(data))
        return path

    first, second = campaign.load(write("first")), campaign.load(write("second"))
    assert {s.seed for s in first.runs}.isdisjoint({s.seed for s in second.runs})
    assert campaign.campaign_seed(first) == campaign.seed_from_name("first")
    results = tmp_path / "results"
    (results / "first").mkdir(parents=True)
    manifest.write_manifest(first, results / "first" / "manifest.csv", lambda _: "planned")
    assert cli.main(["plan", str(write("second")), "--results", str(results)]) == 0
    err = capsys.readouterr().err
    assert f"pin it with 'seed: {campaign.seed_from_name('second')}'" in err
    assert "have the seeds of runs of this one" not in err
    same = write("again", seed=campaign.seed_from_name("first"))
    assert cli.main(["plan", str(same), "--results", str(results)]) == 0
    err = capsys.readouterr().err
    assert "2 runs of campaign first in" in err and "pin it" not in err
    (results / "second").mkdir()
    made = campaign.load(write("second", seed=0))
    manifest.write_manifest(made, results / "second" / "manifest.csv", lambda _: "complete")
    assert cli.main(["plan", str(write("second")), "--results", str(results)]) == 0
    assert "were made with other seeds than" in (err := capsys.readouterr().err)
    assert "('seed: 0' gives theirs)" in err
    meant = write("meant", seed=campaign.seed_from_name("first"), shared_seeds=True)
    assert cli.main(["plan", str(meant), "--results", str(results)]) == 0
    assert "have the seeds of runs" not in capsys.readouterr().err
