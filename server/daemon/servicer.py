"""gRPC <-> domain: each method turns a request into a :class:`DaemonService` call and its
result into a reply; every kvstore error becomes a status through the one mapping in
:mod:`connector.daemon.errors`. No storage logic here."""

from __future__ import annotations

import functools
import hmac
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from itertools import groupby
from typing import Any, TypeVar

import grpc
import numpy as np

from connector.daemon.errors import message_of, status_of
from connector.daemon.wire_events import events_to_wire
from connector.daemon.wire_retention import budget_of, retention_to_wire
from connector.proto import kvstore_daemon_pb2 as pb
from connector.proto import kvstore_daemon_pb2_grpc as pb_grpc
from kvstore.errors import InvalidArgument, KVStoreError, QuotaExceeded
from kvstore.keys import BlockMeta
from kvstore.record import WIRE, RecordMac, wire_fields
from kvstore.results import PutResult
from server.daemon.handlers import Malformed
from server.daemon.service import DaemonService, check_namespace

log = logging.getLogger("kvstore.daemon")
F = TypeVar("F", bound=Callable[..., Any])
#: the longest a server stream waits between checks that its client is still there
_POLL_S = 0.5
#: the longest a ReadEvents call waits for an event (a client asks again), and the most events
#: one reply carries
_EVENTS_WAIT_S = 1.0
_EVENTS_LIMIT = 4096


#: the unary methods by name, undecorated: what the local lane calls (see Servicer.answer)
_ANSWERS: dict[str, Callable[..., Any]] = {}


def _unary(fn: F) -> F:
    """Answer a kvstore error with its status; an unexpected error with INTERNAL (logged)."""
    _ANSWERS[fn.__name__] = fn

    @functools.wraps(fn)
    def wrapper(self: Servicer, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            self.parsed(fn.__name__, request, context)
            return fn(self, request, context)
        except KVStoreError as exc:
            context.abort(status_of(exc), message_of(exc))
        except Exception as exc:  # noqa: BLE001 - the daemon keeps serving
            log.exception("%s failed", fn.__name__)
            context.abort(grpc.StatusCode.INTERNAL, message_of(exc))

    return wrapper  # type: ignore[return-value]


def _watched(ev: Any) -> list[tuple[Any, str]]:
    """What a WatchEvents watcher sees of one log event: (kind, tier) pairs -- a move is a
    removal from one tier and a store in the other; a cleared tier, a removal of nothing
    (watchers predate it: use ReadEvents)."""
    if ev.kind == "stored":
        return [(pb.CacheEvent.STORED, ev.tier)]
    if ev.kind == "moved":
        return [(pb.CacheEvent.REMOVED, ev.tier), (pb.CacheEvent.STORED, ev.to_tier)]
    if ev.kind == "removed":
        return [(pb.CacheEvent.REMOVED, ev.tier)]
    return []


def _metas(ns: bytes, blocks: Any) -> list[BlockMeta]:
    return [BlockMeta(ns, b.key, b.parent, b.token_ids) for b in blocks]


def _tier(name: str) -> str | None:
    return name or None


def _segments(flat: Any) -> np.ndarray | None:
    """A request's (address, length) pairs of the client's memory (peer copy); None: none."""
    if not len(flat):
        return None
    if len(flat) % 2:
        raise InvalidArgument(f"segments holds {len(flat)} numbers: (address, length) pairs")
    return np.array(flat, np.uint64).reshape(-1, 2)


def _runs(tiers: tuple[str, ...]) -> list[Any]:
    """Per-block tiers as runs of one tier; a prompt held in one tier (the usual hit) in one
    C-speed count instead of a walk over every block."""
    if not tiers:
        return []
    if tiers.count(tiers[0]) == len(tiers):
        return [pb.TierRun(tier=tiers[0], blocks=len(tiers))]
    return [pb.TierRun(tier=t, blocks=sum(1 for _ in g)) for t, g in groupby(tiers)]


def _error_reply(code: grpc.StatusCode, message: str) -> Any:
    return pb.LookupReply(error=pb.Status(code=code.value[0], message=message))


class Servicer(pb_grpc.KVStoreDaemonServicer):
    """``mac``: seals the pages ReadPages sends and verifies those WritePages receives (keyed
    by the deployment secret; None: the public key, an integrity check only)."""

    def __init__(self, service: DaemonService, stopping: threading.Event, *,
                 max_streams: int = 256, max_watchers: int = 64, mac: RecordMac | None = None,
                 lane_socket: str = "", shm_socket: str = "") -> None:
        #: the local lane's socket each handshake names ("": none is served)
        self.lane_socket = lane_socket
        self.shm_socket = shm_socket
        #: open LookupStream calls allowed at once (each holds a handler thread)
        self.max_streams = max_streams
        #: open WatchEvents calls allowed at once (each holds a handler thread)
        self.max_watchers = max_watchers
        self._watchers = 0
        self._mac = mac if mac is not None else RecordMac(None)
        #: pages received with a seal that does not verify (refused, never stored)
        self._m_bad_seal = service.store.metrics.corrupt.labels(WIRE, "mac")
        self.service = service
        self.stopping = stopping
        layout = service.store.layout
        self._layout = pb.Layout(
            num_layers=layout.num_layers, num_kv_heads=layout.num_kv_heads,
            head_dim=layout.head_dim, block_size=layout.block_size, dtype=layout.dtype,
            page_bytes=layout.page_bytes, block_format=layout.block_format)
        self._tiers = [pb.TierInfo(name=t.name, kind=t.kind, capacity_pages=t.capacity_pages)
                       for t in service.store.tiers]
        self._m_malformed = service.store.metrics.counter(
            "kvstore_daemon_malformed_requests", "Requests whose bytes did not parse.",
            ["method"])
        self._garbled_peers: OrderedDict[str, None] = OrderedDict()  # logged once each
        self._streams_lock = threading.Lock()
        self._streams: set[grpc.ServicerContext] = set()  # open LookupStream calls

    def parsed(self, method: str, request: Any, context: grpc.ServicerContext | None) -> None:
        """Raise InvalidArgument for a request that did not parse (:class:`Malformed`): counted
        per method, logged once per client (a client sending garbage in a loop fills no log)."""
        if not isinstance(request, Malformed):
            return
        self._m_malformed.labels(method).inc()
        peer = context.peer() if context is not None else "lane"
        with self._streams_lock:
            first = peer not in self._garbled_peers
            if first:
                if len(self._garbled_peers) >= 1024:
                    self._garbled_peers.popitem(last=False)
                self._garbled_peers[peer] = None
        if first:
            log.warning("%s: a %s of %d bytes that does not parse, from %s (logged once per "
                        "client; kvstore_daemon_malformed_requests counts them)", method,
                        request.type_name, request.size, peer)
        raise InvalidArgument(f"a malformed {request.type_name} ({request.size} bytes)")

    def _messages(self, method: str, requests: Iterator[Any],
                  context: grpc.ServicerContext) -> Iterator[Any]:
        for request in requests:
            self.parsed(method, request, context)
            yield request

    def answer(self, name: str, request: Any) -> Any:
        """The reply to unary call ``name`` made outside gRPC (the local lane,
        :mod:`server.daemon.lane`); raises what the call raises. Calls that read the gRPC
        context (Prefetch's deadline) are not answered this way."""
        return _ANSWERS[name](self, request, None)

    # ----------------------------------------------------------------- session

    def OpenSession(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        try:
            self.parsed("OpenSession", request, context)
            session, info = self.service.open_session()
        except KVStoreError as exc:
            context.abort(status_of(exc), message_of(exc))
        # a broken stream (client gone) or a cancel ends the session and frees what it held
        context.add_callback(lambda: self.service.close_session(session.id))
        store = self.service.store
        local = context.peer().startswith("unix:")
        yield pb.SessionInfo(
            session_id=info.session_id, layout=self._layout,
            shm_bytes=info.shm_bytes, slab_pages=self.service.staging.capacity_pages,
            staging_tier=info.staging_tier, tiers=self._tiers, write_policy=store.write_policy,
            lease_ttl_s=info.lease_ttl_s, staging_pages=info.staging_pages,
            # the lane and shared memory are for clients on this node: a TCP session is not
            # told where they are
            lane_socket=self.lane_socket if local else "",
            shm_socket=self.shm_socket if local else "")
        while context.is_active() and not self.stopping.is_set() and not session.ended.is_set():
            session.ended.wait(_POLL_S)
        self.service.close_session(session.id)

    # ----------------------------------------------------------------- lookup, leases

    @_unary
    def Lookup(self, request: Any, context: grpc.ServicerContext) -> Any:
        return self._lookup(request)

    def LookupStream(self, request_iterator: Iterator[Any],
                     context: grpc.ServicerContext) -> Iterator[Any]:
        """Lookups as messages of one call, answered in order; a failed one is answered with
        its status (``LookupReply.error``) and the stream goes on. Ends when the client ends it
        or the daemon stops (:meth:`close` cancels it)."""
        with self._streams_lock:
            if self.stopping.is_set():
                return
            full = len(self._streams) >= self.max_streams
            if not full:
                self._streams.add(context)
        if full:  # each stream holds a handler thread: past the limit, use unary Lookup
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                          f"{self.max_streams} lookup streams are open (daemon.max_sessions); "
                          "use the unary Lookup call")
        try:
            for request in request_iterator:
                try:
                    self.parsed("LookupStream", request, context)
                    reply = self._lookup(request)
                except KVStoreError as exc:
                    reply = _error_reply(status_of(exc), message_of(exc))
                except Exception as exc:  # noqa: BLE001 - the daemon (and the stream) go on
                    log.exception("LookupStream failed")
                    reply = _error_reply(grpc.StatusCode.INTERNAL, message_of(exc))
                yield reply
        except grpc.RpcError:
            pass  # the client cancelled or went away, or close() cancelled it
        finally:
            with self._streams_lock:
                self._streams.discard(context)

    def _lookup(self, request: Any) -> Any:
        found, ticket = self.service.lookup(request.session_id, request.namespace_id,
                                            request.keys, request.lease, request.local_only)
        store = self.service.store
        bw = [pb.TierBandwidth(tier=t.name, bytes_per_s=store.read_bandwidth(t.name) or 0.0)
              for t in store.tiers]
        lease = found.lease
        return pb.LookupReply(num_blocks=found.num_blocks, runs=_runs(found.tiers),
                              lease_id=lease.id if lease else 0,
                              lease_ttl_s=store.lease_ttl_s if lease else 0.0,
                              lease_ticket=ticket, bandwidth=bw,
                              has_remote_tiers=store.has_remote_tiers)

    def close(self) -> None:
        """End every open stream call (the daemon is stopping: ``stopping`` is set)."""
        with self._streams_lock:
            streams = list(self._streams)
        for context in streams:
            context.cancel()

    @_unary
    def Release(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.service.release(request.session_id, request.namespace_id, request.lease_id,
                             request.lease_ticket)
        return pb.Empty()

    @_unary
    def Narrow(self, request: Any, context: grpc.ServicerContext) -> Any:
        lease, ticket = self.service.narrow(request.session_id, request.namespace_id,
                                            request.lease_id, request.keep, request.lease_ticket)
        return pb.LeaseReply(lease_id=lease.id, lease_ttl_s=self.service.store.lease_ttl_s,
                             lease_ticket=ticket)

    @_unary
    def Contains(self, request: Any, context: grpc.ServicerContext) -> Any:
        present = self.service.contains(request.namespace_id, request.tier, list(request.keys))
        leading = next((i for i, p in enumerate(present) if not p), len(present))
        return pb.ContainsReply(present=present, leading=leading)

    # ----------------------------------------------------------------- staging path

    @_unary
    def PrepareLoad(self, request: Any, context: grpc.ServicerContext) -> Any:
        h = self.service.prepare_load(request.session_id, request.namespace_id, list(request.keys),
                                      request.lease_id, _tier(request.tier), request.lease_ticket)
        return pb.PrepareLoadReply(handle_id=h.id, slots=h.slots)

    @_unary
    def CompleteLoad(self, request: Any, context: grpc.ServicerContext) -> Any:
        n = self.service.complete_load(request.session_id, request.namespace_id, request.handle_id,
                                       _segments(request.segments))
        return pb.CompleteLoadReply(num_blocks=n)

    @_unary
    def PrepareStore(self, request: Any, context: grpc.ServicerContext) -> Any:
        ns = check_namespace(request.namespace_id)
        h, rows, dropped = self.service.prepare_store(request.session_id, ns,
                                                      _metas(ns, request.blocks), _tier(request.tier))
        index = {b.key: i for i, b in enumerate(request.blocks)}
        # the client writes the rows of its staging area; complete_store copies them to h.slots
        return pb.PrepareStoreReply(handle_id=h.id, block_index=[index[m.key] for m in h.metas],
                                    slots=rows, existing=h.existing,
                                    refused=h.refused + dropped)

    @_unary
    def CompleteStore(self, request: Any, context: grpc.ServicerContext) -> Any:
        r = self.service.complete_store(request.session_id, request.namespace_id,
                                        request.handle_id, request.ok, _segments(request.segments))
        return pb.PutReply(stored=r.stored, existing=r.existing, refused=r.refused)

    @_unary
    def Abort(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.service.abort(request.session_id, request.namespace_id, request.handle_id)
        return pb.Empty()

    # ----------------------------------------------------------------- the rest

    @_unary
    def Prefetch(self, request: Any, context: grpc.ServicerContext) -> Any:
        n = self.service.prefetch(request.namespace_id, list(request.keys), _tier(request.to),
                                  context.time_remaining())
        return pb.PrefetchReply(leading=n)

    @_unary
    def Delete(self, request: Any, context: grpc.ServicerContext) -> Any:
        return pb.DeleteReply(deleted=self.service.delete(request.namespace_id, list(request.keys)))

    @_unary
    def CountDeclined(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.service.count_declined(request.namespace_id, request.blocks)
        return pb.Empty()

    @_unary
    def CountFailed(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.service.count_failed(request.namespace_id, request.what, request.reason,
                                  request.blocks)
        return pb.Empty()

    @_unary
    def LabelNamespace(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.service.label_namespace(request.namespace_id, request.label)
        return pb.Empty()

    @_unary
    def Stats(self, request: Any, context: grpc.ServicerContext) -> Any:
        st = self.service.stats(request.check_integrity)
        tiers = [pb.TierStats(name=t.name, kind=t.kind, capacity_pages=t.capacity_pages,
                              used_pages=t.used_pages, hits=t.hits, misses=t.misses,
                              writes=t.writes, evictions=t.evictions,
                              free_pages=st.free_pages.get(t.name, 0))
                 for t in st.store.tiers]
        return pb.StatsReply(
            tiers=tiers, lookup_hit_blocks=st.store.lookup_hit_blocks,
            lookup_miss_blocks=st.store.lookup_miss_blocks, active_leases=st.store.active_leases,
            sessions=st.sessions, open_load_handles=st.open_loads,
            open_store_handles=st.open_stores, integrity_checked=st.integrity_checked,
            integrity_error=st.integrity_error)

    def WatchEvents(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        try:
            self.parsed("WatchEvents", request, context)
            ns = check_namespace(request.namespace_id)
        except KVStoreError as exc:
            context.abort(status_of(exc), message_of(exc))
        with self._streams_lock:
            full = self._watchers >= self.max_watchers
            if not full:
                self._watchers += 1
        if full:  # refused before anything is held for it
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                          f"{self.max_watchers} event watchers are open (daemon.max_watchers)")
        store = self.service.store
        try:
            start = store.read_events(namespace_id=ns)
            cursor, epoch = start.next_cursor, start.epoch
            dropped = 0
            while context.is_active() and not self.stopping.is_set():
                batch = store.read_events(cursor, timeout_s=_POLL_S, epoch=epoch,
                                          namespace_id=ns)
                if batch.gap:  # this watcher read too slowly: say how much it lost
                    dropped += batch.next_cursor - cursor
                    cursor, epoch = batch.next_cursor, batch.epoch
                    continue
                cursor = batch.next_cursor
                for ev in batch.events:
                    for kind, tier in _watched(ev):
                        yield pb.CacheEvent(kind=kind, tier=tier, keys=ev.keys,
                                            dropped_before=dropped)
                        dropped = 0
                if batch.closed and not batch.events:
                    return
        except KVStoreError as exc:
            context.abort(status_of(exc), message_of(exc))
        finally:
            self._unwatched()

    @_unary
    def ReadEvents(self, request: Any, context: grpc.ServicerContext) -> Any:
        ns = check_namespace(request.namespace_id)
        wait = min(float(request.timeout_s), _EVENTS_WAIT_S)
        if wait > 0:  # a waiting read holds a handler thread: within the watchers' budget
            with self._streams_lock:
                if self._watchers >= self.max_watchers:
                    wait = 0.0
                else:
                    self._watchers += 1
        try:
            batch = self.service.store.read_events(
                request.cursor or None, limit=max(1, min(request.limit or 1024, _EVENTS_LIMIT)),
                timeout_s=wait, epoch=request.epoch or None, namespace_id=ns)
        finally:
            if wait > 0:
                self._unwatched()
        return pb.EventBatchReply(events=events_to_wire(batch.events),
                                  next_cursor=batch.next_cursor, gap=batch.gap,
                                  closed=batch.closed, epoch=batch.epoch)

    @_unary
    def Pin(self, request: Any, context: grpc.ServicerContext) -> Any:
        ns = check_namespace(request.namespace_id)
        keys = self.service.checked_keys(ns, request.keys)
        held = self.service.store.pin(ns, keys, ttl_s=request.ttl_s)
        return pb.PinReply(pin_id=held.id, expires_in_s=request.ttl_s)

    @_unary
    def Unpin(self, request: Any, context: grpc.ServicerContext) -> Any:
        return pb.UnpinReply(removed=self.service.store.unpin(
            request.pin_id, namespace_id=check_namespace(request.namespace_id)))

    @_unary
    def SetBudget(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.service.store.set_budget(check_namespace(request.namespace_id), request.tier,
                                      budget_of(request))
        return pb.Empty()

    @_unary
    def Retention(self, request: Any, context: grpc.ServicerContext) -> Any:
        info = self.service.store.retention(check_namespace(request.namespace_id))
        # the store's clock is the default one (kvstore.build passes none): time.monotonic
        return retention_to_wire(info, time.monotonic())

    @_unary
    def EventSnapshot(self, request: Any, context: grpc.ServicerContext) -> Any:
        snap = self.service.store.event_snapshot(
            namespace_id=check_namespace(request.namespace_id))
        return pb.EventSnapshotReply(cursor=snap.cursor, events=events_to_wire(snap.events),
                                     epoch=snap.epoch)

    def _unwatched(self) -> None:
        with self._streams_lock:
            self._watchers -= 1

    def ReadPages(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        try:
            self.parsed("ReadPages", request, context)
            ns, keys = request.namespace_id, list(request.keys)
            for i, tier, page in self.service.read_pages(ns, keys):
                seal = self._mac.seal(wire_fields(b"R", ns, keys[i]), page)
                yield pb.Page(index=i, tier=tier, data=page.tobytes(), seal=seal)
        except KVStoreError as exc:
            context.abort(status_of(exc), message_of(exc))

    @_unary
    def WritePages(self, request_iterator: Any, context: grpc.ServicerContext) -> Any:
        """Pages stored in batches as they arrive: the daemon holds one batch of a stream, never
        the whole stream, and refuses one longer than ``max_keys_per_call`` pages with
        RESOURCE_EXHAUSTED at the first page past it (the batches before it are stored)."""
        page_bytes = self.service.store.layout.page_bytes
        limit = self.service.limits.max_keys_per_call
        batch = max(1, min(64, (16 << 20) // page_bytes))
        ns = b""
        metas: list[BlockMeta] = []
        buf = np.empty((batch, page_bytes), np.uint8)
        total = PutResult(0, 0, 0)
        forged = seen = 0
        for msg in self._messages("WritePages", request_iterator, context):
            seen += 1
            if seen > limit:
                raise QuotaExceeded(f"a WritePages stream of more than {limit} pages; the limit "
                                    "is daemon.max_keys_per_call", hint="split the call")
            ns = ns or check_namespace(msg.namespace_id)
            if msg.namespace_id and msg.namespace_id != ns:
                raise InvalidArgument("a WritePages stream names one namespace, in its first message")
            if len(msg.data) != page_bytes:
                raise InvalidArgument(f"page of block {msg.block.key.hex()[:64]} has "
                                      f"{len(msg.data)} bytes; the layout's page is {page_bytes}")
            b = msg.block
            if not self._mac.verify_seal(wire_fields(b"W", ns, b.key, b.parent, b.token_ids),
                                         msg.data, msg.seal):
                forged += 1  # not from a holder of the secret, or changed on the way
                continue
            buf[len(metas)] = np.frombuffer(msg.data, np.uint8)
            metas.append(BlockMeta(ns, b.key, b.parent, b.token_ids))
            if len(metas) == batch:
                total = _added(total, self.service.write_pages(ns, metas, buf))
                metas, buf = [], np.empty((batch, page_bytes), np.uint8)
        if metas:
            total = _added(total, self.service.write_pages(ns, metas, buf[: len(metas)]))
        if forged:
            self._m_bad_seal.inc(forged)
            log.warning("WritePages: %d page(s) refused: their seal does not verify (another "
                        "deployment secret, or changed on the way)", forged)
        return pb.PutReply(stored=total.stored, existing=total.existing,
                           refused=total.refused + forged)


def _added(a: PutResult, b: PutResult) -> PutResult:
    return PutResult(a.stored + b.stored, a.existing + b.existing, a.refused + b.refused)


class TokenAuth(grpc.ServerInterceptor):
    """Every call but health checks needs ``authorization: Bearer <token>`` (compared in
    constant time). The token is never logged."""

    OPEN = ("/grpc.health.v1.Health/",)

    def __init__(self, token: str) -> None:
        self._token = token.encode()

        def deny(request: Any, context: grpc.ServicerContext) -> Any:
            context.abort(grpc.StatusCode.UNAUTHENTICATED,
                          "missing or wrong bearer token (send 'authorization: Bearer <token>')")

        self._deny = grpc.unary_unary_rpc_method_handler(deny)
        self._deny_stream = grpc.stream_unary_rpc_method_handler(deny)
        self._deny_server_stream = grpc.unary_stream_rpc_method_handler(deny)
        self._deny_bidi = grpc.stream_stream_rpc_method_handler(deny)

    def intercept_service(self, continuation: Any, details: Any) -> Any:
        if details.method.startswith(self.OPEN):
            return continuation(details)
        sent = b""
        for key, value in details.invocation_metadata or ():
            if key == "authorization" and isinstance(value, str) and value.startswith("Bearer "):
                sent = value[len("Bearer "):].encode()
        if hmac.compare_digest(sent, self._token):
            return continuation(details)
        handler = continuation(details)
        if handler is None:
            return None
        if handler.request_streaming and handler.response_streaming:
            return self._deny_bidi
        if handler.request_streaming:
            return self._deny_stream
        if handler.response_streaming:
            return self._deny_server_stream
        return self._deny


__all__ = ["Servicer", "TokenAuth"]
