"""Lightcone geometry on the host (numpy, no JAX): the planes' edges and crossing times, and
the sizes of the HEALPix grids of full-sky maps and of the rays their shells are sampled on.
Used by the lightcone's capture (:mod:`pmpipe.physics.evolution.lightcone`) and by the checks and estimates made
before JAX starts."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np

PLANE_BUCKET = 8  # plane arrays are padded to a multiple of this: runs whose cosmologies give
# a few planes more or less still share one compiled evolution


@dataclasses.dataclass(frozen=True)
class Planes:
    """Plane geometry: edges (P + 1,) and centres (P,) in Mpc/h, crossing scale factors a (P,),
    ordered from the observer outwards."""

    chi_edges: np.ndarray
    chi: np.ndarray
    a: np.ndarray

    def __len__(self) -> int:
        return self.chi.size


def planes(chi_max: float, thickness: float, scale_factor_at: Callable) -> Planes:
    """Planes of ``thickness`` Mpc/h from χ = 0 until the first edge at or beyond ``chi_max``,
    crossed at the scale factors ``scale_factor_at`` (a callable of a numpy χ) gives at their
    centres."""
    n = max(1, math.ceil(chi_max / thickness - 1e-9))
    edges = np.arange(n + 1) * thickness
    centres = 0.5 * (edges[1:] + edges[:-1])
    return Planes(edges, centres, np.asarray(scale_factor_at(centres), np.float64))


def shell_k_max(particles: int, mesh_n: int, box_size: float) -> float:
    """Band limit (h/Mpc) the mesh sets for the full-sky shells: the particle grid's Nyquist
    frequency, at most half the mesh's."""
    return math.pi / box_size * min(particles, mesh_n / 2)


SHELL_GATHER_CELLS = 512**3  # up to this force mesh (cells), the shells of a run on several
# devices are sampled from the density gathered whole on each (0.5 GiB in float32, 1 in float64)


def shell_gathers(mesh_n: int, rays: int, devices: int) -> bool:
    """Whether the full-sky shells of a force mesh of ``mesh_n`` cells per side, sampled along
    ``rays`` rays on ``devices`` devices, are sampled from the band-limited density gathered on
    every device, each sampling its share of the rays (one field-sized all-gather per plane;
    when the rays divide by the devices), rather than by each device sampling every ray in its
    own block."""
    return devices > 1 and rays % devices == 0 and mesh_n**3 <= SHELL_GATHER_CELLS


RAYS_PER_PIXEL_SIDE = 4  # full-sky shells are sampled on a HEALPix grid of 4 nside (16 rays a
# pixel): the grid shell_band_limits was measured with


def rays_nside(nside: int) -> int:
    """The HEALPix grid along whose rays the shells of full-sky maps of ``nside`` are sampled."""
    return nside * RAYS_PER_PIXEL_SIDE


TRACED_RAYS_PER_PIXEL_SIDE = 2  # full-sky ray tracing follows rays on a HEALPix grid of 2 nside
# (4 rays a pixel): the analysis of their maps is accurate to the band limit 3 nside - 1 there


def traced_rays_nside(nside: int) -> int:
    """The HEALPix grid of the rays that full-sky ray tracing follows for maps of ``nside``."""
    return nside * TRACED_RAYS_PER_PIXEL_SIDE


def healpix_pixels(nside: int) -> int:
    """Pixels of a HEALPix map of ``nside``: 12 nside²."""
    return 12 * nside * nside


def shell_band_limits(chi_hi, k_mesh: float, nside_rays: int) -> np.ndarray:
    """Band limit (h/Mpc) of each shell's density, shells ending at chi_hi (P,) Mpc/h: at most
    k_mesh (:func:`shell_k_max`), and at most 3 nside_rays / χ_hi, so that no multipole above
    about 3 nside_rays reaches the rays of a HEALPix grid of nside_rays, where point sampling
    would alias it onto large angles. With rays at RAYS_PER_PIXEL_SIDE nside = 4 nside, the
    shell's multipoles up to 3 nside - 1 are within 1.4 % of an alias-free sampling
    (tests/test_lensing.py; measured on a Gaussian field at 1150 and 2180 Mpc/h: at
    6 nside_rays / χ_hi aliasing adds 5-65 %, at 2 nside_rays / χ_hi the cut takes the shell's
    radial modes and the low multipoles lose up to 7 %)."""
    chi_hi = np.asarray(chi_hi, np.float64)
    return np.minimum(k_mesh, 3.0 * nside_rays / np.maximum(chi_hi, 1e-30))


def healpix_ell_max(nside: int) -> int:
    """Band limit of pmpipe's full-sky maps of ``nside``: the highest multipole of their
    harmonic coefficients, 3 nside - 1."""
    return 3 * nside - 1


def pixel_arcmin(nside: int) -> float:
    """Side of a HEALPix pixel of ``nside`` in arcmin: the square root of its area."""
    return math.degrees(math.sqrt(4 * math.pi / healpix_pixels(nside))) * 60


def flat_multipoles(field_of_view: float, pixels: int) -> tuple[float, float]:
    """Multipoles a flat map of ``pixels`` per side over ``field_of_view`` degrees holds: its
    fundamental 2π / field of view to its Nyquist multipole π pixels / field of view."""
    fov = math.radians(field_of_view)
    return 2 * math.pi / fov, math.pi * pixels / fov


def healpix_multipoles(nside: int) -> tuple[float, float]:
    """Multipoles a full-sky map of ``nside`` holds as C_ℓ bin edges: 2 to its band limit
    :func:`healpix_ell_max`, inclusive."""
    return 2.0, float(healpix_ell_max(nside) + 1)


def clipped_multipoles(held: tuple[float, float], chosen: tuple[float, float] | None):
    """The part of ``held`` (a map's multipoles) inside ``chosen`` (summaries.ell_range; None:
    all); ValueError naming summaries.ell_range when they do not overlap."""
    if chosen is None:
        return held
    low, high = max(held[0], chosen[0]), min(held[1], chosen[1])
    if not low < high:
        raise ValueError(
            f"summaries.ell_range = {list(chosen)} lies outside the multipoles "
            f"{held[0]:.0f} to {held[1]:.0f} a map of the run holds: choose a range that "
            "overlaps them, or null for all"
        )
    return low, high
