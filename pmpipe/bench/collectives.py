"""Bytes that one PM step hands to collectives: read off a compiled program, and modelled for
slab and pencil decompositions.

Model, per device and step, force mesh M³ over pdims (px, py) = D devices, halo h cells,
blocks bx = M/px by by = M/py (float32 fields, complex64 modes):
- FFT: the step's four distributed transforms (one forward of the density, three inverse for
  the force components) each transpose their block M³/D of complex64 modes once on slabs and
  twice on pencils (one all-to-all within each split axis' group). An all-to-all keeps the
  part of its operand addressed to its own device: (g - 1)/g of it leaves over a group of g.
- halo: painting folds two halo slabs onto the neighbours along each split axis (along x
  h·(by + 2h)·M cells when y is split too, then along y h·bx·M); reading fills two halo slabs
  along each split axis for each of the three force components (along x h·by·M, then along y
  h·(bx + 2h)·M when x is split). Every cell of a halo slab leaves its device.
"""

from __future__ import annotations

import re

import numpy as np

FLOAT_BYTES, COMPLEX_BYTES = 4, 8
TRANSFORMS_PER_STEP = 4  # r2c of the density, c2r of the three force components
FORCE_COMPONENTS = 3

KINDS = (
    "all-to-all",
    "collective-permute",
    "all-reduce",
    "all-gather",
    "reduce-scatter",
    "collective-broadcast",
)
_COLLECTIVE = re.compile(r"= (.*?) (" + "|".join(KINDS) + r")(?:-start)?\(")
_ARRAY = re.compile(r"([a-z]+)(\d*)\[([\d,]*)\]")


def _element_bytes(kind: str, bits: str) -> int:
    """Bytes of one element of an HLO type: f32 4, c64 8, pred 1 (token: 0)."""
    return 1 if kind == "pred" else int(bits or 0) // 8


def in_program(hlo_text: str) -> list[tuple[str, int, int]]:
    """(kind, elements, bytes) of every collective in an HLO module's text (a compiled
    program's ``as_text()``); a tuple-shaped collective counts all its parts."""
    out = []
    for line in hlo_text.splitlines():
        match = _COLLECTIVE.search(line)
        if not match:
            continue
        elements = nbytes = 0
        for kind, bits, dims in _ARRAY.findall(match.group(1)):
            count = int(np.prod([int(d) for d in dims.split(",") if d]))
            elements += count
            nbytes += count * _element_bytes(kind, bits)
        out.append((match.group(2), elements, nbytes))
    return out


def program_text(compiled) -> str:
    """The HLO text of a compiled program (jax.stages.Compiled); RuntimeError when XLA keeps
    none."""
    text = compiled.as_text()
    if text is None:
        raise RuntimeError("XLA gives no text of the compiled program")
    return text


def bytes_by_kind(hlo_text: str) -> dict[str, int]:
    """Operand bytes of a program's collectives summed per kind (kinds present only)."""
    total: dict[str, int] = {}
    for kind, _, nbytes in in_program(hlo_text):
        total[kind] = total.get(kind, 0) + nbytes
    return total


def transposes(pdims: tuple[int, int]) -> list[int]:
    """Group sizes of the all-to-alls of one distributed FFT: none on one device, one over all
    devices on slabs, one within each split axis on pencils."""
    split = [p for p in pdims if p > 1]
    return [int(np.prod(split))] if len(split) == 1 else split


def halo_cells(force_mesh: int, pdims: tuple[int, int], halo: int) -> tuple[int, int]:
    """Cells of the halo slabs one device sends in a step: (painting, reading)."""
    px, py = pdims
    bx, by, m = force_mesh // px, force_mesh // py, force_mesh
    paint = read = 0
    if px > 1:
        paint += 2 * halo * (by + 2 * halo * (py > 1)) * m
        read += 2 * halo * by * m
    if py > 1:
        paint += 2 * halo * bx * m
        read += 2 * halo * (bx + 2 * halo * (px > 1)) * m
    return paint, FORCE_COMPONENTS * read


def bytes_per_step(force_mesh: int, pdims: tuple[int, int], halo: int) -> dict[str, int]:
    """Bytes one device hands to collectives in one PM step (the module's model): ``fft``
    (all-to-all operands), ``halo`` (collective-permute operands) and the parts of each that
    leave the device, ``fft_sent`` and ``halo_sent``."""
    block = force_mesh**3 // (pdims[0] * pdims[1]) * COMPLEX_BYTES
    groups = transposes(pdims)
    halo_bytes = sum(halo_cells(force_mesh, pdims, halo)) * FLOAT_BYTES
    return {
        "fft": TRANSFORMS_PER_STEP * block * len(groups),
        "fft_sent": round(TRANSFORMS_PER_STEP * block * sum((g - 1) / g for g in groups)),
        "halo": halo_bytes,
        "halo_sent": halo_bytes,
    }
