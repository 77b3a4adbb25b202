"""What the lensing stage makes maps of in its passes over the lightcone planes: the plane
weights of every map (one row per source; with lensing.draws per draw and source), their
layout, and the baryons' filters of the planes, one per draw (one for all unless lensing.draws
draws log_T_AGN): one pass per distinct filter, all rows at once. And the filters themselves,
applied to flat planes and to full-sky shells."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from pmpipe.physics.theory import baryons
from pmpipe.run.setup_parts import BaryonsSetup
from pmpipe.storage import store


class Pass(NamedTuple):
    """The plane ``weights`` (R, P) of every map, laid out as ``shape`` (S,) (or (D, S)), and
    the baryons' ``suppressions``: one per draw, or one for every map (None without
    baryons)."""

    weights: np.ndarray
    suppressions: tuple[baryons.Suppression | None, ...]
    shape: tuple[int, ...]

    def dims(self) -> tuple[str, ...]:
        """The maps' leading dimensions: ('source',) or ('draw', 'source')."""
        return ("draw", "source")[-len(self.shape) :]

    def leading(self, row: int) -> tuple[int, ...]:
        """The index of a row's map in that layout."""
        return tuple(int(i) for i in np.unravel_index(row, self.shape))

    def laid_out(self, rows):
        """Maps (R, ...) as (*shape, ...)."""
        return rows.reshape(*self.shape, *rows.shape[1:])

    def groups(self) -> list[tuple[np.ndarray, baryons.Suppression | None]]:
        """The rows (increasing) that each distinct suppression filters, with it."""
        per_entry = self.weights.shape[0] // len(self.suppressions)
        found: dict[int, tuple[baryons.Suppression | None, list[int]]] = {}
        for i, suppression in enumerate(self.suppressions):
            rows = found.setdefault(id(suppression), (suppression, []))[1]
            rows.extend(range(i * per_entry, (i + 1) * per_entry))
        return [(np.array(rows), suppression) for suppression, rows in found.values()]

    def in_row_order(self, rows: list[np.ndarray], parts: list):
        """The maps of every group (``parts``, each (r_g, ...), for the groups' ``rows``) as
        one array (R, ...) in row order."""
        if len(parts) == 1:
            return parts[0]
        import jax.numpy as jnp

        inverse = np.argsort(np.concatenate(rows))
        stacked = (
            np.concatenate(parts) if isinstance(parts[0], np.ndarray) else jnp.concatenate(parts)
        )
        return stacked[inverse]


def write_suppressions(group, by: Pass, feedback: BaryonsSetup) -> None:
    """The baryons' S(k, z) table (per draw when lensing.draws draws log_T_AGN) and the
    section's parameters (``feedback``; root attribute ``baryons``; the draws' values are in
    ``draw_values``)."""
    first = by.suppressions[0]
    assert first is not None  # the run has baryons
    store.write_coordinate(group, "k_baryons", first.k, "h/Mpc", "wavenumber of S(k, z)")
    store.write_coordinate(group, "z_baryons", first.z, "1", "redshift of S(k, z)")
    per_draw = feedback.per_draw  # the draws' values in draw_values
    ratio = (
        np.stack([s.ratio for s in by.suppressions if s is not None]) if per_draw else first.ratio
    )
    store.write_array(
        group,
        "baryon_suppression",
        ratio,
        (*(("draw",) if per_draw else ()), "z_baryons", "k_baryons"),
        "1",
        "S(k, z): the matter power with baryonic feedback over the gravity-only power "
        "(the planes are filtered by its square root)",
    )
    group.attrs["baryons"] = feedback.parameters


def filtered_planes(planes: list, suppression, z, box_size: float) -> list:
    """The planes (callables returning each one's projected overdensity) filtered by
    sqrt(S(k⊥, z_i)) at their redshifts z (without baryons, ``suppression`` None: as they
    are)."""
    if suppression is None:
        return planes

    def filtered(plane, z_i):
        values = plane()
        kernel = baryons.plane_kernel(suppression, values.shape[0], box_size, z_i)
        return baryons.filter_plane(values, kernel)

    return [lambda p=p, z_i=z_i: filtered(p, z_i) for p, z_i in zip(planes, z)]


def filtered_shells(shells, suppression: baryons.Suppression | None, nb) -> np.ndarray:
    """The shells' coefficients (P, alm) filtered by sqrt(S((ℓ + 1/2)/χ_i, z_i)) (as they
    are without baryons)."""
    if suppression is None:
        return shells
    import healpy

    chi = np.asarray(nb["plane"][:], np.float64)
    z = 1.0 / np.asarray(nb["plane_a"][:], np.float64) - 1.0
    ell_max = healpy.Alm.getlmax(shells.shape[1])
    return np.stack(
        [
            healpy.almxfl(shell, baryons.shell_kernel(suppression, ell_max, c, z_i))
            for shell, c, z_i in zip(shells, chi, z)
        ]
    )
