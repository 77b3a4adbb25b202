"""pmpipe's log: the records of the ``pmpipe`` logger (and its children, one per module) go to
stderr as their bare messages, progress lines included; a stage's or job's log (``stamped``)
starts every line with its ISO 8601 time.

In a run of several processes every process logs, and a filter keeps the lines of one process
(0 by default; the environment variable PMPIPE_LOG_PROCESS names another, or ``all``): a
record meant for every process says so with ``extra=EVERY_PROCESS``, and warnings and errors
come from every process.
"""

from __future__ import annotations

import datetime
import logging
import os
import sys

NAME = "pmpipe"
EVERY_PROCESS = {"every_process": True}  # ``extra`` of a record that every process writes
PROCESS_VARIABLE = "PMPIPE_LOG_PROCESS"
DEBUG_VARIABLE = "PMPIPE_DEBUG"  # set (not 0): errors show their traceback


class _Stamped(logging.Formatter):
    """'<ISO 8601 local time with its offset, to the second> <message>'."""

    def formatTime(self, record, datefmt=None):
        moment = datetime.datetime.fromtimestamp(record.created).astimezone()
        return moment.isoformat(timespec="seconds")


STAMPED = _Stamped("%(asctime)s %(message)s")
BARE = logging.Formatter("%(message)s")


def get(module: str) -> logging.Logger:
    """The logger of a pmpipe module (``__name__``), a child of the ``pmpipe`` logger."""
    return logging.getLogger(module if module.startswith(NAME) else f"{NAME}.{module}")


class ProcessFilter(logging.Filter):
    """Lets through every record of the process ``shown`` (None: of every process), and from
    the others their warnings, errors and the records marked EVERY_PROCESS."""

    def __init__(self, process: int = 0, shown: int | None = 0):
        super().__init__()
        self.process, self.shown = process, shown

    def filter(self, record: logging.LogRecord) -> bool:
        return (
            self.shown is None
            or self.process == self.shown
            or record.levelno >= logging.WARNING
            or getattr(record, "every_process", False)
        )


def shown_process(environ=None) -> int | None:
    """The process whose lines are all shown: PMPIPE_LOG_PROCESS (an index, or 'all': None),
    else 0."""
    value = (os.environ if environ is None else environ).get(PROCESS_VARIABLE, "0").strip()
    if value == "all":
        return None
    if not value.isdigit():
        raise ValueError(f"{PROCESS_VARIABLE} = {value!r}: give a process index or 'all'")
    return int(value)


def debug_requested(environ=None) -> bool:
    """Whether PMPIPE_DEBUG asks for tracebacks (set, and not empty or 0)."""
    return (os.environ if environ is None else environ).get(DEBUG_VARIABLE, "") not in ("", "0")


class _Current(logging.StreamHandler):
    """A handler that writes to sys.stderr or sys.stdout (``name``) of the moment (a
    redirected or captured one)."""

    def __init__(self, name: str):
        self.name_of_stream = name
        super().__init__()

    @property
    def stream(self):
        return getattr(sys, self.name_of_stream)

    @stream.setter
    def stream(self, _value):
        pass


def configure(
    process: int = 0, level: int = logging.INFO, stamped: bool = False
) -> logging.Handler:
    """Send the pmpipe logger's records of ``level`` and above to stderr, filtered for this
    process (:class:`ProcessFilter`, the process shown by :func:`shown_process`), as bare
    messages or, ``stamped`` (a stage's log), after their time. Calling it again (JAX
    started, the process index known) updates the one handler it installs."""
    logger = logging.getLogger(NAME)
    handler = next((h for h in logger.handlers if isinstance(h, _Current)), None)
    if handler is None:
        handler = _Current("stderr")
        handler.setFormatter(BARE)
        logger.addHandler(handler)
        logger.propagate = False
    handler.setFormatter(STAMPED if stamped else BARE)
    handler.filters = [ProcessFilter(process, shown_process())]
    logger.setLevel(level)
    return handler


def terminal() -> logging.Logger:
    """The logger ``pmpipe.terminal``: its records go to stdout, stamped, as well as to the
    pmpipe log: what a job whose stderr is its log file shows on the terminal it runs from."""
    logger = logging.getLogger(f"{NAME}.terminal")
    if not any(isinstance(h, _Current) for h in logger.handlers):
        handler = _Current("stdout")
        handler.setFormatter(STAMPED)
        logger.addHandler(handler)
    return logger
