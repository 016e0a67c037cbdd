"""The servers of one Redis tier and the call that reaches them: one server, or the shards of a
Redis Cluster found from its slot map.

:meth:`Router.call` groups a call's items by the server that owns their names and runs one
pipelined exchange per server (:func:`kvstore.tiers.redis_pool.run_exchange`), servers in
parallel. Items that a shard answers MOVED/ASK are re-routed once, after re-reading the slot map;
a failed server or an uncovered slot (a failover) re-reads it in the background, at most once
per breaker cooldown. Each server has its own pool of connections and circuit breaker
(:class:`~kvstore.tiers.redis_pool.ServerPool`), made on first use.

Thread-safe: ``_lock`` guards the pools, the cluster client and the refresh state; it is never
held during I/O.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

from redis.crc import key_slot

from kvstore.errors import TierUnavailable
from kvstore.keys import KEY_BYTES
from kvstore.metrics import Metrics, ServerStats
from kvstore.tiers.redis_breaker import CircuitBreaker
from kvstore.tiers.redis_pool import FLUSH_BYTES, NET_ERRORS, Exchange, ServerPool, run_exchange
from kvstore.tiers.redis_resp import ReplyError
from kvstore.tiers.redis_setup import Connect, connect_cluster, probe

_BACKOFF_S = 0.01  # first retry delay; doubles per retry
#: A call that moves pages may take timeout_s + its bytes at this rate before it gives up on a
#: server that is slow but not stalled (a stalled one fails after timeout_s without progress).
_SLOW_BYTES_PER_S = 50e6


class Router:
    """The servers of the tier named ``tier``, reached with ``connect``'s settings; errors are
    counted in ``metrics`` under the tier's name."""

    def __init__(
        self,
        tier: str,
        connect: Connect,
        metrics: Metrics,
        *,
        cluster: bool,
        timeout_s: float,
        connect_timeout_s: float,
        retries: int,
        breaker_failures: int,
        breaker_cooldown_s: float,
    ) -> None:
        """Probe the servers (``cluster``: ``connect``'s seeds are a cluster's) and connect.
        Raises :class:`ConfigError` for rejected credentials or the wrong kind of server,
        :class:`TierUnavailable` when no seed answers within ``connect_timeout_s``."""
        self.tier = tier
        self._metrics = metrics
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.retries = retries
        self._connect = connect
        self._breaker_args = (breaker_failures, breaker_cooldown_s)
        self._lock = threading.Lock()
        self._pools: dict[str, ServerPool] = {}
        self._cluster: Any = None
        self._refreshing = False
        self._last_refresh = 0.0
        #: The (major, minor) version of the server that answered the probe.
        self.version = probe(connect, cluster=cluster)
        if not cluster:
            host, port = connect.seeds[0]
            self._single: ServerPool | None = self._pool_for(host, port)
        else:
            self._single = None
            self._cluster = connect_cluster(connect)

    def call(
        self,
        op: str,
        names: list[bytes],
        build: Any,
        handle: Any,
        *,
        window: int | None = None,
        nbytes: int = 0,
        flush: int = FLUSH_BYTES,
    ) -> None:
        """One pipelined exchange for ``names`` (moving ``nbytes`` of values); items of
        unavailable servers keep their default result. Raises TierUnavailable when every item
        failed (the tier's base class counts it); counts an error of the tier when only some
        did (a cluster with one shard down)."""
        deadline = time.monotonic() + self.timeout_s + nbytes / _SLOW_BYTES_PER_S
        items = list(range(len(names)))
        ex = Exchange(build, handle, window, flush)
        failed: list[int] = []
        for attempt in (0, 1):
            groups, uncovered = self._route(names, items)
            failed.extend(uncovered)
            outcome = run_exchange(
                groups, ex, deadline=deadline, wait_s=self.timeout_s, retries=self.retries,
                backoff_s=_BACKOFF_S, connect_timeout_s=self.connect_timeout_s,
            )
            failed.extend(outcome.failed)
            if (outcome.failed or uncovered) and self._cluster is not None:
                self._refresh_topology(background=True)  # a failover may have moved the slots
            if not outcome.moved:
                break
            if attempt == 0 and self._cluster is not None:
                self._refresh_topology(background=False)
                items = outcome.moved
            else:
                failed.extend(outcome.moved)
        if failed:
            if len(failed) == len(names):
                raise TierUnavailable(
                    f"redis tier {self.tier!r}: no server answered {op} within {self.timeout_s}s",
                    hint="check the redis servers, or raise the tier's timeout_s",
                )
            self._metrics.errors.labels(self.tier, op).inc()

    def is_moved(self, reply: ReplyError) -> bool:
        """Whether an error answer asks to re-route the command (MOVED/ASK, in a cluster)."""
        return self._cluster is not None and reply.prefix in ("MOVED", "ASK")

    def stats(self) -> list[ServerStats]:
        with self._lock:
            pools = list(self._pools.values())
        return [p.stats() for p in pools]

    def scan_keys(self, prefix: bytes, count: int) -> Iterator[bytes]:
        """The keys of every name ``prefix`` + 32 hex digits on every server (a cluster's
        primaries): SCAN, ``count`` names per step. Raises TierUnavailable when a server does
        not answer."""
        if self._single is not None:
            servers = [self._connect.seeds[0]]
        else:
            servers = [(n.host, int(n.port)) for n in self._cluster.get_primaries()]
        match = prefix + b"*"
        for host, port in servers:
            conn = self._connect.connection(host, port)
            conn.socket_connect_timeout = self.connect_timeout_s
            conn.socket_timeout = self.timeout_s
            try:
                cursor = b"0"
                while True:
                    conn.send_command("SCAN", cursor, "MATCH", match, "COUNT", count)
                    cursor, names = conn.read_response()
                    for n in names:
                        hexkey = n[len(prefix):]
                        if len(hexkey) == 2 * KEY_BYTES:
                            with contextlib.suppress(ValueError):
                                yield bytes.fromhex(hexkey.decode("ascii", "replace"))
                    if cursor in (b"0", 0, "0"):
                        break
            except NET_ERRORS as exc:
                raise TierUnavailable(
                    f"redis tier {self.tier!r}: {host}:{port} failed during SCAN: "
                    f"{type(exc).__name__}",
                    hint="check the redis servers, or retry") from None
            finally:
                conn.disconnect()

    def close(self) -> None:
        with self._lock:
            pools = list(self._pools.values())
            cluster, self._cluster = self._cluster, None
        for pool in pools:
            pool.close()
        if cluster is not None:
            with contextlib.suppress(Exception):  # closing is best effort
                cluster.close()

    def _route(
        self, names: list[bytes], items: list[int]
    ) -> tuple[dict[ServerPool, list[int]], list[int]]:
        """Items grouped by the server that owns them, and the items of uncovered slots."""
        if self._single is not None:
            return {self._single: items}, []
        cluster = self._cluster
        if cluster is None:  # closed
            return {}, list(items)
        slots = cluster.nodes_manager.slots_cache
        groups: dict[ServerPool, list[int]] = {}
        uncovered: list[int] = []
        for i in items:
            nodes = slots.get(key_slot(names[i]))
            if nodes:
                groups.setdefault(self._pool_for(nodes[0].host, int(nodes[0].port)), []).append(i)
            else:  # no shard serves this slot (a broken cluster): like a dead server
                uncovered.append(i)
        return groups, uncovered

    def _pool_for(self, host: str, port: int) -> ServerPool:
        key = f"{host}:{port}"
        pool = self._pools.get(key)
        if pool is not None:
            return pool
        with self._lock:
            pool = self._pools.get(key)
            if pool is None:
                connect = self._connect
                pool = ServerPool(
                    key, lambda: connect.connection(host, port),
                    CircuitBreaker(*self._breaker_args), tier=self.tier,
                )
                self._pools[key] = pool
            return pool

    def _refresh_topology(self, *, background: bool) -> None:
        """Re-read the cluster's slot map (after MOVED, or a failed server: a failover).
        At most once per breaker cooldown; in the background when asked."""
        with self._lock:
            now = time.monotonic()
            if self._refreshing or now - self._last_refresh < self._breaker_args[1]:
                return
            self._refreshing = True
            self._last_refresh = now
            cluster = self._cluster

        def refresh() -> None:
            try:
                if cluster is not None:
                    cluster.nodes_manager.initialize()
            except Exception:  # noqa: BLE001 - keep the old map; the breaker handles the rest
                pass
            finally:
                with self._lock:
                    self._refreshing = False

        if background:
            threading.Thread(target=refresh, name="kvstore-redis-topology", daemon=True).start()
        else:
            refresh()
