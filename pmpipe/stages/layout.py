"""Array layouts that more than one stage writes (docs/outputs.md)."""

from __future__ import annotations

import numpy as np
import zarr

from pmpipe.storage import store


def write_lagrangian_coordinates(group: zarr.Group, n: int, box_size: float) -> None:
    """Coordinates qx, qy, qz (Lagrangian positions i L/N, Mpc/h) and component ('x', 'y', 'z')."""
    for axis in "xyz":
        store.write_coordinate(
            group,
            f"q{axis}",
            np.arange(n) * (box_size / n),
            "Mpc/h",
            f"Lagrangian {axis} of the particles",
        )
    store.write_coordinate(group, "component", np.array(["x", "y", "z"]), "1", "vector component")


def write_particles(group: zarr.Group, disp, mom, a: float) -> None:
    """Particle displacement and momentum (qx, qy, qz, component) at scale factor a."""
    dims = ("qx", "qy", "qz", "component")
    store.write_array(
        group,
        "displacement",
        disp,
        dims,
        "Mpc/h",
        "comoving displacement x - q of each particle from its Lagrangian position",
        a=float(a),
    )
    store.write_array(
        group,
        "momentum",
        mom,
        dims,
        "Mpc/h",
        "canonical momentum a^2 dx/dt / H0 of each particle",
        a=float(a),
    )


def write_draw_axis(group: zarr.Group, draws: list[dict]) -> None:
    """The draws of lensing.draws (pmpipe.run.draws.filled_points, in draw order):
    coordinates ``draw`` (0, 1, ...) and ``draw_parameter`` (the drawn parameters' names), and
    ``draw_values`` (draw, draw_parameter), NaN where a listed draw leaves out a parameter
    named for every source and the sources' values differ."""
    names = list(dict.fromkeys(name for values in draws for name in values))
    store.write_coordinate(group, "draw", np.arange(len(draws)), "1", "draw of the nuisances")
    store.write_coordinate(
        group, "draw_parameter", np.array(names), "1", "drawn parameter (lensing.draws)"
    )
    store.write_array(
        group,
        "draw_values",
        np.array(
            [[np.nan if values[n] is None else values[n] for n in names] for values in draws],
            np.float64,
        ),
        ("draw", "draw_parameter"),
        "1",
        "value of each drawn parameter in the draw (NaN: the sources differ in it)",
    )
