"""The simulation domain: the particle grid and force mesh split over a device mesh
(:class:`Grid`), and the checks of that split, which need no JAX: made when a configuration is
checked and again by the physics that relies on them."""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from jax.sharding import Mesh


def check_divisible(n: int, pdims: tuple[int, int], field: str = "box.particles") -> None:
    """Raise when an n-per-side grid cannot be split evenly over pdims."""
    px, py = pdims
    if n % px or n % py:
        raise ValueError(
            f"{field} = {n} is not divisible by parallel.pdims = ({px}, {py}); "
            f"choose a grid size that is a multiple of both {px} and {py}"
        )


def check_halo_fits(mesh_n: int, pdims: tuple[int, int], halo: int) -> None:
    """Reject a halo outside 1 .. block width along a split axis (before any work starts)."""
    for p, name in zip(pdims, ("x", "y")):
        if p > 1 and not 0 < halo <= mesh_n // p:
            raise ValueError(
                f"parallel.halo_cells = {halo} must be between 1 and the block width "
                f"{mesh_n // p} cells along {name} (mesh {mesh_n} over {p} devices)"
            )


# The largest excursion of any particle beyond its block grows with N like the largest of N^3
# Gaussian values, sqrt(2 ln N^3) times the linear rms displacement of one component
# (eisenstein_hu.linear_rms_displacement); the halo allows HALO_MARGIN times that
# (tests/test_halo.py: runs of 32^3 and 64^3 particles, boxes 128-512 Mpc/h, B = 1 and 2).
HALO_MARGIN = 1.1


def halo_for_displacement(rms: float, cell_size: float, particles: int) -> int:
    """Force-mesh cells of halo that particles displaced by ``rms`` (Mpc/h, one component,
    linear) need on a mesh of ``cell_size`` (Mpc/h): HALO_MARGIN sqrt(2 ln N^3) rms, plus the
    cell CIC paints into."""
    extreme = HALO_MARGIN * math.sqrt(2 * math.log(particles**3)) * rms
    return math.ceil(extreme / cell_size) + 1


@dataclasses.dataclass(frozen=True)
class Grid:
    """The discretisation of a simulation, frozen and hashable, so that a compiled program takes
    it as one static argument: the device mesh the fields are split over (jax.sharding.Mesh,
    axes ('x', 'y')), particles per side N on the Lagrangian grid, force-mesh oversampling B
    (the force mesh has B N cells per side), the periodic box's side in Mpc/h, the halo width in
    force-mesh cells, and the float dtype of the particles and fields."""

    mesh: Mesh
    particles: int
    oversample: int = 1
    box_size: float = 256.0
    halo: int = 4
    dtype: str = "float32"

    @property
    def force_cells(self) -> int:
        """Force-mesh cells per side, B N."""
        return self.particles * self.oversample

    @property
    def cell_size(self) -> float:
        """Side of a force-mesh cell in Mpc/h."""
        return self.box_size / self.force_cells
