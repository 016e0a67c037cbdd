"""The connector's failed loads and saves are logged, at most once per reason per interval,
with how many were left unlogged; a load that fails through the daemon being killed is logged
with its reason by the worker (tests/server covers the daemon path end to end)."""

from __future__ import annotations

import logging

import pytest

from connector.failure_log import FailureLog


def test_one_line_per_reason_per_interval_with_the_count_of_the_quiet_ones(
        caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    flog = FailureLog(logging.getLogger("kvstore.test"), interval_s=60, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, "kvstore.test"):
        flog.failed("load", "error", 3, ConnectionError("daemon gone"))
        for _ in range(5):
            flog.failed("load", "error", 1, ConnectionError("daemon gone"))
        flog.failed("load", "timeout", 2)
        flog.failed("save", "error", 4, RuntimeError("closed"))
        now[0] = 61.0
        flog.failed("load", "error", 2, ConnectionError("back?"))
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "kvstore load of 3 block(s) failed (reason error): ConnectionError: daemon gone; "
        "they are recomputed",
        "kvstore load of 2 block(s) failed (reason timeout); they are recomputed",
        "kvstore save of 4 block(s) failed (reason error): RuntimeError: closed; they are not "
        "stored (a later miss)",
        "kvstore load of 2 block(s) failed (reason error): ConnectionError: back?; they are "
        "recomputed (5 more since the last such line)",
    ]
