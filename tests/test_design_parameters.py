"""Design parameters beyond the cosmology fields (omega_b = Omega_b h^2), the columns of
manifest.csv and summaries.zarr a point leaves to the run or to its Boltzmann code, and the
memory estimate of runs with massive neutrinos."""

import numpy as np
import pytest
from test_campaign import SMALL, make, run

from pmpipe.campaigns import campaign, resources
from pmpipe.results import manifest
from pmpipe.run import config


@pytest.mark.parametrize(
    "particles, oversample, extra_mb", [(96, 1, 45), (128, 1, 88), (96, 2, 158)]
)
def test_neutrino_runs_are_estimated_to_need_what_they_were_measured_to(
    particles, oversample, extra_mb
):
    """Peak RSS with Σm_ν = 0.1 eV over the massless run (2 CPU cores, 2LPT + 10 steps):
    the estimate's difference within 25 % of the measured one."""
    box = {"oversample": oversample}
    massless, massive = (
        resources.estimate(
            run(particles, box=box, cosmology={"m_nu": m_nu}, power={"kind": "camb"}),
            resources.Execution(),
        ).memory_per_device_bytes
        for m_nu in (0.0, 0.1)
    )
    assert massive - massless == pytest.approx(extra_mb * 1e6, rel=0.25)


def test_a_design_over_omega_b_h2_keeps_it_fixed_while_h_varies():
    grid = {"kind": "grid", "parameters": {"omega_b": [0.0224], "h": [0.64, 0.72]}}
    specs = campaign.expand(make(design=grid))
    for spec in specs:
        cosmo = spec.run.cosmology
        assert cosmo.Omega_b * cosmo.h**2 == pytest.approx(0.0224, rel=1e-12)
        assert spec.parameters == {"omega_b": 0.0224, "h": cosmo.h}
    steps = {"kind": "derivatives", "parameters": {"omega_b": 0.001}}
    fid = config.Cosmology()
    by_point = {s.point: s.run.cosmology for s in campaign.expand(make(design=steps))}
    assert by_point["fiducial"].Omega_b == fid.Omega_b  # the base run's, digit for digit
    assert by_point["omega_b-plus"].Omega_b * fid.h**2 == pytest.approx(
        fid.Omega_b * fid.h**2 + 0.001, rel=1e-9
    )
    both = {"kind": "grid", "parameters": {"omega_b": [0.0224], "Omega_b": [0.05]}}
    with pytest.raises(ValueError, match=r"omega_b \(Omega_b h\^2\) and Omega_b both given"):
        make(design=both)
    listed = {"kind": "list", "points": [{"name": "a", "parameters": both["parameters"]}]}
    listed["points"][0]["parameters"] = {"omega_b": 0.0224, "Omega_b": 0.05}
    with pytest.raises(ValueError, match="vary one of them"):
        make(design=listed)


def test_manifest_and_summaries_fill_a_design_parameter_a_point_leaves_out(tmp_path, monkeypatch):
    """A list design normalising one point by sigma8 and another by A_s, and giving Omega_m
    at one point only: each column holds the point's own value, else the run's (Omega_m of the
    base), else the one its Boltzmann code derived (here stood in for); manifest.csv and
    summaries.zarr agree."""
    from pmpipe.results import aggregate
    from pmpipe.storage import store

    points = [
        {"name": "by-sigma8", "parameters": {"sigma8": 0.8, "Omega_m": 0.3}},
        {"name": "by-A_s", "parameters": {"A_s": 2.0e-9}},
    ]
    camp = make(
        base={**SMALL, "power": {"kind": "camb"}}, design={"kind": "list", "points": points}
    )
    derived = {"c-by-sigma8-r0": {"A_s": 2.1e-9}, "c-by-A_s-r0": {"sigma8": 0.78}}

    def stand_in(spec, run_dir):  # the configuration's value, else "derived by the code"
        given = {"sigma8": spec.run.cosmology.sigma8, "A_s": spec.run.cosmology.A_s}
        return {
            name: given.get(name) or derived[spec.run_id].get(name) for name in manifest.DERIVED
        }

    monkeypatch.setattr(manifest, "derived_parameters", stand_in)
    out = store.create(tmp_path / "summaries.zarr", {})
    aggregate._write_per_run(out, list(camp.runs), tmp_path)
    expected = {
        "sigma8": [0.8, 0.78],
        "A_s": [2.1e-9, 2.0e-9],
        "Omega_m": [0.3, config.Cosmology().Omega_m],
    }
    rows = manifest.manifest_rows(camp, tmp_path, str)
    for name, values in expected.items():
        assert list(out[name][:]) == values
        assert [row[name] for row in rows] == values
    assert np.isnan(out["S8"][:]).all()
