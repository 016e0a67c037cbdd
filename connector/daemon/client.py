""":class:`DaemonStore`: the sidecar daemon seen as a store. It exposes the part of
:class:`~kvstore.store.TieredStore` the in-process connector uses (``lookup``/``release``/
``narrow``, ``prepare_load``/``complete_load``, ``prepare_store``/``complete_store``/``abort``,
``prefetch``, ``tier(name).contains/count_leading``, ``staging_tier``, ``layout``, ``tiers``,
``metrics``, ``read_bandwidth``, ``write_policy``), so :class:`~connector.inprocess.
InProcessScheduler` and :class:`~connector.inprocess.InProcessWorker` run over it unchanged.

Control over gRPC -- on one node, the hot calls (lookups, leases, the staging path) over the
daemon's local lane (:mod:`.lane`), a plain Unix socket that costs a fraction of a gRPC call --
data through shared memory: after the handshake (the session stream's first message) the
client asks the lane socket it names for the session's segments (:func:`.lane.map_segments`):
the host tier's slab, which it maps read-only, and its own staging area, which it maps
read-write. A load handle's ``slab`` is the slab mapping: the worker copies straight out of the
daemon's slots. A store handle's ``slab`` is the staging area: the worker writes its rows, and
the daemon copies them into the slab at ``complete_store`` (so no client can change what
another loads, see :mod:`.shm`). :meth:`register_for_dma` page-locks both mappings for a CUDA
cache (lazy, CUDA only). A TCP client maps nothing: it moves pages with :meth:`read_pages` and
:meth:`write_pages`.

Sessions and failure: the client keeps one session stream open; handles and leases live in it,
and the daemon frees them when the stream ends (this process died). When the daemon cannot be
reached, calls degrade instead of failing the engine: a lookup is a miss, a load pins nothing,
a save is refused -- the engine recomputes -- and each failure is counted
(``kvstore_daemon_client_failures_total{call}``, :attr:`DaemonStore.failures`). The client
reconnects on a later call (at most every ``reconnect_interval_s``) once it holds no open handle,
mapping the restarted daemon's new segments at the old addresses (see :mod:`.shm`).

Namespaces: one client serves any number of namespaces over its one session (an engine whose
requests carry their own tenant salt, LoRA or cache salt). Calls that create or use a handle name
their namespace (``prepare_load``, ``complete_load``) or derive it (``prepare_store`` and its
handle from the blocks; ``release``/``narrow`` from the lookup that granted the lease); a lookup
names it with ``namespace_id=`` or through a one-namespace view (:meth:`DaemonStore.scoped`),
which is what a per-namespace scheduler is given. ``namespace_id`` at construction is only the
default of calls that name none.
"""

from __future__ import annotations

import ctypes
import itertools
import logging
import os
import secrets
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np

from connector.daemon.errors import DaemonUnavailable, error_of, error_of_status
from connector.daemon.lane import METHOD_NUMBER, Lane, LaneBusy, LaneRefused, map_segments
from connector.daemon.peer_memory import segments
from connector.daemon.shm import SharedSlab
from connector.daemon.stream import CallStream, StreamEnded
from connector.proto import kvstore_daemon_pb2 as pb
from connector.proto import kvstore_daemon_pb2_grpc as pb_grpc
from kvstore.checks import check_keys
from kvstore.api import StoreAPI
from kvstore.buffers import page_views
from kvstore.errors import InvalidArgument, KVStoreError, LeaseError, QuotaExceeded, StoreClosed
from kvstore.keys import BlockMeta, pack_keys
from kvstore.layout import KVLayout
from kvstore.metrics import Metrics
from kvstore.namespace_labels import check_label
from kvstore.namespace_stats import MAX_NAMESPACES, NamespaceCounters, NamespaceCounts
from kvstore.record import WIRE, RecordMac, wire_fields
from kvstore.results import Lease, LookupResult, PutResult, load_estimates, merge_runs
from kvstore.staging import LoadHandle, StoreHandle, copy_in, copy_out

log = logging.getLogger(__name__)
#: cudaHostRegisterReadOnly: the slab is mapped read-only, and CUDA only reads it
_CUDA_HOST_REGISTER_READ_ONLY = 0x08

#: seconds of unary lookups after the daemon refused a lookup stream (its limit was reached)
_STREAM_RETRY_S = 30.0
# distinct from in-process stores' owner ids, and (random base) from other processes' clients:
# a lease or handle pickled into another process is never mistaken for one of its own
_owners = itertools.count((1 << 40) + (secrets.randbits(30) << 10))


@dataclass(frozen=True, slots=True)
class DaemonTierStats:
    name: str
    kind: str
    capacity_pages: int
    used_pages: int
    free_pages: int
    hits: int
    misses: int
    writes: int
    evictions: int


@dataclass(frozen=True, slots=True)
class DaemonStats:
    tiers: tuple[DaemonTierStats, ...]
    lookup_hit_blocks: int
    lookup_miss_blocks: int
    active_leases: int
    sessions: int
    open_load_handles: int
    open_store_handles: int
    integrity_checked: bool
    integrity_error: str

    def tier(self, name: str) -> DaemonTierStats:
        return next(t for t in self.tiers if t.name == name)


class RemoteTier:
    """One of the daemon's tiers: its name and size, and membership checks over the wire. The
    staging tier also has the client's mappings: of the slab (``slab``, ``slab_tensor``:
    read-only, loads copy from it) and of the session's staging area (``save_slab``,
    ``save_slab_tensor``: saves write it)."""

    def __init__(self, client: DaemonStore, info: Any) -> None:
        self._client = client
        self.name: str = info.name
        self.kind: str = info.kind
        self.capacity_pages: int = info.capacity_pages
        self.shared = False

    @property
    def slab(self) -> np.ndarray:
        return self._client._slab_view()

    @property
    def slab_tensor(self) -> Any:
        return self._client._mapping(self._client._slab)

    @property
    def save_slab(self) -> np.ndarray:
        return self._client._staging_view()

    @property
    def save_slab_tensor(self) -> Any:
        return self._client._mapping(self._client._stage)

    def contains(self, keys: Sequence[bytes]) -> list[bool]:
        return self._client._contains(self.name, keys)[0]

    def count_leading(self, keys: Sequence[bytes]) -> int:
        return self._client._contains(self.name, keys)[1]


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
        self.target = target[len("tcp://"):] if target.startswith("tcp://") else target
        self.namespace_id = namespace_id
        self.timeout_s, self.prefetch_timeout_s = timeout_s, prefetch_timeout_s
        self.connect_timeout_s, self.reconnect_interval_s = connect_timeout_s, reconnect_interval_s
        self._md = (("authorization", f"Bearer {token}"),) if token else ()
        self._options = [("grpc.max_receive_message_length", max_message_bytes),
                         ("grpc.max_send_message_length", max_message_bytes),
                         # a restarted daemon is found within a second, not after grpc's
                         # default backoff (up to two minutes)
                         ("grpc.initial_reconnect_backoff_ms", 100),
                         ("grpc.max_reconnect_backoff_ms", 1000)]
        self.metrics = metrics if metrics is not None else Metrics()
        self._mac = RecordMac(secret)  # the byte path's page seals; raises for a short secret
        #: pages read over the wire whose seal does not verify (misses)
        self._m_bad_seal = self.metrics.corrupt.labels(WIRE, "mac")
        self._m_fail = self.metrics.counter(
            "kvstore_daemon_client_failures", "Daemon calls that failed to reach it.", ["call"])
        self.failures: Counter[str] = Counter()
        #: load-or-recompute declines counted in this process (as the decisions metric is)
        self.namespace_counts = NamespaceCounters()
        self.owner = next(_owners)
        self._lock = threading.Lock()
        self._open: set[int] = set()  # handle ids issued and not yet completed/aborted
        #: lease id -> (the namespace it was granted under, its expiry); pruned of expired
        #: leases (one handed to another process by its ticket is used up there, unseen here)
        self._lease_ns: dict[int, tuple[bytes, float]] = {}
        #: store handle id -> its namespace: a handle that reserved nothing (another save of
        #: the prefix is writing it) has no block to tell it by
        self._store_ns: dict[int, bytes] = {}
        self._bandwidth: dict[str, float] = {}
        #: namespace id -> its label, told to the daemon once per session (again after a
        #: reconnect: a restarted daemon forgot them); as many as the daemon keeps
        self._labels: dict[bytes, str] = {}
        #: failures (namespace, what, reason) -> blocks not yet told to the daemon (it was
        #: unreachable), told when a session is open again; bounded like the daemon's rows
        self._untold: Counter[tuple[bytes, str, str]] = Counter()
        self._session_id = ""
        self._connected = False
        self._channel: grpc.Channel | None = None
        self._stream: Any = None
        self._slab: SharedSlab | None = None  # read-only
        #: the process the daemon may copy to and from for this session (peer copy); 0: none
        self._peer_pid = 0
        self._stage: SharedSlab | None = None  # this session's staging area
        self._reconnector: threading.Thread | None = None
        #: lookups go as messages of one open call (see _lookup_call), opened at the first
        self._lookup_stream: CallStream | None = None
        #: the daemon's local lane (a Unix-socket daemon that serves one; ``lane=False``: never)
        self._use_lane = lane and self.target.startswith("unix:")
        self._lane: Lane | None = None
        self._max_message_bytes = max_message_bytes
        #: calls answered, by path: "lane", "grpc"
        self.calls: Counter[str] = Counter()
        self._lookup_lock = threading.Lock()  # the stream's one caller at a time
        self._stream_refused_until = 0.0  # monotonic: the daemon had no stream to spare
        self._pool = ThreadPoolExecutor(4, thread_name_prefix="kvstore-daemon-client")
        self._closed = False
        self._remote_tiers = False  # learnt from each lookup reply
        self._dma = False  # the slab mapping is registered with CUDA (cudaHostRegister)
        info = self._connect()
        self.layout = KVLayout(info.layout.num_layers, info.layout.num_kv_heads,
                               info.layout.head_dim, info.layout.block_size, info.layout.dtype,
                               info.layout.block_format)
        self.tiers: list[RemoteTier] = [RemoteTier(self, t) for t in info.tiers]
        self._staging = info.staging_tier
        self.write_policy: str = info.write_policy
        self.lease_ttl_s: float = info.lease_ttl_s

    # ----------------------------------------------------------------- connection

    def _connect(self) -> Any:
        """Open a channel and a session; map (or remap) the slab. Returns the handshake."""
        channel = grpc.insecure_channel(self.target, options=self._options)
        try:
            self._wait_ready(channel)
            stub = pb_grpc.KVStoreDaemonStub(channel)
            stream = stub.OpenSession(pb.OpenSessionRequest(), metadata=self._md)
            info = self._handshake(stream)
            if self._closed:  # closed while the reconnector was connecting: keep nothing
                stream.cancel()
                raise DaemonUnavailable("this DaemonStore was closed")
        except grpc.FutureTimeoutError:
            channel.close()
            raise DaemonUnavailable(f"no kvstore daemon answers at {self.target}") from None
        except grpc.RpcError as err:
            channel.close()
            raise error_of(err) from None
        except DaemonUnavailable:
            channel.close()
            raise
        try:
            self._map(info)
        except KVStoreError:
            stream.cancel()
            channel.close()
            raise
        self._slab_pages = info.slab_pages
        self._page_bytes = info.layout.page_bytes
        old = self._channel
        self._channel, self._stub, self._stream = channel, stub, stream
        self._session_id = info.session_id
        old_lane, self._lane = self._lane, None
        if self._use_lane and info.lane_socket:
            self._lane = Lane(info.lane_socket, info.session_id,
                              max_frame=self._max_message_bytes)
        self._connected = True
        if old_lane is not None:
            old_lane.close()
        if old is not None:
            old.close()
        threading.Thread(target=self._watch_session, args=(stream,), daemon=True,
                         name="kvstore-daemon-session").start()
        with self._lock:
            labels = list(self._labels.items())
        for ns, label in labels:  # a new session: the daemon may be a new process
            self._tell_label(ns, label)
        with self._lock:
            untold, self._untold = self._untold, Counter()
        for (ns, what, reason), n in untold.items():
            self._tell_failed(ns, what, reason, n)
        return info

    def _map(self, info: Any) -> None:
        """Map the new session's slab (read-only) and staging area, or remap them in place
        after a reconnect. A TCP session has none."""
        if not info.shm_socket:
            return
        m = map_segments(info.shm_socket, info.session_id, self.connect_timeout_s)
        slab_fd, slab_bytes, stage_fd, stage_bytes, stage_rows = (
            m.slab_fd, m.slab_bytes, m.staging_fd, m.staging_bytes, m.staging_rows)
        # the daemon reads and writes this process (the pid it saw): a forked child must not
        # name its addresses under this session
        self._peer_pid = os.getpid() if m.peer_copy else 0
        try:
            if slab_bytes != info.shm_bytes or stage_rows != info.staging_pages:
                raise DaemonUnavailable("the daemon's shared memory does not match its handshake")
            if self._slab is None or self._stage is None:
                self._slab = SharedSlab.attach(slab_fd, slab_bytes, writable=False, name="slab")
                self._stage = SharedSlab.attach(stage_fd, stage_bytes, writable=True, name="staging")
            elif (slab_bytes, stage_bytes) != (self._slab.nbytes, self._stage.nbytes) or \
                    info.layout.page_bytes != self.layout.page_bytes:
                raise DaemonUnavailable(
                    f"the daemon came back with a {slab_bytes}-byte slab and a {stage_bytes}-byte "
                    f"staging area of {info.layout.page_bytes}-byte pages; this client mapped "
                    f"{self._slab.nbytes} and {self._stage.nbytes}")
            else:
                # CUDA pinned the old segments' pages: DMA through a stale registration would
                # read and write the old daemon's memory, so register the new mappings afresh
                registered = self._dma
                if registered:
                    self._dma_unregister()
                self._slab.remap(slab_fd, "slab")
                self._stage.remap(stage_fd, "staging")
                if registered:
                    self.register_for_dma()
        finally:
            os.close(slab_fd)
            os.close(stage_fd)
        self._stage_rows = stage_rows

    def _wait_ready(self, channel: grpc.Channel) -> None:
        """Wait up to ``connect_timeout_s`` for ``channel`` to connect, in short slices, so a
        :meth:`close` meanwhile ends the wait (it joins the reconnector). Raises
        grpc.FutureTimeoutError."""
        ready = grpc.channel_ready_future(channel)
        deadline = time.monotonic() + self.connect_timeout_s
        try:
            while True:
                try:
                    ready.result(timeout=min(0.1, max(0.0, deadline - time.monotonic())))
                    return
                except grpc.FutureTimeoutError:
                    if self._closed or time.monotonic() >= deadline:
                        raise
        finally:
            ready.cancel()

    def _handshake(self, stream: Any) -> Any:
        """The session stream's first message, within ``connect_timeout_s``. The stream lives
        as long as the session, so it takes no deadline; its handshake does: a channel can be
        READY (another client of this process holds the connection) while the daemon is
        stopped and answers nothing. A timer cancels the stream then; it is joined before this
        returns or raises, so no cancel ever races the caller's close of the channel."""
        answered = threading.Lock()

        def give_up() -> None:
            if answered.acquire(blocking=False):  # not once the handshake has arrived
                stream.cancel()

        timer = threading.Timer(self.connect_timeout_s, give_up)
        timer.daemon = True
        timer.start()
        failed: grpc.RpcError | None = None
        try:
            info = next(stream)
        except grpc.RpcError as err:
            failed, info = err, None
        except StopIteration:
            info = None
        timer.cancel()
        if not answered.acquire(blocking=False):  # the timer fired: its cancel is done or under way
            timer.join()
            raise DaemonUnavailable(f"the kvstore daemon at {self.target} did not open a "
                                    f"session within {self.connect_timeout_s} s")
        if failed is not None:
            raise failed
        if info is None:
            raise DaemonUnavailable(f"the daemon at {self.target} ended the session")
        return info

    def _watch_session(self, stream: Any) -> None:
        try:
            for _ in stream:
                pass
        except grpc.RpcError:
            pass
        if self._stream is stream:
            self._lost()

    def _ensure(self) -> Any:
        """The stub of a live session; fails fast while the daemon is unreachable (the
        reconnector thread, never the caller, waits for it)."""
        if self._closed:  # the caller's mistake, not an outage: refused, never a quiet miss
            raise StoreClosed("this DaemonStore")
        if not self._connected:
            self._lost()
            raise DaemonUnavailable(f"the kvstore daemon at {self.target} is unreachable")
        return self._stub

    def _call(self, name: str, request: Any, timeout_s: float | None = None) -> Any:
        reply = self._lane_call(name, request, timeout_s)
        if reply is not None:
            return reply
        self.calls["grpc"] += 1
        try:
            stub = self._ensure()
            if "session_id" in request.DESCRIPTOR.fields_by_name:
                request.session_id = self._session_id  # the session now (it may be a new one)
            return getattr(stub, name)(request, timeout=timeout_s or self.timeout_s,
                                       metadata=self._md)
        except grpc.RpcError as err:
            exc = error_of(err)
            if isinstance(exc, DaemonUnavailable):
                self._lost()
            raise exc from None

    def _lane_call(self, name: str, request: Any, timeout_s: float | None) -> Any | None:
        """The reply over the local lane; None when the call must go over gRPC (no lane, not a
        lane call, every lane connection busy, the daemon refused the lane). Raises what
        :meth:`_call` raises."""
        lane = self._lane
        if lane is None or name not in METHOD_NUMBER:
            return None
        self._ensure()
        try:
            reply = lane.call(name, request, timeout_s or self.timeout_s)
        except LaneRefused as exc:
            log.info("the daemon's local lane is not open to this client (%s): using gRPC", exc)
            with self._lock:
                if self._lane is lane:
                    self._lane = None
            lane.close()
            return None
        except LaneBusy:
            return None
        except DaemonUnavailable:
            self._lost()
            raise
        self.calls["lane"] += 1
        return reply

    def _lost(self) -> None:
        with self._lock:
            self._connected = False
            if self._closed or (self._reconnector is not None and self._reconnector.is_alive()):
                return
            self._reconnector = threading.Thread(target=self._reconnect, daemon=True,
                                                 name="kvstore-daemon-reconnect")
            self._reconnector.start()

    def _reconnect(self) -> None:
        """Reconnector thread: every ``reconnect_interval_s``, once no handle is open (copies
        must not straddle a remap), try to open a new session."""
        while not self._closed and not self._connected:
            time.sleep(self.reconnect_interval_s)
            with self._lock:
                if self._open:
                    continue
            try:
                self._connect()
            except KVStoreError as exc:
                log.debug("reconnect to %s failed: %s", self.target, exc)
                continue
            log.info("reconnected to the kvstore daemon at %s", self.target)

    def _failed(self, call: str) -> None:
        self.failures[call] += 1
        self._m_fail.labels(call).inc()

    @property
    def connected(self) -> bool:
        return self._connected

    def wait_connected(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for a live session (after an outage); True if there is one."""
        deadline = time.monotonic() + timeout_s
        while not self._connected and time.monotonic() < deadline:
            if self._reconnector is None or not self._reconnector.is_alive():
                self._lost()
            time.sleep(0.02)
        return self._connected

    def _slab_view(self) -> np.ndarray:
        """The slab as (pages, page_bytes) rows, read-only; empty without shared memory (TCP)."""
        if self._slab is None:
            return np.empty((0, self._page_bytes), np.uint8)
        return self._slab.array[: self._slab_pages * self._page_bytes].reshape(
            self._slab_pages, self._page_bytes)

    def _staging_view(self) -> np.ndarray:
        """This session's staging area as (rows, page_bytes): where saves are written."""
        if self._stage is None:
            return np.empty((0, self._page_bytes), np.uint8)
        return self._stage.array[: self._stage_rows * self._page_bytes].reshape(
            self._stage_rows, self._page_bytes)

    def _mapping(self, seg: SharedSlab | None) -> Any:
        """A ``(rows, page_bytes)`` uint8 torch tensor over a mapping. Made from the mapping's
        memory directly: torch takes no read-only numpy array (a write to the read-only slab
        would fault; nothing here writes it)."""
        import torch

        view = self._slab_view() if seg is self._slab else self._staging_view()
        if seg is None:
            return torch.from_numpy(view.copy())
        buf = (ctypes.c_uint8 * view.nbytes).from_address(seg.address)
        return torch.frombuffer(buf, dtype=torch.uint8).view(view.shape)

    # ----------------------------------------------------------------- the store's surface

    def staging_tier(self, name: str | None = None) -> RemoteTier:
        tier = self.tier(name or self._staging)
        if tier.name != self._staging:
            raise InvalidArgument(f"tier {name!r} is not the daemon's staging tier",
                                  hint=f"the daemon stages through {self._staging!r}")
        return tier

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def open_store_handles(self) -> int:
        """This client's saves prepared and not yet completed or aborted."""
        with self._lock:
            return len(self._store_ns)

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
        req = pb.LookupRequest(session_id=self._session_id, namespace_id=ns,
                               keys=pack_keys(keys), lease=lease, local_only=local_only)
        try:
            r = self._lookup_call(req)
        except DaemonUnavailable:
            self._failed("lookup")
            return LookupResult(0, ())
        except QuotaExceeded:  # the session holds its limit of handles and leases: recompute
            self._failed("quota")
            return LookupResult(0, ())
        except LeaseError:  # the daemon ended this session (it may be draining): a new one
            self._failed("lookup")
            self._lost()
            return LookupResult(0, ())
        self._bandwidth = {b.tier: b.bytes_per_s for b in r.bandwidth}
        self._remote_tiers = r.has_remote_tiers
        granted = None
        if r.lease_id:
            granted = Lease(r.lease_id, tuple(keys[: r.num_blocks]),
                            time.monotonic() + r.lease_ttl_s, self.owner, r.lease_ticket)
            self._remember_lease(granted, ns)
        runs = r.runs
        if len(runs) == 1:  # the usual hit, in one tier
            tiers: tuple[str, ...] = (runs[0].tier,) * runs[0].blocks
        else:
            tiers = tuple(itertools.chain.from_iterable(
                itertools.repeat(run.tier, run.blocks) for run in runs))
        load_s = load_estimates(merge_runs(((run.tier, run.blocks) for run in runs), len(tiers)),
                                self._page_bytes,
                                lambda t: self._bandwidth.get(t) or None) if tiers else ()
        return LookupResult(r.num_blocks, tiers, granted, load_s)

    def _lookup_call(self, req: Any) -> Any:
        """The reply to a LookupRequest: a message on the lookup stream (about half the cost of
        a unary call, see :mod:`.stream`), opened on the live channel when there is none; a
        unary call when another thread's lookup is using the stream, so a slow lookup (a
        remote tier) never holds up another. The local lane first, when there is one. Raises
        what :meth:`_call` raises."""
        reply = self._lane_call("Lookup", req, None)
        if reply is not None:
            return reply
        if time.monotonic() < self._stream_refused_until or not self._lookup_lock.acquire(
                blocking=False):
            return self._call("Lookup", req)
        try:
            stub = self._ensure()
            stream = self._lookup_stream
            if stream is None or not stream.alive or stream.channel is not self._channel:
                if stream is not None:
                    stream.close()
                stream = self._lookup_stream = CallStream(stub.LookupStream, self._channel,
                                                          self._md)
            req.session_id = self._session_id  # the session now (it may be a new one)
            self.calls["grpc"] += 1
            try:
                r = stream.ask(req, self.timeout_s)
            except grpc.RpcError as err:
                if err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                    # the daemon has as many lookup streams open as it allows: unary calls,
                    # and another try at a stream later
                    self._lookup_stream = None
                    self._stream_refused_until = time.monotonic() + _STREAM_RETRY_S
                    return self._call("Lookup", req)
                exc = error_of(err)
                if isinstance(exc, DaemonUnavailable):
                    self._lost()
                raise exc from None
            except StreamEnded:
                self._lost()
                raise DaemonUnavailable(f"the daemon at {self.target} ended the lookup stream") from None
        finally:
            self._lookup_lock.release()
        if r.HasField("error"):
            exc = error_of_status(r.error.code, r.error.message)
            if isinstance(exc, DaemonUnavailable):
                self._lost()
            raise exc
        return r

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
        with self._lock:
            held = self._lease_ns.pop(lease.id, None) if lease.owner == self.owner else None
        if held is not None:
            return held[0], b""
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
            req = pb.DeclinedRequest(namespace_id=namespace_id, blocks=num_blocks)
            try:
                self._pool.submit(self._tell, "CountDeclined", req)
            except RuntimeError:  # closed meanwhile: counted here only
                self._failed("CountDeclined")

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
            self._tell_failed(namespace_id, what, reason, num_blocks)

    def _tell_failed(self, namespace_id: bytes, what: str, reason: str, num_blocks: int) -> None:
        req = pb.FailedRequest(namespace_id=namespace_id, what=what, reason=reason,
                               blocks=num_blocks)

        def tell() -> None:
            try:
                self._call("CountFailed", req)
            except DaemonUnavailable:  # kept for the next session (a reconnect tells it)
                self._failed("CountFailed")
                with self._lock:
                    key = (namespace_id, what, reason)
                    if key in self._untold or len(self._untold) < MAX_NAMESPACES:
                        self._untold[key] += num_blocks
            except KVStoreError:  # refused (an older daemon): counted here only
                self._failed("CountFailed")

        try:
            self._pool.submit(tell)
        except RuntimeError:  # closed meanwhile: counted here only
            self._failed("CountFailed")

    def label_namespace(self, namespace_id: bytes, label: str) -> None:
        """As :meth:`TieredStore.label_namespace`: told to the daemon without waiting for the
        reply, once per namespace per session (a per-namespace scheduler calls this when it is
        created). InvalidArgument for a bad id or label, before anything is sent."""
        _check_ns(namespace_id)
        check_label(label)
        with self._lock:
            if self._labels.get(namespace_id) == label:
                return
            if namespace_id in self._labels or len(self._labels) < MAX_NAMESPACES:
                self._labels[namespace_id] = label
        self._tell_label(namespace_id, label)

    def _tell_label(self, namespace_id: bytes, label: str) -> None:
        req = pb.LabelRequest(namespace_id=namespace_id, label=label.encode())
        try:
            self._pool.submit(self._tell, "LabelNamespace", req)
        except RuntimeError:  # closed meanwhile
            self._failed("LabelNamespace")

    def _tell(self, call: str, request: Any) -> None:
        """A call whose answer nobody waits for (on the client's pool); a failure is counted."""
        try:
            self._call(call, request)
        except KVStoreError:
            self._failed(call)

    @property
    def has_remote_tiers(self) -> bool:
        """Whether the daemon's store has a shared (network) tier, as of the last lookup."""
        return self._remote_tiers

    def release(self, lease: Lease, *, namespace_id: bytes | None = None) -> None:
        """Release ``lease``: this client's, or another process's (by its ticket, under
        ``namespace_id`` or the default namespace)."""
        ns, ticket = self._take_lease(lease, namespace_id)
        try:
            self._call("Release", pb.LeaseRequest(session_id=self._session_id, namespace_id=ns,
                                                  lease_id=lease.id, lease_ticket=ticket))
        except DaemonUnavailable:
            self._failed("release")  # the daemon frees the session's leases itself

    def narrow(self, lease: Lease, n: int, *, namespace_id: bytes | None = None) -> Lease:
        ns, ticket = self._take_lease(lease, namespace_id)
        req = pb.LeaseRequest(session_id=self._session_id, namespace_id=ns,
                              lease_id=lease.id, keep=n, lease_ticket=ticket)
        try:
            r = self._call("Narrow", req)
        except DaemonUnavailable:
            self._failed("narrow")
            raise LeaseError("daemon unreachable: the lease is gone with its session") from None
        narrowed = Lease(r.lease_id, lease.keys[:n], time.monotonic() + r.lease_ttl_s,
                         self.owner, r.lease_ticket)
        self._remember_lease(narrowed, ns)
        return narrowed

    def _remember_lease(self, lease: Lease, ns: bytes) -> None:
        with self._lock:
            if len(self._lease_ns) >= 1024:  # drop what expired (the daemon has, too)
                now = time.monotonic()
                for lid in [i for i, (_, t) in self._lease_ns.items() if t <= now]:
                    del self._lease_ns[lid]
            self._lease_ns[lease.id] = (ns, lease.expires_at)

    def _contains(self, tier: str, keys: Sequence[bytes]) -> tuple[list[bool], int]:
        keys = list(keys)
        if not keys:
            return [], 0
        # presence only: no namespace named (keys are namespaced by construction)
        try:
            r = self._call("Contains", pb.ContainsRequest(tier=tier, keys=keys))
        except DaemonUnavailable:
            self._failed("contains")
            return [False] * len(keys), 0
        return list(r.present), r.leading

    @property
    def shared_memory(self) -> bool:
        """This client maps the daemon's slab and a staging area (a Unix-socket client on the
        daemon's node); False over TCP, where pages move by :meth:`read_pages` and
        :meth:`write_pages`."""
        return self._slab is not None

    def _need_shared_memory(self, call: str) -> None:
        if self._slab is None:
            raise InvalidArgument(f"{call} moves pages through the daemon's shared memory, which "
                                  "a TCP client does not map",
                                  hint="connect over the daemon's Unix socket on its node, or "
                                       "use read_pages / write_pages")

    def prepare_load(self, namespace_id: bytes, keys: Sequence[bytes], *,
                     lease: Lease | None = None, tier: str | None = None) -> LoadHandle:
        self._need_shared_memory("prepare_load")
        keys = list(keys)
        ticket = b""
        if lease is not None:
            with self._lock:
                held = self._lease_ns.get(lease.id) if lease.owner == self.owner else None
            if held is not None and held[0] != namespace_id:
                raise InvalidArgument(f"lease {lease.id} belongs to another namespace",
                                      hint="load under the namespace of the lookup")
            _, ticket = self._take_lease(lease, namespace_id)  # the handle takes the lease over
        req = pb.PrepareLoadRequest(session_id=self._session_id, namespace_id=namespace_id,
                                    keys=keys, lease_id=lease.id if lease else 0, tier=tier or "",
                                    lease_ticket=ticket)
        try:
            r = self._call("PrepareLoad", req)
        except DaemonUnavailable as exc:
            self._failed("prepare_load")
            return LoadHandle(0, self.owner, self._staging, namespace_id, (), (), None,
                              self._slab_view(), unavailable=str(exc))
        with self._lock:
            self._open.add(r.handle_id)
        n = len(r.slots)
        return LoadHandle(r.handle_id, self.owner, self._staging, namespace_id, tuple(keys[:n]),
                          tuple(r.slots), lease, self._slab_view())

    @property
    def peer_copy(self) -> bool:
        """The daemon copies this process's pages itself (``complete_store(pages=)``,
        ``complete_load(into=)``): one copy, on its copy threads."""
        return self._peer_pid != 0 and self._peer_pid == os.getpid()

    def _segments(self, views: list[np.ndarray] | None) -> list[int]:
        """``views`` as the flat (address, length) list the daemon copies by; [] where this
        client copies itself (no views, or no peer copy)."""
        if views is None or not self.peer_copy:
            return []
        return [int(x) for x in segments(views).ravel()]

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
        with self._lock:
            self._open.discard(handle.id)
        segs = self._segments(views)
        if views is not None and not segs:
            copy_out(handle, views)
        req = pb.HandleRequest(session_id=self._session_id, namespace_id=handle.namespace_id,
                               handle_id=handle.id, segments=segs)
        try:
            return int(self._call("CompleteLoad", req).num_blocks)
        except DaemonUnavailable:
            # the copy ran (or runs now) against the old mapping, whose pinned pages nobody
            # rewrote
            if views is not None and segs:
                copy_out(handle, views)
            self._failed("complete_load")
            return handle.num_blocks

    def prepare_store(self, metas: Sequence[BlockMeta], *, tier: str | None = None) -> StoreHandle:
        self._need_shared_memory("prepare_store")
        metas = list(metas)
        ns = {m.namespace_id for m in metas}
        if len(ns) > 1:
            raise InvalidArgument("one prepare_store call takes blocks of one namespace")
        nsid = ns.pop() if ns else self._ns(None)
        blocks = [pb.Block(key=m.key, parent=m.parent, token_ids=m.token_ids) for m in metas]
        req = pb.PrepareStoreRequest(session_id=self._session_id, namespace_id=nsid,
                                     blocks=blocks, tier=tier or "")
        try:
            r = self._call("PrepareStore", req)
        except (DaemonUnavailable, QuotaExceeded) as exc:
            self._failed("prepare_store" if isinstance(exc, DaemonUnavailable) else "quota")
            return StoreHandle(0, self.owner, self._staging, (), (), 0, len(metas),
                               self._staging_view(),
                               unavailable=str(exc) if isinstance(exc, DaemonUnavailable) else "")
        with self._lock:
            self._open.add(r.handle_id)
            self._store_ns[r.handle_id] = nsid
        return StoreHandle(r.handle_id, self.owner, self._staging,
                           tuple(metas[i] for i in r.block_index), tuple(r.slots), r.existing,
                           r.refused, self._staging_view())

    def complete_store(self, handle: StoreHandle, ok: bool = True, *,
                       pages: Any = None) -> PutResult:
        if pages is not None:
            self._own_handle(handle)
        views = None if pages is None or not ok else page_views(
            pages, self.layout, handle.num_blocks, writable=False)
        if not handle.id:
            return PutResult(0, handle.existing, handle.refused + handle.num_blocks)
        segs = self._segments(views)
        if views is not None and not segs:
            copy_in(handle, views)
        req = pb.HandleRequest(session_id=self._session_id, namespace_id=self._end_store_handle(handle),
                               handle_id=handle.id, ok=ok, segments=segs)
        try:
            r = self._call("CompleteStore", req)
        except DaemonUnavailable:
            self._failed("complete_store")
            return PutResult(0, handle.existing, handle.refused + handle.num_blocks)
        return PutResult(r.stored, r.existing, r.refused)

    def abort(self, handle: StoreHandle) -> None:
        if not handle.id:
            return
        req = pb.HandleRequest(session_id=self._session_id, namespace_id=self._end_store_handle(handle),
                               handle_id=handle.id)
        try:
            self._call("Abort", req)
        except DaemonUnavailable:
            self._failed("abort")  # the daemon aborts the session's handles itself

    def _end_store_handle(self, handle: StoreHandle) -> bytes:
        """The namespace ``handle`` was prepared under (forgotten: the handle is being ended)."""
        with self._lock:
            self._open.discard(handle.id)
            ns = self._store_ns.pop(handle.id, None)
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
                return int(self._call("Prefetch", req, self.prefetch_timeout_s).leading)
            except DaemonUnavailable:
                self._failed("prefetch")
                return 0

        return self._pool.submit(run)

    def delete(self, keys: Sequence[bytes], *, namespace_id: bytes | None = None) -> int:
        r = self._call("Delete", pb.DeleteRequest(namespace_id=self._ns(namespace_id),
                                                  keys=list(keys)))
        return int(r.deleted)

    def stats(self, *, check_integrity: bool = False) -> DaemonStats:
        r = self._call("Stats", pb.StatsRequest(check_integrity=check_integrity))
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
        stub = self._ensure()
        ns, keys = self._ns(None), list(keys)
        req = pb.ReadPagesRequest(namespace_id=ns, keys=keys)
        n = 0
        call = stub.ReadPages(req, timeout=self.prefetch_timeout_s, metadata=self._md)
        try:
            for page in call:
                i = page.index
                if i >= len(keys) or not self._mac.verify_seal(
                        wire_fields(b"R", ns, keys[i]), page.data, page.seal):
                    self._m_bad_seal.inc()  # a miss: the run of pages ends here
                    log.warning("read_pages: the page of key %d arrived with a seal that does "
                                "not verify (another deployment secret, or changed on the way)", i)
                    call.cancel()
                    break
                out[i] = np.frombuffer(page.data, np.uint8)
                n = i + 1
        except grpc.RpcError as err:
            raise error_of(err) from None
        return n

    def write_pages(self, metas: Sequence[BlockMeta], pages: np.ndarray) -> PutResult:
        """Store pages sent as bytes over the wire (the cross-node path), each sealed with the
        deployment secret: the daemon refuses (and counts) a page whose seal does not verify."""
        stub = self._ensure()

        def messages() -> Iterator[Any]:
            for i, m in enumerate(metas):
                seal = self._mac.seal(
                    wire_fields(b"W", m.namespace_id, m.key, m.parent, m.token_ids), pages[i])
                yield pb.WritePage(namespace_id=m.namespace_id if i == 0 else b"",
                                   block=pb.Block(key=m.key, parent=m.parent, token_ids=m.token_ids),
                                   data=pages[i].tobytes(), seal=seal)

        try:
            r = stub.WritePages(messages(), timeout=self.prefetch_timeout_s, metadata=self._md)
        except grpc.RpcError as err:
            raise error_of(err) from None
        return PutResult(r.stored, r.existing, r.refused)

    def watch(self, namespace_id: bytes | None = None) -> Iterator[tuple[str, str, tuple[bytes, ...]]]:
        """Cache events of a namespace as ``(kind, tier, keys)``, kind ``stored``/``removed``,
        until the daemon stops (cancel by closing the generator)."""
        stub = self._ensure()
        call = stub.WatchEvents(pb.WatchRequest(namespace_id=self._ns(namespace_id)),
                                metadata=self._md)
        try:
            for ev in call:
                kind = "stored" if ev.kind == pb.CacheEvent.STORED else "removed"
                yield kind, ev.tier, tuple(ev.keys)
        except grpc.RpcError as err:
            raise error_of(err) from None
        finally:
            call.cancel()

    # ----------------------------------------------------------------- GPU, close

    def register_for_dma(self) -> None:
        """Page-lock the slab and staging mappings for CUDA copies (cudaHostRegister; the slab
        read-only); CUDA only, lazy. Call before the worker registers a CUDA KV cache.
        Idempotent; a reconnect that maps a new daemon's memory registers that, and
        :meth:`close` unregisters."""
        import torch

        if self._dma:
            return
        if not torch.cuda.is_available():
            raise InvalidArgument("register_for_dma needs CUDA", hint="a CPU cache needs none")
        if self._slab is None or self._stage is None:
            raise InvalidArgument("this client maps no shared memory (a TCP session)",
                                  hint="connect over the daemon's Unix socket")
        cudart = torch.cuda.cudart()
        rc = cudart.cudaHostRegister(self._slab.address, self._slab.nbytes, _CUDA_HOST_REGISTER_READ_ONLY)
        if int(rc) != 0:
            raise InvalidArgument(f"cudaHostRegister of the shared slab (read-only) failed: {rc}")
        rc = cudart.cudaHostRegister(self._stage.address, self._stage.nbytes, 0)
        if int(rc) != 0:
            cudart.cudaHostUnregister(self._slab.address)
            raise InvalidArgument(f"cudaHostRegister of the staging area failed: {rc}")
        self._dma = True

    @property
    def dma_registered(self) -> bool:
        return self._dma

    def _dma_unregister(self) -> None:
        import torch

        assert self._slab is not None and self._stage is not None
        torch.cuda.cudart().cudaHostUnregister(self._slab.address)
        torch.cuda.cudart().cudaHostUnregister(self._stage.address)
        self._dma = False

    def close(self) -> None:
        """End the session (the daemon frees what it still holds) and unmap the slab: close
        only after the worker using it was closed."""
        if self._closed:
            return
        self._closed = True
        with self._lock:
            reconnector = self._reconnector
        if reconnector is not None and reconnector is not threading.current_thread():
            # its attempt in flight ends within connect_timeout_s and then sees _closed: until
            # then it may map the slab and open a channel, which must not outlive this close
            reconnector.join(self.connect_timeout_s + 1.0)
        self._pool.shutdown(wait=True)
        if self._lane is not None:
            self._lane.close()
        if self._lookup_stream is not None:
            self._lookup_stream.close()
        if self._stream is not None:
            self._stream.cancel()
        if self._channel is not None:
            self._channel.close()
        if self._dma:
            self._dma_unregister()
        for seg in (self._slab, self._stage):
            if seg is not None:
                seg.close()

    def __enter__(self) -> DaemonStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class DaemonNamespace:
    """One namespace's view of a :class:`DaemonStore` (see :meth:`DaemonStore.scoped`): its
    ``lookup``, ``lookup_async`` and ``delete`` are under ``namespace_id``; every other
    attribute is the client's, so it stands wherever the client does (a per-namespace
    :class:`~connector.inprocess.InProcessScheduler`). Closing it is a no-op: the client owns
    the connection."""

    def __init__(self, client: DaemonStore, namespace_id: bytes) -> None:
        self.client = client
        self.namespace_id = namespace_id

    def _own(self, namespace_id: bytes | None) -> bytes:
        """This view's namespace; a call that names another one is refused (a scheduler of
        one namespace passes its own, as it does to a store)."""
        if namespace_id is not None and namespace_id != self.namespace_id:
            raise InvalidArgument(
                f"namespace {namespace_id.hex()} asked of the view of {self.namespace_id.hex()}",
                hint="use DaemonStore.scoped(namespace_id) for another namespace")
        return self.namespace_id

    def lookup(self, keys: Sequence[bytes], *, lease: bool = False, local_only: bool = False,
               namespace_id: bytes | None = None) -> LookupResult:
        return self.client.lookup(keys, lease=lease, local_only=local_only,
                                  namespace_id=self._own(namespace_id))

    def lookup_async(self, keys: Sequence[bytes], *, lease: bool = False,
                     namespace_id: bytes | None = None) -> Future[LookupResult]:
        return self.client.lookup_async(keys, lease=lease, namespace_id=self._own(namespace_id))

    def delete(self, keys: Sequence[bytes], *, namespace_id: bytes | None = None) -> int:
        return self.client.delete(keys, namespace_id=self._own(namespace_id))

    def close(self) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)


def _check_ns(namespace_id: object) -> bytes:
    if not isinstance(namespace_id, bytes) or len(namespace_id) != 16:
        raise InvalidArgument(f"namespace_id must be 16 bytes, got {namespace_id!r}",
                              hint="pass Namespace.id")
    return namespace_id


#: the face, checked by mypy: DaemonStore is a StoreAPI
_FACE: type[StoreAPI] = DaemonStore

__all__ = ["DaemonNamespace", "DaemonStats", "DaemonStore", "DaemonTierStats", "RemoteTier"]
