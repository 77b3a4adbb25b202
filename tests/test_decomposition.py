"""pdims chosen by measurement: `pmpipe tune` times every decomposition of a campaign's devices
on 8 CPU devices and records the fastest; the campaign and `pmpipe plan` take it from the file,
which is validated when it is read."""

import pytest
import yaml

from pmpipe import cli
from pmpipe.campaigns import campaign, decomposition
from pmpipe.cluster import plan_table
from pmpipe.run import config


def test_candidates_split_the_grid_and_leave_room_for_the_halo():
    assert decomposition.candidates(8, 16, 1, 2) == [(1, 8), (2, 4), (4, 2), (8, 1)]
    assert decomposition.candidates(8, 16, 1, 3) == [(2, 4), (4, 2)]  # blocks of 2 < halo 3
    assert decomposition.candidates(4, 12, 1, 2) == [(1, 4), (2, 2), (4, 1)]
    assert decomposition.candidates(8, 12, 1, 2) == [(2, 4), (4, 2)]  # 12 over 8 or 1: no
    assert decomposition.candidates(8, 10, 1, 2) == []
    with pytest.raises(ValueError, match="no decomposition of 8 devices splits 10 particles"):
        decomposition.choose(8, 10, 1, 2, None)
    assert decomposition.guess([(1, 8), (2, 4), (4, 2), (8, 1)]) == (8, 1)
    assert decomposition.guess([(2, 4), (4, 2)]) == (2, 4)


def _campaign(tmp_path, file, pdims="auto"):
    path = tmp_path / "campaign.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "tuned",
                "base": {
                    "box": {"particles": 16},
                    "nbody": {"steps": 2},
                    "parallel": {"halo_cells": 2, "pdims": pdims},
                },
                "execution": {"devices_per_node": 8},
                "decomposition": {"devices": 8, "file": str(file)},
            }
        )
    )
    return path


@pytest.mark.slow
def test_tune_records_the_fastest_and_plan_shows_it(tmp_path, capsys):
    file = tmp_path / "site" / "decompositions.yaml"
    path = _campaign(tmp_path, file)
    guessed = campaign.load(path)
    assert (guessed.base.parallel.pdims, guessed.pdims_source) == ((8, 1), "guessed")
    assert "guessed (no decomposition file" in plan_table.decomposition_line(guessed)

    assert cli.main(["tune", str(path), "--repeat", "1"]) == 0
    table = decomposition.load(file)
    (sweep,) = table.sweeps
    assert table.device_kind == "cpu" and (sweep.devices, sweep.force_mesh) == (8, 16)
    assert set(sweep.step_seconds) == {"1x8", "2x4", "4x2", "8x1"}
    assert decomposition.label(sweep.pdims) == min(sweep.step_seconds, key=sweep.step_seconds.get)

    camp = campaign.load(path)
    assert (camp.base.parallel.pdims, camp.pdims_source) == (sweep.pdims, "recorded")
    assert all(s.run.parallel.pdims == sweep.pdims for s in campaign.expand(camp))
    capsys.readouterr()
    assert cli.main(["plan", str(path)]) == 0
    out = capsys.readouterr().out
    assert (
        f"decomposition: pdims {tuple(sweep.pdims)} for 8 devices at 16^3 cells: recorded in {file}"
        in out
    )

    bigger = _campaign(tmp_path, file)
    text = bigger.read_text().replace("particles: 16", "particles: 32")
    bigger.write_text(text)
    nearest = campaign.load(bigger)  # the 16^3 sweep stands in for 32^3
    assert (nearest.base.parallel.pdims, nearest.pdims_source) == (sweep.pdims, "nearest")


def _sweep(**change):
    return {
        "devices": 8,
        "force_mesh": 16,
        "pdims": [2, 4],
        "measured": "2026-01-01",
        "jax": "0.10.2",
        "step_seconds": {"2x4": 0.1, "8x1": 0.2},
        **change,
    }


@pytest.mark.parametrize(
    "data, message",
    [
        ({"sweeps": [_sweep()]}, "device_kind: Field required"),
        (
            {"device_kind": "cpu", "sweeps": [_sweep(pdims=[2, 2])]},
            "pdims [2, 2] do not make 8 devices",
        ),
        (
            {"device_kind": "cpu", "sweeps": [_sweep(step_seconds={"8x1": 0.2})]},
            "pdims [2, 4] is not among the decompositions timed (8x1)",
        ),
        (
            {"device_kind": "cpu", "sweeps": [_sweep(step_seconds={"2x4": 0.1, "slab": 0.2})]},
            "step_seconds key 'slab': write PXxPY with PX * PY = 8",
        ),
        (
            {"device_kind": "cpu", "sweeps": [_sweep(devices=0)]},
            "sweeps.0.devices: Input should be greater",
        ),
    ],
    ids=["kind", "pdims", "untimed", "key", "devices"],
)
def test_a_bad_decomposition_file_names_the_file_and_field(tmp_path, data, message):
    file = tmp_path / "decompositions.yaml"
    file.write_text(yaml.safe_dump(data))
    with pytest.raises(config.ConfigError, match=str(file)) as err:
        decomposition.load(file)
    assert message in str(err.value)
    with pytest.raises(config.ConfigError, match="decompositions.yaml"):  # also through a campaign
        campaign.load(_campaign(tmp_path, file))


def test_one_machine_kind_per_file_and_pdims_given_once(tmp_path):
    file = tmp_path / "decompositions.yaml"
    file.write_text(yaml.safe_dump({"device_kind": "NVIDIA H100", "sweeps": [_sweep()]}))
    other = decomposition.Sweep.model_validate(_sweep(pdims=[8, 1]))
    with pytest.raises(
        config.ConfigError, match="holds sweeps of 'NVIDIA H100', this machine is 'cpu'"
    ):
        decomposition.record(file, "cpu", other)
    replaced = decomposition.record(file, "NVIDIA H100", other)  # same devices and mesh: replaced
    assert [s.pdims for s in replaced.sweeps] == [(8, 1)] and decomposition.load(file) == replaced
    with pytest.raises(config.ConfigError, match="set base.parallel.pdims to 'auto' or remove"):
        campaign.load(_campaign(tmp_path, file, pdims=[2, 4]))
    lone = _campaign(tmp_path, file)
    lone.write_text(lone.read_text().split("decomposition:")[0])
    with pytest.raises(config.ConfigError, match="'auto' needs a decomposition section"):
        campaign.load(lone)
    run = {"parallel": {"pdims": "auto"}}
    with pytest.raises(ValueError, match="'auto' is chosen for a campaign's runs"):
        config.Run.model_validate(run)


def test_a_sweep_times_every_candidate_and_keeps_the_fastest():
    from pmpipe.campaigns import tune

    sweep = tune.sweep(2, 8, 1, 2, repeat=1)
    assert set(sweep.step_seconds) == {"2x1", "1x2"}
    assert decomposition.label(sweep.pdims) == min(sweep.step_seconds, key=sweep.step_seconds.get)
    assert sweep.devices == 2 and sweep.force_mesh == 8 and sweep.jax
