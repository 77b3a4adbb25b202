"""Massive neutrinos' linear response in the transfer-ratio scheme, on the host (numpy).

The neutrinos are not particles: at every scale factor their density contrast is that of CDM
+ baryons times the Boltzmann code's ratio of transfer functions, δ_ν(k, a) = R(k, a) δ_cb(k, a)
with R = T_ν / T_cb. In the linear, sub-horizon limit the CDM + baryon contrast then obeys

    δ_cb'' + (2 + d ln E / d ln a) δ_cb' = 1.5 [Ω_cb a⁻³ + ρ_ν(a) R(k, a)] / E² δ_cb

(' = d / d ln a, densities in units of today's critical density, E = H / H0), whose solution
is the scale-dependent growth D_cb(k, a). ``nu`` is a
:class:`pmpipe.physics.boltzmann.NeutrinoTransfer` (k in h/Mpc on its own grid of a).
"""

from __future__ import annotations

import numpy as np

from pmpipe.physics import background, cosmology

STEPS_PER_EFOLD = 200  # RK4 steps per unit of ln a in :func:`cb_growth`


def _on_ln_a(nu, values: np.ndarray, a) -> np.ndarray:
    """``values`` (A, Q) on the table's a, linear in ln a at the scalar a (ends held)."""
    x = np.log(nu.a)
    i = int(np.clip(np.searchsorted(x, np.log(a)) - 1, 0, x.size - 2))
    t = np.clip((np.log(a) - x[i]) / (x[i + 1] - x[i]), 0.0, 1.0)
    return (1.0 - t) * values[i] + t * values[i + 1]


def transfer_ratio(nu, a: float) -> np.ndarray:
    """R(k, a) = T_ν / T_cb at scale factor a, on nu.k (Q,)."""
    return _on_ln_a(nu, nu.ratio, a)


def growth_rate_cb(nu, a: float) -> np.ndarray:
    """f_cb(k, a) = d ln T_cb / d ln a from the Boltzmann code, on nu.k (Q,): centred
    differences on the table's grid of ln a (one-sided at its ends), linear between."""
    slopes = np.gradient(np.log(nu.growth_cb), np.log(nu.a), axis=0)
    return _on_ln_a(nu, slopes, a)


def cb_growth(cosmo, nu, a_start: float, a) -> np.ndarray:
    """D_cb(k, a) / D_cb(k, 1) at the scale factors ``a`` (N,) ≥ a_start, on nu.k: shape
    (N, Q). The equation of the module docstring from a_start, where the Boltzmann code gives
    the growth rate, to a = 1 by RK4 in ln a."""
    a = np.atleast_1d(np.asarray(a, np.float64))
    steps = max(int(np.ceil(-np.log(a_start) * STEPS_PER_EFOLD)), 1)
    lna = np.linspace(np.log(a_start), 0.0, steps + 1)
    h = lna[1] - lna[0]

    # the background at every step and half-way between, computed once
    half = np.exp(np.linspace(lna[0], 0.0, 2 * steps + 1))
    e2 = background.E2(cosmo, half)
    cb = 1.5 * background.omega_cb(cosmo) / half**3 / e2
    nu_weight = 1.5 * background.neutrino_density_pressure(cosmo, half)[0] / e2
    friction = 2.0 + cosmology.dlnE_dlna(cosmo, half)  # arithmetic only: numpy here

    def rhs(j, y):
        source = cb[j] + nu_weight[j] * transfer_ratio(nu, half[j])
        return np.stack([y[1], source * y[0] - friction[j] * y[1]])

    y = np.stack([np.ones(nu.k.size), growth_rate_cb(nu, a_start)])
    delta = np.empty((steps + 1, nu.k.size))
    delta[0] = y[0]
    for i in range(steps):
        k1 = rhs(2 * i, y)
        k2 = rhs(2 * i + 1, y + 0.5 * h * k1)
        k3 = rhs(2 * i + 1, y + 0.5 * h * k2)
        k4 = rhs(2 * i + 2, y + h * k3)
        y = y + h / 6.0 * (k1 + 2.0 * k2 + 2.0 * k3 + k4)
        delta[i + 1] = y[0]
    at = np.stack([np.interp(np.log(a), lna, delta[:, q]) for q in range(nu.k.size)], axis=1)
    return at / delta[-1]
