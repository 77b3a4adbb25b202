"""Linear matter power at a = 1 from a Boltzmann code, on the host (numpy): the physical inputs
that determine it, and the call: CAMB here, CLASS in :mod:`pmpipe.physics.theory.class_power`.

Conventions: flat; Ω_m is total matter today (CDM + baryons + massive neutrinos, whose
density follows :mod:`pmpipe.physics.theory.background`, as CAMB's does); the power is of total matter
(CAMB's ``delta_tot``); k in h/Mpc, P in (Mpc/h)^3; A_s at the pivot 0.05 /Mpc; σ8 of total
matter at a = 1. A run gives σ8 or A_s and the other is derived. Precision: CAMB's defaults
(AccuracyBoost 1) without CMB spectra, transfer functions computed to 10 % beyond the table's
k_max and at least to 10 /Mpc (σ8 then changes by less than 1e-4 with that limit);
docs/validation.md gives what these settings reach.
"""

from __future__ import annotations

import math
import threading
import types

import numpy as np

from pmpipe.physics.theory import background, class_power
from pmpipe.physics.theory.boltzmann_tables import (
    A_S_REFERENCE,
    K_PIVOT,
    NEUTRINO_SETTINGS,
    TRANSFER_MARGIN,
    LinearTable,
    NeutrinoTransfer,
    table_wavenumbers,
)
from pmpipe.physics.theory.power_table import BOLTZMANN_KINDS
from pmpipe.runtime import versions

CODE = "camb"
K_MIN = 1e-4  # h/Mpc: first k of every table
POINTS_PER_DECADE = 512  # log-spaced: log-log interpolation between them is good to 3e-5
K_MAX_FLOOR = 1.0  # h/Mpc: tables reach at least this far
TRANSFER_KMAX_FLOOR = 10.0  # 1/Mpc: CAMB's transfer k_max at least this
# how CAMB is called: part of every table's inputs, so that a change here makes tables anew
SETTINGS = {
    "accuracy_boost": 1.0,
    "transfer_margin": TRANSFER_MARGIN,
    "transfer_kmax_floor": TRANSFER_KMAX_FLOOR,
    "A_s_reference": A_S_REFERENCE,
    "pivot_per_mpc": K_PIVOT,
    "dark_energy": "ppf",
    "variable": "delta_tot",
    "cmb": False,
    **NEUTRINO_SETTINGS,
}
# CAMB keeps its state in Fortran module variables: two calls at once in one process crash it
# (a segmentation fault, seen with calls on two threads at once), so calls take turns
CAMB_TURN = threading.Lock()


def table_k_max(k_needed: float) -> float:
    """The table's last k (h/Mpc): the power of two at or above ``k_needed``, at least
    K_MAX_FLOOR, so that runs of nearby sizes share one table."""
    return float(2.0 ** math.ceil(math.log2(max(k_needed, K_MAX_FLOOR))))


def version() -> str:
    """The installed CAMB's version (from its metadata: CAMB itself is imported only to call it)."""
    found = versions.installed("camb")
    if found is None:
        raise ModuleNotFoundError("power.kind 'camb' needs CAMB: pip install camb")
    return found


def _code(code: str) -> dict:
    """The Boltzmann ``code``'s version function, table function and settings."""
    codes = {
        CODE: {"version": version, "table": camb_power, "settings": SETTINGS},
        class_power.CODE: {
            "version": class_power.version,
            "table": class_power.class_power_apart,
            "settings": class_power.SETTINGS,
        },
    }
    if code not in codes:
        raise ValueError(f"Boltzmann code {code!r}: pmpipe calls {' or '.join(BOLTZMANN_KINDS)}")
    return codes[code]


def code_version(code: str) -> str:
    """The installed version of the Boltzmann ``code`` ('camb' or 'class'); ModuleNotFoundError
    saying how to install it when it is not."""
    return _code(code)["version"]()


def linear_table(spec: dict) -> LinearTable:
    """The table of :func:`inputs` ``spec``, from the code it names."""
    return _code(spec["code"])["table"](spec)


def inputs(parameters: dict, k_needed: float, code: str = CODE) -> dict:
    """Everything that determines the table (a JSON mapping: the cache key's content): the
    Boltzmann ``code`` (one of BOLTZMANN_KINDS) and its version, the cosmology ``parameters`` (pmpipe's
    Cosmology fields: Omega_m, Omega_b, h, n_s, w0, wa, T_cmb, N_eff, m_nu (left out when 0 or
    absent), neutrino_hierarchy (left out when degenerate or absent) and exactly one of sigma8,
    A_s), the code's settings (with a named hierarchy, also the mass-squared differences it
    splits m_nu by) and the k grid for wavenumbers up to ``k_needed`` (h/Mpc)."""
    norm = [name for name in ("sigma8", "A_s") if parameters.get(name) is not None]
    if len(norm) != 1:
        raise ValueError(f"exactly one of sigma8 and A_s must be given, got {norm or 'neither'}")
    fields: tuple[str, ...] = (
        "Omega_m",
        "Omega_b",
        "h",
        "n_s",
        "w0",
        "wa",
        "T_cmb",
        "N_eff",
        norm[0],
    )
    if parameters.get("m_nu", 0.0) > 0:
        fields += ("m_nu",)
    cosmology: dict = {name: float(parameters[name]) for name in fields}
    settings = dict(_code(code)["settings"])
    named = background.hierarchy(types.SimpleNamespace(**parameters))
    if named != background.HIERARCHIES[0] and parameters.get("m_nu", 0.0) > 0:
        cosmology["neutrino_hierarchy"] = named
        settings["neutrinos"] = f"3 massive species of the {named} ordering's masses"
        settings["mass_squared_differences"] = {
            "solar": background.DM2_SOLAR,
            "atmospheric": background.DM2_ATMOSPHERIC,
        }
    return {
        "code": code,
        "version": code_version(code),
        "cosmology": cosmology,
        "k_min": K_MIN,
        "k_max": table_k_max(k_needed),
        "points_per_decade": POINTS_PER_DECADE,
        "settings": settings,
    }


def camb_params(cosmology: dict, A_s: float, kmax_per_mpc: float, settings: dict = SETTINGS):
    """CAMB's parameters for pmpipe's cosmology (a mapping of its fields) at amplitude A_s:
    N_eff neutrino species, massless or (m_nu > 0) three massive ones of
    :func:`pmpipe.physics.theory.background.neutrino_masses`, flat, dark
    energy as CAMB's PPF fluid (w0, wa may cross -1), linear power at z = 0 up to
    ``kmax_per_mpc`` (1/Mpc), with the accuracy of ``settings``."""
    import camb

    h = cosmology["h"]
    m_nu = cosmology.get("m_nu", 0.0)
    cosmo = types.SimpleNamespace(**{**cosmology, "m_nu": m_nu})
    omega_cb = background.omega_cb(cosmo)
    params = camb.set_params(
        H0=100.0 * h,
        ombh2=cosmology["Omega_b"] * h**2,
        omch2=(omega_cb - cosmology["Omega_b"]) * h**2,
        mnu=m_nu,
        num_massive_neutrinos=background.NEUTRINO_SPECIES if m_nu > 0 else 0,
        nnu=cosmology["N_eff"],
        TCMB=cosmology["T_cmb"],
        omk=0.0,
        As=A_s,
        ns=cosmology["n_s"],
        pivot_scalar=settings["pivot_per_mpc"],
        w=cosmology["w0"],
        wa=cosmology["wa"],
        dark_energy_model="ppf",
        WantCls=False,
        WantTransfer=True,
        NonLinear=camb.model.NonLinear_none,
        kmax=kmax_per_mpc,
        redshifts=[0.0],
    )
    params.set_accuracy(AccuracyBoost=settings["accuracy_boost"])
    if m_nu > 0 and background.hierarchy(cosmo) != background.HIERARCHIES[0]:
        # three mass eigenstates (CAMB's own 'normal' and 'inverted' are one- or two-eigenstate
        # approximations) sharing the massive part of N_eff. CAMB finds each one's mass from
        # its density today, omnuh2 times its fraction: given the exact density of each, it
        # finds their masses also when the lightest is not yet non-relativistic
        species = background.NEUTRINO_SPECIES
        params.omnuh2 = float(background.omega_nu(cosmo)) * h**2
        params.nu_mass_eigenstates = species
        params.nu_mass_degeneracies = [
            background.massive_neutrino_number(cosmo) / species
        ] * species
        params.nu_mass_fractions = [float(f) for f in background.neutrino_density_shares(cosmo)]
        params.nu_mass_numbers = [1] * species
    return params


def camb_power(spec: dict) -> LinearTable:
    """The table :func:`inputs` describes, from one CAMB call (at the given A_s, or at
    A_S_REFERENCE rescaled to the given σ8); with massive neutrinos, the CAMB call also gives
    the transfer functions at the scale factors of SETTINGS' neutrino tables."""
    import camb

    cosmology, settings = spec["cosmology"], spec["settings"]
    k_max = spec["k_max"]
    A_s = cosmology.get("A_s", settings["A_s_reference"])
    kmax = max(
        k_max * cosmology["h"] * settings["transfer_margin"], settings["transfer_kmax_floor"]
    )
    points = table_wavenumbers(spec["k_min"], k_max, spec["points_per_decade"]).size
    massive = cosmology.get("m_nu", 0.0) > 0
    params = camb_params(cosmology, A_s, kmax, settings)
    if massive:
        grid = settings["neutrino_tables"]
        a = np.geomspace(grid["a_min"], 1.0, grid["points"])
        params.set_matter_power(redshifts=list(1.0 / a - 1.0), kmax=kmax)  # earliest first
    with CAMB_TURN:
        results = camb.get_results(params)
        power = {}
        for name in (settings["variable"], "delta_nonu") if massive else (settings["variable"],):
            k, z, p = results.get_matter_power_spectrum(
                minkh=spec["k_min"],
                maxkh=k_max,
                npoints=points,
                var1=name,
                var2=name,
                have_power_spectra=name == settings["variable"],
            )
            power[name] = np.asarray(p[list(z).index(0.0)], np.float64)
        sigma8 = float(results.get_sigma8_0())
        neutrinos, sigma8_cb = None, sigma8
        if massive:
            total, cb = (
                results.get_sigmaR(8.0, var1=name, var2=name)[-1]
                for name in (settings["variable"], "delta_nonu")
            )
            sigma8_cb = sigma8 * float(cb / total)
            neutrinos = _neutrino_transfer(results.get_matter_transfer_data(), a)
        del results  # its Fortran memory is freed in turn too
    p, p_cb = power[settings["variable"]], power.get("delta_nonu")
    if "sigma8" in cosmology:
        scale = (cosmology["sigma8"] / sigma8) ** 2
        p, A_s, sigma8 = p * scale, A_s * scale, cosmology["sigma8"]
        p_cb, sigma8_cb = None if p_cb is None else p_cb * scale, sigma8_cb * scale**0.5
    return LinearTable(
        np.asarray(k, np.float64),
        p,
        sigma8,
        float(A_s),
        CODE,
        version(),
        p if p_cb is None else p_cb,
        sigma8_cb,
        neutrinos,
    )


def _neutrino_transfer(transfer, a: np.ndarray) -> NeutrinoTransfer:
    """The :class:`NeutrinoTransfer` of CAMB's transfer data at the scale factors ``a``
    (ascending; CAMB's last redshift is a = 1)."""
    import camb

    data = transfer.transfer_data
    k = np.asarray(data[camb.model.Transfer_kh - 1, :, -1], np.float64)
    nu = np.asarray(data[camb.model.Transfer_nu - 1], np.float64).T  # (A, Q)
    cb = np.asarray(data[camb.model.Transfer_nonu - 1], np.float64).T
    return NeutrinoTransfer(np.asarray(a, np.float64), k, nu / cb, cb / cb[-1])
