""":class:`DaemonStore`: the sidecar daemon seen as a store. It exposes the part of
:class:`~kvstore.store.TieredStore` the in-process connector uses (``lookup``/``release``/
``narrow``, ``prepare_load``/``complete_load``, ``prepare_store``/``complete_store``/``abort``,
``prefetch``, ``tier(name).contains/count_leading``, ``staging_tier``, ``layout``, ``tiers``,
``metrics``, ``read_bandwidth``, ``write_policy``), so :class:`~connector.inprocess.
InProcessScheduler` and :class:`~connector.inprocess.InProcessWorker` run over it unchanged.

Its parts, each a class of its own: the connection -- control over gRPC and the local lane, the
session, reconnects -- is a :class:`~connector.daemon.session.Session`; the daemon's shared
memory as this client maps it (pages move through it on the daemon's node) a
:class:`~connector.daemon.session_memory.SessionMemory`; the open handles and the leases'
namespaces :class:`~connector.daemon.holdings.Holdings`; the namespaces' labels and failure
counts told to the daemon :class:`~connector.daemon.namespace_reports.NamespaceReports`; the
byte path (pages over the wire, for a TCP client) :class:`~connector.daemon.wire_pages.WirePages`.

Failure: when the daemon cannot be reached, calls degrade instead of failing the engine: a
lookup is a miss, a load pins nothing, a save is refused -- the engine recomputes -- and each
failure is counted (``kvstore_daemon_client_failures_total{call}``, :attr:`DaemonStore.failures`).
The client reconnects on a later call (at most every ``reconnect_interval_s``) once it holds no
open handle (see :mod:`.session`).

Namespaces: one client serves any number of namespaces over its one session (an engine whose
requests carry their own tenant salt, LoRA or cache salt). Calls that create or use a handle name
their namespace (``prepare_load``, ``complete_load``) or derive it (``prepare_store`` and its
handle from the blocks; ``release``/``narrow`` from the lookup that granted the lease); a lookup
names it with ``namespace_id=`` or through a one-namespace view (:meth:`DaemonStore.scoped`),
which is what a per-namespace scheduler is given. ``namespace_id`` at construction is only the
default of calls that name none.
"""

from __future__ import annotations

import itertools
import secrets
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from connector.daemon.errors import DaemonUnavailable
from connector.daemon.holdings import Holdings
from connector.daemon.namespace_reports import NamespaceReports
from connector.daemon.session import Session
from connector.daemon.session_memory import SessionMemory
from connector.daemon.stats import DaemonStats, DaemonTierStats
from connector.daemon.views import DaemonNamespace, RemoteTier
from connector.daemon.wire_events import events_from_wire
from connector.daemon.wire_pages import WirePages
from connector.daemon.wire_retention import budget_request, read_retention
from connector.proto import kvstore_daemon_pb2 as pb
from kvstore.checks import check_keys
from kvstore.api import StoreAPI
from kvstore.buffers import page_views
from kvstore.errors import InvalidArgument, LeaseError, QuotaExceeded
from kvstore.event_log import EventBatch, Snapshot
from kvstore.retention import Pin, RetentionInfo
from kvstore.keys import BlockMeta, pack_keys
from kvstore.layout import KVLayout
from kvstore.metrics import Metrics
from kvstore.namespace_labels import check_label
from kvstore.namespace_stats import NamespaceCounters, NamespaceCounts
from kvstore.results import Lease, LookupResult, PutResult, load_estimates, merge_runs
from kvstore.staging import LoadHandle, StoreHandle, copy_in, copy_out

# distinct from in-process stores' owner ids, and (random base) from other processes' clients:
# a lease or handle pickled into another process is never mistaken for one of its own
_owners = itertools.count((1 << 40) + (secrets.randbits(30) << 10))


class DaemonStore:
    """A connection to ``kvstore serve`` at ``target`` (``unix:///path/kvstore.sock``, or
    ``host:port`` for TCP with ``token``). ``namespace_id``: the default namespace of calls that
    name none (lookup, delete, read_pages, watch); None: such calls must name one (see the
    module docstring). ``timeout_s``: the deadline of each call; ``prefetch_timeout_s`` of a
    prefetch. ``secret``: the deployment secret (``security.secret``, the daemon's), which
    keys the seals of the pages :meth:`read_pages` and :meth:`write_pages` move over the wire
    (None: the public key, an integrity check only). Raises DaemonUnavailable when the first
    connection fails (a later outage only degrades, see the module docstring)."""

    def __init__(self, target: str, namespace_id: bytes | None = None, *, token: str | None = None,
                 timeout_s: float = 5.0, prefetch_timeout_s: float = 30.0,
                 connect_timeout_s: float = 5.0, reconnect_interval_s: float = 0.5,
                 max_message_bytes: int = 64 << 20, metrics: Metrics | None = None,
                 secret: bytes | None = None, lane: bool = True) -> None:
        if namespace_id is not None:
            _check_ns(namespace_id)
        self.namespace_id = namespace_id
        self.prefetch_timeout_s = prefetch_timeout_s
        self.metrics = metrics if metrics is not None else Metrics()
        self._memory = SessionMemory()
        self._holdings = Holdings()
        self._session = Session(
            target[len("tcp://"):] if target.startswith("tcp://") else target,
            memory=self._memory, busy=self._holdings.busy, on_session=self._on_session,
            token=token, timeout_s=timeout_s, connect_timeout_s=connect_timeout_s,
            reconnect_interval_s=reconnect_interval_s, max_message_bytes=max_message_bytes,
            lane=lane)
        # the settings as given (read-only: the session took its copy)
        self.target = self._session.target
        self.timeout_s = timeout_s
        self.connect_timeout_s, self.reconnect_interval_s = connect_timeout_s, reconnect_interval_s
        self._wire = WirePages(self._session.md, secret, self.metrics)
        self._m_fail = self.metrics.counter(
            "kvstore_daemon_client_failures", "Daemon calls that failed to reach it.", ["call"])
        self.failures: Counter[str] = Counter()
        #: calls answered, by path: "lane", "grpc"
        self.calls: Counter[str] = self._session.calls
        #: load-or-recompute declines counted in this process (as the decisions metric is)
        self.namespace_counts = NamespaceCounters()
        self.owner = next(_owners)
        self._bandwidth: dict[str, float] = {}
        self._pool = ThreadPoolExecutor(4, thread_name_prefix="kvstore-daemon-client")
        self._reports = NamespaceReports(self._session.call, self._pool, self._failed)
        self._remote_tiers = False  # learnt from each lookup reply
        info = self._session.connect()
        self.layout = KVLayout(info.layout.num_layers, info.layout.num_kv_heads,
                               info.layout.head_dim, info.layout.block_size, info.layout.dtype,
                               info.layout.block_format)
        self._memory.layout_page_bytes = self.layout.page_bytes
        self.tiers: list[RemoteTier] = [RemoteTier(self._memory, self._contains, t)
                                        for t in info.tiers]
        self._staging = info.staging_tier
        self.write_policy: str = info.write_policy
        self.lease_ttl_s: float = info.lease_ttl_s

    # ----------------------------------------------------------------- connection

    def _on_session(self) -> None:
        self._reports.retell()  # a new session: the daemon may be a new process

    def _failed(self, call: str) -> None:
        self.failures[call] += 1
        self._m_fail.labels(call).inc()

    @property
    def connected(self) -> bool:
        return self._session.connected

    def wait_connected(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for a live session (after an outage); True if there is one."""
        return self._session.wait_connected(timeout_s)

    # ----------------------------------------------------------------- the store's surface

    def staging_tier(self, name: str | None = None) -> RemoteTier:
        tier = self.tier(name or self._staging)
        if tier.name != self._staging:
            raise InvalidArgument(f"tier {name!r} is not the daemon's staging tier",
                                  hint=f"the daemon stages through {self._staging!r}")
        return tier

    @property
    def closed(self) -> bool:
        return self._session.closed

    @property
    def open_store_handles(self) -> int:
        """This client's saves prepared and not yet completed or aborted."""
        return self._holdings.open_store_handles

    def check_integrity(self) -> None:
        """The daemon checks its store's invariants; AssertionError naming the first broken."""
        error = self.stats(check_integrity=True).integrity_error
        assert not error, error

    @property
    def tier_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.tiers)

    @property
    def commits_pool_itself(self) -> bool:
        return False  # the engine's pool is not the daemon's: every save is the connector's

    def tier(self, name: str) -> RemoteTier:
        for t in self.tiers:
            if t.name == name:
                return t
        raise InvalidArgument(f"no tier named {name!r}",
                              hint=f"tiers are {[t.name for t in self.tiers]}")

    def read_bandwidth(self, tier_name: str) -> float | None:
        self.tier(tier_name)
        return self._bandwidth.get(tier_name) or None

    def _ns(self, namespace_id: bytes | None) -> bytes:
        """``namespace_id``, else the default one; InvalidArgument when there is neither."""
        if namespace_id is not None:
            return _check_ns(namespace_id)
        if self.namespace_id is None:
            raise InvalidArgument(
                "this DaemonStore has no default namespace and the call names none",
                hint="pass namespace_id=, or use DaemonStore.scoped(namespace_id)")
        return self.namespace_id

    def scoped(self, namespace_id: bytes) -> DaemonNamespace:
        """A view of this client whose lookups (and deletes) are under ``namespace_id``; it
        shares the connection, the session and the slab mapping."""
        return DaemonNamespace(self, _check_ns(namespace_id))

    def lookup(self, keys: Sequence[bytes], *, lease: bool = False, local_only: bool = False,
               namespace_id: bytes | None = None) -> LookupResult:
        """As :meth:`TieredStore.lookup`, under ``namespace_id`` (default: the client's); a
        miss when the daemon is down. A granted lease remembers its namespace."""
        check_keys(keys)
        ns = self._ns(namespace_id)
        req = pb.LookupRequest(session_id=self._session.session_id, namespace_id=ns,
                               keys=pack_keys(keys), lease=lease, local_only=local_only)
        try:
            r = self._session.lookup_call(req)
        except DaemonUnavailable:
            self._failed("lookup")
            return LookupResult(0, ())
        except QuotaExceeded:  # the session holds its limit of handles and leases: recompute
            self._failed("quota")
            return LookupResult(0, ())
        except LeaseError:  # the daemon ended this session (it may be draining): a new one
            self._failed("lookup")
            self._session.lost()
            return LookupResult(0, ())
        self._bandwidth = {b.tier: b.bytes_per_s for b in r.bandwidth}
        self._remote_tiers = r.has_remote_tiers
        granted = None
        if r.lease_id:
            granted = Lease(r.lease_id, tuple(keys[: r.num_blocks]),
                            time.monotonic() + r.lease_ttl_s, self.owner, r.lease_ticket)
            self._holdings.remember_lease(granted, ns)
        runs = r.runs
        if len(runs) == 1:  # the usual hit, in one tier
            tiers: tuple[str, ...] = (runs[0].tier,) * runs[0].blocks
        else:
            tiers = tuple(itertools.chain.from_iterable(
                itertools.repeat(run.tier, run.blocks) for run in runs))
        load_s = load_estimates(merge_runs(((run.tier, run.blocks) for run in runs), len(tiers)),
                                self._memory.page_bytes,
                                lambda t: self._bandwidth.get(t) or None) if tiers else ()
        return LookupResult(r.num_blocks, tiers, granted, load_s)

    def lookup_async(self, keys: Sequence[bytes], *, lease: bool = False,
                     namespace_id: bytes | None = None) -> Future[LookupResult]:
        """:meth:`lookup` of every tier of the daemon's store, on a thread of this client."""
        ns = self._ns(namespace_id)
        return self._pool.submit(self.lookup, list(keys), lease=lease, namespace_id=ns)

    def _take_lease(self, lease: Lease, namespace_id: bytes | None = None) -> tuple[bytes, bytes]:
        """The namespace ``lease`` was granted under (forgotten: the lease is being used up)
        and the ticket to send with it: b"" for a lease of this client's session; its ticket for
        one another process's client got from the daemon (vLLM's scheduler leases, its worker
        loads) -- the daemon hands it over to this session, under ``namespace_id``."""
        held = self._holdings.take_lease(lease.id) if lease.owner == self.owner else None
        if held is not None:
            return held, b""
        if lease.ticket and (namespace_id is not None or self.namespace_id is not None):
            return self._ns(namespace_id), lease.ticket
        raise LeaseError(f"lease {lease.id} is not one this client holds",
                         hint="a lease is released, narrowed or loaded once; another "
                              "process's lease needs its ticket and a namespace")

    def count_declined(self, namespace_id: bytes, num_blocks: int) -> None:
        """As :meth:`TieredStore.count_declined`: counted in this process's
        :attr:`namespace_counts`, and told to the daemon (its stats count it for the
        namespace) without waiting for the reply: a scheduler thread calls this."""
        _check_ns(namespace_id)
        if num_blocks:
            self.namespace_counts.add(namespace_id, NamespaceCounts(declined=num_blocks))
            self._reports.tell_declined(namespace_id, num_blocks)

    def count_failed(self, namespace_id: bytes, what: str, reason: str, num_blocks: int) -> None:
        """As :meth:`TieredStore.count_failed`: counted in this process's
        :attr:`namespace_counts` and told to the daemon without waiting for the reply (a
        worker's load or save path calls this). While the daemon is unreachable -- the usual
        cause of the failure -- the count waits here and is told to the next session, so the
        daemon's stats show it once it is back. InvalidArgument for a bad id or pair, before
        anything is counted."""
        _check_ns(namespace_id)
        delta = NamespaceCounts.of_failure(what, reason, num_blocks)
        if num_blocks:
            self.namespace_counts.add(namespace_id, delta)
            self._reports.tell_failed(namespace_id, what, reason, num_blocks)

    def label_namespace(self, namespace_id: bytes, label: str) -> None:
        """As :meth:`TieredStore.label_namespace`: told to the daemon without waiting for the
        reply, once per namespace per session (a per-namespace scheduler calls this when it is
        created). InvalidArgument for a bad id or label, before anything is sent."""
        _check_ns(namespace_id)
        check_label(label)
        self._reports.label(namespace_id, label)

    @property
    def has_remote_tiers(self) -> bool:
        """Whether the daemon's store has a shared (network) tier, as of the last lookup."""
        return self._remote_tiers

    def release(self, lease: Lease, *, namespace_id: bytes | None = None) -> None:
        """Release ``lease``: this client's, or another process's (by its ticket, under
        ``namespace_id`` or the default namespace)."""
        ns, ticket = self._take_lease(lease, namespace_id)
        try:
            self._session.call("Release", pb.LeaseRequest(session_id=self._session.session_id, namespace_id=ns,
                                                  lease_id=lease.id, lease_ticket=ticket))
        except DaemonUnavailable:
            self._failed("release")  # the daemon frees the session's leases itself

    def narrow(self, lease: Lease, n: int, *, namespace_id: bytes | None = None) -> Lease:
        ns, ticket = self._take_lease(lease, namespace_id)
        req = pb.LeaseRequest(session_id=self._session.session_id, namespace_id=ns,
                              lease_id=lease.id, keep=n, lease_ticket=ticket)
        try:
            r = self._session.call("Narrow", req)
        except DaemonUnavailable:
            self._failed("narrow")
            raise LeaseError("daemon unreachable: the lease is gone with its session") from None
        narrowed = Lease(r.lease_id, lease.keys[:n], time.monotonic() + r.lease_ttl_s,
                         self.owner, r.lease_ticket)
        self._holdings.remember_lease(narrowed, ns)
        return narrowed

    def _contains(self, tier: str, keys: Sequence[bytes]) -> tuple[list[bool], int]:
        keys = list(keys)
        if not keys:
            return [], 0
        # presence only: no namespace named (keys are namespaced by construction)
        try:
            r = self._session.call("Contains", pb.ContainsRequest(tier=tier, keys=keys))
        except DaemonUnavailable:
            self._failed("contains")
            return [False] * len(keys), 0
        return list(r.present), r.leading

    @property
    def shared_memory(self) -> bool:
        """This client maps the daemon's slab and a staging area (a Unix-socket client on the
        daemon's node); False over TCP, where pages move by :meth:`read_pages` and
        :meth:`write_pages`."""
        return self._memory.slab is not None

    def prepare_load(self, namespace_id: bytes, keys: Sequence[bytes], *,
                     lease: Lease | None = None, tier: str | None = None) -> LoadHandle:
        self._memory.require("prepare_load")
        keys = list(keys)
        ticket = b""
        if lease is not None:
            held = self._holdings.lease_namespace(lease.id) if lease.owner == self.owner else None
            if held is not None and held != namespace_id:
                raise InvalidArgument(f"lease {lease.id} belongs to another namespace",
                                      hint="load under the namespace of the lookup")
            _, ticket = self._take_lease(lease, namespace_id)  # the handle takes the lease over
        req = pb.PrepareLoadRequest(session_id=self._session.session_id, namespace_id=namespace_id,
                                    keys=keys, lease_id=lease.id if lease else 0, tier=tier or "",
                                    lease_ticket=ticket)
        try:
            r = self._session.call("PrepareLoad", req)
        except DaemonUnavailable as exc:
            self._failed("prepare_load")
            return LoadHandle(0, self.owner, self._staging, namespace_id, (), (), None,
                              self._memory.slab_view(), unavailable=str(exc))
        self._holdings.opened(r.handle_id)
        n = len(r.slots)
        return LoadHandle(r.handle_id, self.owner, self._staging, namespace_id, tuple(keys[:n]),
                          tuple(r.slots), lease, self._memory.slab_view())

    @property
    def peer_copy(self) -> bool:
        """The daemon copies this process's pages itself (``complete_store(pages=)``,
        ``complete_load(into=)``): one copy, on its copy threads."""
        return self._memory.peer_copy

    def _own_handle(self, handle: LoadHandle | StoreHandle) -> None:
        """Before a copy for ``handle``: it is one of this client's (another's rows are not
        this client's to write)."""
        if not isinstance(handle, (LoadHandle, StoreHandle)) or handle.owner != self.owner:
            raise InvalidArgument("the handle was issued by another store",
                                  hint="complete a handle on the store that prepared it")

    def complete_load(self, handle: LoadHandle, *, into: Any = None) -> int:
        if into is not None:
            self._own_handle(handle)
        views = None if into is None else page_views(into, self.layout, handle.num_blocks,
                                                     writable=True)
        if not handle.id:
            return 0
        self._holdings.ended_load(handle.id)
        segs = self._memory.segments(views)
        if views is not None and not segs:
            copy_out(handle, views)
        req = pb.HandleRequest(session_id=self._session.session_id, namespace_id=handle.namespace_id,
                               handle_id=handle.id, segments=segs)
        try:
            return int(self._session.call("CompleteLoad", req).num_blocks)
        except DaemonUnavailable:
            # the copy ran (or runs now) against the old mapping, whose pinned pages nobody
            # rewrote
            if views is not None and segs:
                copy_out(handle, views)
            self._failed("complete_load")
            return handle.num_blocks

    def prepare_store(self, metas: Sequence[BlockMeta], *, tier: str | None = None) -> StoreHandle:
        self._memory.require("prepare_store")
        metas = list(metas)
        ns = {m.namespace_id for m in metas}
        if len(ns) > 1:
            raise InvalidArgument("one prepare_store call takes blocks of one namespace")
        nsid = ns.pop() if ns else self._ns(None)
        blocks = [pb.Block(key=m.key, parent=m.parent, token_ids=m.token_ids) for m in metas]
        req = pb.PrepareStoreRequest(session_id=self._session.session_id, namespace_id=nsid,
                                     blocks=blocks, tier=tier or "")
        try:
            r = self._session.call("PrepareStore", req)
        except (DaemonUnavailable, QuotaExceeded) as exc:
            self._failed("prepare_store" if isinstance(exc, DaemonUnavailable) else "quota")
            return StoreHandle(0, self.owner, self._staging, (), (), 0, len(metas),
                               self._memory.staging_view(),
                               unavailable=str(exc) if isinstance(exc, DaemonUnavailable) else "")
        self._holdings.opened(r.handle_id, nsid)
        return StoreHandle(r.handle_id, self.owner, self._staging,
                           tuple(metas[i] for i in r.block_index), tuple(r.slots), r.existing,
                           r.refused, self._memory.staging_view())

    def complete_store(self, handle: StoreHandle, ok: bool = True, *,
                       pages: Any = None) -> PutResult:
        if pages is not None:
            self._own_handle(handle)
        views = None if pages is None or not ok else page_views(
            pages, self.layout, handle.num_blocks, writable=False)
        if not handle.id:
            return PutResult(0, handle.existing, handle.refused + handle.num_blocks)
        segs = self._memory.segments(views)
        if views is not None and not segs:
            copy_in(handle, views)
        req = pb.HandleRequest(session_id=self._session.session_id, namespace_id=self._end_store_handle(handle),
                               handle_id=handle.id, ok=ok, segments=segs)
        try:
            r = self._session.call("CompleteStore", req)
        except DaemonUnavailable:
            self._failed("complete_store")
            return PutResult(0, handle.existing, handle.refused + handle.num_blocks)
        return PutResult(r.stored, r.existing, r.refused)

    def abort(self, handle: StoreHandle) -> None:
        if not handle.id:
            return
        req = pb.HandleRequest(session_id=self._session.session_id, namespace_id=self._end_store_handle(handle),
                               handle_id=handle.id)
        try:
            self._session.call("Abort", req)
        except DaemonUnavailable:
            self._failed("abort")  # the daemon aborts the session's handles itself

    def _end_store_handle(self, handle: StoreHandle) -> bytes:
        """The namespace ``handle`` was prepared under (forgotten: the handle is being ended)."""
        ns = self._holdings.ended_store(handle.id)
        if ns is not None:
            return ns
        if handle.metas:
            return handle.metas[0].namespace_id
        raise LeaseError(f"store handle {handle.id} is not one this client has open",
                         hint="a store handle is completed or aborted once")

    def prefetch(self, namespace_id: bytes, keys: Sequence[bytes], *,
                 to: str | None = None) -> Future[int]:
        """Copy ``keys`` into tier ``to`` in the daemon; the future yields how many leading
        keys it holds when done (0 when the daemon is unreachable)."""
        req = pb.PrefetchRequest(namespace_id=namespace_id, keys=list(keys), to=to or "")

        def run() -> int:
            try:
                return int(self._session.call("Prefetch", req, self.prefetch_timeout_s).leading)
            except DaemonUnavailable:
                self._failed("prefetch")
                return 0

        return self._pool.submit(run)

    def delete(self, keys: Sequence[bytes], *, namespace_id: bytes | None = None) -> int:
        r = self._session.call("Delete", pb.DeleteRequest(namespace_id=self._ns(namespace_id),
                                                  keys=list(keys)))
        return int(r.deleted)

    def pin(self, namespace_id: bytes, keys: Sequence[bytes], *, ttl_s: float) -> Pin:
        """As :meth:`TieredStore.pin`, on the daemon's store (``expires_at`` on this process's
        monotonic clock)."""
        ns = self._ns(namespace_id)
        keys = list(keys)
        check_keys(keys)
        r = self._session.call("Pin", pb.PinRequest(namespace_id=ns, keys=keys, ttl_s=ttl_s))
        return Pin(int(r.pin_id), ns, tuple(keys), time.monotonic() + r.expires_in_s)

    def unpin(self, pin: Pin | int, *, namespace_id: bytes | None = None) -> bool:
        """As :meth:`TieredStore.unpin`."""
        pin_id = pin.id if isinstance(pin, Pin) else pin
        ns = self._ns(namespace_id if namespace_id is not None else (
            pin.namespace_id if isinstance(pin, Pin) else None))
        return bool(self._session.call("Unpin", pb.UnpinRequest(namespace_id=ns,
                                                                pin_id=pin_id)).removed)

    def set_budget(self, namespace_id: bytes, tier: str, nbytes: int | None) -> None:
        """As :meth:`TieredStore.set_budget`, on the daemon's store."""
        req = budget_request(self._ns(namespace_id), tier, nbytes, self.tier_names)
        self._session.call("SetBudget", req)

    def retention(self, namespace_id: bytes) -> RetentionInfo:
        """As :meth:`TieredStore.retention` (``expires_at`` on this process's monotonic clock)."""
        return read_retention(self._session.call, self._ns(namespace_id))

    def read_events(self, cursor: int | None = None, *, limit: int = 1024,
                    timeout_s: float = 0.0, epoch: bytes | None = None,
                    namespace_id: bytes | None = None) -> EventBatch:
        """As :meth:`TieredStore.read_events`, for one namespace (the default one): the
        daemon's log, whose epoch changes when the daemon restarts (an older cursor is then a
        gap). The daemon waits at most a second per call (``timeout_s`` beyond is cut)."""
        ns = self._ns(namespace_id)
        r = self._session.call("ReadEvents", pb.ReadEventsRequest(
            namespace_id=ns, cursor=cursor or 0, epoch=epoch or b"", limit=limit,
            timeout_s=timeout_s), timeout_s=self._session.timeout_s + timeout_s)
        return EventBatch(events_from_wire(r.events, ns), r.next_cursor, r.gap, r.closed,
                          r.epoch)

    def event_snapshot(self, *, namespace_id: bytes | None = None) -> Snapshot:
        """As :meth:`TieredStore.event_snapshot`, for one namespace (the default one)."""
        ns = self._ns(namespace_id)
        r = self._session.call("EventSnapshot", pb.EventSnapshotRequest(namespace_id=ns))
        return Snapshot(r.cursor, events_from_wire(r.events, ns), r.epoch)

    def stats(self, *, check_integrity: bool = False) -> DaemonStats:
        r = self._session.call("Stats", pb.StatsRequest(check_integrity=check_integrity))
        tiers = tuple(DaemonTierStats(t.name, t.kind, t.capacity_pages, t.used_pages,
                                      t.free_pages, t.hits, t.misses, t.writes, t.evictions)
                      for t in r.tiers)
        return DaemonStats(tiers, r.lookup_hit_blocks, r.lookup_miss_blocks, r.active_leases,
                           r.sessions, r.open_load_handles, r.open_store_handles,
                           r.integrity_checked, r.integrity_error)

    # ----------------------------------------------------------------- the byte path

    def read_pages(self, keys: Sequence[bytes], out: np.ndarray) -> int:
        """Read the pages of the leading ``keys`` held under ``namespace_id`` as bytes over the
        wire (the cross-node path) into ``out`` (``(len(keys), page_bytes)`` uint8). Returns how
        many leading pages arrived with a seal that verifies: a page whose seal does not is a
        miss (counted as ``kvstore_tier_corrupt_records{tier="wire",reason="mac"}``) and ends
        the run."""
        stub = self._session.ensure()
        ns, keys = self._ns(None), list(keys)
        return self._wire.read(stub, ns, keys, out, self.prefetch_timeout_s)

    def write_pages(self, metas: Sequence[BlockMeta], pages: np.ndarray) -> PutResult:
        """Store pages sent as bytes over the wire (the cross-node path), each sealed with the
        deployment secret: the daemon refuses (and counts) a page whose seal does not verify."""
        return self._wire.write(self._session.ensure(), metas, pages, self.prefetch_timeout_s)

    def watch(self, namespace_id: bytes | None = None) -> Iterator[tuple[str, str, tuple[bytes, ...]]]:
        """Cache events of a namespace as ``(kind, tier, keys)``, kind ``stored``/``removed``,
        until the daemon stops (cancel by closing the generator)."""
        stub = self._session.ensure()
        yield from self._wire.watch(stub, self._ns(namespace_id))

    # ----------------------------------------------------------------- GPU, close

    def register_for_dma(self) -> None:
        """Page-lock the slab and staging mappings for CUDA copies (cudaHostRegister; the slab
        read-only); CUDA only, lazy. Call before the worker registers a CUDA KV cache.
        Idempotent; a reconnect that maps a new daemon's memory registers that, and
        :meth:`close` unregisters."""
        self._memory.register_for_dma()

    @property
    def dma_registered(self) -> bool:
        return self._memory.dma

    def close(self) -> None:
        """End the session (the daemon frees what it still holds) and unmap the slab: close
        only after the worker using it was closed."""
        if self._session.closed:
            return
        self._session.stop()
        self._pool.shutdown(wait=True)
        self._session.close()
        self._memory.close()

    def __enter__(self) -> DaemonStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _check_ns(namespace_id: object) -> bytes:
    if not isinstance(namespace_id, bytes) or len(namespace_id) != 16:
        raise InvalidArgument(f"namespace_id must be 16 bytes, got {namespace_id!r}",
                              hint="pass Namespace.id")
    return namespace_id


#: the face, checked by mypy: DaemonStore is a StoreAPI
_FACE: type[StoreAPI] = DaemonStore

__all__ = ["DaemonNamespace", "DaemonStats", "DaemonStore", "DaemonTierStats", "RemoteTier"]
