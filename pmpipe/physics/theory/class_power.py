"""power.kind 'class': a run's linear P(k) table from CLASS (classy, its Python wrapper), with the
conventions of :mod:`pmpipe.physics.theory.background` and the same table layout as CAMB's
(:func:`pmpipe.physics.theory.boltzmann.camb_power`).

Neutrinos as pmpipe counts them: with m_nu > 0 one CLASS species of degeneracy 3 and mass
m_nu / 3 (degenerate), or three of the hierarchy's masses, at the temperature that makes them
carry the massive part of N_eff (so that Ω_ν h² is pmpipe's), the rest of N_eff massless
('N_ur'). Dark energy w0, wa is CLASS's fluid with its PPF
closure, as CAMB's. Units: k in h/Mpc, P in (Mpc/h)^3.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import types

import numpy as np

from pmpipe.physics.theory import background
from pmpipe.physics.theory.boltzmann_tables import (
    A_S_REFERENCE,
    K_PIVOT,
    NEUTRINO_SETTINGS,
    TRANSFER_MARGIN,
    LinearTable,
    NeutrinoTransfer,
    table_wavenumbers,
)
from pmpipe.runtime import versions

CODE = "class"
SETTINGS = {
    "precision": "CLASS defaults",
    # massive neutrinos followed by their full hierarchy to multipole 30: CLASS's fluid
    # approximation leaves their density contrast 20-25 % low at 0.1-0.4 h/Mpc, and the default
    # 17 multipoles the total P(k) 0.5 % low at 1 h/Mpc (docs/validation.md)
    "ncdm_fluid_approximation": 3,
    "l_max_ncdm": 30,
    "transfer_margin": TRANSFER_MARGIN,
    # CLASS's P(k) reaches at least this far (h/Mpc): σ8 sums the power up to there, and is then
    # within 2e-5 of its value at 10 h/Mpc (0.03 % low when it stopped at the table's 1.1 h/Mpc)
    "k_max_floor": 3.0,
    "A_s_reference": A_S_REFERENCE,
    "pivot_per_mpc": K_PIVOT,
    "dark_energy": "fluid with PPF when w0, wa differ from -1, 0",
    **NEUTRINO_SETTINGS,
}


def class_inputs(cosmology: dict, A_s: float, k_max_h: float, settings: dict = SETTINGS) -> dict:
    """CLASS's input parameters for pmpipe's cosmology (a mapping of its fields) at amplitude
    A_s, with linear P(k) at z = 0 up to ``k_max_h`` (h/Mpc)."""
    h, m_nu = cosmology["h"], cosmology.get("m_nu", 0.0)
    cosmo = types.SimpleNamespace(**{**cosmology, "m_nu": m_nu})
    params: dict = {
        "output": "mPk",
        "h": h,
        "omega_b": cosmology["Omega_b"] * h**2,
        "omega_cdm": (background.omega_cb(cosmo) - cosmology["Omega_b"]) * h**2,
        "T_cmb": cosmology["T_cmb"],
        "A_s": A_s,
        "n_s": cosmology["n_s"],
        "k_pivot": settings["pivot_per_mpc"],
        "Omega_k": 0.0,
        "P_k_max_h/Mpc": max(k_max_h * settings["transfer_margin"], settings["k_max_floor"]),
        "z_pk": "0",
    }
    if cosmology["w0"] != -1.0 or cosmology["wa"] != 0.0:
        params.update(Omega_Lambda=0.0, w0_fld=cosmology["w0"], wa_fld=cosmology["wa"])
    params["N_ur"] = cosmology["N_eff"] - float(background.massive_neutrino_number(cosmo))
    if m_nu > 0:
        params.update(
            ncdm_fluid_approximation=settings["ncdm_fluid_approximation"],
            l_max_ncdm=settings["l_max_ncdm"],
            **_species(cosmo),
        )
    return params


def _species(cosmo) -> dict:
    """CLASS's massive species for pmpipe's: one of degeneracy 3 and mass m_nu / 3 when
    degenerate, else the three of :func:`pmpipe.physics.theory.background.neutrino_masses`; all at the
    temperature that makes them carry the massive part of N_eff."""
    species = background.NEUTRINO_SPECIES
    temperature = float(background.neutrino_temperature_ratio(cosmo))
    if background.hierarchy(cosmo) == background.HIERARCHIES[0]:
        return {
            "N_ncdm": 1,
            "deg_ncdm": species,
            "m_ncdm": cosmo.m_nu / species,
            "T_ncdm": temperature,
        }
    return {
        "N_ncdm": species,
        "deg_ncdm": ",".join(["1"] * species),
        "m_ncdm": ",".join(f"{float(m):.17g}" for m in background.neutrino_masses(cosmo)),
        "T_ncdm": ",".join([f"{temperature:.17g}"] * species),
    }


def class_power(spec: dict) -> LinearTable:
    """The table :func:`pmpipe.physics.theory.boltzmann.inputs` describes for code 'class', from one
    CLASS run (at the given A_s, or at the reference A_s rescaled to the given σ8); with
    massive neutrinos also the transfer functions at the scale factors of the settings'
    neutrino tables."""
    import classy

    cosmology, settings = spec["cosmology"], spec["settings"]
    A_s = cosmology.get("A_s", settings["A_s_reference"])
    k_max, h = spec["k_max"], cosmology["h"]
    k = table_wavenumbers(spec["k_min"], k_max, spec["points_per_decade"])
    params = class_inputs(cosmology, A_s, k_max, settings)
    massive = cosmology.get("m_nu", 0.0) > 0
    grid = settings["neutrino_tables"]
    a = np.geomspace(grid["a_min"], 1.0, grid["points"])  # the neutrino tables' scale factors
    if massive:
        z = 1.0 / a - 1.0
        params.update(output="mPk,dTk", z_pk=", ".join(f"{value:.10g}" for value in z))
    code = classy.Class()
    code.set(params)
    try:
        code.compute()
        z0 = np.zeros(1)
        p = np.asarray(code.get_pk_array(k * h, z0, len(k), 1, 0), np.float64) * h**3
        sigma8 = float(code.sigma8())
        p_cb, sigma8_cb, neutrinos = p, sigma8, None
        if massive:
            p_cb = np.asarray(code.get_pk_cb_array(k * h, z0, len(k), 1, 0), np.float64) * h**3
            sigma8_cb = float(code.sigma8_cb())
            neutrinos = _neutrino_transfer(code, a, params, types.SimpleNamespace(**cosmology))
    finally:
        code.struct_cleanup()
    if "sigma8" in cosmology:
        scale = (cosmology["sigma8"] / sigma8) ** 2
        p, p_cb = p * scale, (p_cb * scale if massive else None)
        A_s, sigma8, sigma8_cb = A_s * scale, cosmology["sigma8"], sigma8_cb * scale**0.5
    return LinearTable(
        k,
        p,
        sigma8,
        float(A_s),
        CODE,
        version(),
        p if p_cb is None else p_cb,
        sigma8_cb,
        neutrinos,
    )


def class_power_apart(spec: dict) -> LinearTable:
    """:func:`class_power` in a process of its own (started afresh, not forked from this one,
    which may run JAX's threads): classy holds Python's global lock while CLASS computes, for
    seconds with massive neutrinos, which would stall this process's other threads, such as a
    packed job's running simulation while the next run's table is made ahead."""
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as pool:
        return pool.submit(class_power, spec).result()


def _neutrino_transfer(code, a: np.ndarray, params: dict, cosmo) -> NeutrinoTransfer:
    """The :class:`NeutrinoTransfer` of a computed CLASS run at the scale factors ``a``
    (ascending, the last 1): T_cb is the density-weighted mean of CDM's and baryons', T_ν that
    of the massive species (``cosmo``'s, :func:`pmpipe.physics.theory.background.neutrino_density_shares`)."""
    omega_c, omega_b = params["omega_cdm"], params["omega_b"]
    ratio, cb = [], []
    for value in a:
        transfer = code.get_transfer(1.0 / value - 1.0)
        t_cb = (omega_c * transfer["d_cdm"] + omega_b * transfer["d_b"]) / (omega_c + omega_b)
        shares = (
            (1.0,) if params["N_ncdm"] == 1 else background.neutrino_density_shares(cosmo, value)
        )
        t_nu = sum(share * transfer[f"d_ncdm[{i}]"] for i, share in enumerate(shares))
        ratio.append(t_nu / t_cb)
        cb.append(t_cb)
    k = np.asarray(transfer["k (h/Mpc)"], np.float64)
    cb_array = np.asarray(cb, np.float64)
    return NeutrinoTransfer(
        np.asarray(a, np.float64), k, np.asarray(ratio), cb_array / cb_array[-1]
    )


def version() -> str:
    """The installed classy's version."""
    found = versions.installed("classy")
    if found is None:
        raise ModuleNotFoundError(
            "power.kind 'class' needs CLASS's Python wrapper classy, an optional extra built "
            "from source: pip install 'pmpipe[class]' (or choose power.kind camb)"
        )
    return found
