"""What a Boltzmann code gives a run (:mod:`pmpipe.physics.theory.boltzmann` for CAMB,
:mod:`pmpipe.physics.theory.class_power` for CLASS): the linear P(k) table and the neutrinos' linear
response, as host (numpy) arrays."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

A_S_REFERENCE = 2.1e-9  # A_s of the one call of a run normalised by σ8 (P scales as A_s)
K_PIVOT = 0.05  # 1/Mpc
TRANSFER_MARGIN = 1.1  # the code's transfer k_max over the table's last k
NU_A_MIN = 0.01  # the earliest scale factor of the neutrino tables
NU_A_POINTS = 24  # log-spaced scale factors from NU_A_MIN to 1
# the part of each code's settings (a table's inputs) that says what it computes of neutrinos
NEUTRINO_SETTINGS = {
    "neutrinos": "massless, or 3 degenerate massive species when m_nu > 0",
    "neutrino_tables": {"a_min": NU_A_MIN, "points": NU_A_POINTS},
}


@dataclasses.dataclass(frozen=True, eq=False)
class NeutrinoTransfer:
    """The massive neutrinos' linear response, from the Boltzmann code's transfer functions:
    at scale factors a (A,) and wavenumbers k (Q,) in h/Mpc, ``ratio`` (A, Q) = T_ν / T_cb and
    ``growth_cb`` (A, Q) = T_cb(k, a) / T_cb(k, 1), the CDM + baryon growth."""

    a: np.ndarray
    k: np.ndarray
    ratio: np.ndarray
    growth_cb: np.ndarray


@dataclasses.dataclass(frozen=True, eq=False)
class LinearTable:
    """Linear P(k) at a = 1 from a Boltzmann code: k (T,) in h/Mpc, p (T,) of total matter
    and p_cb (T,) of CDM + baryons in (Mpc/h)^3, the normalisation both ways (σ8 and A_s),
    σ8 of CDM + baryons, the code's name and version, and with massive neutrinos their
    :class:`NeutrinoTransfer` (else None; then p_cb is p)."""

    k: np.ndarray
    p: np.ndarray
    sigma8: float
    A_s: float
    code: str
    version: str
    p_cb: np.ndarray
    sigma8_cb: float
    neutrinos: NeutrinoTransfer | None = None


def table_wavenumbers(k_min: float, k_max: float, points_per_decade: int) -> np.ndarray:
    """The wavenumbers (h/Mpc) of a table: log-spaced from k_min to k_max, both included,
    points_per_decade to a decade."""
    points = round(math.log10(k_max / k_min) * points_per_decade) + 1
    return np.geomspace(k_min, k_max, points)
