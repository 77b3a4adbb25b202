"""pmpipe's log: one handler on stderr, the lines of one process, warnings from every process."""

import logging

import pytest

from pmpipe.runtime import log


def _record(level=logging.INFO, **extra):
    record = logging.LogRecord("pmpipe.x", level, __file__, 1, "message", None, None)
    record.__dict__.update(extra)
    return record


def test_the_filter_keeps_one_process_and_everyones_warnings():
    shown, other, every = log.ProcessFilter(0), log.ProcessFilter(1), log.ProcessFilter(1, None)
    assert shown.filter(_record()) and every.filter(_record())
    assert not other.filter(_record())
    assert other.filter(_record(**log.EVERY_PROCESS))
    assert other.filter(_record(logging.WARNING)) and other.filter(_record(logging.ERROR))


def test_the_process_shown_comes_from_the_environment():
    assert log.shown_process({}) == 0
    assert log.shown_process({log.PROCESS_VARIABLE: "3"}) == 3
    assert log.shown_process({log.PROCESS_VARIABLE: "all"}) is None
    with pytest.raises(ValueError, match=log.PROCESS_VARIABLE):
        log.shown_process({log.PROCESS_VARIABLE: "first"})


def test_configure_writes_bare_lines_to_the_current_stderr_once(capsys, monkeypatch):
    monkeypatch.delenv(log.PROCESS_VARIABLE, raising=False)
    first = log.configure(process=1)
    assert log.configure(process=1) is first
    logger = log.get("pmpipe.stages.runner")
    assert logger.name == "pmpipe.stages.runner" and log.get("bench").name == "pmpipe.bench"
    logger.info("[pmpipe ic run] hidden on process 1")
    logger.info("[pmpipe ic run] shown on every process", extra=log.EVERY_PROCESS)
    logger.error("error: shown")
    log.configure(process=0)
    logger.info("[pmpipe ic run] shown on process 0")
    err = capsys.readouterr().err
    assert err == (
        "[pmpipe ic run] shown on every process\nerror: shown\n[pmpipe ic run] shown on process 0\n"
    )
