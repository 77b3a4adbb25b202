"""parallel.halo_cells 'auto': the halo from the linear displacements, one for every run of a
campaign, enough for the particles of runs of several boxes and force meshes on 8 devices; the
quick start on 8 devices with its default halo equals the one-device run; a run that needs more
halo than given stops at the step where it does."""

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import yaml
import zarr
from conftest import REPO, same_store

from pmpipe import cli
from pmpipe.campaigns import campaign, step_timing
from pmpipe.job import pipeline
from pmpipe.physics.evolution import ics, simulation, timesteps
from pmpipe.physics.mesh import domain
from pmpipe.physics.theory import cosmology, eisenstein_hu
from pmpipe.run import config, ghost_cells
from pmpipe.runtime import parallel


def _run(box_size, particles, oversample, sigma8=0.8102, **parallel_section):
    return config.Run.model_validate(
        {
            "box": {"box_size": box_size, "particles": particles, "oversample": oversample},
            "parallel": {"pdims": [2, 4], **parallel_section},
            "cosmology": {"sigma8": sigma8},
        }
    )


def test_the_auto_halo_grows_with_the_force_mesh_and_the_displacements():
    coarse, fine = ghost_cells.cells(_run(256.0, 64, 1)), ghost_cells.cells(_run(256.0, 64, 2))
    assert _run(256.0, 64, 1).parallel.halo_cells == "auto"
    assert fine in (2 * coarse - 1, 2 * coarse, 2 * coarse + 1)  # the same Mpc/h
    assert ghost_cells.cells(_run(256.0, 64, 2, halo_cells=3)) == 3
    assert ghost_cells.cells(_run(256.0, 64, 2, sigma8=1.2)) > fine
    # normalised by A_s: the estimate's σ8 from A_s is within 3 % of CAMB's 0.810
    cosmo = dataclasses.replace(cosmology.Cosmology(), sigma8=0.0)
    k = np.logspace(-4, 2, 600)
    p = eisenstein_hu.linear_power(cosmo, k, A_s=2.105e-9)
    assert eisenstein_hu.sigma_r(k, p, 8.0) == pytest.approx(0.810, rel=0.03)


def test_a_campaign_gives_its_runs_one_halo_that_more_sobol_samples_keep(tmp_path):
    data = {
        "name": "sobol",
        "base": {"box": {"box_size": 256.0, "particles": 32}, "parallel": {"pdims": [1, 2]}},
        "design": {
            "kind": "sobol",
            "parameters": {"Omega_m": [0.25, 0.35], "sigma8": [0.7, 0.9]},
            "samples": 8,
        },
        "execution": {"devices_per_node": 2},
    }
    small = campaign.Campaign.model_validate(data)
    data["design"]["samples"] = 16
    large = campaign.Campaign.model_validate(data)
    cells = small.base.parallel.halo_cells
    assert small.halo_source == "auto" and isinstance(cells, int)
    assert {spec.run.parallel.halo_cells for spec in large.runs} == {cells}
    assert large.base.parallel.halo_cells == cells
    data["design"]["parameters"]["sigma8"] = [0.7, 1.3]
    assert campaign.Campaign.model_validate(data).base.parallel.halo_cells > cells
    # the halo changes no result, and no run's hash
    run = small.runs[0].run
    wider = run.model_copy(update={"parallel": run.parallel.model_copy(update={"halo_cells": 16})})
    assert config.config_hash(wider) == config.config_hash(run)
    # a run file hashed with its own halo (a halo other than 8, before 'auto') still loads
    data = json.loads(config.RunFile.build("c", "r", 0, {}, wider).to_json())
    data["config_hash"] = config.config_hash(wider, 16)
    assert config.RunFile.model_validate(data).config.parallel.halo_cells == 16
    data["config_hash"] = config.config_hash(wider, 17)
    with pytest.raises(ValueError, match="edited by hand"):
        config.RunFile.model_validate(data)


def test_the_plan_shows_the_halo_and_what_it_costs(tmp_path, capsys):
    data = yaml.safe_load((REPO / "config" / "quickstart.yaml").read_text())
    data["base"]["parallel"] = {"pdims": [2, 4]}
    data["execution"]["devices_per_node"] = 8
    (tmp_path / "q8.yaml").write_text(yaml.safe_dump(data))
    assert cli.main(["plan", str(tmp_path / "q8.yaml"), "--results", str(tmp_path / "r")]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("halo:"))
    cells = campaign.load(tmp_path / "q8.yaml").base.parallel.halo_cells
    assert line.startswith(f"halo: {cells} force-mesh cells (auto") and "pdims (2, 4)" in line


@pytest.mark.slow
@pytest.mark.parametrize(
    "particles, box_size, oversample",
    [(32, 128.0, 2), (32, 256.0, 1), (32, 512.0, 2), (64, 256.0, 2)],
)
def test_the_auto_halo_holds_the_particles_of_runs_of_several_boxes(
    particles, box_size, oversample
):
    """8 devices, 10 steps to a = 1: no particle leaves the auto halo, which is at most twice
    what they need, plus 3 cells."""
    run = _run(box_size, particles, oversample)
    cells = ghost_cells.cells(run)
    mesh = parallel.make_mesh((2, 4))
    grid = domain.Grid(mesh, particles, oversample, box_size, cells)
    noise = ics.white_noise(3, particles, mesh)
    times = timesteps.timeline(0.1, 1.0, 10)
    _, res = simulation.simulate(step_timing.COSMOLOGY, noise, grid, times, step_timing.POWER)
    needed = int(res.needed_halo)
    assert needed <= cells <= 2 * needed + 3, (needed, cells)


def _runs(folder, pdims, realisations=1, particles=64, nside=64, **parallel_section) -> list[Path]:
    """The quick start's fiducial runs of ``particles`` per side and maps of ``nside``, on
    pdims, written under folder/results."""
    data = yaml.safe_load((REPO / "config" / "quickstart.yaml").read_text())
    data["base"]["box"]["particles"] = particles
    if nside != 64:
        data["base"]["lensing"]["full_sky"]["nside"] = nside
        data["base"]["summaries"]["ell_range"] = [30, 3 * nside]
    data["base"]["parallel"] = {"pdims": list(pdims), **parallel_section}
    data["design"], data["realisations"] = {"kind": "fiducial"}, realisations
    data["execution"]["devices_per_node"] = 8
    (folder / "q.yaml").write_text(yaml.safe_dump(data))
    return campaign.write_run_files(campaign.load(folder / "q.yaml"), folder / "results")


@pytest.mark.slow
def test_the_quick_start_on_8_devices_with_its_default_halo_equals_one_device(tmp_path):
    """The quick start at 32^3 particles and nside 32 to keep the suite short: on (2, 4) a
    device holds 16 x 8 columns of particles, a thinner share than at 64^3."""
    runs = {}
    for pdims in [(2, 4), (1, 1)]:
        folder = tmp_path / f"{pdims[0]}x{pdims[1]}"
        folder.mkdir()
        (path,) = _runs(folder, pdims, particles=32, nside=32)
        (outcome,) = pipeline.run_all([path])
        assert outcome.error is None, outcome.error
        runs[pdims] = path.parent
    for stage in ("nbody", "lensing"):  # the density, planes and maps
        same_store(runs[2, 4] / f"{stage}.zarr", runs[1, 1] / f"{stage}.zarr", tolerance=1e-5)
    # bin means of |k| and the κ PDF's counts sum in another order: 1e-4
    one, eight = (zarr.open_group(runs[p] / "summaries.zarr", mode="r") for p in [(1, 1), (2, 4)])
    same_store(one.store.root, eight.store.root, tolerance=1e-4)
    spectra = [name for name in one.array_keys() if name.startswith(("pk", "cl"))]
    assert {"pk", "cl_healpix"} <= set(spectra)
    for name in spectra:  # bin by bin; NaN where a bin holds no mode, Born's B modes are 0
        x, y = (np.asarray(g[name][:], np.float64) for g in (eight, one))
        assert np.array_equal(np.isnan(x), np.isnan(y)), name
        scale = np.nanmax(np.abs(y))
        assert np.nanmax(np.abs(x - y)) <= 1e-5 * scale, name  # relative to the largest bin
        ok = np.abs(x - y) <= 1e-4 * np.abs(y) + 1e-12 * scale  # and bin by bin (5e-5 seen)
        assert ok[~np.isnan(y)].all(), (name, np.nanmax(np.abs(x - y) / np.abs(y)))


@pytest.mark.slow
def test_a_run_that_needs_more_halo_stops_at_that_step_and_its_job_goes_on(tmp_path):
    """The second and third runs of the same size fail without evolving, naming the first."""
    paths = _runs(tmp_path, (2, 4), realisations=3, halo_cells=1)
    first, second, third = pipeline.run_all(paths)
    assert first.error is not None and first.error.startswith("HaloError")
    step, steps = (int(x) for x in first.error.split(" at step ")[1].split(" (")[0].split(" of "))
    assert 0 <= step < steps  # it stopped there, before the last step
    assert not (paths[0].parent / "nbody.zarr").exists()
    assert (
        second.error
        == f"HaloError: not run: run {first.run_id} of this job, of the same size, failed: {first.error}"
    )
    assert third.error == second.error  # the first run's reason, not the second's
    assert second.seconds == 0.0 and not (paths[1].parent / "ic.zarr").exists()
    recorded = json.loads((paths[1].parent / "outcome.json").read_text())
    assert "not run" in json.dumps(recorded)
