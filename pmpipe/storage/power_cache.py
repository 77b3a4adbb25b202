"""The on-disk cache of the power tables a run takes from CAMB or CLASS: linear P(k)
(:func:`linear_table`) and the baryons' suppression S(k, z) of each AGN temperature
(:func:`suppressions`). One ``<key>.npz`` per table under ``results/.power_cache``, the key the
sha256 of the physical inputs that determine it (:func:`pmpipe.physics.theory.boltzmann.inputs`,
:func:`pmpipe.physics.theory.baryons.inputs`). A table is computed once, written whole (a
temporary file renamed into place) and read back bit for bit by every later run; a damaged
one, or one of other inputs, is made again."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import cast

import numpy as np

from pmpipe.physics.theory import baryons, boltzmann
from pmpipe.physics.theory.baryons import Suppression
from pmpipe.physics.theory.boltzmann_tables import LinearTable, NeutrinoTransfer

LOG = logging.getLogger(__name__)

FOLDER = ".power_cache"  # beside the campaigns in the results folder, like .jax_cache


def folder_of(config_path: str | Path) -> Path:
    """The cache of the results folder of ``results/<campaign>/<run>/config.json``."""
    return Path(config_path).absolute().parent.parent.parent / FOLDER


def key(spec: dict) -> str:
    """sha256 (hex) of the inputs' canonical JSON (sorted keys, no spaces)."""
    text = json.dumps(spec, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def _load(path: Path, spec: dict) -> tuple[dict, dict[str, np.ndarray]] | None:
    """The ``about`` mapping and float64 arrays of the file cached at ``path`` for ``spec``;
    None when there is none, or it is unreadable or of other inputs (logged: made again)."""
    try:
        with np.load(path, allow_pickle=False) as data:
            about = json.loads(str(data["about"]))
            arrays = {
                name: np.asarray(data[name], np.float64) for name in data.files if name != "about"
            }
    except FileNotFoundError:
        return None
    except (OSError, EOFError, ValueError, KeyError, TypeError, zipfile.BadZipFile) as err:
        LOG.warning(
            "power cache %s: unreadable (%s: %s); computing it again", path, type(err).__name__, err
        )
        return None
    if not isinstance(about, dict) or about.get("inputs") != spec:
        LOG.warning("power cache %s: it holds other inputs; computing it again", path)
        return None
    return about, arrays


def _checked(path: Path, problem: str | None, found):
    """``found``, or None with the ``problem`` logged (the file is then made again)."""
    if problem is not None:
        LOG.warning("power cache %s: %s; computing it again", path, problem)
        return None
    return found


def _read(path: Path, spec: dict) -> LinearTable | None:
    """The table cached at ``path`` for ``spec``; None when there is none, or it is damaged
    or of other inputs (then it is made again)."""
    loaded = _load(path, spec)
    if loaded is None:
        return None
    about, arrays = loaded
    try:
        k, p = arrays["k"], arrays["p"]
        p_cb = arrays.get("p_cb", p)
        neutrinos = None
        if "nu_a" in arrays:
            neutrinos = NeutrinoTransfer(
                arrays["nu_a"], arrays["nu_k"], arrays["nu_ratio"], arrays["nu_growth_cb"]
            )
        found = LinearTable(
            k,
            p,
            float(about["sigma8"]),
            float(about["A_s"]),
            about["code"],
            about["version"],
            p_cb,
            float(about["sigma8_cb"]),
            neutrinos,
        )
    except (KeyError, TypeError, ValueError) as err:
        return _checked(path, f"unreadable ({type(err).__name__}: {err})", None)
    problem = None
    if not (k.ndim == p.ndim == p_cb.ndim == 1 and k.size == p.size == p_cb.size > 3):
        problem = "its arrays do not match"
    elif not all(np.all(np.isfinite(x)) and np.all(x > 0) for x in (p, p_cb)) or np.any(
        np.diff(k) <= 0
    ):
        problem = "its power is not finite, positive and increasing in k"
    elif neutrinos is not None and not (
        neutrinos.ratio.shape == neutrinos.growth_cb.shape == (neutrinos.a.size, neutrinos.k.size)
        and all(np.all(np.isfinite(x)) for x in (neutrinos.ratio, neutrinos.growth_cb))
    ):
        problem = "its neutrino transfer functions do not match their grid"
    return _checked(path, problem, found)


def _save(path: Path, arrays: dict[str, np.ndarray], about: dict) -> None:
    """Write ``arrays`` and the JSON ``about`` to ``path`` whole: a temporary file beside it,
    renamed into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".npz")
    try:
        with os.fdopen(fd, "wb") as out:
            np.savez(out, allow_pickle=False, **arrays, about=np.array(json.dumps(about)))
            out.flush()
            os.fsync(out.fileno())  # whole on disk before it is renamed into place
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _write(path: Path, spec: dict, table: LinearTable) -> None:
    """Write ``table``, made from ``spec``, to ``path`` (:func:`_save`)."""
    about = {
        "inputs": spec,
        "sigma8": table.sigma8,
        "sigma8_cb": table.sigma8_cb,
        "A_s": table.A_s,
        "code": table.code,
        "version": table.version,
    }
    arrays = {"k": table.k, "p": table.p}
    if table.p_cb is not table.p:
        arrays["p_cb"] = table.p_cb
    if table.neutrinos is not None:
        nu = table.neutrinos
        arrays.update(nu_a=nu.a, nu_k=nu.k, nu_ratio=nu.ratio, nu_growth_cb=nu.growth_cb)
    _save(path, arrays, about)


def linear_table(
    spec: dict, folder: Path | None, compute: Callable[[dict], LinearTable] | None = None
) -> LinearTable:
    """The table of ``spec`` from the cache in ``folder``, or computed by ``compute``
    (default :func:`pmpipe.physics.theory.boltzmann.linear_table`) and cached there; ``folder`` None:
    computed, not cached."""
    compute = compute or boltzmann.linear_table
    path = None if folder is None else Path(folder) / f"{key(spec)}.npz"
    found = None if path is None else _read(path, spec)
    if found is not None:
        LOG.info("linear P(k) from %s %s: cached in %s", found.code, found.version, path)
        return found
    table = compute(spec)
    if path is not None:
        try:
            _write(path, spec, table)
        except OSError as err:  # the run goes on with the table it has
            LOG.warning("linear power cache %s not written: %s", path, err)
        else:
            LOG.info(
                "linear P(k) from %s %s: computed, cached in %s", table.code, table.version, path
            )
    return table


def _read_suppression(path: Path, spec: dict) -> Suppression | None:
    """The S(k, z) cached at ``path`` for ``spec``; None when there is none, or it is damaged
    or of other inputs (then it is made again)."""
    loaded = _load(path, spec)
    if loaded is None:
        return None
    _, arrays = loaded
    k, z, ratio = (arrays.get(name, np.empty(0)) for name in ("k", "z", "ratio"))
    good = (
        k.ndim == z.ndim == 1
        and ratio.shape == (z.size, k.size)
        and k.size > 1
        and np.all(np.diff(k) > 0)
        and np.all(np.diff(z) > 0)
        and np.all(np.isfinite(ratio))
        and np.all(ratio > 0)
    )
    problem = None if good else "its S(k, z) is not positive on increasing k and z"
    return _checked(path, problem, Suppression(k, z, ratio))


def suppressions(
    cosmology: dict,
    A_s: float | None,
    log_t_agns,
    z_max: float,
    folder: Path | None,
    compute: Callable[..., tuple[Suppression, ...]] | None = None,
) -> tuple[Suppression, ...]:
    """:func:`pmpipe.physics.theory.baryons.suppressions` (same arguments; ``compute``, by
    default that function) through the cache in ``folder``: one file per temperature, those
    not cached made in one call and cached there; ``folder`` None: computed, not cached."""
    compute = compute or baryons.suppressions
    common = baryons.inputs(cosmology, A_s, z_max)
    specs = {float(t): {**common, "log_T_AGN": float(t)} for t in log_t_agns}
    paths = {
        t: None if folder is None else Path(folder) / f"{key(s)}.npz" for t, s in specs.items()
    }
    found: dict[float, Suppression | None] = {
        t: _read_suppression(path, specs[t]) for t, path in paths.items() if path is not None
    }
    missing = [t for t in specs if found.get(t) is None]
    if missing:
        for t, made in zip(missing, compute(cosmology, A_s, missing, z_max), strict=True):
            found[t] = made
            path = paths[t]
            if path is None:
                continue
            try:
                _save(path, {"k": made.k, "z": made.z, "ratio": made.ratio}, {"inputs": specs[t]})
            except OSError as err:  # the run goes on with the table it has
                LOG.warning("power cache %s not written: %s", path, err)
    LOG.info(
        "baryons' S(k, z) of log_T_AGN %s: %d computed, %d cached in %s",
        sorted(specs),
        len(missing),
        len(specs) - len(missing),
        folder,
    )
    return tuple(cast(Suppression, found[float(t)]) for t in log_t_agns)
