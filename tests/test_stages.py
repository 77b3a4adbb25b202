"""Stages and stores: labelled zarr output, provenance, completion marker, same stores on any
device mesh."""

import json
import time

import healpy
import numpy as np
import pytest
import references
import xarray as xr
import zarr

from pmpipe import stages
from pmpipe.run import config, validation
from pmpipe.runtime import backend, parallel
from pmpipe.stages import registry, status
from pmpipe.storage import store

RUN = {
    "box": {"particles": 16, "box_size": 64.0},
    "nbody": {"steps": 3, "snapshots": [0.5]},
    "parallel": {"halo_cells": 4},
    "lightcone": {"z_max": 0.05, "plane_thickness": 32.0},
    "lensing": {
        "source_redshifts": [0.03, 0.05],
        "flat_sky": {"field_of_view": 20.0, "pixels": 32},
        "full_sky": {"nside": 8},
    },
    "summaries": {"shape_noise": {}, "smoothing_arcmin": [0, 60.0], "kappa_range": [-0.01, 0.01]},
}


RUN_MODEL = config.Run.model_validate(RUN)
RUNS = stages.run_stages(RUN_MODEL)  # ic, nbody, lensing, summaries


def _write_run(run_dir, pdims=(1, 1), **overrides):
    data = json.loads(json.dumps(RUN))
    data["parallel"]["pdims"] = list(pdims)
    data.update(overrides)
    run = config.Run.model_validate(data)
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "config.json"
    path.write_text(
        config.RunFile.build("test", run_dir.name, 0, {"Omega_m": 0.3111}, run).to_json()
    )
    return path


def _run_all(config_path):
    run = validation.load_run_file(config_path).config
    return [registry.run_stage(stage, config_path) for stage in stages.run_stages(run)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The same run on 1 device and on a (2, 2) device mesh."""
    root = tmp_path_factory.mktemp("runs")
    out = {}
    for pdims in [(1, 1), (2, 2)]:
        path = _write_run(root / f"run-{pdims[0]}x{pdims[1]}", pdims)
        _run_all(path)
        out[pdims] = path.parent
    return out


@pytest.mark.slow
def test_stores_open_with_labels_units_and_coordinates(runs):
    run_dir = runs[1, 1]
    ic = xr.open_zarr(run_dir / "ic.zarr")
    assert ic.linear_density.dims == ("x", "y", "z")
    assert ic.displacement.dims == ("qx", "qy", "qz", "component")
    assert ic.displacement.attrs["units"] == "Mpc/h"
    assert list(ic.component.values) == ["x", "y", "z"]
    nb = xr.open_zarr(run_dir / "nbody.zarr")
    assert nb.density.dims == ("a", "x", "y", "z")
    np.testing.assert_allclose(nb.a.values, [0.5, 1.0])
    assert nb.a.attrs["long_name"] and nb.x.attrs["units"] == "Mpc/h"
    np.testing.assert_allclose(nb.x.values, np.arange(16) * 4.0)
    assert nb.momentum.dims == ("qx", "qy", "qz", "component")
    assert abs(float(nb.density.sel(a=1.0).mean()) - 1.0) < 1e-5  # mass is conserved
    sm = xr.open_zarr(run_dir / "summaries.zarr")
    assert sm.pk.dims == ("a", "k") and sm.pk.attrs["units"] == "(Mpc/h)^3"
    assert sm.k.attrs["units"] == "h/Mpc"
    assert sm.pk.attrs["shot_noise"] == pytest.approx(64.0**3 / 16**3)
    # on the largest scales the measured spectrum follows linear theory at both snapshots
    ratio = (sm.pk / sm.pk_linear).isel(k=slice(0, 3)).values
    assert np.all(np.abs(ratio - 1) < 0.5), ratio


@pytest.mark.slow
def test_provenance_and_config_hash(runs):
    run_dir = runs[2, 2]
    run_file = validation.load_run_file(run_dir / "config.json")
    for stage in stages.STAGES:
        attrs = xr.open_zarr(stages.store_path(run_dir, stage)).attrs
        assert attrs["config_hash"] == run_file.config_hash
        assert attrs["config_hash"] == config.config_hash(
            config.Run.model_validate(attrs["config"])
        )
        assert attrs["stage"] == stage and attrs["run_id"] == run_dir.name
        assert attrs["pdims"] == [2, 2] and attrs["device_count"] == 4
        for key in (
            "pmpipe_version",
            "jax_version",
            "jaxdecomp_version",
            "device_kind",
            "started",
            "finished",
            store.COMPLETE,
        ):
            assert attrs[key], key
        assert attrs["started"] <= attrs["finished"]


@pytest.mark.slow
def test_stores_do_not_depend_on_the_device_mesh(runs):
    one, four = runs[1, 1], runs[2, 2]
    for stage, names in [
        ("ic", ["linear_density", "displacement"]),
        ("nbody", ["density", "displacement", "momentum"]),
        ("lensing", ["kappa", "gamma1", "kappa_healpix", "kappa_healpix_alm", "gamma2_healpix"]),
        ("summaries", ["pk", "pk_cross_initial", "cl", "cl_healpix", "pdf"]),
    ]:
        a = zarr.open_group(stages.store_path(one, stage), mode="r")
        b = zarr.open_group(stages.store_path(four, stage), mode="r")
        for name in names:
            x, y = np.asarray(a[name][:]), np.asarray(b[name][:])
            if np.iscomplexobj(x):
                x, y = np.concatenate([x.real, x.imag]), np.concatenate([y.real, y.imag])
            x, y = x.astype(np.float64), y.astype(np.float64)
            assert np.array_equal(np.isnan(x), np.isnan(y)), (stage, name)  # empty bins
            assert np.nanmax(np.abs(x - y)) <= 1e-4 * np.nanmax(np.abs(x)), (stage, name)
    shards = zarr.open_group(stages.store_path(four, "nbody"), mode="r")["density"].shards
    assert shards == (1, 8, 8, 16)  # one shard per device block: one writer per shard


# the particle, density, plane and map arrays a run writes, by store
FIELDS = {
    "ic": {"displacement", "linear_density"},
    "nbody": {"displacement", "momentum", "density", "lightcone_density", "lightcone_healpix"},
    "lensing": {"kappa", "gamma1", "gamma2", "kappa_healpix", "gamma1_healpix"},
}


def _crc32c_last(codecs) -> bool:
    return codecs[-1].to_dict()["name"] == "crc32c"


@pytest.mark.slow
def test_every_array_is_sharded_with_crc32c_and_a_changed_byte_fails_its_read(runs, tmp_path):
    """Every array of one or more dimensions (the particle, density, plane and map arrays
    among them) is sharded, every chunk and every shard index ending in a CRC-32C; a byte
    changed inside a shard, in a chunk or in the index, fails zarr's own read of it."""
    import shutil

    for stage in ("ic", "nbody", "lensing", "summaries"):
        group = zarr.open_group(stages.store_path(runs[2, 2], stage), mode="r")
        arrays = dict(group.arrays())
        assert FIELDS.get(stage, set()) <= set(arrays), (stage, sorted(arrays))
        for name, array in arrays.items():
            if array.ndim == 0:  # a single value: one chunk, its checksum all the same
                assert _crc32c_last(array.metadata.codecs), (stage, name)
                continue
            (sharding,) = array.metadata.codecs
            assert isinstance(sharding, zarr.codecs.ShardingCodec), (stage, name)
            assert _crc32c_last(sharding.codecs) and _crc32c_last(sharding.index_codecs)
    nbody = tmp_path / "nbody.zarr"
    shutil.copytree(stages.store_path(runs[2, 2], "nbody"), nbody)
    density = zarr.open_array(nbody / "density", mode="r")
    assert density.shards == (1, 8, 8, 16)  # one shard per (2, 2) device block
    shard = nbody / "density" / density.metadata.encode_chunk_key((1, 1, 0, 0))
    original = shard.read_bytes()
    for at in (100, len(original) - 10):  # a chunk's data; the index at the shard's end
        shard.write_bytes(original[:at] + bytes([original[at] ^ 4]) + original[at + 1 :])
        with pytest.raises(ValueError, match="checksum"):
            density[1, 8:, :8]
        assert np.isfinite(density[0]).all()  # the other shards read as before
        assert "does not match its CRC-32" in store.problems(nbody, checksums=True)[0]
    shard.write_bytes(original)
    assert store.problems(nbody, checksums=True) == []


@pytest.mark.slow
def test_store_without_marker_is_never_consumed(runs, tmp_path, capsys):
    path = _write_run(tmp_path / "run", (1, 1))
    registry.run_stage("ic", path)
    ic = zarr.open_group(tmp_path / "run" / "ic.zarr", mode="r+")
    del ic.attrs[store.COMPLETE]
    assert not store.is_complete(tmp_path / "run" / "ic.zarr")
    assert registry.run_checked("nbody", path) == 2
    err = capsys.readouterr().err
    assert "ic.zarr has no completion marker" in err
    assert not (tmp_path / "run" / "nbody.zarr").exists()
    assert references.run_status(tmp_path / "run") == "planned"
    assert "INCOMPLETE" in store.describe(tmp_path / "run" / "ic.zarr")


@pytest.mark.slow
def test_store_of_another_config_is_refused(runs, tmp_path):
    src = runs[1, 1]
    run_dir = tmp_path / "other"
    path = _write_run(run_dir, (1, 1), ic={"seed": 7})
    import shutil

    shutil.copytree(src / "ic.zarr", run_dir / "ic.zarr")
    with pytest.raises(store.IncompleteStoreError, match="is stale: made from config"):
        registry.run_stage("nbody", path)


@pytest.mark.slow
def test_a_store_made_from_an_upstream_store_made_again_since_is_stale(runs, tmp_path):
    """Each store names the run's earlier stores it was made from, by the checksum of their
    manifests; once ic.zarr is made again, the stores made from the old one are stale (to do
    again, STALE in show) until their stage runs again."""
    import shutil

    run_dir = tmp_path / "run"
    shutil.copytree(runs[1, 1], run_dir)
    config_hash = validation.load_run_file(run_dir / "config.json").config_hash
    upstream = {s: zarr.open_group(stages.store_path(run_dir, s)).attrs["upstream"] for s in RUNS}
    assert upstream == {
        "ic": {},
        "nbody": {"ic.zarr": store.manifest_checksum(run_dir / "ic.zarr")},
        "lensing": {n: store.manifest_checksum(run_dir / n) for n in ("ic.zarr", "nbody.zarr")},
        "summaries": {
            n: store.manifest_checksum(run_dir / n)
            for n in ("ic.zarr", "nbody.zarr", "lensing.zarr")
        },
    }
    assert status.pending_stages(RUN_MODEL, config_hash, run_dir) == ()
    time.sleep(1.1)  # the completion time, which the manifest covers, changes
    registry.run_stage("ic", run_dir / "config.json")
    nbody = stages.store_path(run_dir, "nbody")
    assert store.problems(nbody, config_hash=config_hash) == [
        "is stale: made from another ic.zarr (that store was made again since)"
    ]
    assert store.is_complete(nbody)  # intact: only against its run is it stale
    assert "STALE" in store.describe(nbody, config_hash)
    assert status.pending_stages(RUN_MODEL, config_hash, run_dir) == RUNS[1:]
    registry.run_stage("nbody", run_dir / "config.json")
    assert store.problems(nbody, config_hash=config_hash) == []
    assert status.pending_stages(RUN_MODEL, config_hash, run_dir) == RUNS[2:]


@pytest.mark.slow
def test_run_status_and_describe(runs):
    assert references.run_status(runs[1, 1]) == "complete"
    text = store.describe(runs[1, 1] / "nbody.zarr")
    assert "complete" in text and "density (a, x, y, z) [2 x 16 x 16 x 16]" in text


def test_bad_run_file_names_file_and_field(tmp_path, capsys):
    path = _write_run(tmp_path / "run")
    data = json.loads(path.read_text())
    data["config"]["ic"]["seed"] = 5  # valid, but not the config the hash was made from
    path.write_text(json.dumps(data))
    assert registry.run_checked("ic", path) == 2
    err = capsys.readouterr().err
    assert str(path) in err and "config_hash" in err
    assert not (tmp_path / "run" / "ic.zarr").exists()


def test_host_devices_requested_only_when_unset(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--foo")
    parallel.request_host_devices(4)
    assert backend.HOST_DEVICES_FLAG + "=4" in __import__("os").environ["XLA_FLAGS"]
    monkeypatch.setenv("XLA_FLAGS", backend.HOST_DEVICES_FLAG + "=8")
    parallel.request_host_devices(2)
    assert __import__("os").environ["XLA_FLAGS"] == backend.HOST_DEVICES_FLAG + "=8"


@pytest.mark.slow
def test_lensing_store_labels_and_full_sky_mean(runs):
    run_dir = runs[1, 1]
    nb = xr.open_zarr(run_dir / "nbody.zarr")
    assert nb.lightcone_density.dims == ("plane", "u", "v") and nb.plane.attrs["units"] == "Mpc/h"
    assert np.all(np.diff(nb.plane_a.values) < 0)  # farther planes are crossed earlier
    lens = xr.open_zarr(run_dir / "lensing.zarr")
    assert list(lens.source.values) == ["z=0.03", "z=0.05"]
    np.testing.assert_allclose(lens.z_source.values, [0.03, 0.05])
    assert (
        lens.kappa.dims == ("source", "theta_x", "theta_y") and lens.theta_x.attrs["units"] == "deg"
    )
    hp = lens.kappa_healpix
    assert hp.dims == ("source", "pixel") and hp.attrs["grid_name"] == "HEALPix"
    assert hp.attrs["nside"] == 8 and hp.attrs["nest"] is False and hp.shape[1] == 768
    for kappa in hp.values:  # every shell has zero mean, so has κ
        assert abs(kappa.astype(np.float64).mean()) < 1e-6 * np.abs(kappa).max()
    alm = lens.kappa_healpix_alm  # the maps are the synthesis of the coefficients up to 3 nside - 1
    assert alm.dims == ("source", "alm") and alm.attrs["ell_max"] == 23
    for kappa, coefficients in zip(hp.values, alm.values):
        synthesis = healpy.alm2map(coefficients.astype(np.complex128), 8, lmax=23)
        np.testing.assert_allclose(
            kappa, synthesis - synthesis.mean(), atol=1e-5 * np.abs(kappa).max()
        )
    sm = xr.open_zarr(run_dir / "summaries.zarr")
    cl = np.stack([healpy.alm2cl(a.astype(np.complex128)) for a in alm.values])
    for b, (lo, hi) in enumerate(zip(sm.ell_healpix_lo.values, sm.ell_healpix_hi.values)):
        ell = np.arange(24)
        inside = (ell >= lo) & (ell < hi) & (ell > 0)
        if inside.any():  # the stored C_ell is the coefficients' own, binned with 2 ell + 1
            binned = cl[:, inside] @ (2 * ell[inside] + 1) / np.sum(2 * ell[inside] + 1)
            np.testing.assert_allclose(
                np.diagonal(sm.cl_healpix.values[:, :, b]), binned, rtol=1e-5
            )
    assert sm.peaks.dims == ("source", "smoothing", "kappa") and sm.kappa_lo.dims == ("kappa",)
    assert sm.cl_healpix.dims == ("source", "source2", "ell_healpix") and np.all(
        np.isfinite(sm.r_initial.values[:3])
    )
    assert 0.9 < sm.r_initial.values[0] <= 1.0 + 1e-6  # the largest scales stay linear
    # the mean multipole of each bin, computed here from the map geometry
    pixel = np.radians(20.0) / 32
    freq = 2 * np.pi * np.fft.fftfreq(32, d=pixel)
    flat = np.hypot(freq[:, None], freq[None, :]).ravel()
    full = np.arange(3 * 8, dtype=float)
    for suffix, ell, weights in (("", flat, np.ones_like(flat)), ("_healpix", full, 2 * full + 1)):
        lo, hi = sm["ell" + suffix + "_lo"].values, sm["ell" + suffix + "_hi"].values
        expected = []
        for a, b in zip(lo, hi):
            inside = (ell >= a) & (ell < b) & (ell > 0)
            expected.append(
                np.sum(weights[inside] * ell[inside]) / np.sum(weights[inside])
                if inside.any()
                else np.nan
            )
        np.testing.assert_allclose(sm["ell" + suffix + "_mean"].values, expected, rtol=1e-12)
        assert np.isfinite(expected).sum() >= 3


@pytest.mark.slow
def test_valid_ranges_are_stored_with_their_reasons(runs):
    lens = zarr.open_group(runs[1, 1] / "lensing.zarr", mode="r")
    sm = xr.open_zarr(runs[1, 1] / "summaries.zarr")
    for suffix, ell_low, ell_high in (
        ("", 2 * np.pi / np.radians(20.0), np.pi * 32 / np.radians(20.0)),
        ("_healpix", 2, 23),
    ):
        low, high = sm["ell_min_valid" + suffix], sm["ell_max_valid" + suffix]
        assert low.dims == ("source",) and len(low.attrs["reasons"]) == 2
        np.testing.assert_array_equal(low.values, lens["ell_min_valid" + suffix][:])
        assert np.all(low.values >= ell_low - 1e-9) and np.all(high.values <= ell_high + 1e-9)
        assert all(
            r.startswith(("map:", "geometry:", "resolution:", "no multipole"))
            for r in high.attrs["reasons"] + low.attrs["reasons"]
        )
    k_valid = sm.k_max_valid.values
    assert sm.k_max_valid.dims == ("a",) and np.all(k_valid == k_valid[0])
    assert 0 < k_valid[0] <= np.pi * 16 / 64.0  # at most the particle Nyquist frequency
