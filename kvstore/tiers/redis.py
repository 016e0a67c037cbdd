"""Redis tier: pages as verified binary records in Redis or a Redis Cluster shared by many nodes.

Storage layout and compression
    One page is one Redis string named by its key, whose value is a verified binary record:
    :mod:`kvstore.tiers.redis_records` (the names, the records, zstd compression). The servers
    and the call across them: :mod:`kvstore.tiers.redis_route`; what this instance knows about
    keys (owned pages, the header cache, rejected keys): :mod:`kvstore.tiers.redis_book`.

Guarantees
    * **Durability** — whatever the server gives (none, in a cache configured with
      ``--save "" --appendonly no``). Pages may vanish at any time: TTL expiry, the server's
      ``maxmemory-policy``, another node's delete. A vanished page is a miss.
    * **Integrity** — every read verifies the record against the namespace, key and layout asked
      for, the payload checksum and the record's MAC (keyed by the deployment secret: a page
      forged by someone who can write to Redis but lacks the secret fails it). A foreign, stale
      or garbage value is a miss and is counted by reason; a damaged or forged one (bad magic,
      checksums, MAC, length, key or chain) is also deleted. A
      well-formed record that is merely foreign (another namespace, layout, format version, or a
      codec this process lacks) is left for the nodes that can use it — also when its size is
      impossible for this layout: such a value is classed by its header, never by its size
      alone. Nothing past the fixed header is ever deserialised; there is no pickle.
    * **Authenticated before used** — a header's identity (namespace, key, parent, tokens) is
      looked at only after the record's MAC verified (``record.decode_record``'s order). A
      header that someone without the secret rewrote -- say, to name another namespace, with
      the header checksum recomputed -- is a ``mac`` failure (damage: deleted), belongs to no
      namespace, and no ``meta``, flush or promotion ever acts on what it says.
    * **Foreign records do not block owners** — ``contains`` is one EXISTS per key, so it cannot
      tell a page from a foreign value under the same name. A key whose value failed
      verification on a read of this instance is therefore answered absent by ``contains``
      (and ``meta``) until a read verifies it or this instance writes it: the store's next put
      of that key overwrites the foreign value instead of counting it as already there. Another
      node learns the same on its own first read of the key. (A reader that asks for a key
      under the wrong namespace marks the owner's genuine page too; the cost is one rewrite of
      identical content, never wrong bytes.)
    * **Latency** — no call waits more than ``timeout_s`` for a server that makes no progress,
      and a call that moves no pages (``contains``, lookups, ``delete``) takes at most
      ``timeout_s`` in total, retries included; a call moving N page bytes may run
      ``timeout_s + N / 50 MB/s`` before it gives up on a server that is slow but not stalled.
      So a dead, hung or slow server gives misses (reads, lookups) and refused puts within the
      timeout, never a hung worker. A per-server circuit breaker opens after
      ``breaker_failures`` consecutive failed calls; while open, calls to that server return
      at once; after ``breaker_cooldown_s`` one call probes it, and success closes it —
      recovery is automatic.
    * **Round trips** — a batch (a lookup of a whole prompt, a get or put of many pages) is one
      pipelined exchange per server involved: one round trip per server, servers in parallel.
      A put of at least 8 pages of at least 1 MiB is cut into up to ``write_lanes`` parts sent
      over as many connections at once (:mod:`kvstore.tiers.redis_lanes`): still one round
      trip.
    * **Concurrency** — thread-safe; each call takes its own pooled connection per server.
      Concurrent writers of one key write identical content (keys are content addresses), so
      last-writer-wins is harmless.
    * **Back-pressure** — a server at ``maxmemory`` (OOM reply) refuses the puts, which are
      counted as refused; reads go on. OOM is not a breaker failure.

Data path
    Hot commands (GET/GETEX, SET, EXISTS, DEL, GETRANGE) go through a small RESP2 implementation
    (:mod:`kvstore.tiers.redis_resp`) on the socket of a redis-py connection: gets are received
    straight into the caller's page buffers, puts are gather-written from them. redis-py does
    everything else: connect, AUTH/ACL, TLS, SELECT, the cluster slot map.

    The record MAC of a batch of pages is hashed on the MAC pool (``mac_threads``; by default
    from 4 cores, see :mod:`kvstore.record`): a put hashes the next pages while the calling
    thread sends this one; a get verifies each page once it has arrived while the calling
    thread receives the next, and returns after every page was verified. Without the pool (and
    for one page) the calling thread hashes: a put's page before it is sent, a get's page piece
    by piece as it arrives.

Capacity and state
    ``capacity_pages`` is this node's budget for the store's eviction policy. ``used_pages`` is
    the number of pages *this tier instance* wrote and has not deleted or seen vanish — in a
    shared cache an approximation (a TTL expiry is noticed on the next read or contains of the
    key). ``keys()`` yields nothing: a shared cache's keys belong to every node, and adopting
    them all into this node's policy at start would both cost a scan of the whole cluster and
    let this node evict other nodes' pages. Bound the shared cache with ``ttl_s`` and/or the
    server's ``maxmemory`` + ``maxmemory-policy allkeys-lru``. ``meta(key)`` answers from a
    bounded cache of recently read or written headers, else with one GET of the whole record,
    verified like a read: a header is authenticated only with its payload (the MAC covers
    both), and ``meta`` is what flushes, promotions and policies decide by, so it never
    answers from an unauthenticated header. (A flush of a namespace therefore reads every
    record of the shared cache that this node has not cached: a page's bytes each, where a
    header would be ~``132 + 4 * block_size``.)
    Memory: Redis (jemalloc) stores a 2 MiB page plus its header — as it would a raw 2 MiB
    value — in a 2.5 MiB size class; size ``maxmemory`` with 1.25x per 2 MiB page.

TTL
    With ``ttl_s`` every put sets the expiry and every hit refreshes it (GETEX), so pages that are
    used stay and pages that are not expire: a sliding TTL. A page this tier instance wrote is
    counted *expired* (``kvstore_tier_expired_pages_total``, once) when a read or a presence check
    finds it gone at least ``ttl_s`` after its put or its last refreshing hit (measured from the
    reply, so never before the server's own expiry); gone earlier, it is merely absent (the
    server's ``maxmemory`` policy, another node's delete). Pages other nodes wrote are not
    tracked: their vanishing is absent too. Another node's put or hit of the same key extends
    the server's TTL without this node knowing, so the count can only err towards *expired* for
    a page that outlived this node's deadline and then vanished another way.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from kvstore.errors import TierUnavailable
from kvstore.keys import BlockMeta
from kvstore.layout import KVLayout
from kvstore.metrics import Metrics, ServerStats
from kvstore.record import RecordMac, default_mac_threads, mac_jobs, stored_meta
from kvstore.tiers.base import Tier
from kvstore.tiers.redis_book import KeyBook
from kvstore.tiers.redis_lanes import Lanes
from kvstore.tiers.redis_pool import FLUSH_BYTES
from kvstore.tiers.redis_receive import PageReceiver, ValueReceiver
from kvstore.tiers.redis_records import CODEC_ZSTD, DAMAGED, Records, ahead
from kvstore.tiers.redis_resp import ReplyError, RespIO, command, command_head
from kvstore.tiers.redis_route import Router
from kvstore.tiers.redis_config import Compression, RedisTierConfig
from kvstore.tiers.redis_setup import CODECS, connection_settings, load_zstd

_WINDOW_BYTES = 5 << 20  # value bytes in flight per server during a get (deeper costs the server)
#: Pages smaller than this are put over one lane whatever ``write_lanes`` says: each lane's
#: thread takes the GIL a few times per page (hashing, send), and with 256 KiB pages that
#: hand-off cost more than the overlap gained (same measurement: 0.61-0.71 of LMCache with
#: 1 lane, 0.42-0.54 with 2).
LANES_MIN_PAGE_BYTES = 1 << 20


def _text(path: object) -> str | None:
    return None if path is None else str(path)


class RedisTier(Tier):
    kind = "redis"
    writes_records = True
    shared = True
    config_model = RedisTierConfig

    def __init__(
        self,
        config: RedisTierConfig,
        layout: KVLayout,
        metrics: Metrics | None = None,
        *,
        mac: RecordMac | None = None,
        store_token_ids: bool = False,
    ) -> None:
        """Connect to one server (``config.url``) or to a Redis Cluster
        (``config.cluster_nodes``, seeds as ``host:port``); the settings:
        :class:`RedisTierConfig`. ``config.mac_threads`` None: ``record.default_mac_threads()``,
        by the cores. ``config.write_lanes``: connections (per server) one batch of puts of
        pages of at least ``LANES_MIN_PAGE_BYTES`` is split over (smaller pages use one), each
        part hashed and sent at once (:mod:`kvstore.tiers.redis_lanes`); 1: one exchange. Gets
        are one exchange: they already hash each page as it arrives, and lanes measured slower.

        Runtime arguments: ``mac``: the records' MAC, keyed by the deployment secret (None: the
        public key). ``store_token_ids``: keep each block's token ids in its record
        (``security.store_token_ids``); by default they are left out (``record.stored_meta``).

        Raises :class:`ConfigError` for rejected credentials or a url that does not parse, and
        :class:`TierUnavailable` when no server answers within ``connect_timeout_s``.
        """
        super().__init__(config, layout, metrics)
        name, ttl_s, compression = self.name, config.ttl_s, config.compression
        self.timeout_s = config.timeout_s
        self.connect_timeout_s = config.connect_timeout_s
        self.retries = config.retries
        self.ttl_s = ttl_s
        self.compression: Compression = compression
        self._records = Records(
            layout, config.key_prefix, mac if mac is not None else RecordMac(None),
            CODECS[compression], load_zstd(required=compression == "zstd", tier=name),
        )
        self.store_token_ids = bool(store_token_ids)
        #: Threads of the MAC pool (0: none, the calling thread hashes).
        self.mac_threads = (default_mac_threads() if config.mac_threads is None
                            else config.mac_threads)
        write_lanes = config.write_lanes
        self.write_lanes = write_lanes
        #: Lanes a batch of puts really uses: ``write_lanes`` for pages of at least
        #: ``LANES_MIN_PAGE_BYTES``, else 1.
        self.put_lanes = write_lanes if layout.page_bytes >= LANES_MIN_PAGE_BYTES else 1
        self._lanes = Lanes(name, self.put_lanes)
        # Small pages go out FLUSH_BYTES at a time (redis_pool.py says why); large ones one by
        # one, each on its way while the next is hashed (2 MiB pages measured 0.69-0.83 of
        # LMCache so, 0.75 in 4 MiB sends: no gain to trade that overlap for).
        self._put_flush = FLUSH_BYTES if layout.page_bytes < LANES_MIN_PAGE_BYTES else 1
        self._window = max(1, _WINDOW_BYTES // self._records.record_bytes)
        self._ttl_ms = b"%d" % max(1, round(ttl_s * 1000)) if ttl_s else None
        self._lock = threading.Lock()  # guards oom_refused
        self._book = KeyBook(ttl_s)
        self.oom_refused = 0  # puts refused because the server hit maxmemory

        password = config.password
        connect = connection_settings(
            name, self.connect_timeout_s, config.url, config.cluster_nodes, config.username,
            None if password is None else password.get_secret_value(), config.tls,
            _text(config.tls_ca_certs), _text(config.tls_certfile), _text(config.tls_keyfile),
            config.tls_verify,
        )
        self._router = Router(
            name, connect, self.metrics, cluster=config.cluster_nodes is not None,
            timeout_s=self.timeout_s, connect_timeout_s=self.connect_timeout_s,
            retries=self.retries, breaker_failures=config.breaker_failures,
            breaker_cooldown_s=config.breaker_cooldown_s,
        )
        self._getex = ttl_s is not None and self._router.version >= (6, 2)

    # ----------------------------------------------------------------- hooks

    def _contains(self, keys: Sequence[bytes]) -> list[bool]:
        names = [self._records.name(k) for k in keys]
        found = [False] * len(keys)
        gone: list[bytes] = []  # answered absent (not: on a server that failed)
        refusals = [0]

        def handle(io: RespIO, i: int) -> bool:
            reply = io.read_flag()
            if isinstance(reply, ReplyError):
                return self._refused(reply, refusals)
            found[i] = reply
            if not reply:
                gone.append(keys[i])
            return False

        self._router.call("contains", names, lambda i: (command(b"EXISTS", names[i]),), handle)
        self._count_refusals("contains", refusals)
        if gone:
            self._forget(gone, vanished="contains")
        return self._book.unrejected(keys, found)

    def _read(
        self, namespace_id: bytes, keys: Sequence[bytes], outs: Sequence[np.ndarray]
    ) -> list[bool]:
        names = [self._records.name(k) for k in keys]
        bad: dict[bytes, bool] = {}  # key whose value failed verification -> delete it?
        refusals = [0]
        if self._getex:
            px = self._ttl_ms or b""
            build = lambda i: (command(b"GETEX", names[i], b"PX", px),)  # noqa: E731
        else:
            build = lambda i: (command(b"GET", names[i]),)  # noqa: E731
        jobs = mac_jobs(len(keys), self.mac_threads)
        got = PageReceiver(
            self._records, namespace_id, keys, outs, jobs,
            lambda key, reason, hdr: self._bad(key, reason, bad, hdr),
            lambda reply: self._refused(reply, refusals),
        )
        nbytes, window = len(names) * self._records.record_bytes, self._window
        if jobs is None:
            self._router.call("read", names, build, got.handle, window=window, nbytes=nbytes)
        else:
            with jobs:  # every job is done before the caller gets its buffers back
                self._router.call("read", names, build, got.handle, window=window, nbytes=nbytes)
            got.settle_jobs()
        self._count_refusals("read", refusals)
        if got.hits:
            self._book.remember(got.hits, refreshed=self._getex)
        if got.gone:
            self._forget(got.gone, vanished="read")
        if bad:
            self._reject(bad)
        return got.found

    def _write(self, metas: Sequence[BlockMeta], pages: Sequence[np.ndarray]) -> list[bool]:
        metas = [stored_meta(m, self.store_token_ids) for m in metas]  # also what meta() says
        return self._lanes.run(
            self._write_lane, len(metas), (metas, pages),
            lambda: self.metrics.errors.labels(self.name, "write").inc(),
        )

    def _write_lane(
        self, metas: Sequence[BlockMeta], pages: Sequence[np.ndarray]
    ) -> list[bool]:
        records = self._records
        names = [records.name(m.key) for m in metas]
        stored = [False] * len(metas)
        tail = b"\r\n" + (b"$2\r\nPX\r\n$%d\r\n%s\r\n" % (len(self._ttl_ms), self._ttl_ms)
                          if self._ttl_ms else b"")
        extra = 2 if self._ttl_ms else 0
        oom = [0]
        refusals = [0]

        jobs = mac_jobs(len(metas), self.mac_threads)

        def build(i: int) -> Sequence[Any]:
            if jobs is None:
                header, payload = records.record(metas[i], pages[i])
            else:
                header, payload = ahead(jobs, i, len(metas), records.record, metas, pages)
            size = len(header) + memoryview(payload).nbytes
            head = command_head((b"SET", names[i]), size, extra)
            return (head, header, payload, tail)

        def handle(io: RespIO, i: int) -> bool:
            reply = io.read_ok()
            if reply is not None:
                if reply.prefix == "OOM":  # maxmemory: back-pressure, not an error
                    oom[0] += 1
                    return False
                return self._refused(reply, refusals)
            stored[i] = True
            return False

        nbytes, flush = len(names) * records.record_bytes, self._put_flush
        if jobs is None:
            self._router.call("write", names, build, handle, nbytes=nbytes, flush=flush)
        else:
            with jobs:  # no job reads a caller's page after the call
                self._router.call("write", names, build, handle, nbytes=nbytes, flush=flush)
        if oom[0]:
            with self._lock:
                self.oom_refused += oom[0]
        self._count_refusals("write", refusals)
        done = [m for m, ok in zip(metas, stored) if ok]
        if done:
            self._book.wrote(done)
        return stored

    def _delete(self, keys: Sequence[bytes]) -> int:
        names = [self._records.name(k) for k in keys]
        counts = [0] * len(keys)
        refusals = [0]

        def handle(io: RespIO, i: int) -> bool:
            reply = io.read_flag()
            if isinstance(reply, ReplyError):
                return self._refused(reply, refusals)
            counts[i] = int(reply)
            return False

        self._router.call("delete", names, lambda i: (command(b"DEL", names[i]),), handle)
        self._count_refusals("delete", refusals)
        self._forget(keys)
        return sum(counts)

    def _meta(self, key: bytes) -> BlockMeta | None:
        """The identity of ``key``'s page, authenticated: from the cache of headers this
        instance wrote or verified, else by reading the whole record and verifying its MAC (a
        header cannot be authenticated without its payload). Whoever decides by it -- a flush
        of a namespace, a promotion, a policy's parent -- so never trusts a header that someone
        without the secret rewrote: that reads as no namespace's page (None), is counted under
        its reason (``mac``), and the damaged value is deleted like on a read. A value that is
        merely foreign (another layout's or version's, an unknown codec) is None and left."""
        known, meta = self._book.cached(key)
        if known:
            return meta
        name = self._records.name(key)
        got = ValueReceiver(self._records, self._router.is_moved)
        try:
            self._router.call("contains", [name], lambda i: (command(b"GET", name),), got.handle,
                              nbytes=self._records.max_bytes)
        except TierUnavailable:
            return None
        value = got.value
        if value is None:  # gone
            return None
        found = value if isinstance(value, str) else self._records.identify(value, key)
        if not isinstance(found, str):
            self._book.remember([found])
            return found
        reason = found
        if reason in DAMAGED:  # a merely foreign value is not ours to count or judge
            bad: dict[bytes, bool] = {}
            self._bad(key, reason, bad)
            self._reject(bad)
        return None

    def _keys(self) -> Iterator[bytes]:
        return iter(())  # a shared cache's keys are not this node's; see the module docstring

    def _used(self) -> int:
        return self._book.owned()

    def close(self) -> None:
        super().close()
        self._lanes.close()
        self._router.close()

    # ----------------------------------------------------------------- introspection

    def server_stats(self) -> list[ServerStats]:
        """Per-server breaker state and counters (round trips, failures, fast rejections)."""
        return self._router.stats()

    def ping(self) -> bool:
        """Whether every server answers now (one EXISTS through the tier's own path, bounded by
        ``timeout_s``; an open breaker answers False at once). For readiness checks."""
        self._check_open()
        name = self._records.prefix + b"ping"

        def handle(io: RespIO, i: int) -> bool:
            reply = io.read_flag()
            return isinstance(reply, ReplyError) and self._router.is_moved(reply)

        try:
            self._router.call("contains", [name], lambda i: (command(b"EXISTS", name),), handle)
        except TierUnavailable:
            return False
        return True

    def scan_keys(self, count: int = 1000) -> Iterator[bytes]:
        """Every page key under this tier's ``key_prefix`` on every server (a cluster's
        primaries), written by any node: SCAN, ``count`` names per step. For operations that
        must reach pages this node did not write (flushing a namespace); not for hot paths.
        Raises TierUnavailable when a server does not answer."""
        self._check_open()
        yield from self._router.scan_keys(self._records.prefix, count)

    # ----------------------------------------------------------------- helpers

    def _bad(self, key: bytes, reason: str, bad: dict[bytes, bool], hdr: Any = None) -> None:
        """Count a value that failed verification and note whether to delete it
        (``Records.damaged``; ``hdr``: its header)."""
        self.count_corrupt(reason)
        bad[key] = self._records.damaged(key, reason, hdr)

    def _reject(self, bad: dict[bytes, bool]) -> None:
        """After a read: remember the keys whose values failed verification (``contains``
        answers absent for them, so their owner's next put overwrites them) and delete the
        damaged ones."""
        self._book.reject(bad)
        damaged = [k for k, delete in bad.items() if delete]
        if damaged:
            with contextlib.suppress(TierUnavailable):  # else the next reader finds it again
                self._delete(damaged)

    def _forget(self, keys: Sequence[bytes], *, vanished: str = "") -> None:
        """Keys deleted, or that a server answered absent to operation ``vanished``: an owned
        page whose TTL has surely run out by now is counted expired."""
        expired = self._book.forget(keys, vanished=vanished)
        if expired:
            self.count_expired(expired, vanished)

    def _refused(self, reply: ReplyError, refusals: list[int]) -> bool:
        """An error answer to one command: True to re-route it (MOVED/ASK), else counted in
        ``refusals`` (NOPERM, READONLY, LOADING, CLUSTERDOWN...: the item is a miss/refused)."""
        if self._router.is_moved(reply):
            return True
        refusals[0] += 1
        return False

    def _count_refusals(self, op: str, refusals: list[int]) -> None:
        if refusals[0]:  # the server answers but will not serve: one error per call
            self.metrics.errors.labels(self.name, op).inc()


__all__ = ["CODEC_ZSTD", "RedisTier", "ServerStats"]
