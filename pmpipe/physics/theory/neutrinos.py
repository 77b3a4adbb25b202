"""Massive neutrinos' linear response in the transfer-ratio scheme.

The neutrinos are not particles: at every scale factor their density contrast is that of CDM
+ baryons times the Boltzmann code's ratio of transfer functions, δ_ν(k, a) = R(k, a) δ_cb(k, a)
with R = T_ν / T_cb. In the linear, sub-horizon limit the CDM + baryon contrast then obeys

    δ_cb'' + (2 + d ln E / d ln a) δ_cb' = 1.5 [Ω_cb a⁻³ + ρ_ν(a) R(k, a)] / E² δ_cb

(' = d / d ln a, densities in units of today's critical density, E = H / H0), whose solution
is the scale-dependent growth D_cb(k, a). ``nu`` is a
:class:`pmpipe.physics.theory.boltzmann_tables.NeutrinoTransfer` (k in h/Mpc on its own grid of a).

A run's particles are CDM + baryons. On the host, :func:`run_tables` solves that equation and
puts what the compiled programs need into the cosmology's tables, on the fixed grid K_GRID (so
that runs of one size share their programs); in the programs, :func:`force_factor` gives the
PM force's source at each step, :func:`ic_factors` the initial conditions' scale-dependent
growth and growth rate, and :func:`total_matter` the total matter density of the lightcone's
planes.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from pmpipe.physics.mesh import fft
from pmpipe.physics.theory import background, cosmology

K_GRID = np.geomspace(1e-4, 1e2, 160)  # h/Mpc: wavenumbers of the tables in the programs
_LOG_K_STEP = float(np.log(K_GRID[1] / K_GRID[0]))  # uniform in ln k: indices are arithmetic

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


def run_tables(cosmo: cosmology.Cosmology, nu, a_init: float) -> cosmology.Cosmology:
    """``cosmo`` (tabulated) with the neutrino tables of a run starting at ``a_init`` added:
    nu_lna (A,) the tables' ln a, nu_ratio (A, K) = T_ν / T_cb on K_GRID, and at a_init
    nu_ic_growth (K,) = D_cb(k, a_init) / (D_cb(k, 1) D1(a_init)) (D1 the scale-free growth of
    the LPT) and nu_ic_rate (K,) = f_cb(k, a_init)."""
    if a_init < nu.a[0] * (1 - 1e-9):
        raise ValueError(f"a_init = {a_init} precedes the neutrino tables (from a = {nu.a[0]})")
    d1 = float(cosmology.growth_factor(cosmo, a_init))
    on_grid = lambda values: np.interp(np.log(K_GRID), np.log(nu.k), values)  # ends held
    growth = cb_growth(cosmo, nu, a_init, [a_init])[0] / d1
    ratio = np.stack([on_grid(row) for row in nu.ratio])
    dtype = _tables(cosmo)["D1"].dtype
    tables = {
        "nu_lna": np.log(nu.a),
        "nu_ratio": ratio,
        "nu_ic_growth": on_grid(growth),
        "nu_ic_rate": on_grid(growth_rate_cb(nu, a_init)),
    }
    tables = {name: jnp.asarray(value, dtype) for name, value in tables.items()}
    return dataclasses.replace(cosmo, tables={**_tables(cosmo), **tables})


def _tables(cosmo: cosmology.Cosmology) -> dict:
    """The tables ``cosmo`` carries (:func:`pmpipe.physics.theory.cosmology.tabulated`)."""
    if cosmo.tables is None:
        raise ValueError("the cosmology carries no tables: tabulate it first")
    return cosmo.tables


def has_tables(cosmo: cosmology.Cosmology) -> bool:
    """Whether ``cosmo`` carries the neutrino tables of :func:`run_tables`."""
    return cosmo.tables is not None and "nu_ratio" in cosmo.tables


def _on_k(values, k):
    """Table ``values`` (K,) on K_GRID at |k| (any shape, h/Mpc), linear in ln k, ends held:
    the index comes from ln k by arithmetic (no search over the grid at every mesh cell)."""
    x = jnp.clip((jnp.log(jnp.maximum(k, K_GRID[0])) - np.log(K_GRID[0])) / _LOG_K_STEP, 0.0, None)
    i = jnp.minimum(x.astype(jnp.int32), K_GRID.size - 2)
    t = jnp.minimum(x - i, 1.0)
    return (1.0 - t) * values[i] + t * values[i + 1]


def force_factor(cosmo: cosmology.Cosmology, a, k):
    """1.5 (Ω_cb + a³ ρ_ν(a) R(k, a)) at scale factor a (traced scalar) and |k| (any shape):
    the factor of ∇⁻²δ_cb in the PM potential, neutrinos included (JAX)."""
    tables = _tables(cosmo)
    lna = jnp.log(a)
    ratio = jax.vmap(lambda column: jnp.interp(lna, tables["nu_lna"], column), in_axes=1)(
        tables["nu_ratio"]
    )
    weight = a**3 * background.neutrino_density_pressure(cosmo, a)[0]
    return 1.5 * (background.omega_cb(cosmo) + weight * _on_k(ratio, k))


def ic_factors(cosmo: cosmology.Cosmology, k):
    """(D_cb(k, a_init) / (D_cb(k, 1) D1(a_init)), f_cb(k, a_init)) at |k| (any shape) from the
    tables of :func:`run_tables` (JAX)."""
    tables = _tables(cosmo)
    return _on_k(tables["nu_ic_growth"], k), _on_k(tables["nu_ic_rate"], k)


def total_matter(cosmo: cosmology.Cosmology, a, rho, mesh, box_size: float):
    """ρ_m / ρ̄_m, CDM + baryons + neutrinos, from the particles' ρ_cb / ρ̄_cb (M, M, M) on the
    force mesh at scale factor a: δ_m(k) = (Ω_cb + a³ρ_ν R(k, a)) / (Ω_cb + a³ρ_ν) δ_cb(k)
    (JAX)."""
    delta_k = fft.r2c(rho - 1.0, mesh)
    k = fft.wavenumber(delta_k, mesh, box_size)
    weight = a**3 * background.neutrino_density_pressure(cosmo, a)[0]
    share = force_factor(cosmo, a, k) / (1.5 * (background.omega_cb(cosmo) + weight))
    return 1.0 + fft.c2r(share.astype(rho.dtype) * delta_k, mesh)
