"""Redis tier under real faults: a server killed (SIGKILL), hung (SIGSTOP), slow (a delaying
proxy) and restarted while a worker runs. During an outage every call returns misses / refused
puts within ``timeout_s`` (asserted with a margin for a loaded 2-core machine), nothing hangs,
and the tier recovers by itself once the server is back."""

from __future__ import annotations

import logging
import threading
import time

import numpy as np
import pytest

from kvstore.keys import Namespace
from kvstore.layout import KVLayout
from kvstore.tiers.redis import RedisTier
from tests.redis_servers import DelayProxy, RedisServer

pytestmark = pytest.mark.timeout(120)

LAYOUT = KVLayout(2, 1, 64, 16, "float16")  # 8 KiB pages
TIMEOUT_S = 0.3
MARGIN_S = 0.3  # scheduling noise on a busy 2-core machine
COOLDOWN_S = 0.3


def make(url: str, **kw) -> RedisTier:
    kw = {"timeout_s": TIMEOUT_S, "connect_timeout_s": 0.2, "breaker_failures": 2,
          "breaker_cooldown_s": COOLDOWN_S, **kw}
    return RedisTier.build("redis", LAYOUT, 10_000, url=url, **kw)


def data(n: int, start: int = 0):
    ns = Namespace("m", LAYOUT)
    ch = ns.chain(np.arange(start, start + n * LAYOUT.block_size))
    pages = np.random.default_rng(start).integers(0, 256, (n, LAYOUT.page_bytes), dtype=np.uint8)
    return ns, ch, pages


def timed(fn, *args):
    t0 = time.monotonic()
    out = fn(*args)
    return out, time.monotonic() - t0


def wait_until(pred, timeout_s: float) -> float:
    """Seconds until ``pred()`` was true (polling); fails after ``timeout_s``."""
    t0 = time.monotonic()
    while not pred():
        if time.monotonic() - t0 > timeout_s:
            pytest.fail(f"not recovered after {timeout_s}s")
        time.sleep(0.02)
    return time.monotonic() - t0


def test_killed_server_gives_misses_at_once_and_recovery_after_restart(
    redis_server: RedisServer,
) -> None:
    ns, ch, pages = data(20)
    t = make(redis_server.url)
    try:
        assert all(t.write(ch.metas(), list(pages)))
        redis_server.kill()
        outs = list(np.empty_like(pages))
        for _ in range(5):
            found, took = timed(t.read, ns.id, ch.keys, outs)
            assert found == [False] * 20 and took < TIMEOUT_S + MARGIN_S
            lead, took = timed(t.count_leading, ch.keys)
            assert lead == 0 and took < TIMEOUT_S + MARGIN_S
            stored, took = timed(t.write, ch.metas(0, 2), list(pages[:2]))
            assert stored == [False, False] and took < TIMEOUT_S + MARGIN_S
        st = t.stats()
        assert st.errors >= 15 and st.writes_refused == 10 and st.misses == 100
        assert t.server_stats()[0].trips >= 1
        redis_server.restart()  # empty: no persistence
        wait_until(lambda: t.write(ch.metas(0, 1), [pages[0]]) == [True], 3 * COOLDOWN_S + 2)
        assert t.read(ns.id, ch.keys[:2], outs[:2]) == [True, False]
        assert np.array_equal(outs[0], pages[0])
        assert t.server_stats()[0].breaker == "closed"
    finally:
        t.close()


def test_hung_server_gives_misses_within_the_timeout(redis_server: RedisServer) -> None:
    ns, ch, pages = data(20)
    t = make(redis_server.url)
    try:
        assert all(t.write(ch.metas(), list(pages)))
        redis_server.pause()
        outs = list(np.empty_like(pages))
        times = []
        for _ in range(4):
            found, took = timed(t.read, ns.id, ch.keys, outs)
            assert found == [False] * 20
            times.append(took)
        assert max(times) < TIMEOUT_S + MARGIN_S, times
        assert times[0] >= TIMEOUT_S * 0.9  # it did wait for the server ...
        assert times[-1] < 0.1, times  # ... until the breaker opened: then no waiting at all
        stored, took = timed(t.write, ch.metas(0, 1), [pages[0]])
        assert stored == [False] and took < TIMEOUT_S + MARGIN_S
        time.sleep(COOLDOWN_S)  # half-open: the probe meets the hung server and waits once
        found, took = timed(t.contains, ch.keys)
        assert found == [False] * 20 and took < TIMEOUT_S + MARGIN_S
        redis_server.resume()
        wait_until(lambda: t.read(ns.id, ch.keys, outs) == [True] * 20, 3 * COOLDOWN_S + 2)
        assert np.array_equal(np.stack(outs), pages)
    finally:
        t.close()


def test_slow_server_gives_misses_within_the_timeout(redis_server: RedisServer) -> None:
    ns, ch, pages = data(8)
    proxy = DelayProxy(redis_server.port)
    t = make(proxy.url)
    try:
        assert all(t.write(ch.metas(), list(pages)))
        proxy.delay_s = 1.0  # answers arrive, but long after the timeout
        outs = list(np.empty_like(pages))
        for _ in range(3):
            found, took = timed(t.read, ns.id, ch.keys, outs)
            assert found == [False] * 8 and took < TIMEOUT_S + MARGIN_S
        proxy.delay_s = 0.0
        time.sleep(1.0)  # let the late answers to closed connections drain
        wait_until(lambda: t.read(ns.id, ch.keys, outs) == [True] * 8, 3 * COOLDOWN_S + 2)
        assert np.array_equal(np.stack(outs), pages)
    finally:
        t.close()
        proxy.close()


def test_restart_while_a_worker_runs(redis_server: RedisServer) -> None:
    """A worker puts and gets in a loop while the server is killed and restarted under it: no
    call takes longer than the timeout, none raises, and the worker's calls succeed again."""
    t = make(redis_server.url)
    durations: list[float] = []
    results: list[tuple[float, bool]] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def worker() -> None:
        i = 0
        try:
            while not stop.is_set():
                ns, ch, pages = data(4, start=i * 64)
                i += 1
                stored, took = timed(t.write, ch.metas(), list(pages))
                durations.append(took)
                found, took = timed(t.read, ns.id, ch.keys, list(np.empty_like(pages)))
                durations.append(took)
                results.append((time.monotonic(), all(stored) and all(found)))
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    th = threading.Thread(target=worker)
    th.start()
    try:
        time.sleep(0.4)
        redis_server.kill()
        time.sleep(0.8)
        redis_server.restart()
        back = time.monotonic()
        time.sleep(3 * COOLDOWN_S + 1.0)
    finally:
        stop.set()
        th.join(10)
        t.close()
    assert not th.is_alive() and not errors
    assert max(durations) < TIMEOUT_S + MARGIN_S, max(durations)
    assert any(not ok for _, ok in results)  # the outage was seen
    assert any(ok for when, ok in results if when > back)  # and it ended by itself
    assert results[-1][1]


def test_a_lost_server_logs_one_warning_per_breaker_state_change(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Killed, probed in vain many times, restarted: one warning when calls start failing fast,
    one when the server answers again — not zero lines, and not one per failed probe."""
    ns, ch, pages = data(2)
    t = make(redis_server.url)
    outs = list(np.empty_like(pages))
    try:
        with caplog.at_level(logging.INFO, logger="kvstore"):
            assert all(t.write(ch.metas(), list(pages)))
            redis_server.kill()
            for _ in range(3):  # trips the breaker, then probes fail after each cooldown
                t.read(ns.id, ch.keys, outs)
                time.sleep(COOLDOWN_S)
            assert t.read(ns.id, ch.keys, outs) == [False, False]
            redis_server.restart()
            wait_until(lambda: t.write(ch.metas(), list(pages)) == [True, True],
                       3 * COOLDOWN_S + 2)
            assert t.read(ns.id, ch.keys, outs) == [True, True]
        lines = [r for r in caplog.records if r.name.startswith("kvstore")]
        assert [r.levelno for r in lines] == [logging.WARNING, logging.WARNING], lines
        down, up = (r.getMessage() for r in lines)
        assert redis_server.node in down and "unavailable" in down
        assert redis_server.node in up and "answers again" in up
        assert t.server_stats()[0].trips >= 2  # failed probes re-opened it: not logged again
    finally:
        t.close()
