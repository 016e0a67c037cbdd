"""Redis tier start-up against misconfigurations, with real servers: each is refused with a
message and hint that name the actual problem, and no message or log line ever carries the
password (a URL is quoted with its password masked)."""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable

import pytest

from kvstore.errors import ConfigError, KVStoreError
from kvstore.tiers.redis import RedisTier
from tests.redis_servers import RedisServer, free_port
from tests.tiers.test_redis import SMALL
from tests.tiers.test_redis_faults import wait_until

pytestmark = pytest.mark.timeout(120)

SECRET = "Xq7-s3cret-pw"


def start(url: str, **kw) -> RedisTier:
    return RedisTier.build("redis", SMALL, 10, url=url, connect_timeout_s=0.5, **kw)


def test_a_tls_url_against_a_plain_server_says_tls_mismatch(redis_server: RedisServer) -> None:
    with pytest.raises(ConfigError) as err:
        start(f"rediss://127.0.0.1:{redis_server.port}/0")
    assert (err.value.message, err.value.hint) == (
        f"redis tier 'redis': {redis_server.node} answers plain RESP, not TLS",
        "use redis:// (and tls=False) for this server, or point the tier's url at the server's "
        "tls-port",
    )


def test_a_database_out_of_range_says_so(redis_server: RedisServer) -> None:
    with pytest.raises(ConfigError) as err:
        start(f"redis://127.0.0.1:{redis_server.port}/99")
    assert (err.value.message, err.value.hint) == (  # not a question of ACL rights
        f"redis tier 'redis': {redis_server.node} has no database 99: DB index is out of range",
        "set the url's database number (its /N) below the server's 'databases' setting (16 by "
        "default)",
    )


def test_a_secret_never_appears_in_a_message_or_a_log(
    caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    """Every way a tier with a password can fail to start, and a tier that loses its server:
    the password appears in no exception (message, hint, traceback with its chained causes),
    no log record of any logger, and nothing printed."""
    plain = RedisServer()
    guarded = RedisServer("--requirepass", SECRET)
    port = plain.port
    attempts: dict[str, Callable[[], RedisTier]] = {
        "unix socket": lambda: start(f"unix://:{SECRET}@/tmp/kvstore-none.sock"),
        "unknown scheme": lambda: start(f"http://user:{SECRET}@127.0.0.1:{port}/0"),
        "bad port": lambda: start(f"redis://:{SECRET}@127.0.0.1:notaport/0"),
        "password in the query": lambda: start(f"redis://127.0.0.1:{port}/0?password={SECRET}"
                                               "&socket_timeout=x"),
        "password in the url": lambda: start(f"redis://:{SECRET}@127.0.0.1:{port}/0"),
        "unreachable": lambda: start(f"redis://127.0.0.1:{free_port()}/0", password=SECRET),
        "no password configured": lambda: start(plain.url, password=SECRET),
        "wrong password": lambda: start(guarded.url, password=f"wrong-{SECRET}"),
        "wrong user": lambda: start(f"redis://nobody@127.0.0.1:{guarded.port}/0",
                                    password=SECRET),
        "tls mismatch": lambda: start(f"rediss://127.0.0.1:{guarded.port}/0", password=SECRET),
        "database out of range": lambda: start(f"redis://127.0.0.1:{guarded.port}/99",
                                               password=SECRET),
    }
    texts: list[str] = []
    try:
        with caplog.at_level(logging.DEBUG):
            for what, attempt in attempts.items():
                with pytest.raises(KVStoreError) as err:  # refused, as one of ours
                    attempt()
                exc = err.value
                texts += [what, str(exc), repr(exc), exc.hint,
                          "".join(traceback.format_exception(exc))]
                if "://" in exc.message:  # it quotes the url: with the password masked
                    assert "***" in exc.message, (what, exc.message)
            # A working tier with a password that loses its server, and gets it back.
            t = start(guarded.url, password=SECRET, breaker_failures=1, breaker_cooldown_s=0.05,
                      timeout_s=0.3)
            try:
                guarded.kill()
                assert t.contains([b"\x01" * 16]) == [False]
                guarded.restart()

                def answers() -> bool:
                    t.contains([b"\x01" * 16])
                    return t.server_stats()[0].breaker == "closed"

                wait_until(answers, 5)
                texts += [repr(t.server_stats()), repr(t.stats())]
            finally:
                t.close()
        logged = [r.getMessage() for r in caplog.records]
        assert any("unavailable" in line for line in logged)  # the loss was logged
        assert any("answers again" in line for line in logged)  # and the recovery
        texts += logged
        texts += list(capfd.readouterr())
    finally:
        plain.stop()
        guarded.stop()
    leaks = [t for t in texts if SECRET in t]
    assert not leaks, leaks
