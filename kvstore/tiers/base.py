"""The tier seam: one interface for HBM, host, disk and Redis.

A tier is a slot allocator of fixed-size pages of one :class:`KVLayout`. :class:`Tier` is a
template: its public methods validate arguments, time and count every call, and translate
failures; a concrete tier implements only the ``_contains / _read / _write / _delete`` hooks
(and ``_keys`` / ``_meta`` / ``_used``).

Contract of the public methods (batch operations on lists of keys; keys are 16-byte ``bytes``):

* ``contains(keys) -> list[bool]`` — whether each key is stored. ``count_leading(keys)`` — how many
  leading keys are stored (stops at the first absent one).
* ``read(namespace_id, keys, outs) -> list[bool]`` — copies each stored page into the caller's
  buffer ``outs[i]`` (a writable 1-D uint8 numpy array of ``page_bytes``) and returns which were
  read. A page that fails verification is dropped from the tier, counted as ``corrupt`` and
  reported False: a buffer whose flag is False holds unspecified bytes and must not be used.
* ``write(metas, pages) -> list[bool]`` — stores each page (read-only 1-D uint8 arrays of
  ``page_bytes``) under ``metas[i].key``, replacing any page of that key. ``metas[i]`` carries
  ``block_size`` token ids, or none (a page read back from a tier that stores none). False means
  refused (tier full, medium error); it is counted, never raised. The tier does not evict: the
  store decides what to evict and calls ``delete`` first.
* ``read`` and ``count_leading`` take an optional :class:`MissTally` that the call fills with
  why pages were missed (records dropped as corrupt, pages found expired, pages of a call that
  failed whole): the store attributes them to the namespace it read for.
* ``delete(keys) -> int`` — removes the keys; absent keys are ignored; returns how many existed.
* ``meta(key) -> BlockMeta | None`` — the stored identity of a page (used to write it to another
  tier), as the tier keeps it: a tier that writes records keeps the token ids only with its
  ``store_token_ids`` (``record.stored_meta``); ``keys()`` — every stored key (for rebuilding
  policy state after a warm restart).
* ``health()`` — whether the tier can serve now (readiness), ``scan_keys()`` — every key,
  other nodes' pages in a shared tier included (flushing a namespace), ``sync()`` — make
  acknowledged writes durable now, ``ttl_s`` — the sliding expiry of its pages, if any. The
  defaults fit a tier in memory or on a local disk; a tier over servers overrides them.

Every public method is thread-safe. Argument errors raise :class:`InvalidArgument` before anything
changes. Tiers never read the environment; their settings arrive through the constructor, as one
validated config model (:attr:`Tier.config_model`).
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Self

import numpy as np
from pydantic import ValidationError

from kvstore.errors import InvalidArgument, StoreClosed, TierUnavailable
from kvstore.checks import check_keys
from kvstore.keys import KEY_BYTES, BlockMeta
from kvstore.layout import KVLayout
from kvstore.metrics import Metrics, ServerStats, TierHealth, TierStats
from kvstore.tiers.config_base import TierConfigBase


@dataclass(slots=True)
class MissTally:
    """Why one ``read`` or ``count_leading`` call missed pages (the tier adds to it on the calling
    thread while the call runs): ``corrupt`` records dropped because they failed verification,
    ``expired`` pages found gone after their TTL ran out, ``failed`` pages of a call that failed
    whole (timeout, unreachable server, open breaker)."""

    corrupt: int = 0
    expired: int = 0
    failed: int = 0


class Tier(ABC):
    #: Registry name of the implementation ("host", "disk", "redis", "hbm").
    kind: ClassVar[str] = ""
    #: True when other processes or nodes add and remove this tier's pages (a shared Redis).
    #: Such a tier's ``keys()`` yields only what this process may adopt (possibly nothing), its
    #: contents can change under the store, and it does not refuse writes past
    #: ``capacity_pages`` — that is this node's budget, enforced by the store's policy.
    shared: ClassVar[bool] = False
    #: True when pages leave the process as records (:mod:`kvstore.record`): the constructor
    #: then takes the runtime arguments ``mac`` and ``store_token_ids``.
    writes_records: ClassVar[bool] = False
    #: Seconds an unused page lives before the medium drops it by itself (a sliding expiry each
    #: hit renews); None: a page stays until it is deleted.
    ttl_s: float | None = None

    #: This kind's config model (``kvstore.tiers.<kind>_config``): the one declaration of its
    #: settings, which the constructor reads; what no config can hold (an object, a secret key
    #: derived elsewhere) is a keyword argument of the constructor instead.
    config_model: ClassVar[type[TierConfigBase]] = TierConfigBase

    def __init__(
        self, config: TierConfigBase, layout: KVLayout, metrics: Metrics | None = None
    ) -> None:
        """``config``: a validated instance of :attr:`config_model`; the tier holds
        ``config.capacity // layout.page_bytes`` pages. Raises InvalidArgument for a config of
        another model or a capacity under one page (the config cannot know the layout)."""
        if not isinstance(config, self.config_model):
            raise InvalidArgument(
                f"{type(self).__name__} takes a {self.config_model.__name__}, got "
                f"{type(config).__name__}",
                hint=f"build one from settings with {type(self).__name__}.build(...) or "
                "kvstore.build.build_tier",
            )
        name = config.name
        capacity_pages = int(config.capacity) // layout.page_bytes
        if capacity_pages < 1:
            raise InvalidArgument(
                f"tier {name!r} holds {capacity_pages} pages of {layout.page_bytes} bytes",
                hint="raise the tier's capacity to at least one page",
            )
        #: The settings this tier was built with.
        self.config = config
        self.name = name
        self._tier_closed = False
        self.layout = layout
        self.capacity_pages = capacity_pages
        self.metrics = metrics if metrics is not None else Metrics()
        m = self.metrics
        self._m_hit = m.pages.labels(name, "read", "hit")
        self._m_miss = m.pages.labels(name, "read", "miss")
        self._m_stored = m.pages.labels(name, "write", "stored")
        self._m_refused = m.pages.labels(name, "write", "refused")
        self._m_deleted = m.pages.labels(name, "delete", "deleted")
        self._m_bytes_in = m.bytes.labels(name, "in")
        self._m_bytes_out = m.bytes.labels(name, "out")
        self._m_lat = {op: m.latency.labels(name, op) for op in ("contains", "read", "write", "delete")}
        m.occupancy.labels(name, "capacity").set(capacity_pages)
        self._tally = threading.local()  # .current: the MissTally of this thread's call, if any

    @classmethod
    def build(
        cls, name: str, layout: KVLayout, capacity_pages: int, metrics: Metrics | None = None,
        **settings: Any,
    ) -> Self:
        """The tier from loose settings, for code that sizes a tier in pages (tests, benchmarks,
        an engine's pool): ``settings`` that are fields of :attr:`config_model` build the
        config (validated: ConfigError naming each bad field, as
        :func:`kvstore.build.build_tier` raises); the rest go to the constructor as runtime
        arguments (e.g. a record tier's ``mac``)."""
        if not isinstance(capacity_pages, int) or isinstance(capacity_pages, bool):
            raise InvalidArgument(
                f"tier {name!r}: capacity_pages must be an int, got {capacity_pages!r:.40}",
                hint="give a whole number of pages (a config's capacity may be a size in bytes)",
            )
        fields = cls.config_model.model_fields
        runtime = {k: settings.pop(k) for k in list(settings) if k not in fields}
        try:
            config = cls.config_model(
                name=name, capacity=max(0, capacity_pages) * layout.page_bytes, **settings)
        except ValidationError as exc:
            from kvstore.config import tier_config_error  # kvstore.config imports the tiers

            raise tier_config_error(exc, name) from None
        return cls(config, layout, metrics, **runtime)

    # ----------------------------------------------------------------- public, instrumented

    def contains(self, keys: Sequence[bytes]) -> list[bool]:
        self._check_open()
        check_keys(keys)
        if not keys:
            return []
        t0 = time.perf_counter()
        try:
            return self._contains(keys)
        except TierUnavailable:
            self.metrics.errors.labels(self.name, "contains").inc()
            return [False] * len(keys)
        finally:
            self._m_lat["contains"].observe(time.perf_counter() - t0)

    def count_leading(self, keys: Sequence[bytes], tally: MissTally | None = None) -> int:
        check_keys(keys)
        return self.count_leading_checked(keys, tally)

    def count_leading_checked(self, keys: Sequence[bytes], tally: MissTally | None = None) -> int:
        """:meth:`count_leading` of ``keys`` the caller has checked (a store checks a lookup's
        keys once, not once per tier: a 32K-token prompt has 2048)."""
        self._check_open()
        if not keys:
            return 0
        self._tally.current = tally
        try:
            return self._count_leading(keys)
        except TierUnavailable:
            self.metrics.errors.labels(self.name, "contains").inc()
            if tally is not None:
                tally.failed += len(keys)
            return 0
        finally:
            self._tally.current = None

    def read(
        self, namespace_id: bytes, keys: Sequence[bytes], outs: Sequence[np.ndarray],
        tally: MissTally | None = None,
    ) -> list[bool]:
        self._check_open()
        check_keys(keys)
        if len(namespace_id) != KEY_BYTES:
            raise InvalidArgument(f"namespace id must be {KEY_BYTES} bytes, got {len(namespace_id)}")
        self._check_buffers(outs, len(keys), writable=True)
        if not keys:
            return []
        t0 = time.perf_counter()
        self._tally.current = tally
        try:
            found = self._read(namespace_id, keys, outs)
        except TierUnavailable:
            self.metrics.errors.labels(self.name, "read").inc()
            found = [False] * len(keys)
            if tally is not None:
                tally.failed += len(keys)
        finally:
            self._tally.current = None
        self._m_lat["read"].observe(time.perf_counter() - t0)
        hits = sum(found)
        self.count_reads(hits, len(keys) - hits)
        return found

    def write(self, metas: Sequence[BlockMeta], pages: Sequence[np.ndarray]) -> list[bool]:
        self._check_open()
        for meta in metas:
            # No token ids: a page read back from a tier that does not store them.
            if len(meta.key) != KEY_BYTES or len(meta.token_ids) not in (
                0, 4 * self.layout.block_size
            ):
                raise InvalidArgument(
                    f"block {meta.key.hex()} carries {len(meta.token_ids) // 4} tokens, "
                    f"layout block_size is {self.layout.block_size}"
                )
        self._check_buffers(pages, len(metas), writable=False)
        if not metas:
            return []
        t0 = time.perf_counter()
        try:
            stored = self._write(metas, pages)
        except TierUnavailable:
            self.metrics.errors.labels(self.name, "write").inc()
            stored = [False] * len(metas)
        self._m_lat["write"].observe(time.perf_counter() - t0)
        ok = sum(stored)
        self.count_writes(ok, len(metas) - ok)
        self._update_occupancy()
        return stored

    def delete(self, keys: Sequence[bytes]) -> int:
        self._check_open()
        check_keys(keys)
        if not keys:
            return 0
        t0 = time.perf_counter()
        try:
            n = self._delete(keys)
        except TierUnavailable:
            self.metrics.errors.labels(self.name, "delete").inc()
            n = 0
        self._m_lat["delete"].observe(time.perf_counter() - t0)
        self._m_deleted.inc(n)
        self._update_occupancy()
        return n

    def meta(self, key: bytes) -> BlockMeta | None:
        self._check_open()
        return self._meta(key)

    def keys(self) -> Iterator[bytes]:
        self._check_open()
        return self._keys()

    @property
    def used_pages(self) -> int:
        return self._used()

    @property
    def free_pages(self) -> int:
        return max(0, self.capacity_pages - self._used())

    def stats(self) -> TierStats:
        self._check_open()
        v = self.metrics.value
        n = self.name
        return TierStats(
            name=n,
            kind=self.kind,
            capacity_pages=self.capacity_pages,
            used_pages=self._used(),
            page_bytes=self.layout.page_bytes,
            hits=int(v("kvstore_tier_pages_total", tier=n, op="read", result="hit")),
            misses=int(v("kvstore_tier_pages_total", tier=n, op="read", result="miss")),
            writes=int(v("kvstore_tier_pages_total", tier=n, op="write", result="stored")),
            writes_refused=int(v("kvstore_tier_pages_total", tier=n, op="write", result="refused")),
            deletes=int(v("kvstore_tier_pages_total", tier=n, op="delete", result="deleted")),
            bytes_read=int(v("kvstore_tier_bytes_total", tier=n, direction="out")),
            bytes_written=int(v("kvstore_tier_bytes_total", tier=n, direction="in")),
            evictions=int(v("kvstore_tier_evictions_total", tier=n)),
            errors=sum(
                int(v("kvstore_tier_errors_total", tier=n, op=op))
                for op in ("contains", "read", "write", "delete")
            ),
            corrupt=int(
                sum(
                    s.value
                    for metric in self.metrics.corrupt.collect()
                    for s in metric.samples
                    if s.name.endswith("_total") and s.labels.get("tier") == n
                )
            ),
        )

    # ----------------------------------------------------------------- health and operations
    # Defaults for a tier in this process's memory or on a local disk; a tier over servers
    # (Redis) overrides ping, server_stats and scan_keys, a tier with a durable medium sync.

    def health(self) -> TierHealth:
        """Whether the tier can serve now: not once closed, nor while :meth:`ping` fails or a
        server's breaker is open; with :meth:`server_stats`. For readiness checks, not hot paths
        (it may take one round trip, bounded by the tier's timeout)."""
        if self.closed:
            return TierHealth(False, "closed")
        answered = self.ping()
        servers = tuple(self.server_stats())
        if not answered:
            return TierHealth(False, "a server did not answer within timeout_s", servers)
        if any(s.breaker == "open" for s in servers):
            return TierHealth(False, "a server's circuit breaker is open", servers)
        return TierHealth(True, "", servers)

    def ping(self) -> bool:
        """Whether the medium answers now (a tier over servers asks each, bounded by its
        timeout). Raises StoreClosed once closed."""
        self._check_open()
        return True

    def server_stats(self) -> Sequence[ServerStats]:
        """Each server's breaker state and counters, for a tier spread over servers; else none."""
        return ()

    def scan_keys(self) -> Iterator[bytes]:
        """Every page key the tier holds, pages other nodes wrote to a shared tier included
        (:meth:`keys` yields only what this node may adopt). For operations such as flushing a
        namespace, never hot paths. Raises TierUnavailable when the medium does not answer."""
        return iter(list(self.keys()))

    def sync(self) -> bool:
        """Make every write acknowledged so far as durable as the medium makes pages (power-safe,
        on a disk) now; False when that failed (logged and counted). Nothing to force where
        pages do not outlive the process."""
        self._check_open()
        return True

    def close(self) -> None:
        """Release the medium. Idempotent; every later call raises StoreClosed. A tier that
        holds a medium overrides this and calls ``super().close()`` first."""
        self._tier_closed = True

    @property
    def closed(self) -> bool:
        return self._tier_closed

    def _check_open(self) -> None:
        if self._tier_closed:
            raise StoreClosed(f"tier {self.name!r}")

    # ----------------------------------------------------------------- for implementations

    def count_corrupt(self, reason: str) -> None:
        """Count one record that failed verification (dropped, served as a miss)."""
        self.metrics.corrupt.labels(self.name, reason).inc()
        tally = getattr(self._tally, "current", None)
        if tally is not None:
            tally.corrupt += 1

    def count_expired(self, n: int, op: str) -> None:
        """Count ``n`` pages that ``op`` (read, contains) found gone after their TTL ran out
        (a tier with a TTL)."""
        self.metrics.expired.labels(self.name, op).inc(n)
        tally = getattr(self._tally, "current", None)
        if tally is not None:
            tally.expired += n

    def count_reads(self, hits: int, misses: int) -> None:
        """Count pages read (hits, with their bytes) and missed -- by ``read``, and by the
        store's staging path for loads that copy straight out of a slab."""
        self._m_hit.inc(hits)
        self._m_miss.inc(misses)
        self._m_bytes_out.inc(hits * self.layout.page_bytes)

    def count_writes(self, stored: int, refused: int = 0) -> None:
        """Count pages stored (with their bytes) and refused -- by ``write``, and by the store's
        staging path for pages published into a slab."""
        self._m_stored.inc(stored)
        self._m_refused.inc(refused)
        self._m_bytes_in.inc(stored * self.layout.page_bytes)

    def count_eviction(self, n: int = 1) -> None:
        self.metrics.evictions.labels(self.name).inc(n)

    def _update_occupancy(self) -> None:
        self.metrics.occupancy.labels(self.name, "used").set(self._used())

    def _count_leading(self, keys: Sequence[bytes]) -> int:
        n = 0
        for present in self._contains(keys):
            if not present:
                break
            n += 1
        return n

    @abstractmethod
    def _contains(self, keys: Sequence[bytes]) -> list[bool]: ...

    @abstractmethod
    def _read(
        self, namespace_id: bytes, keys: Sequence[bytes], outs: Sequence[np.ndarray]
    ) -> list[bool]: ...

    @abstractmethod
    def _write(self, metas: Sequence[BlockMeta], pages: Sequence[np.ndarray]) -> list[bool]: ...

    @abstractmethod
    def _delete(self, keys: Sequence[bytes]) -> int: ...

    @abstractmethod
    def _meta(self, key: bytes) -> BlockMeta | None: ...

    @abstractmethod
    def _keys(self) -> Iterator[bytes]: ...

    @abstractmethod
    def _used(self) -> int: ...

    # ----------------------------------------------------------------- validation

    def _check_buffers(self, bufs: Sequence[np.ndarray], n: int, *, writable: bool) -> None:
        if len(bufs) != n:
            raise InvalidArgument(f"{n} keys but {len(bufs)} page buffers")
        nbytes = self.layout.page_bytes
        for i, buf in enumerate(bufs):
            if not isinstance(buf, np.ndarray) or buf.dtype != np.uint8 or buf.ndim != 1:
                raise InvalidArgument(
                    f"page buffer {i} must be a 1-D uint8 numpy array, got "
                    f"{type(buf).__name__} {getattr(buf, 'dtype', '')} {getattr(buf, 'shape', '')}",
                    hint="convert pages with kvstore.buffers.page_views()",
                )
            if buf.nbytes != nbytes:
                raise InvalidArgument(
                    f"page buffer {i} is {buf.nbytes} bytes, the layout's pages are {nbytes}"
                )
            if not buf.flags.c_contiguous:
                raise InvalidArgument(f"page buffer {i} is not contiguous")
            if writable and not buf.flags.writeable:
                raise InvalidArgument(f"page buffer {i} is read-only; reads need writable buffers")
