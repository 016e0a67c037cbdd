"""Redis tier: pages as verified binary records in Redis or a Redis Cluster shared by many nodes.

Storage layout
    One page is one Redis string ``<key_prefix>:<key hex>`` (e.g. ``kvstore:3f9a…``, 32 hex
    digits), whose value is a :mod:`kvstore.record` record: the fixed header (namespace id,
    layout fingerprint, key, parent, payload length and checksum, header checksum; the block's
    token ids only with ``store_token_ids``) followed by the page bytes, raw or compressed by
    the codec the header names. The name holds the key only — ``contains`` and ``delete`` get
    keys without a namespace — and the key already identifies its namespace (it chains from the
    namespace seed); the namespace is checked from the verified header on every read. The name
    has no hash tag, so in a cluster the pages of one prompt spread over all shards.

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

Compression
    ``compression="zstd"`` (needs the ``zstandard`` package) compresses each page at level 1 and
    stores it raw when that does not make it smaller. Measured on bf16 KV-like pages (normal
    values with per-channel scales) on the 2-core CPU machine: 21-22 % fewer bytes, at
    ~0.6 GB/s compress / ~0.5 GB/s decompress per core; through the tier on loopback, puts ran
    at ~0.45x and gets at ~0.35x of uncompressed. So it does not pay for speed on loopback or
    any link faster than ~2-4 Gb/s; it pays for capacity (the same Redis memory holds ~1.4x
    the pages: 22 % fewer bytes, and the values drop out of jemalloc's 2.5 MiB size class) or on
    slow links. lz4 gains nothing on bf16 (ratio 1.00); zlib level 1 compresses at ~0.01 GB/s.
    Off by default. Readers decode compressed records whatever their own setting, so nodes may
    differ.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import Any, Literal

import numpy as np
from redis.crc import key_slot

from kvstore.errors import InvalidArgument, RecordError, TierUnavailable
from kvstore.keys import KEY_BYTES, BlockMeta
from kvstore.layout import KVLayout
from kvstore.metrics import Metrics
from kvstore.record import (
    MacJobs,
    RecordMac,
    decode_record,
    default_mac_threads,
    encode_header,
    header_bytes,
    mac_jobs,
    parse_header,
    payload_digest,
    stored_meta,
    verify_identity,
    verify_layout,
    verify_payload,
)
from kvstore.tiers.base import Tier
from kvstore.tiers.redis_breaker import CircuitBreaker
from kvstore.tiers.redis_lanes import Lanes
from kvstore.tiers.redis_pool import (
    FLUSH_BYTES,
    NET_ERRORS,
    Exchange,
    ServerPool,
    ServerStats,
    run_exchange,
)
from kvstore.tiers.redis_resp import ReplyError, RespIO, command, command_head
from kvstore.tiers.redis_setup import (
    CODECS,
    connect_cluster,
    connection_settings,
    load_zstd,
    probe,
    validate,
)

Compression = Literal["none", "zstd"]

CODEC_ZSTD = CODECS["zstd"]  # record codec id of zstd-compressed payloads

#: Failed checks after which the stored value is deleted (it can never be read by anyone).
#: Other reasons (namespace, layout, version, codec) mean "well-formed but not for us".
_DAMAGED = frozenset(
    {"truncated", "magic", "header_checksum", "key", "chain", "length", "payload_checksum",
     "mac"}
)
_META_CACHE = 4096  # recent headers kept for meta()
_WINDOW_BYTES = 5 << 20  # value bytes in flight per server during a get (deeper costs the server)
_BACKOFF_S = 0.01  # first retry delay; doubles per retry
#: A call that moves pages may take timeout_s + its bytes at this rate before it gives up on a
#: server that is slow but not stalled (a stalled one fails after timeout_s without progress).
_SLOW_BYTES_PER_S = 50e6
#: Connections a batch of puts of large pages is split over. Measured on the 2-core machine,
#: MAC on, against LMCache's client in the same rounds: 2 MiB pages put 0.75-0.83 of LMCache
#: with 2 lanes, 0.67-0.71 with 1; 4 lanes no faster than 2. Gets were 5-15 % slower with
#: lanes, so gets do not use them.
DEFAULT_WRITE_LANES = 2
#: Pages smaller than this are put over one lane whatever ``write_lanes`` says: each lane's
#: thread takes the GIL a few times per page (hashing, send), and with 256 KiB pages that
#: hand-off cost more than the overlap gained (same measurement: 0.61-0.71 of LMCache with
#: 1 lane, 0.42-0.54 with 2).
LANES_MIN_PAGE_BYTES = 1 << 20


class RedisTier(Tier):
    kind = "redis"
    shared = True

    def __init__(
        self,
        name: str,
        layout: KVLayout,
        capacity_pages: int,
        metrics: Metrics | None = None,
        *,
        url: str | None = None,
        cluster_nodes: Sequence[str] | None = None,
        username: str | None = None,
        password: str | None = None,
        tls: bool = False,
        tls_ca_certs: str | None = None,
        tls_certfile: str | None = None,
        tls_keyfile: str | None = None,
        tls_verify: bool = True,
        connect_timeout_s: float = 0.5,
        timeout_s: float = 1.0,
        retries: int = 2,
        breaker_failures: int = 3,
        breaker_cooldown_s: float = 1.0,
        ttl_s: float | None = None,
        compression: Compression = "none",
        key_prefix: str = "kvstore",
        mac: RecordMac | None = None,
        mac_threads: int | None = None,
        write_lanes: int = DEFAULT_WRITE_LANES,
        store_token_ids: bool = False,
    ) -> None:
        """Connect to one server (``url``, e.g. ``redis://[user:password@]host:6379/0``;
        ``rediss://`` for TLS) or to a Redis Cluster (``cluster_nodes``, seeds as ``host:port``).
        ``mac``: the records' MAC, keyed by the deployment secret (None: the public key).
        ``mac_threads``: threads of the MAC pool that hashes a batch's pages in parallel (None:
        ``record.default_mac_threads()``, by the cores; 0: the calling thread hashes them).
        ``write_lanes``: connections (per server) one batch of puts of pages of at least
        ``LANES_MIN_PAGE_BYTES`` is split over (smaller pages use one), each part
        hashed and sent at once (:mod:`kvstore.tiers.redis_lanes`); 1: one exchange. Gets are
        one exchange: they already hash each page as it arrives, and lanes measured slower.
        ``store_token_ids``: keep each block's token ids in its record (``security.
        store_token_ids``); by default they are left out (``record.stored_meta``).

        Raises :class:`ConfigError` for a bad setting or rejected credentials, and
        :class:`TierUnavailable` when no server answers within ``connect_timeout_s``.
        """
        super().__init__(name, layout, capacity_pages, metrics)
        validate(name, url, cluster_nodes, connect_timeout_s, timeout_s, retries,
                 breaker_failures, breaker_cooldown_s, ttl_s, compression, key_prefix)
        self.timeout_s = float(timeout_s)
        self.connect_timeout_s = float(connect_timeout_s)
        self.retries = int(retries)
        self.ttl_s = ttl_s
        self.compression: Compression = compression
        self._codec = CODECS[compression]
        self._zstd = load_zstd(required=compression == "zstd", tier=name)
        self._local = threading.local()  # zstd (de)compressors are not thread-safe
        self._prefix = key_prefix.encode() + b":"
        self._mac = mac if mac is not None else RecordMac(None)
        self.store_token_ids = bool(store_token_ids)
        if mac_threads is None:
            mac_threads = default_mac_threads()
        elif not isinstance(mac_threads, int) or not 0 <= mac_threads <= 256:
            raise InvalidArgument(
                f"redis tier {name!r}: mac_threads must be in [0, 256], got {mac_threads!r}"
            )
        #: Threads of the MAC pool (0: none, the calling thread hashes).
        self.mac_threads = mac_threads
        if not isinstance(write_lanes, int) or not 1 <= write_lanes <= 64:
            raise InvalidArgument(
                f"redis tier {name!r}: write_lanes must be in [1, 64], got {write_lanes!r}"
            )
        self.write_lanes = write_lanes
        #: Lanes a batch of puts really uses: ``write_lanes`` for pages of at least
        #: ``LANES_MIN_PAGE_BYTES``, else 1.
        self.put_lanes = write_lanes if layout.page_bytes >= LANES_MIN_PAGE_BYTES else 1
        self._lanes = Lanes(name, self.put_lanes)
        # Small pages go out FLUSH_BYTES at a time (redis_pool.py says why); large ones one by
        # one, each on its way while the next is hashed (2 MiB pages measured 0.69-0.83 of
        # LMCache so, 0.75 in 4 MiB sends: no gain to trade that overlap for).
        self._put_flush = FLUSH_BYTES if layout.page_bytes < LANES_MIN_PAGE_BYTES else 1
        self._hb = header_bytes(layout)
        self._rec_len = self._hb + layout.page_bytes
        self._window = max(1, _WINDOW_BYTES // self._rec_len)
        self._ttl_ms = b"%d" % max(1, round(ttl_s * 1000)) if ttl_s else None
        self._breaker_args = (breaker_failures, breaker_cooldown_s)
        self._lock = threading.Lock()
        #: pages this instance wrote and has not deleted or seen vanish -> the monotonic time by
        #: which their TTL has surely run out (inf: no TTL)
        self._owned: dict[bytes, float] = {}
        self._metas: OrderedDict[bytes, BlockMeta] = OrderedDict()
        #: Keys whose value failed verification when read (most recent last, bounded): present
        #: in Redis, but not pages — contains() answers False, so their owner's put rewrites them.
        self._rejected: OrderedDict[bytes, None] = OrderedDict()
        self._pools: dict[str, ServerPool] = {}
        self._cluster: Any = None
        self._refreshing = False
        self._last_refresh = 0.0
        self.oom_refused = 0  # puts refused because the server hit maxmemory

        self._connect = connection_settings(
            name, self.connect_timeout_s, url, cluster_nodes, username, password, tls,
            tls_ca_certs, tls_certfile, tls_keyfile, tls_verify,
        )
        version = probe(self._connect, cluster=cluster_nodes is not None)
        self._getex = ttl_s is not None and version >= (6, 2)
        if cluster_nodes is None:
            host, port = self._connect.seeds[0]
            self._single: ServerPool | None = self._pool_for(host, port)
        else:
            self._single = None
            self._cluster = connect_cluster(self._connect)

    # ----------------------------------------------------------------- hooks

    def _contains(self, keys: Sequence[bytes]) -> list[bool]:
        names = [self._name(k) for k in keys]
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

        self._call("contains", names, lambda i: (command(b"EXISTS", names[i]),), handle)
        self._count_refusals("contains", refusals)
        if gone:
            self._forget(gone, vanished="contains")
        with self._lock:
            rejected = self._rejected
            if rejected:
                found = [f and k not in rejected for k, f in zip(keys, found)]
        return found

    def _read(
        self, namespace_id: bytes, keys: Sequence[bytes], outs: Sequence[np.ndarray]
    ) -> list[bool]:
        names = [self._name(k) for k in keys]
        found = [False] * len(keys)
        gone: list[bytes] = []
        bad: dict[bytes, bool] = {}  # key whose value failed verification -> delete it?
        hits: list[BlockMeta] = []
        refusals = [0]
        hdr = bytearray(self._hb)
        hdr_mv = memoryview(hdr)
        rec_len, hb, page_bytes = self._rec_len, self._hb, self.layout.page_bytes
        max_len = hb + page_bytes + page_bytes // 64 + 4096  # raw, or compressed with overhead
        if self._getex:
            px = self._ttl_ms or b""
            build = lambda i: (command(b"GETEX", names[i], b"PX", px),)  # noqa: E731
        else:
            build = lambda i: (command(b"GET", names[i]),)  # noqa: E731

        def settle(i: int, got: BlockMeta | RecordError, hdr: Any) -> None:
            if isinstance(got, RecordError):
                self._bad(keys[i], got.reason, bad, hdr)
            else:
                found[i] = True
                hits.append(got)

        def handle(io: RespIO, i: int) -> bool:
            n = io.read_bulk_len()
            if isinstance(n, ReplyError):
                if n.prefix == "WRONGTYPE":  # something that is not a string under our prefix
                    self._bad(keys[i], "magic", bad)
                    return False
                return self._refused(n, refusals)
            if n < 0:
                gone.append(keys[i])
                return False
            out = outs[i]
            if n == rec_len:  # raw record: header, then the page straight into the caller's buffer
                if jobs is not None:  # verified on the MAC pool while the next page arrives
                    head = bytearray(hb)
                    io.read_into(memoryview(head))
                    io.read_into(out.data)
                    io.expect_crlf()
                    heads[i] = head
                    jobs.start(i, _attempt, self._verify, head, out, None, namespace_id, keys[i])
                    return False
                io.read_into(hdr_mv)
                digest = payload_digest(self._mac, hdr_mv)  # the MAC, fed as the page arrives
                io.read_into(out.data, digest)
                io.expect_crlf()
                settle(i, _attempt(self._verify, hdr_mv, out, digest, namespace_id, keys[i]),
                       hdr_mv)
            elif hb <= n <= max_len:
                rec = bytearray(n)
                io.read_into(memoryview(rec))
                io.expect_crlf()
                if jobs is not None:
                    heads[i] = rec
                    jobs.start(i, _attempt, self._verify_slow, rec, out, namespace_id, keys[i])
                else:
                    settle(i, _attempt(self._verify_slow, rec, out, namespace_id, keys[i]), rec)
            else:  # no record of this layout has this size: its header says whose it is
                got = min(n, hb)
                io.read_into(hdr_mv[:got])
                io.skip(n - got)
                io.expect_crlf()
                self._check_size(hdr_mv[:got], n, keys[i], bad)
            return False

        jobs = mac_jobs(len(keys), self.mac_threads)
        heads: dict[int, Any] = {}  # item -> its header (or record), for the pool's jobs
        if jobs is None:
            self._call("read", names, build, handle, window=self._window,
                       nbytes=len(names) * rec_len)
        else:
            with jobs:  # every job is done before the caller gets its buffers back
                self._call("read", names, build, handle, window=self._window,
                           nbytes=len(names) * rec_len)
            for i, got in jobs.results():
                settle(i, got, heads[i])
        self._count_refusals("read", refusals)
        if hits:
            self._remember(hits, refreshed=self._getex)
        if gone:
            self._forget(gone, vanished="read")
        if bad:
            self._reject(bad)
        return found

    def _write(self, metas: Sequence[BlockMeta], pages: Sequence[np.ndarray]) -> list[bool]:
        metas = [stored_meta(m, self.store_token_ids) for m in metas]  # also what meta() says
        return self._lanes.run(
            self._write_lane, len(metas), (metas, pages),
            lambda: self.metrics.errors.labels(self.name, "write").inc(),
        )

    def _write_lane(
        self, metas: Sequence[BlockMeta], pages: Sequence[np.ndarray]
    ) -> list[bool]:
        names = [self._name(m.key) for m in metas]
        stored = [False] * len(metas)
        tail = b"\r\n" + (b"$2\r\nPX\r\n$%d\r\n%s\r\n" % (len(self._ttl_ms), self._ttl_ms)
                          if self._ttl_ms else b"")
        extra = 2 if self._ttl_ms else 0
        oom = [0]
        refusals = [0]

        jobs = mac_jobs(len(metas), self.mac_threads)

        def build(i: int) -> Sequence[Any]:
            if jobs is None:
                header, payload = self._record(metas[i], pages[i])
            else:
                header, payload = _ahead(jobs, i, len(metas), self._record, metas, pages)
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

        nbytes, flush = len(names) * self._rec_len, self._put_flush
        if jobs is None:
            self._call("write", names, build, handle, nbytes=nbytes, flush=flush)
        else:
            with jobs:  # no job reads a caller's page after the call
                self._call("write", names, build, handle, nbytes=nbytes, flush=flush)
        if oom[0]:
            with self._lock:
                self.oom_refused += oom[0]
        self._count_refusals("write", refusals)
        done = [m for m, ok in zip(metas, stored) if ok]
        if done:
            deadline = time.monotonic() + self.ttl_s if self.ttl_s else math.inf
            with self._lock:
                self._owned.update(dict.fromkeys([m.key for m in done], deadline))
            self._remember(done)
        return stored

    def _delete(self, keys: Sequence[bytes]) -> int:
        names = [self._name(k) for k in keys]
        counts = [0] * len(keys)
        refusals = [0]

        def handle(io: RespIO, i: int) -> bool:
            reply = io.read_flag()
            if isinstance(reply, ReplyError):
                return self._refused(reply, refusals)
            counts[i] = int(reply)
            return False

        self._call("delete", names, lambda i: (command(b"DEL", names[i]),), handle)
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
        with self._lock:
            if key in self._rejected:
                return None
            meta = self._metas.get(key)
            if meta is not None:
                self._metas.move_to_end(key)
                return meta
        name = self._name(key)
        got: list[Any] = [None]  # the record, or (the value's size, its first bytes), or a reason
        max_len = self._hb + self.layout.page_bytes + self.layout.page_bytes // 64 + 4096

        def handle(io: RespIO, i: int) -> bool:
            n = io.read_bulk_len()
            if isinstance(n, ReplyError):
                if n.prefix == "WRONGTYPE":  # not a string under our prefix, as a read sees it
                    got[0] = "magic"
                    return False
                return self._is_moved(n)
            if n < 0:
                return False
            if self._hb <= n <= max_len:  # a record of this layout has such a size
                rec = bytearray(n)
                io.read_into(memoryview(rec))
                got[0] = rec
            else:  # none has: its header says whose it is (as a read classes it)
                head = bytearray(min(n, self._hb))
                io.read_into(memoryview(head))
                io.skip(n - len(head))
                got[0] = (n, head)
            io.expect_crlf()
            return False

        try:
            self._call("contains", [name], lambda i: (command(b"GET", name),), handle,
                       nbytes=max_len)
        except TierUnavailable:
            return None
        value = got[0]
        if value is None:  # gone
            return None
        if isinstance(value, str):
            reason = value
        elif isinstance(value, tuple):
            reason = _size_reason(value[1], value[0], self.layout)
        else:
            try:
                header, _ = decode_record(value, self.layout, self._mac, namespace_id=None,
                                          key=key)
            except RecordError as exc:
                reason = exc.reason
            else:
                meta = header.meta()
                self._remember([meta])
                return meta
        if reason in _DAMAGED:  # a merely foreign value is not ours to count or judge
            bad: dict[bytes, bool] = {}
            self._bad(key, reason, bad)
            self._reject(bad)
        return None

    def _keys(self) -> Iterator[bytes]:
        return iter(())  # a shared cache's keys are not this node's; see the module docstring

    def _used(self) -> int:
        return len(self._owned)

    def close(self) -> None:
        super().close()
        self._lanes.close()
        with self._lock:
            pools = list(self._pools.values())
            cluster, self._cluster = self._cluster, None
        for pool in pools:
            pool.close()
        if cluster is not None:
            with contextlib.suppress(Exception):  # closing is best effort
                cluster.close()

    # ----------------------------------------------------------------- introspection

    def server_stats(self) -> list[ServerStats]:
        """Per-server breaker state and counters (round trips, failures, fast rejections)."""
        with self._lock:
            pools = list(self._pools.values())
        return [p.stats() for p in pools]

    def ping(self) -> bool:
        """Whether every server answers now (one EXISTS through the tier's own path, bounded by
        ``timeout_s``; an open breaker answers False at once). For readiness checks."""
        self._check_open()
        name = self._prefix + b"ping"

        def handle(io: RespIO, i: int) -> bool:
            reply = io.read_flag()
            return isinstance(reply, ReplyError) and self._is_moved(reply)

        try:
            self._call("contains", [name], lambda i: (command(b"EXISTS", name),), handle)
        except TierUnavailable:
            return False
        return True

    def scan_keys(self, count: int = 1000) -> Iterator[bytes]:
        """Every page key under this tier's ``key_prefix`` on every server (a cluster's
        primaries), written by any node: SCAN, ``count`` names per step. For operations that
        must reach pages this node did not write (flushing a namespace); not for hot paths.
        Raises TierUnavailable when a server does not answer."""
        self._check_open()
        if self._single is not None:
            servers = [self._connect.seeds[0]]
        else:
            servers = [(n.host, int(n.port)) for n in self._cluster.get_primaries()]
        match = self._prefix + b"*"
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
                        hexkey = n[len(self._prefix):]
                        if len(hexkey) == 2 * KEY_BYTES:
                            with contextlib.suppress(ValueError):
                                yield bytes.fromhex(hexkey.decode("ascii", "replace"))
                    if cursor in (b"0", 0, "0"):
                        break
            except NET_ERRORS as exc:
                raise TierUnavailable(
                    f"redis tier {self.name!r}: {host}:{port} failed during SCAN: "
                    f"{type(exc).__name__}",
                    hint="check the redis servers, or retry") from None
            finally:
                conn.disconnect()

    # ----------------------------------------------------------------- the call

    def _call(
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
        failed (the base class counts it); counts an error when only some did (a cluster with
        one shard down)."""
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
                    f"redis tier {self.name!r}: no server answered {op} within {self.timeout_s}s",
                    hint="check the redis servers, or raise the tier's timeout_s",
                )
            self.metrics.errors.labels(self.name, op).inc()

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
                    CircuitBreaker(*self._breaker_args), tier=self.name,
                )
                self._pools[key] = pool
            return pool

    # ----------------------------------------------------------------- records

    def _name(self, key: bytes) -> bytes:
        return self._prefix + key.hex().encode()

    def _record(self, meta: BlockMeta, page: np.ndarray) -> tuple[bytes, Any]:
        """The header and payload of ``page``'s record (encoded by the codec, tagged by the MAC)."""
        payload, flags = self._encode(page)
        return encode_header(meta, self.layout, payload, self._mac, flags=flags), payload

    def _encode(self, page: np.ndarray) -> tuple[Any, int]:
        if not self._codec:
            return page, 0
        packed = self._compressor().compress(page)
        if len(packed) >= page.nbytes:
            return page, 0
        return packed, self._codec

    def _verify(
        self, hdr: Any, out: np.ndarray, digest: Any, ns: bytes, key: bytes
    ) -> BlockMeta:
        """Verify a raw record whose page already sits in ``out``, the caller's buffer: ``hdr``
        its header; ``digest`` the MAC's hasher (``record.payload_digest``) that the page was fed
        to as it arrived, or None to hash it here (on the MAC pool). Raises RecordError."""
        header = parse_header(hdr, self.layout)
        verify_layout(header, self.layout)
        if header.codec:
            raise RecordError(f"a page-sized payload of codec {header.codec}", reason="length")
        verify_payload(header, out, self._mac, digest)
        verify_identity(header, namespace_id=ns, key=key)  # authenticated by now
        return header.meta()

    def _verify_slow(self, rec: bytearray, out: np.ndarray, ns: bytes, key: bytes) -> BlockMeta:
        """Verify a record of another size (compressed, or damaged) and decode it into ``out``.
        Raises RecordError."""
        view = memoryview(rec)
        page_bytes = self.layout.page_bytes
        header, payload = decode_record(view, self.layout, self._mac, namespace_id=ns, key=key)
        if header.codec == 0:
            raise RecordError("raw payload of the wrong size", reason="length")
        if header.codec != CODEC_ZSTD or self._zstd is None:
            raise RecordError(f"unknown or unavailable codec {header.codec}", reason="codec")
        try:
            data = self._decompressor().decompress(payload, max_output_size=page_bytes)
        except self._zstd.ZstdError as exc:
            raise RecordError(f"zstd: {exc}", reason="codec") from None
        if len(data) != page_bytes:
            raise RecordError(f"decoded {len(data)} bytes", reason="length")
        out[:] = np.frombuffer(data, np.uint8)
        return header.meta()

    def _check_size(self, hdr: memoryview, n: int, key: bytes, bad: dict[bytes, bool]) -> None:
        """Classify a value of ``n`` bytes, a size no record of this layout has, by its header
        (``hdr``, its first bytes; not authenticated: its payload was not read): another
        layout's or version's well-formed record is left for its readers; anything else --
        this layout's header on a value of the wrong size, whatever namespace it names -- is
        damage."""
        self._bad(key, _size_reason(hdr, n, self.layout), bad)

    def _bad(self, key: bytes, reason: str, bad: dict[bytes, bool], hdr: Any = None) -> None:
        """Count a value that failed verification and note whether to delete it. ``hdr``: its
        header, authenticated when ``reason`` is ``namespace`` (the only identity failure
        that leaves a value alone, and only once the MAC verified it)."""
        self.count_corrupt(reason)
        bad[key] = reason in _DAMAGED or (
            reason == "namespace" and not _genuine(hdr, key, self.layout)
        )

    def _reject(self, bad: dict[bytes, bool]) -> None:
        """After a read: remember the keys whose values failed verification (``contains``
        answers absent for them, so their owner's next put overwrites them) and delete the
        damaged ones."""
        with self._lock:
            rejected = self._rejected
            for key in bad:
                rejected[key] = None
                rejected.move_to_end(key)
                self._metas.pop(key, None)
            while len(rejected) > _META_CACHE:
                rejected.popitem(last=False)
        damaged = [k for k, delete in bad.items() if delete]
        if damaged:
            with contextlib.suppress(TierUnavailable):  # else the next reader finds it again
                self._delete(damaged)

    def _compressor(self) -> Any:
        c = getattr(self._local, "c", None)
        if c is None:
            c = self._local.c = self._zstd.ZstdCompressor(level=1)
        return c

    def _decompressor(self) -> Any:
        d = getattr(self._local, "d", None)
        if d is None:
            d = self._local.d = self._zstd.ZstdDecompressor()
        return d

    # ----------------------------------------------------------------- bookkeeping

    def _remember(self, metas: Sequence[BlockMeta], *, refreshed: bool = False) -> None:
        """Headers just written or verified by a read: cached for meta(), no longer rejected.
        ``refreshed``: the read reset their TTL (GETEX), so owned pages expire later."""
        deadline = time.monotonic() + self.ttl_s if refreshed and self.ttl_s else None
        with self._lock:
            cache, owned = self._metas, self._owned
            for m in metas:
                cache[m.key] = m
                cache.move_to_end(m.key)
                self._rejected.pop(m.key, None)
                if deadline is not None and m.key in owned:
                    owned[m.key] = deadline
            while len(cache) > _META_CACHE:
                cache.popitem(last=False)

    def _forget(self, keys: Sequence[bytes], *, vanished: str = "") -> None:
        """Keys deleted, or that a server answered absent to operation ``vanished``: an owned
        page whose TTL has surely run out by now is counted expired."""
        now, expired = time.monotonic(), 0
        with self._lock:
            owned, rejected = self._owned, self._rejected
            for k in keys:
                deadline = owned.pop(k, None)
                if vanished and deadline is not None and deadline <= now:
                    expired += 1
                rejected.pop(k, None)
        if expired:
            self.count_expired(expired, vanished)

    def _is_moved(self, reply: ReplyError) -> bool:
        return self._cluster is not None and reply.prefix in ("MOVED", "ASK")

    def _refused(self, reply: ReplyError, refusals: list[int]) -> bool:
        """An error answer to one command: True to re-route it (MOVED/ASK), else counted in
        ``refusals`` (NOPERM, READONLY, LOADING, CLUSTERDOWN...: the item is a miss/refused)."""
        if self._is_moved(reply):
            return True
        refusals[0] += 1
        return False

    def _count_refusals(self, op: str, refusals: list[int]) -> None:
        if refusals[0]:  # the server answers but will not serve: one error per call
            self.metrics.errors.labels(self.name, op).inc()

    # ----------------------------------------------------------------- cluster topology

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


def _ahead(
    jobs: MacJobs, i: int, n: int, record: Any, metas: Sequence[BlockMeta],
    pages: Sequence[np.ndarray],
) -> tuple[bytes, Any]:
    """Item ``i``'s ``record(metas[i], pages[i])`` from the MAC pool, having started the
    records of the items after it (in index order, two per pool thread ahead): the pool hashes
    the next pages while the calling thread sends this one."""
    for k in range(i, min(n, i + 1 + 2 * jobs.threads)):
        if k not in jobs:
            jobs.start(k, record, metas[k], pages[k])
    return jobs.result(i)


def _attempt(verify: Any, *args: Any) -> BlockMeta | RecordError:
    """``verify(*args)``, or the RecordError it raised."""
    try:
        return verify(*args)
    except RecordError as exc:
        return exc


def _size_reason(hdr: Any, n: int, layout: KVLayout) -> str:
    """Why a value of ``n`` bytes, a size no record of ``layout`` has, is not a page, by its
    first bytes ``hdr``: another layout's or version's reason (left for its readers), else
    ``length`` (damage)."""
    try:
        verify_layout(parse_header(hdr, layout), layout)
    except RecordError as exc:
        return exc.reason
    return "length"


def _genuine(hdr: Any, key: bytes, layout: KVLayout) -> bool:
    """Whether an authenticated header that failed the namespace check is nonetheless a
    self-consistent record of ``key`` (another tenant's page asked for under the wrong
    namespace: leave it alone)."""
    if hdr is None:
        return False
    try:
        header = parse_header(hdr, layout)
    except RecordError:
        return False
    return header.key == key and header.chains()


__all__ = ["CODEC_ZSTD", "RedisTier", "ServerStats"]
