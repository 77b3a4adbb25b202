"""JAX profiler traces of a compiled program and the time its operations take, by category.

A trace (``jax.profiler.trace`` with a Perfetto file) records every operation that XLA runs,
named by its instruction in the compiled program (on GPUs, the ``hlo_op`` of each kernel).
Each instruction falls in one category: ``collectives`` and ``fft`` by its operation, else by
the function it was traced in (its JAX name stack): ``fft`` (jaxdecomp's distributed
transform), ``painting`` (``painting.paint``), ``reading`` (``painting.read``), else
``other``. Control flow (loops, calls) is left out; the instructions of its bodies are
counted. Events of copies between host and device, named by the runtime rather than the
program, make ``host transfers``."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

from pmpipe.bench import collectives

CATEGORIES = ("fft", "collectives", "painting", "reading", "host transfers", "other")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = .*? ([a-z][a-z\-]*)\(")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_CONTROL = {"while", "conditional", "call", "async-start", "async-done"}
# where an instruction comes from, by the jitted functions in its JAX name stack
_ORIGINS = (
    ("fft", re.compile(r"jit\(_?(do_)?pi?fft(_impl)?\)")),  # jaxdecomp's transforms
    ("painting", re.compile(r"jit\(paint\)")),
    ("reading", re.compile(r"jit\(read\)")),
)
_HOST = re.compile(
    r"memcpy|transfer(to|from)device|htod|dtoh|d2h|h2d|host-to-device|"
    r"device-to-host",
    re.IGNORECASE,
)


def _opcode(opcode: str) -> str:
    return opcode.removesuffix("-start").removesuffix("-done")


def categories(hlo_text: str) -> dict[str, str]:
    """Category of every instruction of a compiled program (its ``as_text()``) by name: its
    operation for collectives and FFTs, else the pmpipe or jaxdecomp function it was traced in
    (its metadata's name stack: ``paint``, ``read``, jaxdecomp's distributed FFT)."""
    out = {}
    for line in hlo_text.splitlines():
        match = _INSTRUCTION.match(line)
        if not match or match.group(2) in _CONTROL:
            continue
        name, opcode = match.group(1), _opcode(match.group(2))
        origin = _OP_NAME.search(line)
        stack = origin.group(1) if origin else ""
        if opcode in collectives.KINDS:
            out[name] = "collectives"
        elif opcode == "fft":
            out[name] = "fft"
        else:
            out[name] = next((c for c, pattern in _ORIGINS if pattern.search(stack)), "other")
    return out


def perfetto_file(folder: str | Path) -> Path:
    """The newest ``perfetto_trace.json.gz`` that jax.profiler wrote under ``folder``."""
    found = sorted(Path(folder).glob("plugins/profile/*/perfetto_trace.json.gz"))
    if not found:
        raise FileNotFoundError(
            f"{folder}: no plugins/profile/*/perfetto_trace.json.gz (a trace "
            f"written with create_perfetto_trace=True)"
        )
    return found[-1]


def summarise(trace_path: str | Path, hlo_text: str, steps: int, devices: int) -> dict:
    """Seconds per step and device in each category, and the count of each kind of collective
    per step and device, from a Perfetto trace of ``steps`` runs of the program ``hlo_text`` on
    ``devices`` devices of this process. Operations are the events named by an instruction;
    where none is (a trace of kernels only), the kernels' ``hlo_op``."""
    with gzip.open(trace_path, "rt") as fh:
        trace = json.load(fh)
    events = [
        e
        for e in (trace["traceEvents"] if isinstance(trace, dict) else trace)
        if e.get("ph") == "X"
    ]
    kinds = categories(hlo_text)
    opcode_of = {
        m.group(1): m.group(2) for m in map(_INSTRUCTION.match, hlo_text.splitlines()) if m
    }
    named = any(e.get("name") in kinds for e in events)
    seconds = dict.fromkeys(CATEGORIES, 0.0)
    counts: dict[str, int] = {}
    for event in events:
        name = event.get("name", "") if named else (event.get("args") or {}).get("hlo_op")
        if name in kinds:
            category, opcode = kinds[name], opcode_of[name]
            if _opcode(opcode) in collectives.KINDS and not opcode.endswith("-done"):
                counts[_opcode(opcode)] = counts.get(_opcode(opcode), 0) + 1
        elif _HOST.search(event.get("name", "")):
            category = "host transfers"
        else:
            continue
        seconds[category] += event.get("dur", 0.0) * 1e-6
    per = steps * devices
    return {
        "seconds_per_step": {k: v / per for k, v in seconds.items()},
        "collectives_per_step": {k: v / per for k, v in sorted(counts.items())},
    }
