"""Small arrays gathered before they are written, so that those of several draws can be stacked
along a leading dimension of one store."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import zarr

from pmpipe.storage import store


class Gathered:
    """Labelled numpy arrays by name, in the order given: :func:`pmpipe.storage.store.write_array`
    and ``write_coordinate`` without the group."""

    def __init__(self) -> None:
        self.arrays: dict[str, tuple] = {}

    def write_array(
        self, name: str, data, dims: tuple[str, ...], units: str, long_name: str, **attrs
    ):
        if name in self.arrays:
            raise ValueError(f"array {name} gathered twice")
        self.arrays[name] = (np.asarray(data), tuple(dims), units, long_name, attrs)

    def write_coordinate(self, name: str, values, units: str, long_name: str):
        self.write_array(name, np.asarray(values), (name,), units, long_name)


def write(
    group: zarr.Group,
    draws: list[Gathered],
    stacked: Callable[[str, tuple[str, ...]], bool] = lambda name, dims: False,
    dim: str = "draw",
) -> None:
    """Write the arrays of the first of ``draws``; those for which ``stacked(name, dims)``
    holds stacked over every draw along a leading dimension ``dim`` (each draw gathered the
    same names, in the same order)."""
    first = draws[0]
    for other in draws[1:]:
        if list(other.arrays) != list(first.arrays):
            raise ValueError("the draws gathered different arrays")
    for name, (data, dims, units, long_name, attrs) in first.arrays.items():
        if stacked(name, dims):
            data, dims = np.stack([d.arrays[name][0] for d in draws]), (dim, *dims)
        store.write_array(group, name, data, dims, units, long_name, **attrs)
