"""The simulation domain: the particle grid and force mesh split over a device mesh. Checks that
need no JAX, made when a configuration is checked and again by the physics that relies on them."""

from __future__ import annotations


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
