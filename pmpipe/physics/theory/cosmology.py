"""Background cosmology, linear growth and the linear matter power spectrum.

Flat ΛCDM with an optional CPL dark energy (w0, wa), photons and neutrinos (massless, or of
total mass m_nu in the background).
Everything here is a pure JAX function of a :class:`Cosmology` pytree, so it can be
jit-compiled and differentiated with respect to the parameters (e.g. Ω_m).

Units: distances in Mpc/h, wavenumbers in h/Mpc, P(k) in (Mpc/h)^3.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from pmpipe.physics.theory import background, eisenstein_hu
from pmpipe.physics.theory.background import (
    E2,
    FIDUCIAL,
    HUBBLE_DISTANCE,
    omega_de,
    omega_radiation,
)

# Growth tables: RK4 in ln a from A_TABLE_MIN to 1.
A_TABLE_MIN = 1e-5
N_TABLE = 1024


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Cosmology:
    """Cosmological parameters (all differentiable leaves).

    Omega_m: total matter density today (CDM + baryons + massive neutrinos); Omega_b: baryons;
    h: H0 / 100 km/s/Mpc; n_s: primordial tilt; sigma8: rms linear density in 8 Mpc/h spheres at a = 1;
    w0, wa: CPL dark energy equation of state; T_cmb: CMB temperature in K (0 drops radiation);
    N_eff: effective number of neutrino species; m_nu: their total mass in eV;
    neutrino_hierarchy: how it splits (static, not a leaf; :mod:`pmpipe.physics.theory.background`
    gives the convention). Defaults: the fiducial cosmology
    (background.FIDUCIAL), a run's too. ``tables``: the growth and distance tables of these
    parameters (:func:`growth_table`) when the cosmology carries them (:func:`tabulated`),
    else None and every lookup computes them.
    """

    Omega_m: float = FIDUCIAL["Omega_m"]
    Omega_b: float = FIDUCIAL["Omega_b"]
    h: float = FIDUCIAL["h"]
    n_s: float = FIDUCIAL["n_s"]
    sigma8: float = FIDUCIAL["sigma8"]
    w0: float = FIDUCIAL["w0"]
    wa: float = FIDUCIAL["wa"]
    T_cmb: float = FIDUCIAL["T_cmb"]
    N_eff: float = FIDUCIAL["N_eff"]
    m_nu: float = FIDUCIAL["m_nu"]
    neutrino_hierarchy: str = dataclasses.field(
        default=background.HIERARCHIES[0], metadata={"static": True}
    )
    tables: dict | None = dataclasses.field(default=None, compare=False, repr=False)


def E(cosmo: Cosmology, a):
    """H(a) / H0."""
    return jnp.sqrt(E2(cosmo, a))


def dlnE_dlna(cosmo: Cosmology, a):
    """d ln E / d ln a."""
    dde = -3.0 * (1.0 + cosmo.w0 + cosmo.wa) + 3.0 * cosmo.wa * a
    rho_nu, p_nu = background.neutrino_density_pressure(cosmo, a)
    num = (
        -4.0 * omega_radiation(cosmo) * a**-4
        - 3.0 * background.omega_cb(cosmo) * a**-3
        - 3.0 * (rho_nu + p_nu)
        + omega_de(cosmo) * background.de_scaling(cosmo, a) * dde
    )
    return 0.5 * num / E2(cosmo, a)


def omega_m_of_a(cosmo: Cosmology, a):
    """Ω_m(a) = Ω_m a^-3 / E^2."""
    return cosmo.Omega_m * a**-3 / E2(cosmo, a)


# ---------------------------------------------------------------------------------------------
# Growth and distance tables (one RK4 integration in ln a, cubic Hermite interpolation)


def _background_coefficients(cosmo: Cosmology, lna):
    """The growth and distance equations' coefficients at ln a (shape (3,) + lna's shape):
    the friction 2 + d ln E / d ln a, the source 1.5 Ω_m(a) and dχ/dln a = -1 / (a E) in c/H0."""
    a = jnp.exp(lna)
    return jnp.stack(
        [2.0 + dlnE_dlna(cosmo, a), 1.5 * omega_m_of_a(cosmo, a), -1.0 / (a * E(cosmo, a))]
    )


def _table_rhs(coefficients, y):
    """d/dlna of (D1, D1', D2, D2', chi) where ' = d/dlna, given the
    :func:`_background_coefficients` at that ln a."""
    friction, src, dchi = coefficients
    d1, d1p, d2, d2p, _ = y
    return jnp.stack(
        [
            d1p,
            -friction * d1p + src * d1,
            d2p,
            -friction * d2p + src * d2 - src * d1 * d1,
            dchi,
        ]
    )


def tabulated(cosmo: Cosmology) -> Cosmology:
    """``cosmo`` carrying its growth and distance tables: itself when it carries them, else a
    copy with :func:`growth_table` computed once, here (in a compiled program, once per
    program)."""
    if cosmo.tables is not None:
        return cosmo
    return dataclasses.replace(cosmo, tables=growth_table(cosmo))


def _tables(cosmo: Cosmology) -> dict:
    """The growth and distance tables of ``cosmo``: those it carries, else computed."""
    return growth_table(cosmo) if cosmo.tables is None else cosmo.tables


def growth_table(cosmo: Cosmology) -> dict:
    """The growth and distance tables of the cosmology's parameters (:func:`_growth_table`;
    tables the cosmology carries are ignored)."""
    return _growth_table(dataclasses.replace(cosmo, tables=None))


@jax.jit
def _growth_table(cosmo: Cosmology) -> dict:
    """Tabulate growth and distance on a uniform ln a grid from A_TABLE_MIN to 1.

    Starts in the radiation era on the Meszaros growing mode D1 ∝ a + 2/3 a_eq with
    D2 = -3/7 D1^2; transients decay as 1/D1. Returns a dict of arrays of shape (N_TABLE + 1,):
    lna, D1, dD1 (= dD1/dlna), D2, dD2, chi (Mpc/h, from a = 1), normalised to D1(1) = 1
    and D2 scaled by 1/D1(1)^2.
    """
    lna0 = math.log(A_TABLE_MIN)
    h = -lna0 / N_TABLE
    a0 = A_TABLE_MIN
    a_eq = omega_radiation(cosmo) / cosmo.Omega_m
    d1 = a0 + 2.0 / 3.0 * a_eq
    d1p = a0 * jnp.ones_like(d1)
    y0 = jnp.stack([d1, d1p, -3.0 / 7.0 * d1**2, -6.0 / 7.0 * d1 * d1p, 0.0 * d1])
    # the background at every grid point and half-way between, computed once (not per step)
    coefficients = _background_coefficients(cosmo, lna0 + 0.5 * h * jnp.arange(2 * N_TABLE + 1)).T

    def step(y, c):
        start, middle, end = c
        k1 = _table_rhs(start, y)
        k2 = _table_rhs(middle, y + 0.5 * h * k1)
        k3 = _table_rhs(middle, y + 0.5 * h * k2)
        k4 = _table_rhs(end, y + h * k3)
        y1 = y + h / 6.0 * (k1 + 2.0 * k2 + 2.0 * k3 + k4)
        return y1, y1

    on_grid = coefficients[::2]
    _, ys = jax.lax.scan(step, y0, (on_grid[:-1], coefficients[1::2], on_grid[1:]))
    ys = jnp.concatenate([y0[None], ys], axis=0)
    lna = lna0 + h * jnp.arange(N_TABLE + 1, dtype=ys.dtype)
    d1_today = ys[-1, 0]
    chi_today = ys[-1, 4]
    rhs = jax.vmap(_table_rhs)(on_grid, ys)
    return {
        "lna": lna,
        "D1": ys[:, 0] / d1_today,
        "dD1": ys[:, 1] / d1_today,
        "ddD1": rhs[:, 1] / d1_today,
        "D2": ys[:, 2] / d1_today**2,
        "dD2": ys[:, 3] / d1_today**2,
        "ddD2": rhs[:, 3] / d1_today**2,
        "chi": (ys[:, 4] - chi_today) * HUBBLE_DISTANCE,
        "dchi": rhs[:, 4] * HUBBLE_DISTANCE,
    }


def _hermite(x, xs, ys, dys):
    """Cubic Hermite interpolation on a uniform grid xs with values ys and slopes dys."""
    h = xs[1] - xs[0]
    i = jnp.clip(jnp.floor((x - xs[0]) / h).astype(jnp.int32), 0, xs.shape[0] - 2)
    t = (x - xs[i]) / h
    t2, t3 = t * t, t * t * t
    return (
        (2 * t3 - 3 * t2 + 1) * ys[i]
        + (t3 - 2 * t2 + t) * h * dys[i]
        + (-2 * t3 + 3 * t2) * ys[i + 1]
        + (t3 - t2) * h * dys[i + 1]
    )


def _lookup(cosmo: Cosmology, a, name):
    """Interpolate the table ``name`` (with its ln-a derivative) at scale factor(s) a."""
    t = _tables(cosmo)
    lna = jnp.log(jnp.asarray(a, dtype=t["lna"].dtype))
    return _hermite(lna, t["lna"], t[name], t["d" + name])


# The lookups are compiled (cosmologies and times traced): eager callers run one program each.


@jax.jit
def growth_factor(cosmo: Cosmology, a):
    """Linear growth D1(a), normalised to D1(1) = 1."""
    return _lookup(cosmo, a, "D1")


@jax.jit
def growth_factor_derivative(cosmo: Cosmology, a):
    """dD1 / d ln a."""
    return _lookup(cosmo, a, "dD1")


@jax.jit
def growth_factor_2(cosmo: Cosmology, a):
    """Second-order growth D2(a) (negative, ≈ -3/7 D1^2), in units of D1(1)^2."""
    return _lookup(cosmo, a, "D2")


@jax.jit
def growth_rate(cosmo: Cosmology, a):
    """f1 = d ln D1 / d ln a."""
    return _lookup(cosmo, a, "dD1") / _lookup(cosmo, a, "D1")


@jax.jit
def growth_rate_2(cosmo: Cosmology, a):
    """f2 = d ln D2 / d ln a."""
    return _lookup(cosmo, a, "dD2") / _lookup(cosmo, a, "D2")


@jax.jit
def comoving_distance(cosmo: Cosmology, a):
    """Line-of-sight comoving distance χ(a) from a = 1, in Mpc/h."""
    return _lookup(cosmo, a, "chi")


@jax.jit
def scale_factor_at_distance(cosmo: Cosmology, chi):
    """Inverse of :func:`comoving_distance`: a(χ) for χ in Mpc/h (two Newton refinements)."""
    t = _tables(cosmo)
    chi = jnp.asarray(chi, dtype=t["lna"].dtype)
    lna = jnp.interp(-chi, -t["chi"], t["lna"])
    for _ in range(2):
        a = jnp.exp(lna)
        resid = _hermite(lna, t["lna"], t["chi"], t["dchi"]) - chi
        lna = lna - resid / (-HUBBLE_DISTANCE / (a * E(cosmo, a)))
    return jnp.exp(lna)


def on_host(function, cosmo: Cosmology, x) -> np.ndarray:
    """function(cosmo, x) (one of the lookups above) for x of any shape, as a float64
    numpy array. x is flattened and padded to the next power of two (at least 64), so that
    the lookups of runs whose plane counts or tables differ a little share a compiled program."""
    x = np.asarray(x, np.float64)
    size = max(64, 1 << max(0, x.size - 1).bit_length())
    padded = np.concatenate([x.ravel(), np.full(size - x.size, x.ravel()[-1] if x.size else 1.0)])
    out = np.asarray(function(cosmo, padded), np.float64)
    return out[: x.size].reshape(x.shape)


# ---------------------------------------------------------------------------------------------
# Linear matter power spectrum


def transfer_eisenstein_hu(cosmo: Cosmology, k, wiggles: bool = True):
    """Eisenstein & Hu (1998) matter transfer function; k in h/Mpc
    (:func:`pmpipe.physics.theory.eisenstein_hu.transfer`)."""
    return eisenstein_hu.transfer(cosmo, k, wiggles, jnp)


def sigma_r(k, pk, radius):
    """rms of a field with power pk(k) (log-spaced k, h/Mpc) in top-hat spheres of radius Mpc/h."""
    return eisenstein_hu.sigma_r(k, pk, radius, jnp)


_SIGMA8_K = (1e-5, 1e2, 4096)  # k range (h/Mpc) and points for the σ8 integral


@functools.partial(jax.jit, static_argnames="wiggles")
def linear_power_eisenstein_hu(cosmo: Cosmology, k, wiggles: bool = True):
    """Linear P(k) at a = 1 in (Mpc/h)^3 from the Eisenstein-Hu transfer function, normalised to σ8."""
    kk = jnp.logspace(math.log10(_SIGMA8_K[0]), math.log10(_SIGMA8_K[1]), _SIGMA8_K[2])
    shape = lambda q: q**cosmo.n_s * transfer_eisenstein_hu(cosmo, q, wiggles) ** 2
    norm = (cosmo.sigma8 / sigma_r(kk, shape(kk), 8.0)) ** 2
    return norm * shape(jnp.asarray(k))


@jax.jit
def interp_power(k, k_table, p_table, n_s):
    """Log-log interpolation of a tabulated P(k); k = 0 gives 0, k below the table its first
    value. Beyond the table, the small-scale form of a CDM spectrum,
    P ∝ k^(n_s - 4) ln²(k / k_0), with k_0 set by the table's log slope over its last 0.1
    decade (from a CAMB table to 2 h/Mpc: within 0.6 % of CAMB up to 64 h/Mpc)."""
    lnk, ln_kt, ln_pt = jnp.log(jnp.maximum(k, k_table[0])), jnp.log(k_table), jnp.log(p_table)
    j = jnp.clip(jnp.searchsorted(ln_kt, ln_kt[-1] - 0.1 * jnp.log(10.0)), 0, ln_kt.size - 2)
    slope = (ln_pt[-1] - ln_pt[j]) / (ln_kt[-1] - ln_kt[j])
    log_k0 = 2.0 / jnp.maximum(slope - n_s + 4.0, 1e-3)  # ln(k_last / k_0)
    beyond = jnp.maximum(lnk - ln_kt[-1], 0.0)
    tail = ln_pt[-1] + (n_s - 4.0) * beyond + 2.0 * jnp.log1p(beyond / log_k0)
    lnp = jnp.where(lnk > ln_kt[-1], tail, jnp.interp(lnk, ln_kt, ln_pt))
    return jnp.where(k > 0, jnp.exp(lnp), 0.0)


# Host evaluations of P(k) run on arrays padded to a power of two of at least this many
# wavenumbers, so that the statistics' and predictions' many k grids of a run share a few
# compiled programs instead of compiling one per shape (about 0.3 s each on CPU)
HOST_POWER_BUCKET = 4096


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True, eq=False)
class LinearPower:
    """Linear P(k) at a = 1 [(Mpc/h)^3] as a callable of k [h/Mpc] and a pytree: the kind
    (one of pmpipe.physics.theory.power_table.POWER_KINDS) is static, the cosmology and the table
    (k_table, p_table: (T,) arrays, the kinds of power_table.TABULATED_KINDS only) are leaves,
    so compiled programs take them as arguments."""

    kind: str = dataclasses.field(metadata={"static": True})
    cosmo: Cosmology
    k_table: jax.Array | np.ndarray | None = None
    p_table: jax.Array | np.ndarray | None = None

    def __call__(self, k):
        """P(k) at k of any shape: a JAX array's (in a compiled program, as part of it), or a
        host array's (numpy, computed in float32) through one program per power-of-two size of
        at least HOST_POWER_BUCKET wavenumbers, flattened and padded."""
        if isinstance(k, jax.Array):
            return self._evaluate(k)
        k = np.asarray(k, np.float32)
        flat = k.reshape(-1)
        size = max(HOST_POWER_BUCKET, 1 << max(flat.size - 1, 0).bit_length())
        padded = np.concatenate([flat, np.ones(size - flat.size, np.float32)])
        return np.asarray(self._evaluate(padded))[: flat.size].reshape(k.shape)

    def _evaluate(self, k):
        if self.k_table is not None:
            return interp_power(k, self.k_table, self.p_table, self.cosmo.n_s)
        return linear_power_eisenstein_hu(self.cosmo, k, self.kind == "eisenstein_hu")
