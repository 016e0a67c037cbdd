"""The daemon's domain layer: one :class:`~kvstore.store.TieredStore` shared by many client
sessions, with tenancy, quotas and per-session cleanup. No gRPC here (the servicer translates).

Sessions. A client opens one long-lived session (the servicer ties it to a server stream).
Every load handle, store handle and lease the client obtains is recorded in its session; when
the session closes -- the client closed it, or died and its stream broke -- the daemon
completes its load handles (unpins), aborts its store handles (frees the reserved slots
unpublished) and releases its leases, so a dead client leaks no slot. The store's handles never
time-expire by themselves (see :meth:`TieredStore.prepare_store`).

Tenancy. Every call names its namespace (``Namespace.id``, 16 bytes):

* a handle or lease is usable only by the session that got it (another session: NOT_FOUND, as
  if it did not exist) and only under the namespace it was made for (InvalidArgument);
* a page is loaded only under the namespace it was stored under (the staging tier checks);
* a stored block must chain from its namespace: its parent is the namespace seed, an earlier
  block of the same call, or a block held (or being written) under the same namespace. A parent
  held under *another* namespace is an error; a parent unknown everywhere (evicted) makes the
  block refused -- so no tenant can plant pages under another tenant's keys;
* a delete of a key held under another namespace is an error and deletes nothing;
* ``namespace_quota``: the staging-tier pages one namespace may hold (stored plus reserved);
  a store beyond it raises QuotaExceeded.

Shared memory. Clients map the host tier's slab read-only; each session that maps it also
gets a staging area of its own (:class:`~server.daemon.staging_area.StagingArea`), created at
its first :meth:`DaemonService.segments` call. A store handle's slots, as the client sees them,
are rows of that area; ``complete_store`` copies them into the slab slots the store reserved,
then publishes. A session without one (TCP) saves through :meth:`write_pages`.

Peer copy. A session whose client proved at MAP that the daemon may read and write its memory
(:mod:`connector.daemon.peer_memory`; ``daemon.peer_copy``) may instead name where its pages
are: ``complete_store`` reads them from the client's memory straight into the reserved slots,
``complete_load`` writes the pinned pages into the client's memory before it unpins -- one
copy each, split over the copy threads.

Thread-safety: every method may be called from many threads; the session table and each
session's records are guarded by one lock, never held during store I/O.
"""

from __future__ import annotations

import hmac
import itertools
import logging
import secrets
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import cast

import numpy as np

from kvstore.api import LocalStagingSlab
from kvstore.checks import check_keys
from kvstore.errors import InvalidArgument, KVStoreError, LeaseError, QuotaExceeded, TierUnavailable
from kvstore.keys import KEY_BYTES, BlockMeta, unpack_keys
from kvstore.namespace_labels import check_label
from kvstore.results import Lease, LookupResult, PutResult, StoreStats
from kvstore.staging import LoadHandle, StoreHandle
from kvstore.store import TieredStore
from connector.daemon.peer_memory import Peer, probe
from connector.daemon.shm import SharedSlab
from server.daemon.peer_copy import PeerCopy
from server.daemon.session import Segments, Session, SessionInfo
from server.daemon.staging_area import StagingArea
from server.daemon.tenancy import check_namespace, check_quota, chained

log = logging.getLogger("kvstore.daemon")


@dataclass(frozen=True, slots=True)
class Limits:
    max_keys_per_call: int = 1 << 16
    max_handles_per_session: int = 4096
    max_sessions: int = 256
    namespace_quota_pages: int | None = None
    #: rows of each session's staging area (its saves in flight, in pages); None: as many as
    #: the staging tier has slots
    staging_pages: int | None = None


@dataclass(frozen=True, slots=True)
class DaemonStats:
    store: StoreStats
    free_pages: dict[str, int]
    sessions: int
    open_loads: int
    open_stores: int
    integrity_checked: bool
    integrity_error: str


class DaemonService:
    def __init__(self, store: TieredStore, slab: SharedSlab, *, limits: Limits = Limits(),
                 copy_pool: ThreadPoolExecutor | None = None,
                 peer_copy: bool = False) -> None:
        self.store = store
        self.staging: LocalStagingSlab = store.staging_tier()
        self.slab = slab
        #: the slab as the staging tier's (P, page_bytes) rows: the daemon's writable mapping
        self._slab_rows = self.staging.slab
        self._copy_pool = copy_pool
        self._copy_threads = max(1, getattr(copy_pool, "_max_workers", 1))
        self.peer_copy = peer_copy
        self._peer = PeerCopy(self._slab_rows, store.layout, store.metrics)
        self._staging_pages = min(limits.staging_pages or self.staging.capacity_pages,
                                  self.staging.capacity_pages)
        self.limits = limits
        self._lock = threading.Lock()
        self._sessions: dict[str, Session] = {}
        #: lease id -> (the session holding it, its ticket): a lease handed to another process
        #: of the same engine (vLLM's scheduler looks up, its workers load) is taken over by
        #: the session that shows its ticket
        self._tickets: dict[int, tuple[Session, bytes]] = {}
        self._closing = False

    # ----------------------------------------------------------------- sessions

    def open_session(self) -> tuple[Session, SessionInfo]:
        with self._lock:
            if self._closing:
                raise KVStoreError("the daemon is shutting down", hint="reconnect once it is back")
            if len(self._sessions) >= self.limits.max_sessions:
                raise QuotaExceeded(f"{len(self._sessions)} sessions are open, the limit",
                                    hint="raise daemon.max_sessions")
            s = Session(secrets.token_hex(16))
            self._sessions[s.id] = s
        info = SessionInfo(s.id, self.slab.nbytes, self.staging.name, self.store.lease_ttl_s,
                           self._staging_pages)
        return s, info

    def segments(self, session_id: str) -> Segments:
        """The slab and the session's staging area (made at the first call)."""
        s = self._session(session_id)
        with self._lock:
            if s.staging is None:
                if s.id not in self._sessions:
                    raise LeaseError(f"session {s.id[:8]!r} closed during the call")
                s.staging = StagingArea(f"kvstore-staging-{s.id[:8]}", self._staging_pages,
                                        self.store.layout.page_bytes, self._copy_pool)
            return Segments(self.slab, s.staging)

    def attach_peer(self, session_id: str, pid: int, address: int, expect: bytes) -> bool:
        """Let the session copy by peer copy if process ``pid`` (the kernel's word for who is on
        the other end of its lane) reads back as holding ``expect`` at ``address``. Returns
        whether it may."""
        s = self._session(session_id)
        if not self.peer_copy:
            return False
        if not probe(pid, address, expect):
            log.info("session %s: no peer copy with process %d (the kernel did not let the daemon "
                     "read its memory: another user, another pid namespace, Yama or seccomp); its "
                     "host-memory saves go through its staging area", s.id[:8], pid)
            return False
        try:
            peer = Peer(pid, self._copy_threads)
        except OSError:
            return False  # it exited meanwhile
        with self._lock:
            old, s.peer = s.peer, peer
            if s.id not in self._sessions:  # closed meanwhile: close_session missed this one
                s.peer = None
                old = peer
        if old is not None:
            old.close()
        return s.peer is peer

    def close_session(self, session_id: str) -> None:
        """End a session: complete its loads, abort its stores, release its leases. Idempotent."""
        with self._lock:
            s = self._sessions.pop(session_id, None)
        if s is None:
            return
        with self._lock:
            loads, stores, leases = list(s.loads.values()), list(s.stores.values()), list(s.leases.values())
            for lease_id in s.leases:
                self._tickets.pop(lease_id, None)
            s.loads.clear(), s.stores.clear(), s.leases.clear(), s.staged.clear()
            staging, s.staging = s.staging, None
            peer, s.peer = s.peer, None
        if peer is not None:
            peer.close()
        for _, h in loads:
            _quietly(self.store.complete_load, h)
        for _, sh in stores:
            _quietly(self.store.abort, sh)
        for _, lease in leases:
            _quietly(self.store.release, lease)
        if staging is not None:
            staging.close()  # after a copy in progress (its handle was taken before) ends
        s.ended.set()

    def has_session(self, session_id: str) -> bool:
        with self._lock:
            return session_id in self._sessions

    def _session(self, session_id: str) -> Session:
        with self._lock:
            s = self._sessions.get(session_id)
        if s is None:
            if self._closing:  # a drain ended it: to the client, the daemon is going away
                raise TierUnavailable("the daemon is draining: its sessions are closed",
                                      hint="reconnect once it is back")
            raise LeaseError(f"session {session_id[:8]!r} is unknown or closed",
                             hint="open a session (OpenSession) and keep its stream open")
        return s

    def _record(self, s: Session, table: dict, rid: int, ns: bytes, obj: object) -> bytes:
        """Record ``obj`` in the session; a lease gets a ticket (returned; else b"")."""
        ticket = secrets.token_bytes(16) if table is s.leases else b""
        with self._lock:
            if s.id not in self._sessions:  # closed meanwhile: undo right away
                raise LeaseError(f"session {s.id[:8]!r} closed during the call")
            table[rid] = (ns, obj)
            if ticket:
                self._tickets[rid] = (s, ticket)
        return ticket

    def _check_room(self, s: Session) -> None:
        if s.num_records >= self.limits.max_handles_per_session:
            raise QuotaExceeded(
                f"session holds {s.num_records} handles and leases, the limit",
                hint="complete or abort handles; or raise daemon.max_handles_per_session")

    def _take(self, s: Session, table: dict, rid: int, ns: bytes, kind: str) -> object:
        with self._lock:
            entry = table.get(rid)
            if entry is None:
                raise LeaseError(f"{kind} {rid} is unknown, completed, or not this session's")
            if entry[0] != ns:
                raise InvalidArgument(f"{kind} {rid} belongs to another namespace",
                                      hint="name the namespace the handle was made for")
            del table[rid]
            if table is s.leases:
                self._tickets.pop(rid, None)
        return entry[1]

    def _take_lease(self, s: Session, lease_id: int, ns: bytes, ticket: bytes) -> Lease:
        """Lease ``lease_id`` taken out of the session that holds it: this one's, or -- with
        its ticket -- another's (a ticket that does not match is as if the lease did not
        exist: nothing changes)."""
        if not ticket:
            return cast(Lease, self._take(s, s.leases, lease_id, ns, "lease"))
        with self._lock:
            held = self._tickets.get(lease_id)
            if held is None or not hmac.compare_digest(held[1], ticket):
                raise LeaseError(f"lease {lease_id} is unknown, used up, or not this ticket's",
                                 hint="a lease is released, narrowed or loaded once")
            holder = held[0]
            if holder.leases[lease_id][0] != ns:
                raise InvalidArgument(f"lease {lease_id} belongs to another namespace",
                                      hint="load under the namespace of the lookup")
            _, lease = holder.leases.pop(lease_id)
            del self._tickets[lease_id]
        return cast(Lease, lease)

    # ----------------------------------------------------------------- checks

    def checked_keys(self, ns: bytes, keys: Sequence[bytes]) -> list[bytes]:
        """``keys`` of a call in ``ns``: InvalidArgument past ``max_keys_per_call`` or for a
        malformed key or namespace."""
        return self._keys(ns, keys)

    def _keys(self, ns: bytes, keys: Sequence[bytes]) -> list[bytes]:
        check_namespace(ns)
        keys = list(keys)
        if len(keys) > self.limits.max_keys_per_call:
            raise InvalidArgument(f"{len(keys)} keys in one call; the limit is "
                                  f"{self.limits.max_keys_per_call}", hint="split the call")
        check_keys(keys)
        return keys

    def _writing_under(self, ns: bytes) -> set[bytes]:
        with self._lock:
            return {m.key for s in self._sessions.values()
                    for n, h in itertools.chain(s.stores.values(), s.completing.values())
                    if n == ns for m in h.metas}

    # ----------------------------------------------------------------- lookup and leases

    def lookup(self, session_id: str, ns: bytes, packed_keys: bytes, lease: bool,
               local_only: bool = False) -> tuple[LookupResult, bytes]:
        """``packed_keys``: the keys as :func:`~kvstore.keys.pack_keys` sends them. Returns the
        result and, with a lease, its ticket (see :meth:`_take_lease`)."""
        check_namespace(ns)
        keys = unpack_keys(packed_keys, limit=self.limits.max_keys_per_call)
        s = self._session(session_id) if lease else None
        if s is not None:
            self._check_room(s)
        found = self.store.lookup(keys, lease=lease, local_only=local_only, namespace_id=ns)
        ticket = b""
        if s is not None and found.lease is not None:
            try:
                ticket = self._record(s, s.leases, found.lease.id, ns, found.lease)
            except LeaseError:
                _quietly(self.store.release, found.lease)
                raise
        return found, ticket

    def release(self, session_id: str, ns: bytes, lease_id: int, ticket: bytes = b"") -> None:
        s = self._session(session_id)
        self.store.release(self._take_lease(s, lease_id, ns, ticket))

    def narrow(self, session_id: str, ns: bytes, lease_id: int, keep: int,
               ticket: bytes = b"") -> tuple[Lease, bytes]:
        """The narrowed lease (held by this session) and its ticket."""
        s = self._session(session_id)
        lease = self._take_lease(s, lease_id, ns, ticket)
        try:
            narrowed = self.store.narrow(lease, keep)
        except BaseException:
            _quietly(self.store.release, lease)
            raise
        return narrowed, self._record(s, s.leases, narrowed.id, ns, narrowed)

    def contains(self, ns: bytes, tier: str, keys: Sequence[bytes]) -> list[bool]:
        """Which of ``keys`` tier ``tier`` holds. ``ns`` may be empty: presence is told of any
        key, whoever's (a key is namespaced by construction; knowing it is knowing its
        namespace), so a client serving many namespaces need not name one."""
        keys = self._keys(ns or bytes(KEY_BYTES), keys)
        return self.store.tier(tier).contains(keys) if keys else []

    # ----------------------------------------------------------------- loads

    def prepare_load(self, session_id: str, ns: bytes, keys: Sequence[bytes], lease_id: int,
                     tier: str | None, ticket: bytes = b"") -> LoadHandle:
        keys = self._keys(ns, keys)
        s = self._session(session_id)
        self._check_room(s)
        lease = None
        if lease_id:
            lease = self._take_lease(s, lease_id, ns, ticket)
        try:
            handle = self.store.prepare_load(ns, keys, lease=lease, tier=tier)
        except BaseException:
            if lease is not None:
                _quietly(self.store.release, lease)
            raise
        try:
            self._record(s, s.loads, handle.id, ns, handle)
        except LeaseError:
            _quietly(self.store.complete_load, handle)
            raise
        return handle

    def complete_load(self, session_id: str, ns: bytes, handle_id: int,
                      into: np.ndarray | None = None) -> int:
        """End a load; with ``into`` (peer copy: segments of the client's memory) write its
        pages there first. The handle ends either way."""
        s = self._session(session_id)
        handle = cast(LoadHandle, self._take(s, s.loads, handle_id, ns, "load handle"))
        try:
            if into is not None:
                self._peer.copy(s.peer, handle.slots, into, write=True, what="complete_load")
        finally:
            n = self.store.complete_load(handle)
        return n

    # ----------------------------------------------------------------- stores

    def prepare_store(self, session_id: str, ns: bytes, metas: Sequence[BlockMeta],
                      tier: str | None) -> tuple[StoreHandle, list[int], int]:
        """Reserve slots for the blocks of ``metas`` that chain from ``ns``, and as many rows
        of the session's staging area, where the client writes them. Returns the handle, the
        staging rows (``rows[i]`` takes ``handle.metas[i]``) and how many blocks were dropped
        for an unknown parent or a full staging area (refused too)."""
        check_namespace(ns)
        metas = list(metas)
        self._keys(ns, [m.key for m in metas])
        s = self._session(session_id)
        self._check_room(s)
        ok, dropped = chained(self.store, ns, metas, self._writing_under)
        check_quota(self.staging, self.limits.namespace_quota_pages, ns, ok,
                    self._writing_under)
        if s.staging is None:
            raise InvalidArgument("this session has mapped no shared memory: it has no staging "
                                  "area to save into", hint="save over WritePages instead")
        rows = s.staging.take(len(ok))
        dropped += len(ok) - len(rows)  # the session has this many saves in flight already
        try:
            handle = self.store.prepare_store(ok[: len(rows)], tier=tier)
        except BaseException:
            s.staging.give(rows)
            raise
        used, spare = rows[: len(handle.slots)], rows[len(handle.slots):]
        s.staging.give(spare)
        try:
            self._record(s, s.stores, handle.id, ns, handle)
        except LeaseError:
            _quietly(self.store.abort, handle)
            raise  # the session closed: its staging area went with it
        with self._lock:
            s.staged[handle.id] = used
        return handle, used, dropped

    def _take_store(self, s: Session, ns: bytes, handle_id: int,
                    completing: bool = False) -> tuple[StoreHandle, list[int]]:
        handle = cast(StoreHandle, self._take(s, s.stores, handle_id, ns, "store handle"))
        with self._lock:
            if completing:
                s.completing[handle_id] = (ns, handle)
            return handle, s.staged.pop(handle_id, [])

    def complete_store(self, session_id: str, ns: bytes, handle_id: int, ok: bool,
                       source: np.ndarray | None = None) -> PutResult:
        """Copy the handle's staging rows -- or, with ``source`` (peer copy), the client's
        memory segments -- into its slab slots (``ok``), then publish."""
        s = self._session(session_id)
        handle, rows = self._take_store(s, ns, handle_id, completing=True)
        staging = s.staging
        try:
            try:
                if ok and source is not None:
                    self._peer.copy(s.peer, handle.slots, source, write=False, what="complete_store")
                elif ok and rows:
                    assert staging is not None
                    staging.copy_into(self._slab_rows, rows, handle.slots)
            except BaseException:
                self.store.abort(handle)
                raise
            finally:
                if staging is not None:
                    staging.give(rows)
            return self.store.complete_store(handle, ok)
        finally:
            with self._lock:
                s.completing.pop(handle_id, None)

    def abort(self, session_id: str, ns: bytes, handle_id: int) -> None:
        s = self._session(session_id)
        handle, rows = self._take_store(s, ns, handle_id)
        if s.staging is not None:
            s.staging.give(rows)
        self.store.abort(handle)

    # ----------------------------------------------------------------- prefetch, delete, stats

    def prefetch(self, ns: bytes, keys: Sequence[bytes], to: str | None, timeout_s: float | None) -> int:
        """Copy ``keys`` into tier ``to`` (default the fastest) and wait up to ``timeout_s``
        for it; returns how many leading keys it holds then."""
        keys = self._keys(ns, keys)
        fut = self.store.prefetch(ns, keys, to=to)
        try:
            return fut.result(timeout=timeout_s)
        except FutureTimeout:
            return self.store.tier(to or self.store.tiers[0].name).count_leading(keys)

    def count_declined(self, ns: bytes, blocks: int) -> None:
        """A client recomputes ``blocks`` matched blocks of ``ns`` instead of loading them."""
        check_namespace(ns)
        self.store.count_declined(ns, blocks)

    def count_failed(self, ns: bytes, what: str, reason: str, blocks: int) -> None:
        """A client failed to load (recomputed) or save ``blocks`` blocks of ``ns`` for
        ``reason``; InvalidArgument for a (what, reason) the store does not count."""
        check_namespace(ns)
        self.store.count_failed(ns, what, reason, blocks)

    def label_namespace(self, ns: bytes, label: bytes) -> None:
        """A client names ``ns`` (its model and tenant) for the stats; ``label`` as the wire
        carries it: InvalidArgument unless it is short UTF-8 text (see
        :func:`kvstore.namespace_labels.check_label`)."""
        check_namespace(ns)
        self.store.label_namespace(ns, check_label(label))

    def delete(self, ns: bytes, keys: Sequence[bytes]) -> int:
        keys = self._keys(ns, keys)
        return self.store.delete(keys, namespace_id=ns)

    def stats(self, check_integrity: bool = False) -> DaemonStats:
        error = ""
        if check_integrity:
            try:
                self.store.check_integrity()
            except AssertionError as exc:
                error = str(exc) or "assertion failed"
        with self._lock:
            sessions = list(self._sessions.values())
            loads = sum(len(s.loads) for s in sessions)
            stores = sum(len(s.stores) for s in sessions)
        return DaemonStats(self.store.stats(), {t.name: t.free_pages for t in self.store.tiers},
                           len(sessions), loads, stores, check_integrity, error)

    # ----------------------------------------------------------------- the byte path

    def read_pages(self, ns: bytes, keys: Sequence[bytes]) -> Iterator[tuple[int, str, np.ndarray]]:
        """Pages of the leading ``keys`` held under ``ns`` (any tier), in order, as page-sized
        arrays; stops at the first miss. Reads in batches of 16 pages."""
        keys = self._keys(ns, keys)
        page = self.store.layout.page_bytes
        step = 16
        for i in range(0, len(keys), step):
            part = keys[i : i + step]
            out = np.empty((len(part), page), np.uint8)
            got = self.store.get(ns, part, out)
            for j, tier in enumerate(got.tiers):
                if tier is None:
                    return
                yield i + j, tier, out[j]

    def write_pages(self, ns: bytes, metas: Sequence[BlockMeta], pages: np.ndarray) -> PutResult:
        """Store pages sent over the wire into the fastest tier (the byte path's save)."""
        check_namespace(ns)
        metas = list(metas)
        self._keys(ns, [m.key for m in metas])
        ok, dropped = chained(self.store, ns, metas, self._writing_under)
        check_quota(self.staging, self.limits.namespace_quota_pages, ns, ok,
                    self._writing_under)
        keep = {m.key for m in ok}
        rows = [i for i, m in enumerate(metas) if m.key in keep]
        res = self.store.put(ok, pages[rows] if rows else pages[:0])
        return PutResult(res.stored, res.existing, res.refused + dropped)

    # ----------------------------------------------------------------- shutdown

    def close(self) -> None:
        """End every session (their handles are completed or aborted), then refuse new ones."""
        with self._lock:
            self._closing = True
            ids = list(self._sessions)
        for sid in ids:
            self.close_session(sid)


def _quietly(fn, *args) -> None:  # noqa: ANN001
    try:
        fn(*args)
    except KVStoreError:
        pass  # expired, already completed, or the store closed: nothing left to free


__all__ = ["DaemonService", "DaemonStats", "Limits", "Segments", "Session", "SessionInfo",
           "check_namespace"]
