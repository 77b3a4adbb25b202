"""Hostile input: generated campaign and run configurations, P(k) tables and n(z) tables are
accepted and planned, or rejected with a ConfigError (or PowerTableError) naming the file and
the field; names cannot leave the results folder; YAML is read safely and within limits."""

import copy
import json
import math

import numpy as np
import pytest
import references
import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from pmpipe.campaigns import campaign
from pmpipe.cluster import plan_table
from pmpipe.physics.theory import cosmology, power_table
from pmpipe.run import config, derive, validation

BASE_RUN = {
    "box": {"box_size": 64.0, "particles": 16, "oversample": 1},
    "ic": {"a_init": 0.1, "seed": 3},
    "nbody": {"steps": 3, "snapshots": [0.5]},
    "parallel": {"pdims": [1, 2], "halo_cells": 4},
    "lightcone": {"z_max": 0.05, "plane_thickness": 32.0},
    "lensing": {
        "source_redshifts": [0.05],
        "distributions": [
            {"kind": "table", "name": "nz", "z": [0.0, 0.02, 0.05], "n": [0.0, 1.0, 0.5]}
        ],
        "flat_sky": {"field_of_view": 20.0, "pixels": 16},
        "full_sky": {"nside": 4},
    },
    "summaries": {"kappa_range": [-0.01, 0.01], "smoothing_arcmin": [10.0]},
}
BASE_CAMPAIGN = {
    "name": "hostile",
    "seed": 1,
    "base": {**BASE_RUN, "ic": {"a_init": 0.1}},
    "design": {"kind": "derivatives", "parameters": {"Omega_m": 0.02}},
    "realisations": 2,
    "execution": {
        "platform": "cpu",
        "devices_per_node": 2,
        "cpus_per_task": 1,
        "device_memory_gb": 2,
    },
}
# values a person (or a broken script) might put anywhere
VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(-1e3, 1e3),
    st.text(max_size=12),
    st.sampled_from(
        [
            "../escape",
            "a/b",
            "..",
            "/etc/passwd",
            "~",
            "gpu",
            "cpu",
            "smail",
            "table",
            "grid",
            "list",
            "float64",
            "log_a",
            "none",
            "all",
            "1e309",
            "nan",
        ]
    ),
    st.lists(st.floats(-10, 10), max_size=4),
    st.lists(st.integers(-3, 3), max_size=3),
    st.dictionaries(
        st.sampled_from(["kind", "name", "z", "n", "x"]), st.integers(-2, 2), max_size=2
    ),
)
SETTINGS = settings(
    max_examples=200,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


def _paths(data, prefix=()):
    """Every key path of a nested mapping/list (parents included)."""
    out = []
    items = (
        data.items()
        if isinstance(data, dict)
        else enumerate(data)
        if isinstance(data, list)
        else ()
    )
    for key, value in items:
        out.append(prefix + (key,))
        out += _paths(value, prefix + (key,))
    return out


def _mutate(data, mutations):
    data = copy.deepcopy(data)
    for path, value, how in mutations:
        parent = data
        for key in path[:-1]:
            try:
                parent = parent[key]
            except (KeyError, IndexError, TypeError):
                break
        else:
            try:
                if how == "delete":
                    del parent[path[-1]]
                elif how == "add" and isinstance(parent, dict):
                    parent[f"extra_{path[-1]}"] = value
                else:
                    parent[path[-1]] = value
            except (KeyError, IndexError, TypeError):
                pass
    return data


def mutations(base):
    return st.lists(
        st.tuples(
            st.sampled_from(_paths(base)), VALUES, st.sampled_from(["set", "set", "delete", "add"])
        ),
        min_size=1,
        max_size=3,
    )


def _write(tmp_path, data, suffix=".yaml"):
    path = tmp_path / f"generated{suffix}"
    path.write_text(yaml.safe_dump(data) if suffix == ".yaml" else json.dumps(data))
    return path


def _rejected_naming_the_file(err, path):
    event("rejected")
    text = str(err)
    assert str(path) in text, text
    assert "Traceback" not in text and len(text) < 20_000


def test_the_unchanged_configurations_are_valid(tmp_path):
    assert campaign.load(_write(tmp_path, BASE_CAMPAIGN)).name == "hostile"
    assert references.load_run(_write(tmp_path, BASE_RUN)).box.particles == 16


@pytest.mark.slow
@SETTINGS
@given(changes=mutations(BASE_CAMPAIGN), suffix=st.sampled_from([".yaml", ".json"]))
def test_generated_campaigns_are_planned_or_rejected_naming_file_and_field(
    tmp_path, changes, suffix
):
    path = _write(tmp_path, _mutate(BASE_CAMPAIGN, changes), suffix)
    try:
        camp = campaign.load(path)
    except config.ConfigError as err:
        _rejected_naming_the_file(err, path)
        return
    event("accepted")
    specs = campaign.expand(camp)
    assert specs and all("/" not in s.run_id and ".." not in s.run_id.split("-") for s in specs)
    try:
        campaign.check_fits(camp)
    except config.ConfigError as err:
        assert "execution.device_memory_gb" in str(err)
        return
    table = plan_table.plan_table(camp, rows=None)
    assert all(s.run_id in table for s in specs)


@SETTINGS
@given(changes=mutations(BASE_RUN))
def test_generated_run_configs_are_accepted_or_rejected_naming_file_and_field(tmp_path, changes):
    path = _write(tmp_path, _mutate(BASE_RUN, changes))
    try:
        run = references.load_run(path)
    except config.ConfigError as err:
        _rejected_naming_the_file(err, path)
        return
    event("accepted")
    cosmo = cosmology.tabulated(derive.cosmology_params(run))
    bounds = derive.timeline(run, cosmo).bounds
    assert np.all(np.isfinite(bounds)) and np.all(np.diff(bounds) > 0)
    if run.lightcone is not None:
        planes = validation.planes(run)
        assert np.all(np.isfinite(planes.chi_edges)) and len(planes) >= 1


NUMBERS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(1e-5, 1e5),
    st.sampled_from(["x", "nan", "-inf", "1e400", ""]),
)


@settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    rows=st.lists(st.lists(NUMBERS, min_size=0, max_size=3), max_size=12), sorted_k=st.booleans()
)
def test_generated_power_tables_are_used_or_rejected_naming_the_file(tmp_path, rows, sorted_k):
    if sorted_k:  # many usable tables too, not only broken ones
        rows = [[10 ** (-3 + 0.5 * i), 1e4 * 10 ** (-0.2 * i)] for i in range(len(rows))]
    path = tmp_path / "pk.txt"
    path.write_text("# k P\n" + "\n".join(" ".join(str(v) for v in row) for row in rows) + "\n")
    try:
        k, pk = validation.load_power_table(path, 0.01, 0.5)
    except (power_table.PowerTableError, config.ConfigError) as err:
        event("rejected")
        assert str(path) in str(err)
        return
    event("accepted")
    assert np.all(np.isfinite(k)) and np.all(np.isfinite(pk)) and np.all(pk > 0)
    assert np.all(np.diff(k) > 0) and k[0] <= 0.01 and k[-1] >= 0.5


@settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    z=st.one_of(
        st.lists(st.floats(allow_nan=True, allow_infinity=True), max_size=6),
        st.lists(st.floats(0, 0.05), min_size=2, max_size=6).map(sorted),
    ),
    n=st.one_of(
        st.lists(st.floats(allow_nan=True, allow_infinity=True), max_size=6),
        st.lists(st.floats(0, 10), min_size=2, max_size=6),
    ),
)
def test_generated_redshift_distributions_are_accepted_or_rejected_naming_the_field(tmp_path, z, n):
    data = copy.deepcopy(BASE_RUN)
    data["lensing"]["distributions"] = [{"kind": "table", "name": "nz", "z": z, "n": n}]
    path = _write(tmp_path, data)
    try:
        run = references.load_run(path)
    except config.ConfigError as err:
        _rejected_naming_the_file(err, path)
        assert "lensing.distributions" in str(err)
        return
    event("accepted")
    table = run.lensing.distributions[0]
    assert all(math.isfinite(v) for v in table.z + table.n) and max(table.n) > 0


@pytest.mark.parametrize(
    "name", ["../escape", "a/b", "..", "/abs", "a\\b", ".hidden", "x/../../y", "", "n" * 260]
)
def test_names_cannot_leave_the_results_folder_nor_outgrow_a_file_name(tmp_path, name):
    for data in (
        BASE_CAMPAIGN | {"name": name},
        BASE_CAMPAIGN | {"design": {"kind": "list", "points": [{"name": name, "Omega_m": 0.3}]}},
    ):
        path = _write(tmp_path, data)
        with pytest.raises(config.ConfigError, match="name"):
            campaign.load(path)


def test_unsafe_or_oversized_yaml_is_refused_before_it_is_used(tmp_path):
    marker = tmp_path / "executed"
    unsafe = tmp_path / "unsafe.yaml"
    unsafe.write_text(f"name: !!python/object/apply:os.system ['touch {marker}']\nseed: 1\n")
    with pytest.raises(config.ConfigError, match="not valid YAML"):
        campaign.load(unsafe)
    assert not marker.exists()
    laughs = ["lol0: &lol0 [x, x, x, x, x, x, x, x, x, x]"]
    laughs += [f"lol{i}: &lol{i} [{', '.join([f'*lol{i - 1}'] * 10)}]" for i in range(1, 9)]
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join(laughs) + "\n")
    with pytest.raises(config.ConfigError, match="more than 100000 values"):
        campaign.load(bomb)
    deep = tmp_path / "deep.json"
    deep.write_text('{"name": ' + "[" * 100 + "]" * 100 + "}")
    with pytest.raises(config.ConfigError, match="nested deeper"):
        campaign.load(deep)
    big = tmp_path / "big.yaml"
    big.write_text("name: x\n" + "# padding\n" * 200_000)
    with pytest.raises(config.ConfigError, match="at most"):
        campaign.load(big)
    infinite = tmp_path / "inf.yaml"
    infinite.write_text(
        yaml.safe_dump(BASE_CAMPAIGN | {"base": BASE_RUN | {"box": {"box_size": math.inf}}})
    )
    with pytest.raises(config.ConfigError, match="base.box.box_size"):
        campaign.load(infinite)


BOUNDED_PLAN = """
import sys
from pmpipe.cli import main
from pmpipe.runtime import memory
assert main(["plan", "ok.yaml"]) == 0  # the process started: what planning imports, imported
before = memory.peak_rss_bytes()
code = main(["plan", sys.argv[1]])
print(code, (memory.peak_rss_bytes() - before) / 1e6)
"""


@pytest.mark.parametrize(
    "change",
    [
        {"power": {"kind": "table", "table": "/dev/zero"}},
        {"power": {"kind": "table", "table": "big.txt"}},
        {"nbody": {"steps": 10**9}},
    ],
    ids=["dev-zero-table", "1-GB-table", "1e9-steps"],
)
def test_oversized_inputs_are_refused_before_memory_is_spent(tmp_path, change):
    """`pmpipe plan` refuses a P(k) table that is a device or over the size limit, and a step
    count beyond the bound, with exit status 2 and at most 50 MB more peak memory than the
    process had before."""
    import subprocess
    import sys

    with open(tmp_path / "big.txt", "wb") as fh:  # sparse: 1 GB that costs no disk
        fh.truncate(2**30)
    camp = {"name": "bounded", "seed": 1, "base": change, "execution": {"platform": "cpu"}}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(camp))
    (tmp_path / "ok.yaml").write_text(yaml.safe_dump({**camp, "base": {}}))
    out = subprocess.run(
        [sys.executable, "-c", BOUNDED_PLAN, "c.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    code, growth_mb = out.stdout.split()[-2:]
    assert code == "2", out.stdout + out.stderr
    assert float(growth_mb) <= 50, (growth_mb, out.stderr)
    assert any(w in out.stderr for w in ("at most", "not a regular file", "1 to 100000")), (
        out.stderr
    )
