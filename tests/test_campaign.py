"""Campaign files: designs, run ids, seeds, config.json files, estimates, schema, bad input."""

import csv
import json
import math
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from pmpipe import cli
from pmpipe.campaigns import campaign, resources, seeds
from pmpipe.cluster import plan_table
from pmpipe.physics.evolution import lightcone, sky
from pmpipe.results import manifest
from pmpipe.run import config, validation

REPO = Path(__file__).resolve().parent.parent
SMALL = {"box": {"particles": 16, "box_size": 64.0}}


def make(**fields):
    return campaign.Campaign.model_validate({"name": "c", "seed": 1, "base": SMALL, **fields})


def test_grid_is_the_cartesian_product():
    specs = campaign.expand(
        make(
            design={
                "kind": "grid",
                "parameters": {"Omega_m": [0.28, 0.31, 0.34], "sigma8": [0.7, 0.8]},
            }
        )
    )
    assert len(specs) == 6
    assert {(s.run.cosmology.Omega_m, s.run.cosmology.sigma8) for s in specs} == {
        (o, s) for o in (0.28, 0.31, 0.34) for s in (0.7, 0.8)
    }
    assert [s.run_id for s in specs][:2] == ["c-p0000-r0", "c-p0001-r0"]
    assert len({s.seed for s in specs}) == 6  # independent seeds


@pytest.mark.parametrize("kind", ["latin_hypercube", "sobol"])
def test_quasi_random_samples_are_in_range_and_deterministic(kind):
    design = {"kind": kind, "samples": 8, "parameters": {"Omega_m": [0.25, 0.35], "h": [0.6, 0.8]}}
    specs = campaign.expand(make(design=design))
    values = np.array([[s.parameters["Omega_m"], s.parameters["h"]] for s in specs])
    assert values.shape == (8, 2)
    assert np.all((values[:, 0] >= 0.25) & (values[:, 0] <= 0.35))
    assert np.all((values[:, 1] >= 0.6) & (values[:, 1] <= 0.8))
    if kind == "latin_hypercube":  # one sample in each of the 8 strata of every axis
        assert sorted(np.floor((values[:, 0] - 0.25) / 0.1 * 8).astype(int)) == list(range(8))
    again = campaign.expand(make(design=design))
    assert [s.parameters for s in again] == [s.parameters for s in specs]
    other = campaign.expand(
        campaign.Campaign.model_validate({"name": "c", "seed": 2, "base": SMALL, "design": design})
    )
    assert [s.parameters for s in other] != [s.parameters for s in specs]
    assert specs[0].run.cosmology.Omega_m == specs[0].parameters["Omega_m"]


def test_derivatives_share_the_fiducial_seeds():
    specs = campaign.expand(
        make(
            design={"kind": "derivatives", "parameters": {"Omega_m": 0.02, "sigma8": 0.05}},
            realisations=2,
        )
    )
    assert len(specs) == (1 + 2 * 2) * 2
    points = {s.point for s in specs}
    assert points == {"fiducial", "Omega_m-minus", "Omega_m-plus", "sigma8-minus", "sigma8-plus"}
    fid = config.Cosmology()
    by_id = {s.run_id: s for s in specs}
    assert by_id["c-Omega_m-minus-r1"].run.cosmology.Omega_m == pytest.approx(fid.Omega_m - 0.02)
    assert by_id["c-sigma8-plus-r0"].run.cosmology.sigma8 == pytest.approx(fid.sigma8 + 0.05)
    assert by_id["c-fiducial-r0"].parameters == {"Omega_m": fid.Omega_m, "sigma8": fid.sigma8}
    assert by_id["c-sigma8-minus-r0"].parameters == {"Omega_m": fid.Omega_m, "sigma8": 0.7602}
    for r in (0, 1):
        seeds = {s.seed for s in specs if s.realisation == r}
        assert seeds == {by_id[f"c-fiducial-r{r}"].seed}
    assert by_id["c-fiducial-r0"].seed != by_id["c-fiducial-r1"].seed


def test_a_design_over_A_s_replaces_the_default_sigma8_and_steps_a_given_A_s():
    camb = {**SMALL, "power": {"kind": "camb"}}
    grid = {"kind": "grid", "parameters": {"A_s": [1.9e-9, 2.2e-9]}}
    specs = campaign.expand(make(base=camb, design=grid))
    assert [(s.run.cosmology.A_s, s.run.cosmology.sigma8) for s in specs] == [
        (1.9e-9, None),
        (2.2e-9, None),
    ]
    with pytest.raises(ValueError, match="cosmology.sigma8 = 0.8 and cosmology.A_s = 1.9e-09"):
        make(base={**camb, "cosmology": {"sigma8": 0.8}}, design=grid)
    chosen = make(
        base=camb, design=grid, decomposition={"devices": 2}, execution={"devices_per_node": 2}
    )
    assert chosen.runs[0].run.cosmology.sigma8 is None  # pdims chosen, the file's fields kept
    steps = {"kind": "derivatives", "parameters": {"A_s": 1e-10}}
    with pytest.raises(ValueError, match="design.parameters A_s: derivatives step from the base"):
        make(base=camb, design=steps)
    specs = campaign.expand(make(base={**camb, "cosmology": {"A_s": 2.10058e-9}}, design=steps))
    assert [s.run.cosmology.A_s for s in specs] == [2.10058e-9, 2.00058e-9, 2.20058e-9]


def test_plan_counts_the_camb_tables_and_those_cached(tmp_path):
    camb = {**SMALL, "power": {"kind": "camb"}}
    grid = {"kind": "grid", "parameters": {"A_s": [1.9e-9, 2.2e-9]}}
    camp = make(base=camb, design=grid, realisations=3)
    line = plan_table.linear_power_line(camp, tmp_path)
    assert line.startswith("linear P(k): 2 CAMB tables for 6 runs, 0 of them cached in")
    assert plan_table.linear_power_line(make(), tmp_path) is None


def test_pairs_and_common_seeds():
    specs = campaign.expand(
        make(
            design={
                "kind": "list",
                "points": [{"name": "a", "parameters": {"Omega_m": 0.3}}, {"name": "b"}],
            },
            paired=True,
            common_seeds=True,
        )
    )
    assert [s.run_id for s in specs] == ["c-a-r0", "c-a-r0-paired", "c-b-r0", "c-b-r0-paired"]
    assert specs[1].run.ic.paired and not specs[0].run.ic.paired
    assert len({s.seed for s in specs}) == 1
    assert [s.index for s in specs] == [0, 1, 2, 3]


def test_seeds_are_stable():
    """Seeds depend only on the campaign seed and the run position (fold_in), never on time."""
    first = [s.seed for s in campaign.expand(make(realisations=3))]
    assert first == seeds.derive_seeds(1, range(3)).tolist()
    assert first == [s.seed for s in campaign.expand(make(realisations=3))]


def test_run_files_are_rewritten_only_when_they_change(tmp_path):
    camp = make(realisations=2)
    paths = campaign.write_run_files(camp, tmp_path)
    assert [p.parent.name for p in paths] == ["c-fiducial-r0", "c-fiducial-r1"]
    mtimes = [p.stat().st_mtime_ns for p in paths]
    time.sleep(0.01)
    campaign.write_run_files(camp, tmp_path)
    assert [p.stat().st_mtime_ns for p in paths] == mtimes
    loaded = validation.load_run_file(paths[1])
    assert (
        loaded.run_id == "c-fiducial-r1" and loaded.config.ic.seed == campaign.expand(camp)[1].seed
    )
    assert loaded.config_hash == config.config_hash(loaded.config)
    changed = campaign.Campaign.model_validate(
        {
            "name": "c",
            "seed": 1,
            "base": {"box": {"particles": 16, "box_size": 32.0}},
            "realisations": 2,
        }
    )
    campaign.write_run_files(changed, tmp_path)
    assert validation.load_run_file(paths[0]).config.box.box_size == 32.0


def run(particles=64, pdims=(1, 1), **sections):
    return config.Run.model_validate(
        {
            "box": {"particles": particles, **sections.pop("box", {})},
            "parallel": {"pdims": pdims},
            **sections,
        }
    )


@pytest.mark.parametrize(
    "particles, oversample, peak_gb, run_s, step_s",
    [(64, 1, 0.67, 0.48, 0.034), (64, 2, 0.78, 1.11, 0.103), (128, 1, 1.17, 3.70, 0.321)],
)
def test_estimates_bound_the_measured_runs(particles, oversample, peak_gb, run_s, step_s):
    """`pmpipe bench nbody` on 2 CPU cores (2LPT + 10 steps, docs/performance.md)."""
    est = resources.estimate(run(particles, box={"oversample": oversample}), resources.Execution())
    assert peak_gb * 1e9 < est.memory_per_device_bytes < 1.15 * peak_gb * 1e9
    nbody_s = est.runtime_s["nbody"] - resources.STARTUP_SECONDS
    assert 10 * step_s < nbody_s < 1.5 * 10 * step_s
    assert run_s < nbody_s + est.runtime_s["ic"] - resources.STARTUP_SECONDS


def test_estimates_grow_with_particles_and_shrink_with_devices():
    gpu = resources.Execution(platform="gpu", devices_per_node=4)
    est = lambda r, ex=gpu: resources.estimate(r, ex)
    assert est(run(64)).memory_per_device_bytes < est(run(128)).memory_per_device_bytes
    assert est(run(128, (2, 2))).memory_per_device_bytes < est(run(128)).memory_per_device_bytes
    assert est(run(128, (2, 2))).runtime_s["nbody"] < est(run(128)).runtime_s["nbody"]
    assert est(run(64)).runtime_s["nbody"] < est(run(64, nbody={"steps": 20})).runtime_s["nbody"]
    cpu = resources.Execution(devices_per_node=4)  # one process holds every CPU device
    assert (
        est(run(128, (2, 2)), cpu).memory_per_device_bytes
        >= est(run(128), cpu).memory_per_device_bytes
    )
    assert est(run(128, (2, 4))).nodes == 2 and est(run(128, (2, 4)), cpu).nodes == 1


def test_estimates_count_the_full_sky_shells_split_over_the_devices():
    """Each device keeps its share of the shells' rays and samples its share of the rays from
    the gathered density, or every ray in its block where the force mesh is too large to gather."""
    gpu = resources.Execution(platform="gpu", devices_per_node=4)
    cpu = resources.Execution(devices_per_node=4)  # one process: 4 shares, 4 samplers
    rays = 12 * (512 * sky.RAYS_PER_PIXEL_SIDE) ** 2
    for particles, oversample in ((128, 2), (512, 2)):
        cone = {"lightcone": {"z_max": 1.0}, "box": {"box_size": 1000.0, "oversample": oversample}}
        lensing = {"source_redshifts": [1.0], "flat_sky": {}}
        flat = run(particles, (2, 2), **cone, lensing=lensing)
        full_sky = {**lensing, "full_sky": {"nside": 512}}
        full = run(particles, (2, 2), **cone, lensing=full_sky)
        padded = sky.PLANE_BUCKET * math.ceil(len(validation.planes(full)) / sky.PLANE_BUCKET)
        cells = (particles * oversample) ** 3
        gathers = sky.shell_gathers(particles * oversample, rays, 4)
        assert gathers == (particles == 128)
        if gathers:
            words = (padded + resources.SHELL_RAY_WORDS) * rays / 4
            words += resources.SHELL_GATHER_CELL_WORDS * cells
        else:
            words = padded * rays / 4 + resources.SHELL_RAY_WORDS * rays
        for execution, devices in ((gpu, 1), (cpu, 4)):
            extra = (
                resources.estimate(full, execution).memory_per_device_bytes
                - resources.estimate(flat, execution).memory_per_device_bytes
            )
            assert extra == pytest.approx(4 * devices * words)


def test_estimates_count_full_sky_ray_tracing_in_the_lensing_stage():
    """Ray tracing at nside 1024 needs the host memory and time of its rays (measured per ray by
    `pmpipe bench raytrace --nside`): more than the N-body of a 64³ run, and only with method
    raytrace or both; the lensing stage's runtime grows by the tracing, divided over the
    cores."""
    cone = {"lightcone": {"z_max": 1.0}, "box": {"box_size": 1000.0}}
    lens = {"source_redshifts": [0.5, 1.0], "flat_sky": None, "full_sky": {"nside": 1024}}
    born = run(64, (1, 1), **cone, lensing=lens)
    traced = run(64, (1, 1), **cone, lensing=lens | {"method": "raytrace"})
    cpu, wide = resources.Execution(), resources.Execution(cpus_per_task=8)
    planes = len(validation.planes(traced))
    rays = 12 * 2048**2
    memory, seconds = resources.full_sky_raytrace(traced, planes, 2)
    assert memory > rays * (resources.RAYTRACE_RAY_BYTES + resources.RAYTRACE_SOURCE_RAY_BYTES)
    assert resources.full_sky_raytrace(born, planes, 2) == (0.0, 0.0)
    assert resources.full_sky_raytrace(traced, planes, 8)[1] == pytest.approx(seconds / 4)
    per_ray = [
        c[0]
        for c in (
            resources.RAYTRACE_SECONDS_PER_RAY_SHELL,
            resources.RAYTRACE_SECONDS_PER_RAY_SOURCE,
        )
    ]
    assert seconds == pytest.approx(
        rays * (planes * per_ray[0] + 2 * per_ray[1])
    )  # measured at 1024
    finer = run(
        64, (1, 1), **cone, lensing=lens | {"method": "raytrace", "full_sky": {"nside": 2048}}
    )
    per_shell = resources.full_sky_raytrace(finer, planes, 2)[1] / seconds
    assert per_shell > 4 * 1.3  # 4 times the rays, each dearer at the higher band limit
    est = resources.estimate
    assert est(born, cpu).memory_per_device_bytes < memory
    assert est(traced, cpu).memory_per_device_bytes == pytest.approx(
        memory + resources.PROCESS_OVERHEAD_BYTES["cpu"]
    )
    extra = est(traced, cpu).runtime_s["lensing"] - est(born, cpu).runtime_s["lensing"]
    assert extra == pytest.approx(seconds)
    assert est(traced, cpu).runtime_s["nbody"] == est(born, cpu).runtime_s["nbody"]
    assert est(traced, wide).runtime_s["lensing"] < est(traced, cpu).runtime_s["lensing"]


def _shell_temp_words(mesh_n: int, rays: int, pdims: tuple[int, int], gather: bool) -> float:
    """Words of XLA's temporary memory per device for the shell program of a mesh_n^3 density
    on pdims, sampled along the rays of the HEALPix grid ``rays`` (4 samples a ray)."""
    import jax
    import jax.numpy as jnp

    from pmpipe.runtime import parallel

    mesh = parallel.make_mesh(pdims)
    transform = lightcone.PlaneTransform((0, 1, 2), (False,) * 3, (0, 0, 0))
    source, scale, offset = lightcone.box_frame((1.0, 2.0, 3.0), transform, 100.0, mesh_n)
    density = jax.device_put(jnp.ones((mesh_n,) * 3, jnp.float32), parallel.field_sharding(mesh))
    program = lightcone._shell.lower(
        density,
        np.float32(10),
        np.float32(1),
        np.int32(4),
        source,
        scale.astype(np.float32),
        offset.astype(np.float32),
        mesh=mesh,
        rays_nside=rays,
        gather=gather,
    ).compile()
    return program.memory_analysis().temp_size_in_bytes / 4


def test_the_shell_words_per_ray_are_those_of_the_compiled_shell_program():
    """SHELL_RAY_WORDS against XLA's memory analysis of the shell program (one device)."""
    words = _shell_temp_words(16, 64, (1, 1), gather=False) / sky.healpix_pixels(64)
    assert resources.SHELL_RAY_WORDS - 1 < words <= resources.SHELL_RAY_WORDS + 0.01


def test_the_gathered_shell_program_holds_its_rays_share_and_at_most_its_cell_words():
    """Sampling its share of the rays from the gathered density (8 devices, 64^3): XLA's
    memory analysis finds SHELL_RAY_WORDS per ray of the share and at most
    SHELL_GATHER_CELL_WORDS per force-mesh cell, more than the whole density alone."""
    mesh_n, rays = 64, 32
    assert sky.shell_gathers(mesh_n, sky.healpix_pixels(rays), 8)
    words = _shell_temp_words(mesh_n, rays, (2, 4), gather=True)
    share = resources.SHELL_RAY_WORDS * sky.healpix_pixels(rays) / 8
    assert mesh_n**3 < words - share <= resources.SHELL_GATHER_CELL_WORDS * mesh_n**3


def test_resources():
    gpu = resources.Execution(platform="gpu", devices_per_node=4)
    res = resources.resources(run(128, (2, 4)), "nbody", gpu)
    assert (
        res["nodes"] == 2 and res["tasks_per_node"] == 4 and res["gpu"] == 4 and res["devices"] == 8
    )
    assert set(res) == {
        "gpu",
        "nodes",
        "tasks_per_node",
        "cpus_per_task",
        "mem_mb",
        "runtime",
        "devices",
    }
    per_node = resources.Execution(platform="gpu", devices_per_node=4, processes_per_node=1)
    res = resources.resources(run(128, (2, 4)), "nbody", per_node)  # one process drives 4 GPUs
    assert (res["nodes"], res["tasks_per_node"], res["gpu"]) == (2, 1, 4)
    two = resources.resources(
        run(64, (2, 2)), "ic", resources.Execution(devices_per_node=4, processes_per_node=2)
    )
    assert (two["tasks_per_node"], two["gpu"], two["devices"]) == (2, 0, 4)
    cpu = resources.resources(run(64), "ic", resources.Execution())
    assert (
        cpu["gpu"] == 0
        and cpu["tasks_per_node"] == 1
        and cpu["mem_mb"] >= 1000
        and cpu["runtime"] >= 1
    )
    spec = campaign.expand(make())[0]
    with pytest.raises(ValueError, match="unknown stage 'raytrace'"):
        resources.resources(spec.run, "raytrace", resources.Execution())


def test_overlapped_jobs_count_two_runs_memory_and_pass_the_option_to_their_jobs(
    tmp_path, monkeypatch
):
    """execution.overlap: a run of one device needs two runs' memory beside one process
    overhead (a run of two devices does not overlap and needs its own); a device too small for
    two is refused naming the key; the workflow's jobs and the submitted job array run with
    --overlap."""
    from pmpipe.cluster import launch, workflow

    base = {"name": "ov", "base": {"box": {"particles": 64}}}
    plain = campaign.Campaign.model_validate(base)
    both = campaign.Campaign.model_validate({**base, "execution": {"overlap": True}})
    one = resources.estimate(plain.runs[0].run, plain.execution).memory_per_device_bytes
    two = resources.estimate(both.runs[0].run, both.execution).memory_per_device_bytes
    overhead = resources.PROCESS_OVERHEAD_BYTES["cpu"]
    assert two == pytest.approx(2 * one - overhead) and two > one
    split = {"box": {"particles": 64}, "parallel": {"pdims": [1, 2]}}
    wide = campaign.Campaign.model_validate(
        {"name": "ov", "base": split, "execution": {"overlap": True, "devices_per_node": 2}}
    )
    assert not resources.overlaps(wide.runs[0].run, wide.execution)
    small = campaign.Campaign.model_validate(
        {**base, "execution": {"overlap": True, "device_memory_gb": round((one + two) / 2e9, 3)}}
    )
    with pytest.raises(config.ConfigError, match=r"or set execution.overlap: false"):
        campaign.check_fits(small)
    assert len(campaign.check_fits(small.model_copy(update={"execution": plain.execution})))
    assert "each run overlapping the next" in plan_table.jobs_line(both, tmp_path, None)
    assert "overlapping" not in plan_table.jobs_line(plain, tmp_path, None)
    path = tmp_path / "ov.yaml"
    path.write_text(yaml.safe_dump({**base, "execution": {"overlap": True}}))
    (job,) = workflow.prepare({"campaign": str(path)}, results=tmp_path / "results").jobs
    assert job.options == "--overlap "
    path.write_text(yaml.safe_dump(base))
    (job,) = workflow.prepare({"campaign": str(path)}, results=tmp_path / "results").jobs
    assert job.options == ""
    mapped = []

    class Executor:
        def map_array(self, function, *columns):
            mapped.append(columns)

    monkeypatch.setattr(launch, "_executor", lambda *args, **kwargs: Executor())
    groups = [both.runs]
    launch.submit_campaign(both, groups, tmp_path / "results", tmp_path / "logs", None, 4)
    launch.submit_campaign(plain, groups, tmp_path / "results", tmp_path / "logs", None, 4)
    assert [columns[2] for columns in mapped] == [[True], [False]]  # run_job's overlap


def test_a_submitted_job_runs_its_runs_overlapped_when_asked(monkeypatch):
    from pmpipe.job import pipeline

    calls = []
    monkeypatch.setattr(pipeline, "run_all", lambda paths, **kw: calls.append(kw) or [])
    assert pipeline.run_job(["c.json"], "part", True) == []
    assert pipeline.run_job(["c.json"]) == []
    assert [c["overlap"] for c in calls] == [True, False] and calls[0]["part"] == "part"


def test_a_gpu_run_fits_the_share_of_device_memory_xla_takes(monkeypatch):
    """XLA's allocator takes 75 % of a GPU by default, XLA_PYTHON_CLIENT_MEM_FRACTION else: a
    run that needs 85 % of the device is refused by default and fits at 0.9. Its runtimes
    are said to be a guess without a calibration."""
    base = {"name": "frac", "base": {"box": {"particles": 128}}}
    probe = campaign.Campaign.model_validate({**base, "execution": {"platform": "gpu"}})
    need = resources.estimate(probe.runs[0].run, probe.execution).memory_per_device_bytes
    memory = round(need / 0.85 / 1e9, 3)
    camp = campaign.Campaign.model_validate(
        {**base, "execution": {"platform": "gpu", "device_memory_gb": memory}}
    )
    monkeypatch.delenv("XLA_PYTHON_CLIENT_MEM_FRACTION", raising=False)
    with pytest.raises(config.ConfigError) as err:
        campaign.check_fits(camp)
    assert f"may use 75% of execution.device_memory_gb = {memory}" in str(err.value)
    assert "XLA's default; XLA_PYTHON_CLIENT_MEM_FRACTION unset" in str(err.value)
    monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.9")
    assert len(campaign.check_fits(camp)) == 1
    assert "GPU runtimes are a guess" in plan_table.plan_table(camp)  # no calibration given
    monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", "most")
    with pytest.raises(config.ConfigError, match="XLA_PYTHON_CLIENT_MEM_FRACTION='most'"):
        campaign.check_fits(camp)


def test_check_fits_and_plan():
    huge = campaign.Campaign.model_validate(
        {"name": "big", "base": {"box": {"particles": 512}}, "execution": {"device_memory_gb": 1}}
    )
    with pytest.raises(
        config.ConfigError,
        match=r"big-fiducial-r0 needs about .* GB per device but may use "
        r"execution.device_memory_gb = 1\.0; on cpu .* fewer particles",
    ):
        campaign.check_fits(huge)
    on_gpu = huge.model_copy(
        update={"execution": resources.Execution(platform="gpu", device_memory_gb=1)}
    )
    with pytest.raises(config.ConfigError, match=r"use more devices \(base.parallel.pdims\)"):
        campaign.check_fits(on_gpu)
    sky = campaign.Campaign.model_validate(
        {
            "name": "sky",
            "base": {
                "lightcone": {"z_max": 1.0, "plane_thickness": 64.0},
                "lensing": {"full_sky": {"nside": 1024}, "method": "raytrace"},
            },
            "execution": {"device_memory_gb": 4},
        }
    )
    with pytest.raises(
        config.ConfigError,
        match=r"the full-sky maps take .* GB of it \(lower base\.lensing\.full_sky\.nside\)",
    ):
        campaign.check_fits(sky)
    table = plan_table.plan_table(
        make(design={"kind": "grid", "parameters": {"Omega_m": [0.3, 0.32]}})
    )
    assert "c-p0001-r0" in table and "GB/device" in table and "2 runs" in table


def test_manifest_columns(tmp_path):
    camp = make(design={"kind": "grid", "parameters": {"sigma8": [0.7, 0.9], "h": [0.7]}})
    (tmp_path / "c").mkdir()
    manifest.write_manifest(camp, tmp_path / "c/manifest.csv", lambda d: f"status of {d}")
    rows = list(csv.DictReader((tmp_path / "c/manifest.csv").open()))
    assert list(rows[0]) == [
        "run_id",
        "index",
        "point",
        "realisation",
        "paired",
        "seed",
        "sigma8",
        "h",
        "A_s",
        "S8",
        "sigma8_cb",
        "Omega_cb",
        "run_dir",
        "config_hash",
        "status",
    ]
    assert rows[1]["sigma8"] == "0.9" and rows[1]["run_dir"] == str(tmp_path / "c/c-p0001-r0")
    assert rows[1]["status"] == f"status of {tmp_path / 'c/c-p0001-r0'}"
    assert rows[1]["config_hash"] == config.config_hash(campaign.expand(camp)[1].run)
    with pytest.raises(ValueError, match="belongs in <results>/c/"):
        manifest.write_manifest(camp, tmp_path / "manifest.csv", str)


def test_committed_schema_is_current():
    committed = json.loads((REPO / "workflow/schemas/campaign.schema.json").read_text())
    assert committed == campaign.campaign_schema(), (
        "workflow/schemas/campaign.schema.json is stale: run `pmpipe schema` and commit it"
    )


def test_schema_command_writes_the_schema(tmp_path):
    assert cli.main(["schema", "--output", str(tmp_path / "s.json")]) == 0
    assert json.loads((tmp_path / "s.json").read_text()) == campaign.campaign_schema()


@pytest.mark.parametrize("path", sorted((REPO / "config").rglob("*.yaml")), ids=lambda p: p.name)
def test_shipped_campaigns_load_and_expand(path):
    camp = campaign.load(path)
    assert campaign.expand(camp)
    plan_table.plan_table(camp)


GOOD = {
    "name": "ok",
    "seed": 1,
    "base": {"box": {"particles": 16}},
    "design": {"kind": "grid", "parameters": {"Omega_m": [0.3]}},
}


def _with(path, value):
    data = json.loads(json.dumps(GOOD))
    node = data
    keys = path.split(".")
    for k in keys[:-1]:
        node = node.setdefault(k, {})
    node[keys[-1]] = value
    return data


BAD = [
    (_with("base.box.colour", "red"), "base.box.colour: unknown key (got 'red')"),
    (_with("sede", 3), "sede: unknown key; did you mean 'seed'?"),
    (_with("realisations", "two"), "realisations: Input should be a valid integer"),
    (_with("base.box.box_size", -100.0), "base.box.box_size: Input should be greater than 0"),
    (
        _with("base.parallel", {"pdims": [3, 1]}),
        "base: box.particles = 16 is not divisible by parallel.pdims",
    ),
    (_with("design", {"kind": "grid", "parameters": {}}), "design.parameters: empty design"),
    (
        _with("design", {"kind": "grid", "parameters": {"Omega_m": []}}),
        "design.parameters.Omega_m: List should have at least 1 item",
    ),
    (
        _with("design", {"kind": "grid", "parameters": {"Omega_m": "0.3"}}),
        "design.parameters.Omega_m: Input should be a valid list",
    ),
    (
        _with(
            "design",
            {"kind": "latin_hypercube", "samples": 4, "parameters": {"sigma8": [0.9, 0.7]}},
        ),
        "design.parameters.sigma8: parameter range inverted or empty: give [low, high] with low < high",
    ),
    (
        _with(
            "design",
            {"kind": "latin_hypercube", "samples": 0, "parameters": {"sigma8": [0.7, 0.9]}},
        ),
        "design.samples: Input should be greater than or equal to 1",
    ),
    (
        _with("design", {"kind": "sobol", "samples": 6, "parameters": {"sigma8": [0.7, 0.9]}}),
        "design.samples: Sobol samples must be a power of 2 for the sequence's balance properties: use 4 or 8",
    ),
    (
        _with("design", {"kind": "derivatives", "parameters": {"h": 0.0}}),
        "design.parameters.h: the derivative step must be > 0",
    ),
    (
        _with("design", {"kind": "grid", "parameters": {"omega_m": [0.3]}}),
        (
            "design.parameters.omega_m.[key]: unknown design parameter 'omega_m': use a "
            "cosmology parameter (Omega_m, Omega_b, h,"
        ),
    ),
    (
        _with("design", {"kind": "grid", "parameters": {"Omega_m": [0.3, -0.1]}}),
        (
            "design point p0001 (design parameters Omega_m = -0.1): invalid configuration\n"
            "  cosmology.Omega_m: Input should be greater than 0"
        ),
    ),
    (
        _with(
            "design",
            {"kind": "latin_hypercube", "samples": 2, "parameters": {"Omega_b": [0.4, 0.5]}},
        ),
        "must be smaller than cosmology.Omega_m",
    ),
    (
        _with("design", {"kind": "list", "points": [{"name": "a"}, {"name": "a"}]}),
        "design.points: duplicate point name(s) a would give duplicate run ids",
    ),
    (
        _with("design", {"kind": "list", "points": []}),
        "design.points: List should have at least 1 item",
    ),
    (
        _with("design", {"kind": "list", "points": [{"name": "a b"}]}),
        "design.points.0.name: String should match pattern",
    ),
    (
        _with("design", {"kind": "latin"}),
        "design: Input tag 'latin' found using 'kind' does not match",
    ),
    (
        _with("execution.platform", "tpu"),
        "execution.platform: Input should be 'cpu' or 'gpu' (got 'tpu')",
    ),
    (
        _with("execution.device_memory_gb", -1),
        "execution.device_memory_gb: Input should be greater than 0",
    ),
    (_with("name", "my campaign"), "name: String should match pattern"),
    (
        _with("base.ic", {"seed": 4}),
        "base.ic.seed must not be set: run seeds derive from the campaign seed",
    ),
    (_with("base.ic", {"paired": True}), "base.ic.paired must not be set"),
    (
        _with("base.parallel", {"pdims": [2, 2], "halo_cells": 2}),
        "base.parallel.pdims needs 4 devices but execution.devices_per_node = 1 on cpu",
    ),
    (
        {
            **_with("base.parallel", {"pdims": [2, 2], "halo_cells": 2}),
            "execution": {"devices_per_node": 4, "processes_per_node": 3},
        },
        (
            "execution.processes_per_node = 3 with 4 devices on a node: each process holds an equal "
            "share of its node's devices; choose a divisor of 4"
        ),
    ),
]


@pytest.mark.parametrize("data, message", BAD, ids=[m[:40] for _, m in BAD])
def test_bad_campaign_files_name_the_file_and_field(tmp_path, data, message):
    path = tmp_path / "campaign.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(config.ConfigError) as err:
        campaign.load(path)
    text = str(err.value)
    assert message in text, text
    assert str(path) in text, text


def test_json_campaign_files_load(tmp_path):
    (tmp_path / "c.json").write_text(json.dumps(GOOD))
    assert campaign.load(tmp_path / "c.json") == campaign.Campaign.model_validate(GOOD)


def test_unreadable_and_malformed_files(tmp_path):
    with pytest.raises(config.ConfigError, match="missing.yaml: cannot be read"):
        campaign.load(tmp_path / "missing.yaml")
    (tmp_path / "bad.yaml").write_text("name: [unclosed\n")
    with pytest.raises(config.ConfigError, match="bad.yaml: not valid YAML"):
        campaign.load(tmp_path / "bad.yaml")
    (tmp_path / "list.yaml").write_text("- name: a\n")
    with pytest.raises(config.ConfigError, match="list.yaml: the top level must be a mapping"):
        campaign.load(tmp_path / "list.yaml")


@pytest.mark.slow
def test_a_bench_record_calibrates_the_plan(tmp_path, capsys):
    """`pmpipe bench nbody --json` on this machine: the calibrated model gives that run's step
    time and peak memory back, and scales the others by the same factors."""
    import json

    from pmpipe import cli

    record_path = tmp_path / "bench.json"
    assert (
        cli.main(
            ["bench", "nbody", "--particles", "16", "--steps", "2", "--json", str(record_path)]
        )
        == 0
    )
    capsys.readouterr()
    record = json.loads(record_path.read_text())
    # the bench's peak is this worker's own, however high earlier tests raised it: the model
    # is checked at a peak of 1.5 GB, and a peak within the model's overhead is refused
    lean = tmp_path / "lean.json"
    lean.write_text(json.dumps({**record, "peak_rss_bytes": int(0.3e9)}))
    with pytest.raises(
        ValueError,
        match=rf"execution.calibration {lean}: its peak_rss_bytes \(0.30 GB\) is not above "
        r"the process overhead of the memory model \(0.6 GB\)",
    ):
        resources.Execution(calibration=lean)
    record["peak_rss_bytes"] = int(1.5e9)
    record_path.write_text(json.dumps(record))
    plain = resources.Execution()
    calibrated = resources.Execution(calibration=record_path)
    measured = run(16, nbody={"steps": 2})
    est = resources.estimate(measured, calibrated)
    assert est.step_s == pytest.approx(record["step_s"], rel=1e-9)
    assert est.memory_per_device_bytes == pytest.approx(record["peak_rss_bytes"], rel=1e-9)
    overhead = resources.PROCESS_OVERHEAD_BYTES["cpu"]
    overlapped = resources.Execution(calibration=record_path, overlap=True)  # two runs at once
    assert resources.estimate(measured, overlapped).memory_per_device_bytes == pytest.approx(
        2 * record["peak_rss_bytes"] - overhead, rel=1e-9
    )
    time, memory = resources.calibration_factors(calibrated)
    bigger = run(64, (2, 2))
    assert resources.estimate(bigger, calibrated).step_s == pytest.approx(
        time * resources.estimate(bigger, plain).step_s, rel=1e-9
    )
    assert resources.estimate(
        bigger, calibrated
    ).memory_per_device_bytes - overhead == pytest.approx(
        memory * (resources.estimate(bigger, plain).memory_per_device_bytes - overhead), rel=1e-9
    )

    with pytest.raises(
        ValueError,
        match=f"execution.calibration {record_path} was measured on cpu, execution.platform is gpu",
    ):
        resources.Execution(platform="gpu", calibration=record_path)
    partial = tmp_path / "partial.json"
    partial.write_text(json.dumps({k: v for k, v in record.items() if k not in ("halo", "step_s")}))
    with pytest.raises(
        ValueError,
        match="the record lacks halo, step_s; write it with `pmpipe "
        "bench nbody --json` on the cpu platform",
    ):
        resources.Execution(calibration=partial)


def test_a_sampled_range_whose_end_makes_an_invalid_run_is_refused():
    """σ8 in [0, 0.9]: no sample lands on 0, but samples come arbitrarily close, so the range
    is refused, naming the end and the field; ranges whose ends are valid expand."""
    design = {"kind": "latin_hypercube", "samples": 4}
    with pytest.raises(ValueError, match="sigma8 at the low end of its range") as err:
        make(design={**design, "parameters": {"sigma8": [0.0, 0.9], "Omega_m": [0.2, 0.4]}})
    assert "cosmology.sigma8: Input should be greater than 0" in str(err.value)
    fine = make(design={**design, "parameters": {"sigma8": [0.7, 0.9], "Omega_m": [0.2, 0.4]}})
    assert len(fine.runs) == 4
