"""Store writes: shards that tile the device blocks, codecs per array, lossy bit rounding,
background writes (bounded, waited for by mark_complete, failures reported, done at exit)."""

import json
import os
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path

import jax
import numpy as np
import pytest
import xarray as xr
import zarr
from conftest import mount_tmpfs

from pmpipe.runtime import parallel
from pmpipe.storage import encoding, shards, store, writes

DIMS = ("qx", "qy", "qz", "component")


def _sharded(values: np.ndarray, pdims):
    return jax.device_put(values, parallel.field_sharding(parallel.make_mesh(pdims)))


def _particles(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, n, n, 3)).astype(np.float32)


def _codec_names(array: zarr.Array) -> list[str]:
    """The codecs of the chunks inside the array's shards, once it is checked that the array
    is sharded and that every chunk and the shard index end in a CRC-32C."""
    (sharding,) = array.metadata.codecs
    assert isinstance(sharding, zarr.codecs.ShardingCodec), array.metadata.codecs
    names = [c.to_dict()["name"] for c in sharding.codecs]
    assert names[-1] == "crc32c" and sharding.index_codecs[-1].to_dict()["name"] == "crc32c"
    return names[:-1]


def _disk_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


@pytest.mark.parametrize("pdims", [(1, 1), (2, 4), (8, 1)])
def test_shards_tile_device_blocks_and_read_back_exactly(tmp_path, monkeypatch, pdims):
    monkeypatch.setattr(encoding, "MAX_SHARD_BYTES", 16 * 2**10)
    values = _particles(32)
    data = _sharded(values, pdims)
    block = data.sharding.shard_shape(data.shape)
    chunks = encoding.block_shards(data)
    assert all(b % c == 0 for b, c in zip(block, chunks)), (block, chunks)
    assert np.prod(chunks) * 4 <= 16 * 2**10 < np.prod(block) * 4  # the block was cut
    # every chunk is one contiguous piece of its block: leading axes cut first
    cut = [i for i, (b, c) in enumerate(zip(block, chunks)) if b != c]
    assert all(chunks[i] == 1 for i in cut[:-1]) and cut == list(range(cut[0], cut[-1] + 1))

    path = tmp_path / "s.zarr"
    group = store.create(path, {"stage": "test"})
    store.write_array(group, "displacement", data, DIMS, "Mpc/h", "displacement")
    snaps = [_particles(32, seed)[..., 0] for seed in (1, 2)]  # a stacked (a, x, y, z) array
    first = _sharded(snaps[0], pdims)
    density = store.create_array(
        group,
        "density",
        (2, 32, 32, 32),
        np.float32,
        store.Labels(("a", "x", "y", "z"), "1", "density"),
        (1,) + encoding.block_shards(first),
    )
    for i, snap in enumerate(snaps):
        store.write_blocks(density, _sharded(snap, pdims), (i,))
    store.mark_complete(group)

    g = store.open_complete(path)
    assert g["displacement"].shards == g["displacement"].chunks == chunks
    assert g["density"].shards[0] == 1
    assert np.array_equal(g["displacement"][:], values)
    assert np.array_equal(g["density"][:], np.stack(snaps))
    mesh = parallel.make_mesh(pdims)
    back = store.read_sharded(g["displacement"], mesh)
    assert back.sharding.is_equivalent_to(data.sharding, 4)
    assert np.array_equal(np.asarray(back), values)
    assert np.array_equal(np.asarray(store.read_sharded(g["density"], mesh, (1,))), snaps[1])
    ds = xr.open_zarr(path)
    # dask (open_zarr's default chunks={}) takes the preferred chunks: the zarr chunks
    assert ds.displacement.encoding["chunks"] == chunks
    assert ds.displacement.encoding["preferred_chunks"] == dict(zip(DIMS, chunks))
    assert np.array_equal(ds.displacement.values, values)
    assert np.array_equal(ds.density.isel(a=0).values, snaps[0])


def test_numpy_arrays_sharded_along_leading_axis(tmp_path, monkeypatch):
    monkeypatch.setattr(encoding, "MAX_SHARD_BYTES", 8000)
    assert encoding.block_shards(np.zeros((100, 50, 7))) == (2, 50, 7)  # 2 * 50 * 7 * 8 <= 8000
    assert encoding.block_shards(np.zeros((4, 300, 7))) == (1, 142, 7)  # one row is too large
    assert encoding.block_shards(np.zeros((10,))) == (10,)
    values = np.random.default_rng(3).standard_normal((101, 50, 7))
    group = store.create(tmp_path / "s.zarr", {})
    array = store.write_array(group, "pk", values, ("a", "k", "b"), "1", "x")
    values[...] = 0  # the caller may reuse its array once write_array returned
    store.mark_complete(group)
    assert array.shards == array.chunks == (2, 50, 7)
    back = zarr.open_group(tmp_path / "s.zarr", mode="r")["pk"][:]
    assert np.array_equal(back, np.random.default_rng(3).standard_normal((101, 50, 7)))


def test_codecs_per_array(tmp_path):
    group = store.create(tmp_path / "s.zarr", {})
    store.write_array(group, "displacement", _sharded(_particles(64), (2, 4)), DIMS, "Mpc/h", "big")
    store.write_array(group, "big_f64", np.ones((400, 400)), ("a", "b"), "1", "big numpy float")
    store.write_array(group, "seed", np.arange(400 * 400, dtype=np.int64), ("run",), "1", "int")
    store.write_array(group, "flag", np.ones(10, bool), ("run",), "1", "bool")
    store.write_coordinate(group, "k", np.arange(50) * 0.1, "h/Mpc", "small float")
    store.write_coordinate(group, "component", np.array(["x", "y", "z"]), "1", "text")
    store.mark_complete(group)
    g = store.open_complete(tmp_path / "s.zarr")
    for name in ("displacement", "big_f64"):  # 3 MB and 1.3 MB of floats: raw bytes
        assert _codec_names(g[name]) == ["bytes"], name
    for name in ("seed", "flag", "k", "component"):
        assert "zstd" in _codec_names(g[name]), name
    assert np.array_equal(g["seed"][:], np.arange(400 * 400))
    assert list(g["component"][:]) == ["x", "y", "z"]


@pytest.mark.filterwarnings("ignore:Numcodecs codecs are not in the Zarr version 3")
def test_keepbits_rounds_large_floats_only(tmp_path):
    values = _particles(64, 5) * 10.0
    paths = {}
    for keepbits in (None, 7):
        paths[keepbits] = path = tmp_path / f"keep{keepbits}.zarr"
        group = store.create(path, {}, keepbits=keepbits)
        store.write_array(group, "displacement", _sharded(values, (2, 4)), DIMS, "Mpc/h", "x")
        store.write_coordinate(group, "k", np.arange(50) / 3.0, "h/Mpc", "small: stays exact")
        store.mark_complete(group)
    exact = zarr.open_group(paths[None], mode="r")
    lossy = zarr.open_group(paths[7], mode="r")
    assert _codec_names(lossy["displacement"]) == ["numcodecs.bitround", "bytes", "zstd"]
    rounded = lossy["displacement"][:]
    assert np.array_equal(exact["displacement"][:], values)
    rel = np.abs(rounded - values) / np.abs(values)
    assert 0 < rel.max() <= 2.0**-7
    assert np.array_equal(lossy["k"][:], np.arange(50) / 3.0)
    size = {k: _disk_bytes(p / "displacement") for k, p in paths.items()}
    assert size[7] < 0.6 * size[None], size
    with pytest.raises(ValueError, match="keepbits"):
        store.create(tmp_path / "bad.zarr", {}, keepbits=60)


@pytest.mark.parametrize("pdims", [(1, 1), (2, 4)])
def test_raw_shards_skip_zarr_and_are_its_bytes(tmp_path, monkeypatch, pdims):
    """Raw float shards (no compression: every float array here) are written and read by
    pmpipe.storage.shards, not by zarr's codec pipeline: byte for byte the files zarr writes
    (chunks cut along one axis and along two), checksummed in the manifest as written, read
    back exactly; a changed byte in a chunk or in the index fails the read that meets it."""
    monkeypatch.setattr(encoding, "COMPRESS_BELOW_BYTES", 0)
    monkeypatch.setattr(encoding, "MAX_SHARD_BYTES", 64 * 2**10)
    monkeypatch.setattr(encoding, "MAX_CHUNK_BYTES", 16 * 2**10)
    values = _particles(32)
    zarr_writes = []
    real_setitem = zarr.Array.__setitem__

    def counted(self, selection, value):
        zarr_writes.append(self.path)
        return real_setitem(self, selection, value)

    monkeypatch.setattr(zarr.Array, "__setitem__", counted)
    path = tmp_path / "s.zarr"
    group = store.create(path, {"stage": "test"})
    store.write_array(group, "displacement", _sharded(values, pdims), DIMS, "Mpc/h", "x")
    store.mark_complete(group)
    assert "displacement" not in zarr_writes
    ours = zarr.open_array(path / "displacement", mode="r")
    assert shards.chunk_shape(ours) is not None and ours.chunks != ours.shards
    monkeypatch.setattr(zarr.Array, "__setitem__", real_setitem)
    theirs = zarr.create_array(
        tmp_path / "zarr", shape=ours.shape, dtype=ours.dtype, shards=ours.shards,
        chunks=ours.chunks, filters=None, compressors=[zarr.codecs.Crc32cCodec()],
    )  # fmt: skip
    theirs[...] = values
    files = _chunk_files(path, "displacement")
    assert len(files) > 1
    manifest = json.loads((path / "pmpipe_manifest.json").read_text())
    for f in files:
        key = str(f.relative_to(path / "displacement"))
        assert f.read_bytes() == (tmp_path / "zarr" / key).read_bytes(), key
        assert manifest["arrays"]["displacement"]["chunks"][key] == [
            f.stat().st_size,
            zlib.crc32(f.read_bytes()),
        ]
    back = store.read_sharded(store.open_complete(path)["displacement"], parallel.make_mesh(pdims))
    assert np.array_equal(np.asarray(back), values)
    assert np.array_equal(shards.read(theirs, (slice(None),)), values)  # zarr's files too
    original = files[0].read_bytes()
    for at in (100, len(original) - 10):  # a chunk's data; the index at the shard's end
        files[0].write_bytes(original[:at] + bytes([original[at] ^ 4]) + original[at + 1 :])
        with pytest.raises(ValueError, match="checksum do not match"):
            shards.read(ours, (slice(None),))
    files[0].write_bytes(original)


@pytest.mark.parametrize("raw", [False, True])
def test_failed_background_write_leaves_no_marker(tmp_path, monkeypatch, raw):
    """A zarr write, or a raw shard's (pmpipe.storage.shards), that fails."""
    real, real_write = zarr.Array.__setitem__, shards.write
    monkeypatch.setattr(encoding, "COMPRESS_BELOW_BYTES", 0 if raw else 2**20)

    def failing(self, selection, value):
        if self.path == "momentum":
            raise OSError("disk full (test)")
        return real(self, selection, value)

    def failing_write(path, block, chunks):
        if "momentum" in path.parts:
            raise OSError("disk full (test)")
        return real_write(path, block, chunks)

    monkeypatch.setattr(zarr.Array, "__setitem__", failing)
    monkeypatch.setattr(shards, "write", failing_write)
    path = tmp_path / "s.zarr"
    group = store.create(path, {})
    data = _sharded(_particles(16), (2, 4))
    store.write_array(group, "displacement", data, DIMS, "Mpc/h", "x")
    store.write_array(group, "momentum", data, DIMS, "Mpc/h", "x")  # fails in the background only
    with pytest.raises(writes.StoreWriteError, match="'momentum'.*disk full") as err:
        store.mark_complete(group)
    assert isinstance(err.value.__cause__, OSError)
    assert not store.is_complete(path)
    assert "INCOMPLETE" in store.describe(path)
    with pytest.raises(store.IncompleteStoreError):
        store.open_complete(path)
    assert np.array_equal(zarr.open_group(path, mode="r")["displacement"][:], np.asarray(data))
    monkeypatch.setattr(zarr.Array, "__setitem__", real)
    monkeypatch.setattr(shards, "write", real_write)
    group = store.create(path, {})  # the store made again: the old failure is forgotten
    store.write_array(group, "momentum", data, DIMS, "Mpc/h", "x")
    store.mark_complete(group)
    assert store.is_complete(path)


def test_writes_run_in_background(tmp_path, monkeypatch):
    gate = threading.Event()
    real = writes._write

    def gated(array, selection, block):
        assert gate.wait(30)
        real(array, selection, block)

    monkeypatch.setattr(writes, "_write", gated)
    values = _particles(16)
    group = store.create(tmp_path / "s.zarr", {})
    store.write_array(group, "displacement", _sharded(values, (2, 4)), DIMS, "Mpc/h", "x")
    pending = writes.store_state(writes.store_key(group)).pending
    assert len(pending) == 8 and not any(f.done() for _, f in pending)  # returned before writing
    assert not (tmp_path / "s.zarr" / "displacement" / "c").exists()
    gate.set()
    store.mark_complete(group)
    assert np.array_equal(zarr.open_group(tmp_path / "s.zarr")["displacement"][:], values)


def test_pending_host_copies_are_bounded(tmp_path, monkeypatch):
    block = 16 * 8 * 32 * 3 * 4  # one (2, 4)-mesh block of a 32^3 x 3 float32 array
    monkeypatch.setattr(writes, "MAX_PENDING_BYTES", 2 * block)
    monkeypatch.setattr(encoding, "MAX_SHARD_BYTES", block // 4)
    seen = []
    real = writes._write

    def slow(array, selection, values):
        seen.append(writes._pending_bytes)
        time.sleep(0.01)
        real(array, selection, values)

    monkeypatch.setattr(writes, "_write", slow)
    values = _particles(32)
    group = store.create(tmp_path / "s.zarr", {})
    store.write_array(group, "displacement", _sharded(values, (2, 4)), DIMS, "Mpc/h", "x")
    store.mark_complete(group)
    assert len(seen) == 32 and 0 < max(seen) <= 2 * block  # 8 blocks of 4 shards, 2 blocks at most
    assert writes._pending_bytes == 0
    assert np.array_equal(zarr.open_group(tmp_path / "s.zarr")["displacement"][:], values)


def test_unaligned_writes_are_not_lost(tmp_path):
    """Blocks that share shards are written one after the other, not by two threads at once."""
    group = store.create(tmp_path / "s.zarr", {})
    array = store.create_array(
        group, "pk", (6, 10), np.float64, store.Labels(("a", "k"), "1", "x"), (4, 10)
    )
    for i in range(6):
        store.write_blocks(array, np.full(10, float(i)), (i,))
    store.mark_complete(group)
    back = zarr.open_group(tmp_path / "s.zarr")["pk"][:]
    assert np.array_equal(back, np.repeat(np.arange(6.0)[:, None], 10, axis=1))


def test_pending_writes_finish_at_interpreter_exit(tmp_path):
    code = """
import sys, time
import numpy as np
from pmpipe.storage import store, writes
real = writes._write
def slow(*args):
    time.sleep(0.3)
    real(*args)
writes._write = slow
group = store.create(sys.argv[1], {})
store.write_array(group, "x", np.arange(4 * 10**5, dtype=np.int32).reshape(4, -1), ("a", "b"), "1", "x")
assert writes.store_state(writes.store_key(group)).pending  # exits with the write still pending
"""
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "s.zarr")], check=True, env=env, timeout=120
    )
    back = zarr.open_group(tmp_path / "s.zarr", mode="r")["x"][:]
    assert np.array_equal(back, np.arange(4 * 10**5, dtype=np.int32).reshape(4, -1))


def _complete_store(path: Path, pdims=(2, 4)) -> Path:
    group = store.create(path, {"stage": "test"})
    store.write_array(group, "displacement", _sharded(_particles(16), pdims), DIMS, "Mpc/h", "big")
    store.write_coordinate(group, "k", np.arange(50) * 0.1, "h/Mpc", "small float")
    store.mark_complete(group)
    return path


def _chunk_files(path: Path, array: str) -> list[Path]:
    return sorted(f for f in (path / array / "c").rglob("*") if f.is_file())


def test_manifest_records_every_shard_with_its_size_and_crc(tmp_path):
    import json
    import zlib

    path = _complete_store(tmp_path / "s.zarr")
    manifest = json.loads((path / "pmpipe_manifest.json").read_text())
    entry = manifest["arrays"]["displacement"]
    files = _chunk_files(path, "displacement")
    assert entry["shape"] == [16, 16, 16, 3] and entry["dtype"] == "float32"
    assert len(entry["chunks"]) == len(files) == 8  # one shard per device block
    for f in files:
        size, crc = entry["chunks"][str(f.relative_to(path / "displacement"))]
        assert size == f.stat().st_size and crc == zlib.crc32(f.read_bytes())
    assert set(manifest["arrays"]) == {"displacement", "k"}
    assert not list(path.glob(".pmpipe_chunks.*"))
    assert store.problems(path, checksums=True) == [] and store.is_complete(path)


@pytest.mark.parametrize("damage", ["deleted", "truncated", "byte changed"])
def test_damaged_shard_fails_verification_and_verify_takes_the_marker_off(tmp_path, damage):
    from pmpipe import cli

    path = _complete_store(tmp_path / "run" / "nbody.zarr")
    chunk = _chunk_files(path, "displacement")[3]
    data = chunk.read_bytes()
    if damage == "deleted":
        chunk.unlink()
    elif damage == "truncated":
        chunk.write_bytes(data[:100])
    else:
        chunk.write_bytes(data[:50] + bytes([data[50] ^ 1]) + data[51:])
    quick, full = store.problems(path), store.problems(path, checksums=True)
    assert full and ("CRC-32" in full[0] if damage == "byte changed" else quick == full)
    assert store.is_complete(path) == (damage == "byte changed")  # sizes only, without reading
    if damage != "byte changed":
        with pytest.raises(store.IncompleteStoreError, match="shard displacement/c/.* "):
            store.open_complete(path)
    assert cli.main(["verify", "--report-only", str(tmp_path)]) == 1
    assert store.has_marker(path)
    assert cli.main(["verify", str(tmp_path / "run")]) == 1
    assert not store.has_marker(path) and not store.is_complete(path)
    assert "damaged" in store.problems(path)[0]
    assert cli.main(["verify", str(_complete_store(tmp_path / "other.zarr"))]) == 0


def _edit_json(path: Path, edit) -> None:
    import json

    meta = json.loads(path.read_text())
    edit(meta)
    path.write_text(json.dumps(meta))


def _big_endian(codecs: list) -> None:
    """The chunks' byte order inside the shards (the only codec) made big-endian."""
    (sharding,) = codecs
    inner = sharding["configuration"]["codecs"]
    next(c for c in inner if c["name"] == "bytes")["configuration"]["endian"] = "big"


@pytest.mark.parametrize(
    "edit",
    [
        ("displacement/zarr.json", lambda m: _big_endian(m["codecs"])),
        (
            "zarr.json",
            lambda m: _big_endian(m["consolidated_metadata"]["metadata"]["displacement"]["codecs"]),
        ),
        ("zarr.json", lambda m: m["attributes"].update(stage="other")),
        ("displacement/zarr.json", lambda m: m["attributes"].update(units="km")),
        ("zarr.json", lambda m: m["attributes"].update(finished="1999-01-01T00:00:00+00:00")),
    ],
    ids=["array-codec", "consolidated-codec", "root-attribute", "array-attribute", "marker-time"],
)
def test_edited_metadata_is_found_and_the_store_is_not_read(tmp_path, edit):
    """An edit of any metadata a reader depends on (an array's codecs, their consolidated copy,
    the attributes) makes the store damaged: found by the quick check readers make."""
    path = _complete_store(tmp_path / "s.zarr")
    name, change = edit
    _edit_json(path / name, change)
    found = store.problems(path)
    assert found and "was changed" in found[0], found
    with pytest.raises(store.IncompleteStoreError, match="was changed"):
        store.open_complete(path)


def test_verify_on_a_read_only_file_system_reports_every_store(tmp_path, capsys):
    """Damaged stores on a read-only mount keep their marker and are reported, and verify goes
    on to the stores after them."""
    from pmpipe import cli

    mount = tmp_path / "ro"
    mount_tmpfs(mount, "20m")
    try:
        for name in ("a", "b"):
            chunk = _chunk_files(_complete_store(mount / name / "nbody.zarr"), "displacement")[0]
            chunk.write_bytes(chunk.read_bytes()[:100])
        subprocess.run(["mount", "-o", "remount,ro", str(mount)], check=True)
        assert cli.main(["verify", str(mount)]) == 1
        out = capsys.readouterr()
        for name in ("a", "b"):
            assert f"FAILED  {mount / name / 'nbody.zarr'}: shard displacement/" in out.out
            assert store.has_marker(mount / name / "nbody.zarr")
        assert out.out.count("(completion marker kept: Read-only file system)") == 2
        assert "2 could not be changed (read-only?)" in out.err
    finally:
        subprocess.run(["umount", str(mount)], check=False)


def test_a_failed_completion_leaves_no_marker(tmp_path, monkeypatch):
    path = tmp_path / "s.zarr"
    group = store.create(path, {"stage": "test"})
    array = store.create_array(
        group, "x", (4, 10), np.float32, store.Labels(("a", "b"), "1", "x"), (1, 10)
    )
    store.write_blocks(array, np.ones((2, 10), np.float32), (0, 0))  # two of four shards
    with pytest.raises(writes.StoreWriteError, match="2 of its 4 shards were written"):
        store.mark_complete(group)
    assert not store.has_marker(path) and not (path / "pmpipe_manifest.json").exists()


def test_the_marker_arrives_in_one_write_with_the_manifest_checksum(tmp_path, monkeypatch):
    """A reader at any moment (another job, `pmpipe verify`, a resuming run) finds either no
    marker or the marker with the checksum of the manifest on disk: every version of the
    root zarr.json written (zarr writes a temporary file and renames it) is recorded."""
    path = tmp_path / "s.zarr"
    versions = []
    rename = Path.replace

    def recording(self, target):
        moved = rename(self, target)
        if Path(target) == path / "zarr.json":
            versions.append(json.loads(Path(target).read_text())["attributes"])
        return moved

    monkeypatch.setattr(Path, "replace", recording)
    group = store.create(path, {"stage": "test", "a": 1, "b": 2})
    array = store.create_array(
        group, "x", (4, 10), np.float32, store.Labels(("a", "b"), "1", "x"), (1, 10)
    )
    store.write_blocks(array, np.ones((4, 10), np.float32))
    store.mark_complete(group)
    marked = [v for v in versions if store.COMPLETE in v]
    manifest_crc = zlib.crc32((path / "pmpipe_manifest.json").read_bytes())
    assert len(marked) == 1 and marked[0]["manifest_crc32"] == manifest_crc, versions
    assert versions[-1] == marked[0] and store.is_complete(path)
    assert all(v.get("a") == 1 and v.get("b") == 2 for v in versions)  # one write at creation


def test_remove_takes_a_store_out_of_sight_at_once(tmp_path, monkeypatch):
    """While its files are deleted, a removed store is no longer at its path (nor found by
    stores_under); removing a missing one does nothing."""
    path = tmp_path / "s.zarr"
    store.create(path, {"stage": "test"})
    seen = []
    monkeypatch.setattr(
        store.shutil, "rmtree", lambda p, **kw: seen.append((Path(p), path.exists()))
    )
    store.remove(path)
    ((hidden, still_there),) = seen
    assert not still_there and hidden.parent == tmp_path and hidden.name.startswith(".s.zarr")
    assert store.stores_under(tmp_path) == [] and (hidden / "zarr.json").is_file()
    monkeypatch.undo()
    store.remove(path)  # gone already
    store.remove(hidden)
    assert list(tmp_path.iterdir()) == []


def test_a_stage_on_a_full_disk_fails_cleanly_without_marker(tmp_path):
    import json as json_module

    from pmpipe.run import config

    small = tmp_path / "small"
    mount_tmpfs(small, "600k")  # the ICs of 32^3 particles take 3 MB
    try:
        run = config.Run.model_validate(
            {"box": {"particles": 32, "box_size": 64.0}, "outputs": {"ic": "all"}}
        )
        path = small / "run" / "config.json"
        path.parent.mkdir()
        path.write_text(config.RunFile.build("test", "run", 0, {}, run).to_json())
        done = subprocess.run(
            [sys.executable, "-m", "pmpipe.cli", "run", "ic", str(path)],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert done.returncode == 2, done.stderr[-2000:]
        assert "No space left on device" in done.stderr and "Traceback" not in done.stderr
        assert "the file system is full: free space or choose a writable folder" in done.stderr
        assert not store.has_marker(path.parent / "ic.zarr")
        assert json_module.loads(path.read_text())  # the run's config is intact
    finally:
        subprocess.run(["umount", str(small)], check=False)
