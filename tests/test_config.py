import json

import numpy as np
import pytest
import references

from pmpipe.physics.theory import cosmology as C
from pmpipe.run import config, derive, validation


def _write(tmp_path, data, name="run.json"):
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def test_defaults_validate_and_convert(tmp_path):
    run = references.load_run(_write(tmp_path, {"box": {"particles": 32}}))
    assert run.force_cells() == 32
    assert derive.cosmology_params(run) == C.Cosmology()


def _table(tmp_path, k_max=10.0):
    k = np.logspace(-4, np.log10(k_max), 100)
    path = tmp_path / "pk.dat"
    np.savetxt(
        path, np.c_[k, np.asarray(C.linear_power_eisenstein_hu(C.Cosmology(), k))], header="k/h P"
    )
    return path


def test_power_table_accepted(tmp_path):
    run = config.Run.model_validate(
        {"power": {"kind": "table", "table": str(_table(tmp_path))}, "box": {"particles": 32}}
    )
    assert run.power.kind == "table"


BAD = [
    (
        {"box": {"particles": 30}, "parallel": {"pdims": [4, 1]}},
        "box.particles = 30 is not divisible",
    ),
    ({"nbody": {"a_final": 0.1}, "ic": {"a_init": 0.1}}, "nbody.a_final"),
    ({"nbody": {"a_final": 0.5}, "ic": {"a_init": 0.6}}, "nbody.a_final"),
    ({"cosmology": {"Omega_m": 0.0}}, "cosmology.Omega_m"),
    ({"cosmology": {"Omega_m": -0.3}}, "cosmology.Omega_m"),
    ({"cosmology": {"Omega_m": 0.04, "Omega_b": 0.05}}, "Omega_b"),
    ({"box": {"box_size": -10}}, "box.box_size"),
    (
        {"box": {"particles": 32}, "parallel": {"pdims": [1, 8], "halo_cells": 5}},
        "parallel.halo_cells = 5",
    ),
    ({"parallel": {"halo_cells": 0}}, "parallel.halo_cells"),
    ({"cosmology": {"omega_m": 0.3}}, "cosmology.omega_m: unknown key; did you mean 'Omega_m'?"),
    ({"box": {"particles": "many"}}, "box.particles"),
    ({"power": {"kind": "table"}}, "power.table must be given"),
    ({"power": {"kind": "classy"}}, "power.kind"),
    ({"nbody": {"steps": [0.1, 0.5, 0.3, 1.0]}}, "strictly increasing"),
    ({"nbody": {"snapshots": [1.5]}}, "nbody.snapshots"),
    ({"ic": {"lpt_order": 3}}, "ic.lpt_order"),
    ({"cosmology": {"T_cmb": 0.0}}, "cosmology.T_cmb must be > 0"),
]


@pytest.mark.parametrize("data, message", BAD)
def test_bad_input_names_the_field(tmp_path, data, message):
    path = _write(tmp_path, data)
    with pytest.raises(config.ConfigError) as err:
        references.load_run(path)
    text = str(err.value)
    assert str(path) in text
    assert message in text, text


def test_power_table_not_covering_the_mesh(tmp_path):
    table = _table(tmp_path, k_max=0.5)
    path = _write(
        tmp_path,
        {
            "power": {"kind": "table", "table": str(table)},
            "box": {"particles": 64, "box_size": 256.0},
        },
    )
    with pytest.raises(config.ConfigError, match="covers k"):
        references.load_run(path)


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(config.ConfigError, match="cannot be read"):
        references.load_run(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(config.ConfigError, match="not valid JSON"):
        references.load_run(bad)


def test_a_lensing_run_hashes_as_before_the_fields_it_leaves_unset():
    """A full-sky, ray-traced run with shape noise: its hash from before the nuisances,
    baryons, masks and depth maps existed (fields left at their defaults are not hashed),
    and a field set changes it."""
    data = {
        "box": {"particles": 16, "box_size": 64.0},
        "lightcone": {"z_max": 0.05, "plane_thickness": 32.0},
        "lensing": {"source_redshifts": [0.03], "full_sky": {"nside": 16}, "method": "raytrace"},
        "summaries": {"shape_noise": {"sigma_e": 0.3, "n_gal": 1.0}, "xi_bins": 10},
    }
    assert config.config_hash(config.Run.model_validate(data)) == (
        "sha256:5eceaef5eaadd476849a2529779b4a34070bf3800fe8582c810b2d7087924599"
    )
    data["lensing"]["full_sky"]["mask"] = "mask.npy"
    assert config.config_hash(config.Run.model_validate(data)) != (
        "sha256:5eceaef5eaadd476849a2529779b4a34070bf3800fe8582c810b2d7087924599"
    )


def test_config_hash_is_stable_and_ignores_a_null_A_s():
    """Existing results stay valid: the default run's hash is the one its stores record, and a
    run normalised by σ8 hashes as if A_s did not exist; a given A_s changes the hash."""
    run = config.Run()
    assert config.config_hash(run) == (
        "sha256:b320a01f46f3b9f47a1bbdbcdb216238d772c31d6b5c3ab39981e3d53dcb737f"
    )
    camb = config.Run.model_validate({"power": {"kind": "camb"}})
    by_A_s = config.Run.model_validate({"power": {"kind": "camb"}, "cosmology": {"A_s": 2e-9}})
    assert len({config.config_hash(r) for r in (run, camb, by_A_s)}) == 3


def test_a_cudecomp_request_on_a_build_without_it_is_refused_with_the_fix():
    from jaxdecomplib import _jaxdecomp

    assert not _jaxdecomp.registrations(), "this jaxdecomp has cuDecomp: not the build tested"
    with pytest.raises(config.ConfigError) as err:
        validation.validate_run({"parallel": {"backend": "cudecomp"}}, "run.yaml")
    text = str(err.value)
    assert "run.yaml" in text and "parallel.backend 'cudecomp'" in text
    assert "built without NVIDIA cuDecomp" in text
    assert "docs/slurm.md" in text and "parallel.backend: jax" in text
    default = config.Run()
    assert default.parallel.backend == "jax"
    assert config.config_hash(default) == config.config_hash(
        config.Run.model_validate({"parallel": {"backend": "jax"}})
    )


def test_a_build_with_cudecomp_is_refused_too_since_no_fft_calls_it():
    from pmpipe.runtime import backend

    assert "calls no cuDecomp operation" in backend.cudecomp_refusal({"cudecomp_fft": object()})
