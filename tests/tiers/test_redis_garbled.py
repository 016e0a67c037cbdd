"""Redis tier against a server that breaks the protocol: a real TCP proxy in front of a real
redis-server answers chosen commands with malformed RESP (see ``garbling_proxy``). A garbled
reply, in the handshake or in the data path, is a miss or a refused put plus a counted failure —
never an exception, never a hit, never wrong bytes — and it never wedges the circuit breaker."""

from __future__ import annotations

import time

import numpy as np
import pytest

from kvstore.errors import TierUnavailable
from kvstore.tiers.redis_breaker import CircuitBreaker
from kvstore.tiers.redis_pool import Exchange, ServerPool, run_exchange
from kvstore.tiers.redis_resp import command
from kvstore.tiers.redis_setup import connection_settings
from tests.redis_servers import RedisServer
from tests.tiers.garbling_proxy import GarblingProxy
from tests.tiers.test_redis_faults import COOLDOWN_S, data, make, wait_until

pytestmark = pytest.mark.timeout(120)

DATA_COMMANDS = (b"EXISTS", b"GET", b"GETEX", b"SET", b"DEL", b"GETRANGE")

#: Malformed replies: numbers that are not numbers, an unknown type, a bulk string without its
#: CRLF, a well-framed reply of the wrong type (a simple string where a count or OK belongs).
GARBAGE = {
    "integer_not_a_number": b":notanumber\r\n",
    "bulk_length_not_a_number": b"$12x\r\n",
    "array_length_not_a_number": b"*z\r\n",
    "nested_integer_not_a_number": b"*1\r\n:1x\r\n",
    "unknown_type": b"?7\r\n",
    "bulk_without_crlf": b"$3\r\nabcXY",
    "wrong_type_simple_string": b"+WHAT\r\n",
}


@pytest.fixture
def proxied(redis_server: RedisServer):
    proxy = GarblingProxy(redis_server.port)
    try:
        yield redis_server, proxy
    finally:
        proxy.close()


@pytest.mark.parametrize("garbage", sorted(GARBAGE))
def test_a_garbled_reply_is_a_miss_never_an_exception(proxied, garbage: str) -> None:
    server, proxy = proxied
    ns, ch, pages = data(4)
    t = make(proxy.url)
    other = make(proxy.url)  # no cached headers: its meta() asks the server
    try:
        assert all(t.write(ch.metas(0, 3), list(pages[:3])))
        proxy.garble = dict.fromkeys(DATA_COMMANDS, GARBAGE[garbage])
        outs = np.zeros_like(pages)
        for _ in range(3):  # the first calls meet the garbage, later ones the open breaker
            assert t.contains(ch.keys) == [False] * 4
            assert t.count_leading(ch.keys) == 0
            assert t.read(ns.id, ch.keys, list(outs)) == [False] * 4
            assert t.write(ch.metas(3), [pages[3]]) == [False]
            assert t.delete(ch.keys[:1]) == 0
            assert other.meta(ch.keys[1]) is None
        assert t.stats().errors > 0 and t.server_stats()[0].failures > 0
        assert not outs.any()  # not a byte of garbage reached a caller's buffer
        proxy.garble = {}
        wait_until(lambda: t.read(ns.id, ch.keys, list(outs)) == [True] * 3 + [False],
                   COOLDOWN_S + 5)
        assert np.array_equal(outs[:3], pages[:3])
        assert t.server_stats()[0].breaker == "closed"
        # Nothing was written through the garbled calls: the server holds exactly the 3 pages.
        assert server.client().dbsize() == 3
    finally:
        t.close()
        other.close()


@pytest.mark.parametrize(
    ("db", "name", "garbage"),
    [
        (0, b"CLIENT", b"!junk\r\n"),  # CLIENT SETINFO, the first command redis-py sends
        (0, b"CLIENT", b":x\r\n"),
        (1, b"SELECT", b"-ERR DB index is out of range\r\n"),
        (1, b"SELECT", b"$2x\r\n"),
    ],
    ids=["client_unknown_type", "client_integer_not_a_number", "select_error", "select_garbled"],
)
def test_a_garbled_handshake_is_a_miss_never_an_exception(
    proxied, db: int, name: bytes, garbage: bytes
) -> None:
    """The data path's own connections go through redis-py's handshake; the tier's start-up
    probe used its own connection, so the handshake is garbled only after the tier started."""
    _server, proxy = proxied
    ns, ch, pages = data(2)
    t = make(f"redis://127.0.0.1:{proxy.port}/{db}")
    try:
        proxy.garble = {name: garbage}
        outs = np.zeros_like(pages)
        for _ in range(3):
            assert t.write(ch.metas(), list(pages)) == [False, False]
            assert t.contains(ch.keys) == [False, False]
            assert t.read(ns.id, ch.keys, list(outs)) == [False, False]
        assert t.server_stats()[0].failures > 0
        proxy.garble = {}
        wait_until(lambda: t.write(ch.metas(), list(pages)) == [True, True], COOLDOWN_S + 5)
        assert t.read(ns.id, ch.keys, list(outs)) == [True, True]
        assert np.array_equal(outs, pages)
    finally:
        t.close()


def test_a_garbled_reply_to_the_half_open_probe_does_not_wedge_the_breaker(proxied) -> None:
    """The breaker opens on a real fault (the server stopped); once it is back, the probe meets
    a garbled reply: a miss, and the breaker opens again for one cooldown — not for ever."""
    server, proxy = proxied
    ns, ch, pages = data(2)
    t = make(proxy.url, breaker_failures=1)
    try:
        assert all(t.write(ch.metas(), list(pages)))
        server.pause()
        outs = np.zeros_like(pages)
        assert t.read(ns.id, ch.keys, list(outs)) == [False, False]  # times out: breaker opens
        assert t.server_stats()[0].breaker == "open"
        server.resume()
        proxy.garble = dict.fromkeys(DATA_COMMANDS, b"$garbled\r\n")
        time.sleep(COOLDOWN_S)
        assert t.server_stats()[0].breaker == "half_open"
        assert t.read(ns.id, ch.keys, list(outs)) == [False, False]  # the probe: garbled
        assert t.server_stats()[0].breaker == "open"
        proxy.garble = {}
        wait_until(lambda: t.read(ns.id, ch.keys, list(outs)) == [True, True], COOLDOWN_S + 5)
        assert np.array_equal(outs, pages)
        assert t.server_stats()[0].breaker == "closed"
    finally:
        t.close()


def test_every_exchange_reports_to_the_breaker_even_when_a_handler_raises(
    redis_server: RedisServer,
) -> None:
    """A handler that raises something unexpected (a bug) propagates — but the exchange still
    reports a failure, so a half-open breaker is not left waiting for a probe that ended."""
    connect = connection_settings("t", 1.0, redis_server.url, None, None, None, False,
                                  None, None, None, True)
    breaker = CircuitBreaker(1, 0.05)
    pool = ServerPool("s", lambda: connect.connection("127.0.0.1", redis_server.port), breaker)

    class Bug(Exception):
        pass

    def handle(io, _item: int) -> bool:
        io.read_reply()
        raise Bug

    def run(handler) -> None:  # noqa: ANN001
        run_exchange({pool: [0]}, Exchange(lambda _i: (command(b"PING"),), handler),
                     deadline=time.monotonic() + 2, wait_s=1.0, retries=0, backoff_s=0.01,
                     connect_timeout_s=1.0)

    breaker.failure()  # open
    time.sleep(0.06)
    assert breaker.state == "half_open"
    with pytest.raises(Bug):
        run(handle)  # the probe
    assert breaker.state in ("open", "half_open")  # reported as a failure ...
    assert pool.failures == 1
    time.sleep(0.06)
    run(lambda io, _i: io.read_reply() is None)  # ... so the next probe goes through
    assert breaker.state == "closed" and pool.rejected == 0
    pool.close()


@pytest.mark.parametrize("name", [b"CLIENT", b"INFO"])
def test_a_garbled_handshake_at_start_is_tier_unavailable(proxied, name: bytes) -> None:
    """At construction the tier raises only its own errors: a server that garbles the handshake
    (CLIENT SETINFO) or the probe (INFO) is one that did not answer."""
    _server, proxy = proxied
    proxy.garble = {name: b"!junk\r\n"}
    with pytest.raises(TierUnavailable) as err:
        make(proxy.url)
    assert proxy.url.split("//")[1].split("/")[0] in err.value.message
