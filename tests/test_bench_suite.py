"""``pmpipe bench suite``: what it would measure, the largest size it tries, and how each
measurement's process ends up in the record."""

import pytest

from pmpipe import cli
from pmpipe.bench import suite


def test_the_dry_run_lists_every_measurement_in_the_order_it_runs(capsys):
    assert cli.main(["bench", "suite", "--dry-run", "--sizes", "128", "256"]) == 0
    lines = capsys.readouterr().out.splitlines()
    names = [line.split(":")[0] for line in lines]
    assert names[:4] == [f"nbody {n}^3 B={b} vs pmwd" for n in (128, 256) for b in (1, 2)]
    assert names[4].startswith("campaign of 16 runs")
    assert names[5:7] == ["nbody 128^3 B=1 vs jaxpm", "nbody 256^3 B=1 vs jaxpm"]
    assert names[7].startswith("largest N") and names[8].startswith("scaling 256^3")
    assert "pmpipe bench nbody --particles 256 --steps 10 --oversample 2 --compare pmwd" in lines[3]
    assert len(lines) == 9


def test_the_largest_size_follows_the_largest_b1_job_measured():
    def job(n, b, per_particle):
        return {
            "particles": n,
            "oversample": b,
            "device_peak_bytes": per_particle * n**3,
            "device_bytes_per_particle": per_particle,
            "device_bytes_limit": 100e9,
        }

    records = [job(256, 1, 200.0), job(512, 1, 184.0), job(512, 2, 440.0), {}]
    n = suite.largest_size(records)
    assert n % suite.LARGEST_STRIDE == 0
    assert n**3 * 184.0 <= 100e9 < (n + suite.LARGEST_STRIDE) ** 3 * 184.0
    assert suite.largest_size([{**job(512, 1, 184.0), "device_peak_bytes": None}]) is None


def test_each_measurement_is_recorded_done_failed_or_not_started(tmp_path):
    store = suite.Measurement("store 16^3", ("store", "--particles", "16", "--repeat", "1"))
    done = suite.measure(store, tmp_path, timeout_s=300)
    assert done["status"] == "done" and done["record"]["particles"] == 16
    assert done["command"].startswith("pmpipe bench store --particles 16")
    bad = suite.measure(suite.Measurement("bad", ("store", "--particles", "0")), tmp_path, 300)
    assert bad["status"] == "failed" and bad["returncode"] != 0 and bad["output"]
    assert "| bad | failed |" in suite.table({"entries": [done, bad]})


@pytest.mark.parametrize("runs", [2, 16])
def test_the_campaign_packs_its_runs_into_one_job_on_the_platform_found(tmp_path, runs):
    from pmpipe.bench import campaign_timing as bench_campaign
    from pmpipe.campaigns import campaign

    repo = bench_campaign.default_snakefile().parent
    camp = campaign.load(suite.campaign_file(tmp_path, runs, repo, "cpu"))
    assert len(camp.runs) == runs and camp.execution.platform == "cpu"
    assert len(campaign.job_ids(camp)) == 1
