"""The halo a run's domains need: parallel.halo_cells, or for 'auto' the width that the run's
linear displacements call for (pmpipe.physics.mesh.domain.halo_for_displacement), largest over the
cosmologies given (a campaign's design, so that its runs share one compiled program per size).
Numpy estimates only: planning a campaign imports no JAX."""

from __future__ import annotations

import types
from collections.abc import Mapping, Sequence

import numpy as np

from pmpipe.physics.mesh import domain
from pmpipe.physics.theory import eisenstein_hu
from pmpipe.physics.theory.background import FIDUCIAL
from pmpipe.run import config


def auto_cells(run: config.Run, cosmologies: Sequence[Mapping] = ()) -> int:
    """The 'auto' halo of the run's box, particles, oversampling and a_final: the largest that
    any of ``cosmologies`` (cosmology sections as dicts; default the run's own) needs, from
    Eisenstein-Hu estimates of them all at once, normalised by sigma8 or A_s (power.kind
    'table' too; the fit's shape with massive neutrinos left out overestimates their
    displacements, on the safe side; w0 and wa are left out: a ΛCDM growth). ValueError naming
    parallel.halo_cells when no cosmology gives an estimate."""
    sections = list(cosmologies) or [run.cosmology.model_dump()]
    fields = ("Omega_m", "Omega_b", "h", "n_s", "T_cmb")
    values = {f: np.array([float(c[f]) for c in sections]) for f in fields}
    values["T_cmb"] = np.where(values["T_cmb"] > 0, values["T_cmb"], FIDUCIAL["T_cmb"])
    sigma8 = np.array([np.nan if c.get("sigma8") is None else c["sigma8"] for c in sections])
    A_s = np.array([np.nan if c.get("A_s") is None else c["A_s"] for c in sections])
    cosmo = types.SimpleNamespace(**values, sigma8=np.nan_to_num(sigma8))
    box, n, a = run.box.box_size, run.box.particles, run.nbody.a_final
    with np.errstate(all="ignore"):  # an invalid point is refused when its run is checked
        rms = eisenstein_hu.linear_rms_displacement(cosmo, box, n, a)
        if np.isnan(sigma8).any():  # normalised by A_s
            by_A_s = eisenstein_hu.linear_rms_displacement(cosmo, box, n, a, np.nan_to_num(A_s))
            rms = np.where(np.isnan(sigma8), by_A_s, rms)
    if not np.isfinite(rms).any():
        raise ValueError(
            "parallel.halo_cells 'auto': no linear displacement could be estimated for the "
            "cosmology given; set parallel.halo_cells to a number of force-mesh cells"
        )
    largest = float(np.max(rms, initial=0.0, where=np.isfinite(rms)))
    return domain.halo_for_displacement(largest, box / run.force_cells(), n)


def cells(run: config.Run) -> int:
    """The run's halo width in force-mesh cells (parallel.halo_cells resolved)."""
    given = run.parallel.halo_cells
    return auto_cells(run) if given == "auto" else given
