"""Device decompositions chosen by measurement: ``pdims`` of a run from sweeps recorded per
machine kind.

A sweep (:func:`pmpipe.campaigns.tune.sweep`) times one PM step for every slab and pencil
decomposition of a device count that the particle grid and halo allow, on this machine. The
fastest is recorded in a small YAML file kept with the site settings (one device kind per
file), keyed by device count and force mesh. A campaign with a ``decomposition`` section takes
its pdims from that file (:func:`choose`): the sweep of its device count and force mesh, else
that of the nearest force mesh measured for its device count, else a guess (slabs where they
fit), and ``pmpipe plan`` says which.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import Field, model_validator

from pmpipe.physics.mesh import domain
from pmpipe.run import config


class Sweep(config.StrictModel):
    """One sweep: seconds of one PM step per decomposition, the fastest chosen."""

    devices: int = Field(ge=1, description="devices of the run, px * py")
    force_mesh: int = Field(ge=1, description="force-mesh cells per side, particles * oversample")
    pdims: tuple[int, int] = Field(description="the fastest decomposition (px, py)")
    step_seconds: dict[str, float] = Field(
        description="best time of one PM step per decomposition 'PXxPY', seconds"
    )
    measured: str = Field(description="date of the sweep, YYYY-MM-DD")
    jax: str = Field(description="JAX version of the sweep")

    @model_validator(mode="after")
    def _consistent(self):
        if self.pdims[0] * self.pdims[1] != self.devices:
            raise ValueError(f"pdims {list(self.pdims)} do not make {self.devices} devices")
        if label(self.pdims) not in self.step_seconds:
            raise ValueError(
                f"pdims {list(self.pdims)} is not among the decompositions timed "
                f"({', '.join(self.step_seconds)})"
            )
        for name in self.step_seconds:
            px, sep, py = name.partition("x")
            if not (sep and px.isdigit() and py.isdigit() and int(px) * int(py) == self.devices):
                raise ValueError(
                    f"step_seconds key {name!r}: write PXxPY with PX * PY = {self.devices}"
                )
        return self


class Decompositions(config.StrictModel):
    """A decomposition file: the sweeps of one device kind."""

    device_kind: str = Field(description="jax.devices()[0].device_kind of the machine measured")
    sweeps: list[Sweep] = Field(default_factory=list)


def label(pdims: tuple[int, int]) -> str:
    """'PXxPY', the name of a decomposition in a file."""
    return f"{pdims[0]}x{pdims[1]}"


def candidates(devices: int, particles: int, oversample: int, halo: int) -> list[tuple[int, int]]:
    """Every (px, py) with px * py = devices that splits the particle grid and the force mesh
    evenly and leaves room for the halo: slabs (devices, 1) and (1, devices) and pencils."""
    out = []
    for px in range(1, devices + 1):
        py = devices // px
        if px * py != devices or particles % px or particles % py:
            continue
        try:
            domain.check_halo_fits(particles * oversample, (px, py), halo)
        except ValueError:
            continue
        out.append((px, py))
    return out


def guess(options: list[tuple[int, int]]) -> tuple[int, int]:
    """Without a sweep: slabs over x (one transpose per FFT) where they fit, else the most
    square pencil."""
    slab = [p for p in options if p[1] == 1]
    return slab[0] if slab else min(options, key=lambda p: abs(p[0] - p[1]))


def load(path: str | Path) -> Decompositions:
    """A decomposition file, validated; ConfigError naming the file and field."""
    return config.validate(Decompositions, config.read_mapping(path), path)


def choose(
    devices: int, particles: int, oversample: int, halo: int, path: str | Path | None
) -> tuple[tuple[int, int], str]:
    """pdims for a run and how they were chosen: 'recorded' (a sweep of this device count and
    force mesh in the file at ``path``), 'nearest' (the sweep of the nearest force mesh measured for this
    device count, when its pdims fit), else 'guessed' (:func:`guess`; also without a file). ValueError when no
    decomposition fits."""
    options = candidates(devices, particles, oversample, halo)
    if not options:
        raise ValueError(
            f"no decomposition of {devices} devices splits {particles} particles "
            f"per side with parallel.halo_cells = {halo}: choose a device count "
            f"that divides the particle grid"
        )
    mesh = particles * oversample
    recorded = load(path).sweeps if path and Path(path).exists() else []
    sweeps = [s for s in recorded if s.devices == devices]
    for sweep in sorted(sweeps, key=lambda s: abs(s.force_mesh - mesh)):
        if tuple(sweep.pdims) in options:
            return sweep.pdims, "recorded" if sweep.force_mesh == mesh else "nearest"
    return guess(options), "guessed"


def record(path: str | Path, device_kind: str, new: Sweep) -> Decompositions:
    """Add (or replace) ``new`` in the file at ``path`` (made if missing) and write it back;
    ConfigError when the file holds another device kind's sweeps."""
    path = Path(path)
    table = load(path) if path.exists() else Decompositions(device_kind=device_kind)
    if table.device_kind != device_kind:
        raise config.ConfigError(
            f"{path}: holds sweeps of {table.device_kind!r}, this machine "
            f"is {device_kind!r}; keep one file per machine kind (site)"
        )
    kept = [s for s in table.sweeps if (s.devices, s.force_mesh) != (new.devices, new.force_mesh)]
    table = Decompositions(
        device_kind=device_kind,
        sweeps=sorted([*kept, new], key=lambda s: (s.devices, s.force_mesh)),
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(table.model_dump(mode="json"), sort_keys=False))
    return table
