"""How many XLA programs a piece of code compiles, counted with JAX's own monitoring events.

JAX reports every program that reaches XLA (compiled, or loaded from the persistent
compilation cache) and every persistent-cache hit and write. One process-wide listener, added
on first use (JAX cannot unregister listeners in every version), keeps running totals; a
:class:`CompileCounter` reports what happened between its start and stop::

    with compilation.CompileCounter() as counter:
        run()
    counter.counts.compiled  # programs XLA compiled (not loaded from the persistent cache)

Programs served by JAX's in-memory caches (the same function on the same shapes again) reach
XLA no more and are not counted.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Self

BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"
CACHE_WRITE_EVENT = "/jax/compilation_cache/cache_misses"  # JAX's name: sent when it writes


@dataclasses.dataclass(frozen=True)
class Counts:
    """Programs that reached XLA, persistent-cache hits among them, programs compiled and
    written to the persistent cache (JAX's 'cache_misses'), seconds spent compiling or loading
    them, the names of all of them and of those XLA compiled, in order."""

    programs: int = 0
    hits: int = 0
    misses: int = 0
    seconds: float = 0.0
    names: tuple[str, ...] = ()
    compiled_names: tuple[str, ...] = ()

    @property
    def compiled(self) -> int:
        """Programs XLA compiled (the others came from the persistent cache)."""
        return self.programs - self.hits

    def __sub__(self, before: Counts) -> Counts:
        return Counts(
            self.programs - before.programs,
            self.hits - before.hits,
            self.misses - before.misses,
            self.seconds - before.seconds,
            self.names[len(before.names) :],
            self.compiled_names[len(before.compiled_names) :],
        )

    def summary(self) -> str:
        """One line: 'N programs: C compiled (W written to the cache), H from the cache, S s'."""
        return (
            f"{self.programs} programs: {self.compiled} compiled ({self.misses} written to "
            f"the persistent cache), {self.hits} from the persistent cache, "
            f"{self.seconds:.2f} s"
        )


class _Totals:
    """Running totals of this process, fed by the listeners registered in :func:`listen`. JAX
    sends a program's cache hit before its compile duration, on the compiling thread."""

    def __init__(self):
        self.lock = threading.Lock()
        self.counts = Counts()
        self.thread = threading.local()  # hit: the program being compiled came from the cache

    def on_event(self, event: str, **kwargs) -> None:
        if event == CACHE_HIT_EVENT:
            self.thread.hit = True
            self._add(hits=1)
        elif event == CACHE_WRITE_EVENT:
            self._add(misses=1)

    def on_duration(self, event: str, duration_secs: float, **kwargs) -> None:
        if event == BACKEND_COMPILE_EVENT:
            name = str(kwargs.get("fun_name", "?"))
            hit, self.thread.hit = getattr(self.thread, "hit", False), False
            self._add(
                programs=1,
                seconds=duration_secs,
                names=(name,),
                compiled_names=() if hit else (name,),
            )

    def _add(self, **more) -> None:
        """Add ``more`` (Counts' fields) to the process's totals and the calling thread's."""
        with self.lock:
            self.counts = _added(self.counts, **more)
        self.thread.counts = _added(getattr(self.thread, "counts", Counts()), **more)


def _added(c: Counts, programs=0, hits=0, misses=0, seconds=0.0, names=(), compiled_names=()):
    return Counts(
        c.programs + programs,
        c.hits + hits,
        c.misses + misses,
        c.seconds + seconds,
        c.names + names,
        c.compiled_names + compiled_names,
    )


_TOTALS = _Totals()
_REGISTERED: list[bool] = []
_REGISTER_LOCK = threading.Lock()


def listen() -> None:
    """Register the process-wide listeners (once; later calls do nothing)."""
    with _REGISTER_LOCK:
        if _REGISTERED:
            return
        from jax import monitoring

        monitoring.register_event_listener(_TOTALS.on_event)
        monitoring.register_event_duration_secs_listener(_TOTALS.on_duration)
        _REGISTERED.append(True)


def totals() -> Counts:
    """Everything counted in this process since :func:`listen` was first called."""
    return _TOTALS.counts


def thread_totals() -> Counts:
    """What the calling thread compiled since :func:`listen` was first called (JAX compiles a
    program on the thread that first calls it)."""
    return getattr(_TOTALS.thread, "counts", Counts())


class CompileCounter:
    """Counts of the programs compiled between :meth:`start` and :meth:`stop` (or inside a
    ``with`` block); ``counts`` is live while counting, fixed after stopping."""

    def __init__(self) -> None:
        self._start: Counts | None = None
        self._end: Counts | None = None

    def start(self) -> Self:
        listen()
        self._start, self._end = totals(), None
        return self

    def stop(self) -> Counts:
        self._end = totals()
        return self.counts

    @property
    def counts(self) -> Counts:
        if self._start is None:
            raise RuntimeError("CompileCounter.counts before start()")
        return (totals() if self._end is None else self._end) - self._start

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
