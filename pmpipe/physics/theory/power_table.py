"""The sources of a run's linear P(k), and P(k) tables as CAMB and CLASS write them, read and
checked on the host (numpy)."""

from __future__ import annotations

from typing import Literal, get_args

import numpy as np

# Eisenstein-Hu with or without BAO (normalised to sigma8), CAMB or CLASS at the run's cosmology
# (pmpipe.physics.theory.boltzmann), or a table from a file
PowerKind = Literal["eisenstein_hu", "eisenstein_hu_nowiggle", "camb", "class", "table"]
POWER_KINDS: tuple[str, ...] = get_args(PowerKind)
BOLTZMANN_KINDS = ("camb", "class")  # a Boltzmann code called at each run's cosmology
TABULATED_KINDS = (*BOLTZMANN_KINDS, "table")  # interpolated in a (k, P) table


class PowerTableError(ValueError):
    """A tabulated P(k) file that cannot be used."""


def check_power_table(data: np.ndarray, source, k_min: float, k_max: float):
    """A linear P(k) table at a = 1 as CAMB or CLASS write it, from its rows of numbers
    (``data``, (rows, columns); ``source`` names it in errors).

    Columns: k in h/Mpc, P in (Mpc/h)^3 (further columns are ignored). The table must be
    finite, positive, strictly increasing in k and cover [k_min, k_max] (h/Mpc), the
    wavenumbers the mesh needs. Returns (k, P) as float64 numpy arrays.
    """
    data = np.asarray(data, dtype=np.float64)
    if data.ndim != 2 or data.shape[0] < 4 or data.shape[1] < 2:
        raise PowerTableError(
            f"power spectrum table {source}: needs at least 4 rows of two columns (k [h/Mpc], "
            f"P [(Mpc/h)^3]), found shape {data.shape}"
        )
    k, pk = data[:, 0], data[:, 1]
    for name, col in (("k", k), ("P", pk)):
        bad = ~np.isfinite(col)
        if bad.any():
            raise PowerTableError(
                f"power spectrum table {source}: column {name} has non-finite values "
                f"(first at row {int(np.argmax(bad)) + 1})"
            )
        if (col <= 0).any():
            raise PowerTableError(
                f"power spectrum table {source}: column {name} must be > 0 "
                f"(row {int(np.argmax(col <= 0)) + 1} has {col[col <= 0][0]:g})"
            )
    if (np.diff(k) <= 0).any():
        row = int(np.argmax(np.diff(k) <= 0)) + 2
        raise PowerTableError(
            f"power spectrum table {source}: k must be strictly increasing (row {row} is not)"
        )
    if k[0] > k_min or k[-1] < k_max:
        raise PowerTableError(
            f"power spectrum table {source}: covers k = [{k[0]:.4g}, {k[-1]:.4g}] h/Mpc but the mesh "
            f"needs [{k_min:.4g}, {k_max:.4g}] h/Mpc; extend the table or change box_size / particles"
        )
    return k, pk
