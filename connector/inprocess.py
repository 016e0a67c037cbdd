"""The connector's two sides over any store of the one face (:class:`~kvstore.api.StoreAPI`): an
in-process :class:`~kvstore.store.TieredStore` or a client of the sidecar daemon. Every load and
save goes through the store's staging path (``prepare_load``/``complete_load``,
``prepare_store``/``complete_store``/``abort``) on its staging tier -- the tier with page slots
in one slab (the host tier, :meth:`~kvstore.api.StoreAPI.staging_tier`) -- so the tier's
policy, counters and leases see every hit and every save.

Loads (worker side, one thread per bound load)::

    lease still valid?  -- no --> every block fails ("lease_expired")
    pages below host?   -- prefetch them into host (store.prefetch); how long the load waits is
                           the worker's prefetch policy (below)
    store.prepare_load  -- pins the leading pages host holds (policy touched, hits counted);
                           the first block absent from host (a miss, a page dropped by its
                           check, a timeout) fails, with every later block of the request
    for l in layers:    copy layer l of each page (slab row slice, zero-copy source) into the
                        engine block; set event[l]        <- wait_for_layer_load(l) waits here
    store.complete_load -- unpins the slots (they kept their bytes throughout), releases the lease

A page's layer ``l`` is bytes ``[l * S, (l + 1) * S)`` of the page, ``S = page_bytes /
num_layers``; an engine block's layer ``l`` is the same ``S`` bytes (see :class:`KVCacheSpec`).

Prefetch policy (worker side, ``prefetch_policy``) for matched pages still below the host tier
(disk, Redis) when the load starts:

* ``best_effort``   -- load only what host holds now; the pages below are not waited for: they
                       fail at once (reason ``not_prefetched``) and the engine recomputes them from
                       the first missing block. The prefetch still runs in the background, so host
                       is warm for the next request with this prefix.
* ``wait_complete`` -- wait until the prefetch has finished (every matched page arrived, or a read
                       of it failed); only real misses fail.
* ``timeout``       -- (default) wait at most ``prefetch_timeout_s``; what has not arrived by then
                       fails (reason ``timeout``), from the first missing block on.

Load or recompute (scheduler side, ``recompute_tokens_per_s``): when given (the engine's
measured prefill speed), each matched block below the host tier is loaded only if reading its
page at the tier's measured bandwidth (:meth:`TieredStore.read_bandwidth`) takes no longer than
recomputing its ``block_size`` tokens; the match ends at the first block whose load does not pay
(a tier not measured yet is assumed to pay). Host-tier blocks always load. Each decided block is
counted in ``kvstore_connector_decisions_total{decision="load"|"recompute"}`` on the store's
registry and in :attr:`InProcessScheduler.decisions`.

Saves (worker side, one save thread, in submission order): binding a plan reserves host slots
for each save (``store.prepare_store``: pages host already holds are skipped; eviction makes
room); ``save_kv_layer(l)`` queues the copy of layer ``l`` of every bound save's blocks straight
into its reserved slots; after the last layer the save thread publishes them
(``store.complete_store``; write policies then copy down), or aborts a save that did not finish.
``wait_for_save`` waits for the copies out of engine blocks only, never for the publishing.

Concurrency: the store holds leases, so eviction cannot take a leased page, and a load handle
pins its slots, so a page deleted or replaced during the copy keeps its bytes until the copy
is done. Worker-side state shared with its threads is guarded by one lock; public methods are
for one engine thread.

Layer-wise or not (``layerwise``, default True): with False, ``wait_for_layer_load(l)`` waits
for the whole load before layer 0 computes -- the load-then-compute baseline of the overlap
ablation in ``bench.ttft``.

CPU and GPU: the copies themselves are :mod:`connector.transfer`'s -- memcpy on the load and save
threads for a CPU cache; for a CUDA cache one scatter/gather kernel per layer on a load stream and
a save stream, ordered against the engine's stream by CUDA events, so neither a load nor a save
blocks the engine thread on a copy.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any, Literal

from connector.base import (
    ConnectorMetadata,
    ConnectorStats,
    FinishedRequests,
    KVCacheSpec,
    KVConnectorScheduler,
    KVConnectorWorker,
    LoadMatch,
    LoadSpec,
    SaveSpec,
)
from connector.failure_log import FailureLog
from connector.transfer import CopyFn, LayerTransfer, SaveBuffer, make_transfer
from kvstore.api import StagingSlab, StoreAPI
from kvstore.checks import check_keys
from kvstore.errors import InvalidArgument, LeaseError
from kvstore.keys import BlockMeta, CheckedKeys, Namespace, chain_keys, token_bytes
from kvstore.ops import copy_spans
from kvstore.results import Lease, LookupResult
from kvstore.staging import LoadHandle, StoreHandle

log = logging.getLogger("kvstore.connector")

PrefetchPolicy = Literal["best_effort", "wait_complete", "timeout"]
PREFETCH_POLICIES: tuple[str, ...] = ("best_effort", "wait_complete", "timeout")

def _host_index(store: StoreAPI, host_tier: str) -> int:
    tier = store.staging_tier(host_tier)  # raises InvalidArgument naming the problem
    return store.tier_names.index(tier.name)


def _first_block(tiers: Sequence[str], wanted: Callable[[str], bool]) -> int:
    """The first block of a hit (``tiers``: its tier per block) whose tier is ``wanted``,
    else ``len(tiers)``: asked once per distinct tier, the blocks scanned in C (a 32K-token
    hit has 2048)."""
    return min((tiers.index(t) for t in set(tiers) if wanted(t)), default=len(tiers))


#: The last tuple of block ids that passed :func:`_check_block_ids`, and the bound it passed:
#: a load's ids are checked by the scheduler side and again when the worker binds the plan --
#: the same immutable tuple, looked at once (a 32K-token hit has 2048).
_last_checked: tuple[tuple[int, ...] | None, int] = (None, 0)


def _check_block_ids(block_ids: Sequence[int], num_blocks: int) -> None:
    global _last_checked
    last, bound = _last_checked
    if block_ids is last and num_blocks >= bound:
        return
    # C-speed passes; the loop only finds the culprit for the message
    n = len(block_ids)
    if n and (list(map(type, block_ids)).count(int) != n or min(block_ids) < 0
              or max(block_ids) >= num_blocks):
        for b in block_ids:
            if not isinstance(b, int) or isinstance(b, bool) or not 0 <= b < num_blocks:
                raise InvalidArgument(
                    f"block id {b!r} is not in [0, {num_blocks})",
                    hint="pass block ids the engine allocated from its KV cache",
                )
    if len(set(block_ids)) != n:
        raise InvalidArgument(f"a block id appears twice: {list(block_ids)}")
    if type(block_ids) is tuple:
        _last_checked = (block_ids, num_blocks)


# ===================================================================== scheduler side


@dataclass(slots=True)
class _Match:
    keys: tuple[bytes, ...]
    lease: Lease | None
    load_async: bool
    in_host: int = 0  # leading pages found in the host tier, kept there by the lease
    spec: LoadSpec | None = None  # set by update_state_after_alloc


@dataclass(slots=True)
class _Pending:
    """A lookup of the remote tiers in flight for a request (the scheduler never waits on it)."""

    keys: tuple[bytes, ...]
    future: Future[LookupResult]


class InProcessScheduler(KVConnectorScheduler):
    """Scheduler side over ``store``. ``num_blocks``: the engine's KV cache size (block ids are
    checked against it). Loads come from ``host_tier`` and the tiers below it; a page found only
    in a tier above it (the engine's own hbm pool) ends the match. ``recompute_tokens_per_s``:
    the engine's prefill speed; when set, blocks whose load from below host would be slower than
    recomputing them are not matched (see the module docstring, "Load or recompute").
    ``async_below_host``: a match with pages below host loads asynchronously (default); False:
    synchronously like a host match -- for a worker with ``cpu_inline``, which then waits for
    their prefetch on the engine thread. ``skip_first_layer``: the loads it plans leave layer 0
    uncopied (:attr:`LoadSpec.skip_first_layer`), for an engine that writes the first layer's
    K/V of its loads itself (the bundled runtime's ``Engine`` sets it); off by default."""

    def __init__(
        self,
        store: StoreAPI,
        namespace: Namespace,
        *,
        num_blocks: int,
        host_tier: str = "host",
        recompute_tokens_per_s: float | None = None,
        async_below_host: bool = True,
        skip_first_layer: bool = False,
    ) -> None:
        if namespace.layout != store.layout:
            raise InvalidArgument(
                f"namespace layout {namespace.layout} differs from the store's {store.layout}"
            )
        if not isinstance(num_blocks, int) or num_blocks < 1:
            raise InvalidArgument(f"num_blocks must be an int >= 1, got {num_blocks!r}")
        self.store = store
        self.namespace = namespace
        self.num_blocks = num_blocks
        self.block_size = store.layout.block_size
        self.recompute_tokens_per_s = recompute_tokens_per_s  # validated by the setter
        self.async_below_host = bool(async_below_host)
        self.skip_first_layer = bool(skip_first_layer)
        self.decisions: Counter[str] = Counter()  # matched blocks below host: load / recompute
        self._m_decisions = store.metrics.counter(
            "kvstore_connector_decisions",
            "Matched blocks below the host tier, by load-or-recompute decision.",
            ["decision"],
        )
        self._host = _host_index(store, host_tier)
        self._staging = store.staging_tier(host_tier)
        self._rank = {name: i for i, name in enumerate(store.tier_names)}
        self._matches: dict[str, _Match] = {}
        self._pending: dict[str, _Pending] = {}
        self.pending_answers = 0  # "not known yet" answers given (remote lookups in flight)
        self._loads: list[LoadSpec] = []
        self._saves: list[SaveSpec] = []
        self._transfers: set[str] = set()  # requests with saves or async loads handed out
        # once per namespace: the store's stats then name it by model and tenant, not by id
        store.label_namespace(namespace.id, namespace.label)

    @property
    def keys_namespace_id(self) -> bytes:
        return self.namespace.id

    def get_num_new_matched_tokens(
        self, request_id: str, token_ids: Sequence[int], num_computed_tokens: int, *,
        block_keys: Sequence[bytes] | None = None,
    ) -> LoadMatch:
        B = self.block_size
        if not isinstance(num_computed_tokens, int) or num_computed_tokens < 0 or num_computed_tokens % B:
            raise InvalidArgument(
                f"num_computed_tokens must be a multiple of block_size={B} and >= 0, "
                f"got {num_computed_tokens!r}"
            )
        max_blocks = (len(token_ids) - 1) // B if len(token_ids) else 0
        start = num_computed_tokens // B
        all_keys: Sequence[bytes]
        if block_keys is None:
            all_keys = self.namespace.chain(list(token_ids[: max_blocks * B])).keys  # checks ids
        else:
            all_keys = self._given_keys(token_ids, block_keys, max_blocks)
        self._drop(request_id, lookups=False)
        if start >= max_blocks:
            return LoadMatch(0, False)
        # checked once here (the namespace's own hashes, or the caller's keys by _given_keys):
        # the store's lookup, count and pin of a 2048-key hit then skip their checks
        keys = (all_keys if type(all_keys) is CheckedKeys and start == 0
                and len(all_keys) == max_blocks else CheckedKeys(all_keys[start:max_blocks]))
        found = self._lookup(request_id, keys)
        if found is None:
            self.pending_answers += 1
            return LoadMatch(None, False)
        # the run up to the first block a tier faster than host holds (the engine has it)
        tiers, rank = found.tiers, self._rank
        if tiers and rank[tiers[0]] == self._host and tiers.count(tiers[0]) == len(tiers):
            n, load_async = len(tiers), False  # the usual hit, all in host: nothing to weigh
            in_host = n
        else:
            n = _first_block(tiers, lambda t: rank[t] < self._host)
            n = self._worth_loading(tiers[:n])
            if n == 0:
                if found.lease is not None:
                    self._release(found.lease)
                return LoadMatch(0, False)
            load_async = self.async_below_host and any(rank[t] > self._host
                                                       for t in set(tiers[:n]))
            in_host = _first_block(tiers[:n], lambda t: rank[t] != self._host)
        lease = found.lease
        if lease is not None and n < found.num_blocks:
            try:  # the rest (held in hbm, or declined) must stay evictable
                lease = self.store.narrow(lease, n)
            except LeaseError:
                lease = None  # expired already: the load judges its pages as they are
        self._matches[request_id] = _Match(keys if n == len(keys) else CheckedKeys(keys[:n]),
                                           lease, load_async, in_host if lease else 0)
        return LoadMatch(n * B, load_async, tuple(found.tiers[:n]))

    def _given_keys(self, token_ids: Sequence[int], block_keys: Sequence[bytes],
                    max_blocks: int) -> Sequence[bytes]:
        """The caller's keys of the first ``max_blocks`` blocks, once their ends check out: the
        first hashes from this namespace's seed and its tokens, the last from its parent and
        its tokens (a caller of another namespace, or keys of other tokens, is refused)."""
        if isinstance(block_keys, (bytes, str)) or not isinstance(block_keys, Sequence):
            raise InvalidArgument(
                f"block_keys must be a sequence of keys, got {type(block_keys).__name__}")
        if len(block_keys) < max_blocks:
            raise InvalidArgument(
                f"block_keys has {len(block_keys)} keys, the prompt has {max_blocks} full "
                "blocks before its last token")
        if not max_blocks:
            return ()
        # one copy, checked (16-byte bytes, as every lookup needs) and then used throughout
        keys = (block_keys if type(block_keys) is CheckedKeys and len(block_keys) == max_blocks
                else tuple(block_keys[:max_blocks]))
        check_keys(keys)
        B = self.block_size
        ends = {0, max_blocks - 1}
        for i in ends:
            parent = keys[i - 1] if i else self.namespace.seed
            want = chain_keys(parent, token_bytes(token_ids[i * B: (i + 1) * B]), B)
            if [keys[i]] != want:
                raise InvalidArgument(
                    f"block_keys[{i}] is not the key of block {i} of these tokens in namespace "
                    f"{self.namespace.model_id!r}",
                    hint="pass keys hashed under the connector's namespace, or none")
        return keys

    def _lookup(self, request_id: str, keys: tuple[bytes, ...]) -> LookupResult | None:
        """The leased lookup of ``keys``, or None while a remote part of it is in flight. The
        local tiers answer at once; only when they end the run early and a remote tier could
        extend it is the full lookup started in the background (asked again next step)."""
        pending = self._pending.get(request_id)
        if pending is not None:
            if pending.keys == keys:
                if not pending.future.done():
                    return None
                del self._pending[request_id]
                try:
                    return pending.future.result()
                except Exception:  # noqa: BLE001 - a failed remote lookup is a local answer
                    return self._store_lookup(keys, local_only=True)
            del self._pending[request_id]  # asked for other tokens now
            self._abandon(pending)
        found = self._store_lookup(keys, local_only=True)
        if found.num_blocks == len(keys) or not self.store.has_remote_tiers:
            return found
        if found.lease is not None:
            self._release(found.lease)
        self._pending[request_id] = _Pending(
            keys, self.store.lookup_async(keys, lease=True, namespace_id=self.namespace.id))
        return None

    def _store_lookup(self, keys: tuple[bytes, ...], *, local_only: bool) -> LookupResult:
        return self.store.lookup(keys, lease=True, local_only=local_only,
                                 namespace_id=self.namespace.id)

    def _abandon(self, pending: _Pending) -> None:
        """Release the lease a dropped lookup took (or will take, once it finishes)."""
        def release(fut: Future[LookupResult]) -> None:
            if fut.exception() is None and fut.result().lease is not None:
                self._release(fut.result().lease)  # type: ignore[arg-type]
        pending.future.add_done_callback(release)

    @property
    def recompute_tokens_per_s(self) -> float | None:
        return self._recompute_tps

    @recompute_tokens_per_s.setter
    def recompute_tokens_per_s(self, value: float | None) -> None:
        """The engine may update its measured prefill speed at any time."""
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0
        ):
            raise InvalidArgument(
                f"recompute_tokens_per_s must be a number > 0 or None, got {value!r}")
        self._recompute_tps = None if value is None else float(value)

    def _worth_loading(self, tiers: Sequence[str]) -> int:
        """How many leading blocks (held in ``tiers``) to load rather than recompute."""
        tps = self._recompute_tps
        if tps is None:
            return len(tiers)
        recompute_s = self.block_size / tps
        page_bytes = self.store.layout.page_bytes
        rank, bw_of = self._rank, self.store.read_bandwidth
        n = len(tiers)
        first = _first_block(tiers, lambda t: rank[t] > self._host)
        if first == n:  # the usual hit, all in host or faster: nothing to weigh
            return n
        below = 0
        for i, t in enumerate(tiers[first:], first):
            if rank[t] <= self._host:
                continue
            bw = bw_of(t)
            if bw is not None and page_bytes / bw > recompute_s:
                n = i
                break
            below += 1
        # blocks after the first declined one are recomputed too (the prefix must be contiguous)
        declined = len(tiers) - n
        if below:
            self.decisions["load"] += below
            self._m_decisions.labels("load").inc(below)
        if declined:
            self.decisions["recompute"] += declined
            self._m_decisions.labels("recompute").inc(declined)
            self.store.count_declined(self.namespace.id, declined)
        return n

    def update_state_after_alloc(
        self, request_id: str, block_ids: Sequence[int], num_external_tokens: int, *,
        load_async: bool | None = None,
    ) -> None:
        """``load_async``: overrides the match's own answer, for an engine that loads one
        request from several schedulers (vLLM's tensor-parallel shards, each from its own
        namespace): every shard's load must end the same way -- asynchronously, reported in
        ``recving``, or in the step -- or the engine waits for a report that never comes."""
        match = self._matches.get(request_id)
        if match is None or match.spec is not None:
            raise InvalidArgument(
                f"request {request_id!r} has no pending match",
                hint="call get_num_new_matched_tokens first, once per allocation",
            )
        B = self.block_size
        have = len(match.keys) * B
        if not isinstance(num_external_tokens, int) or num_external_tokens % B or not 0 <= num_external_tokens <= have:
            raise InvalidArgument(
                f"num_external_tokens={num_external_tokens!r} must be a multiple of {B} in "
                f"[0, {have}] for request {request_id!r}"
            )
        n = num_external_tokens // B
        if len(block_ids) != n:
            raise InvalidArgument(f"{num_external_tokens} tokens need {n} blocks, got {len(block_ids)}")
        ids = tuple(block_ids)
        _check_block_ids(ids, self.num_blocks)
        if n == 0:
            self._drop(request_id)
            return
        match.spec = LoadSpec(  # the keys passed the lookup's checks: not checked again
            request_id, self.namespace.id, ids,
            match.keys if n == len(match.keys) else CheckedKeys(match.keys[:n]),
            match.lease, match.load_async if load_async is None else bool(load_async),
            self.skip_first_layer, min(match.in_host, n),
        )

    def request_save(
        self, request_id: str, block_ids: Sequence[int], metas: Sequence[BlockMeta]
    ) -> None:
        if len(block_ids) != len(metas):
            raise InvalidArgument(f"{len(block_ids)} blocks but {len(metas)} block identities")
        _check_block_ids(block_ids, self.num_blocks)
        for m in metas:
            if not isinstance(m, BlockMeta) or len(m.token_ids) != 4 * self.block_size:
                raise InvalidArgument(f"request_save takes BlockMeta identities, got {m!r:.80}")
            if m.namespace_id != self.namespace.id or not m.verify_chain():
                raise InvalidArgument(
                    f"block {m.key.hex()} is not of this namespace or does not hash from its "
                    "parent and tokens",
                    hint="build identities with Namespace.chain()",
                )
        # pages host holds already are not saved again (prepare_store would skip them too; this
        # spares the worker a handle and the engine a transfer)
        held = self._staging.contains([m.key for m in metas]) if metas else []
        keep = [i for i, h in enumerate(held) if not h]
        if keep:
            self._saves.append(SaveSpec(
                request_id, tuple(block_ids[i] for i in keep), tuple(metas[i] for i in keep)))

    def build_connector_meta(self) -> ConnectorMetadata:
        loads = []
        for rid, match in list(self._matches.items()):
            if match.spec is not None:
                loads.append(match.spec)
                del self._matches[rid]
                if match.spec.load_async:
                    self._transfers.add(rid)
        saves, self._saves = self._saves, []
        # Only what is handed to the worker delays a free: a save dropped by request_finished
        # before it was handed out must not (the worker would never report it done).
        self._transfers.update(s.request_id for s in saves)
        return ConnectorMetadata(tuple(loads), tuple(saves))

    def request_finished(self, request_id: str) -> bool:
        self._drop(request_id)
        self._saves = [s for s in self._saves if s.request_id != request_id]
        if request_id in self._transfers:
            self._transfers.discard(request_id)
            return True
        return False

    @property
    def wants_saves(self) -> bool:
        # under write-through a store copies the commits of an engine pool it owns down itself;
        # a store without the engine's pool (the daemon's) needs every save
        return not self.store.commits_pool_itself

    def close(self) -> None:
        for rid in list(self._matches) + list(self._pending):
            self._drop(rid)

    def _drop(self, request_id: str, *, lookups: bool = True) -> None:
        match = self._matches.pop(request_id, None)
        if match is not None and match.lease is not None:
            self._release(match.lease)
        pending = self._pending.pop(request_id, None) if lookups else None
        if pending is not None:
            self._abandon(pending)

    def _release(self, lease: Lease) -> None:
        try:
            self.store.release(lease)
        except LeaseError:
            pass  # expired already: its pages are unpinned


# ===================================================================== worker side


class _LayersQueued:
    """How many of a load's layers have their copies queued (on the CPU: done), in layer
    order; ``wait(layer)`` returns once that layer's are. One condition for every layer: a
    load used to build one Event per layer before its first copy."""

    __slots__ = ("_cond", "_n")

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._n = 0

    def reach(self, n: int) -> None:
        with self._cond:
            if n > self._n:
                self._n = n
                self._cond.notify_all()

    def wait(self, layer: int) -> None:
        if self._n > layer:  # the usual case on a GPU: every layer queued before the forward
            return
        with self._cond:
            self._cond.wait_for(lambda: self._n > layer)


@dataclass(eq=False)
class _LoadJob:
    spec: LoadSpec
    layers: _LayersQueued
    gate: Any = None  # what the copies wait for (LayerTransfer.gate)
    ctx: Any = None  # the transfer's context once copies are queued
    handle: LoadHandle | None = None  # the store's pins on the host slots copied from
    done: threading.Event = field(default_factory=threading.Event)
    failed: list[int] = field(default_factory=list)
    reason: str = ""
    queued: tuple[int, str] | None = None  # (blocks loading, reason) once queued on the caller
    error: BaseException | None = None  # why it failed whole ("error")


@dataclass(eq=False)
class _SaveJob:
    spec: SaveSpec
    handle: StoreHandle  # the host slots reserved for the pages host does not hold yet
    buf: SaveBuffer


class InProcessWorker(KVConnectorWorker):
    """Worker side over ``store``. ``prefetch_policy``: ``best_effort``, ``wait_complete`` or
    ``timeout`` (the default) -- how a load treats pages still below the host tier (see the
    module docstring). ``prefetch_timeout_s``: the ``timeout`` policy's wait (default:
    ``load_timeout_s``, its older name). ``layerwise``: False waits for a whole load before
    layer 0 (the ablation baseline). Saves go straight into host slots the store reserves; a
    save the host tier has no room for (everything evictable pinned) is counted in
    ``saves_abandoned``.
    ``clock``: the store's clock (lease expiry is judged by it). ``copy_fn``: copies one
    layer's spans of a CPU cache (tests inject a slow one). ``cpu_inline``: a CPU cache's
    synchronous loads run whole on the engine thread in ``start_load_kv`` (pin, copy, complete:
    no load thread), and a synchronous load of pages below host waits for their prefetch there
    (per the prefetch policy; pair it with a scheduler's ``async_below_host=False``) -- for
    engines whose threads leave no CPU to ours: vLLM's CPU backend, whose OpenMP threads spin on
    every core between parallel regions (and stall when anything else runs during a forward:
    a load completed over the daemon's socket meanwhile made a host hit ~200 ms instead of
    ~18), and whose engine loop polls while a request waits for an asynchronous load (see
    :class:`~connector.transfer.CpuTransfer`). Saves keep the save thread."""

    skips_first_layer = True

    def __init__(
        self,
        store: StoreAPI,
        *,
        host_tier: str = "host",
        load_timeout_s: float = 5.0,
        prefetch_policy: PrefetchPolicy = "timeout",
        prefetch_timeout_s: float | None = None,
        layerwise: bool = True,
        clock: Callable[[], float] = time.monotonic,
        copy_fn: CopyFn = copy_spans,
        cpu_inline: bool = False,
    ) -> None:
        if not load_timeout_s > 0:
            raise InvalidArgument(f"load_timeout_s must be > 0, got {load_timeout_s!r}")
        if prefetch_policy not in PREFETCH_POLICIES:
            raise InvalidArgument(
                f"unknown prefetch policy {prefetch_policy!r}",
                hint=f"use one of {list(PREFETCH_POLICIES)}",
            )
        if prefetch_timeout_s is not None and not prefetch_timeout_s > 0:
            raise InvalidArgument(f"prefetch_timeout_s must be > 0, got {prefetch_timeout_s!r}")
        self.store = store
        layout = store.layout
        self.layout = layout
        self._host_name = host_tier
        self._host: StagingSlab = store.staging_tier(host_tier)
        self._layer_bytes = layout.page_bytes // layout.num_layers
        self.load_timeout_s = load_timeout_s if prefetch_timeout_s is None else prefetch_timeout_s
        self.prefetch_policy = prefetch_policy
        self.layerwise = bool(layerwise)
        self._clock = clock
        self._copy = copy_fn
        self._cpu_inline = bool(cpu_inline)
        self._spec: KVCacheSpec | None = None
        self._xfer: LayerTransfer | None = None
        self._lock = threading.Lock()
        self._meta: ConnectorMetadata | None = None
        self._step_loads: list[_LoadJob] = []
        self._step_saves: list[_SaveJob] | None = []  # None: bound, not yet reserved
        self._step_layers: set[int] = set()  # layers save_kv_layer saw this step
        self._jobs: list[_LoadJob] = []  # loads not yet reported
        self._saver = ThreadPoolExecutor(1, thread_name_prefix="kvconnector-save")
        # threads for loads from host, kept (starting a thread per load costs the engine thread
        # a GIL hand-off); loads from below host, which wait on prefetches, get their own
        self._loader = ThreadPoolExecutor(8, thread_name_prefix="kvconnector-load")
        self._inflight: Counter[str] = Counter()  # saves + async loads per request
        self._tracked: set[str] = set()  # requests that had saves or async loads
        self._finishing: set[str] = set()
        self._errors: set[int] = set()
        self._loaded = 0
        self._saved = 0
        self._abandoned = 0
        self._failures: Counter[str] = Counter()
        self._save_failures: Counter[str] = Counter()
        self._failure_log = FailureLog(log)

    @property
    def prefetch_timeout_s(self) -> float:
        """The ``timeout`` policy's wait (the same setting as ``load_timeout_s``)."""
        return self.load_timeout_s

    # ----------------------------------------------------------------- registration, plan

    def register_kv_caches(self, spec: KVCacheSpec) -> None:
        if not isinstance(spec, KVCacheSpec):
            raise InvalidArgument(f"register_kv_caches takes a KVCacheSpec, got {type(spec).__name__}")
        spec.validate(self.layout)
        with self._lock:
            if self._meta is not None or any(not j.done.is_set() for j in self._jobs) or any(self._inflight.values()):
                raise InvalidArgument("cannot re-register KV caches while transfers are in flight")
        layers = spec.layer_views(self.layout)
        assert all(tuple(v.shape) == (spec.num_blocks, self._layer_bytes) for v in layers)
        xfer = make_transfer(layers, self._host.slab_tensor, self.layout.num_layers,
                             self.layout.page_bytes, self._copy, self._saver,
                             cpu_inline=self._cpu_inline, save_slab=self._host.save_slab_tensor)
        if self._xfer is not None:
            self._xfer.close()
        self._spec, self._xfer = spec, xfer

    def bind_connector_metadata(self, meta: ConnectorMetadata) -> None:
        if not isinstance(meta, ConnectorMetadata):
            raise InvalidArgument(f"expected ConnectorMetadata, got {type(meta).__name__}")
        if self._spec is None:
            raise InvalidArgument("no KV caches registered", hint="call register_kv_caches first")
        if self._meta is not None:
            raise InvalidArgument("a plan is already bound", hint="call clear_connector_metadata")
        nb = self._spec.num_blocks
        for spec in meta.loads:
            _check_block_ids(spec.block_ids, nb)
        for save in meta.saves:
            _check_block_ids(save.block_ids, nb)
        assert self._xfer is not None
        self._meta = meta
        self._step_loads = []
        # host slots are reserved at the first save_kv_layer that needs them, not here: a
        # reservation may evict host pages, and the engine binds before it queues the step's
        # forward -- there it would delay the GPU; in a hook the GPU is busy meanwhile
        self._step_saves = None
        self._step_layers = set()
        with self._lock:
            for s in meta.saves:
                self._inflight[s.request_id] += 1
                self._tracked.add(s.request_id)

    def _reserve_step_saves(self) -> list[_SaveJob]:
        """This step's save jobs, reserving their host slots on the first call."""
        if self._step_saves is None:
            assert self._meta is not None
            jobs: list[_SaveJob] = []
            for spec in self._meta.saves:
                try:
                    jobs.append(self._reserve(spec))
                except Exception as exc:  # noqa: BLE001 - a save that can't start is a later miss
                    with self._lock:
                        self._save_failures["reserve"] += len(spec.block_ids)
                    self._report("save", "reserve", spec.metas[0].namespace_id,
                                 len(spec.block_ids), exc)
                    self._drop_unreserved(spec)
            short = sum(j.handle.refused > 0 for j in jobs)
            gone = [j for j in jobs if j.handle.unavailable]  # the store could not be asked
            with self._lock:
                self._abandoned += short  # host had no room for some pages: they are not saved
                for j in gone:
                    self._save_failures["unavailable"] += j.handle.refused
            for j in gone:
                self._report("save", "unavailable", j.spec.metas[0].namespace_id,
                             j.handle.refused, j.handle.unavailable)
            self._step_saves = jobs
        return self._step_saves

    def _drop_unreserved(self, spec: SaveSpec) -> None:
        with self._lock:
            self._abandoned += 1
            self._inflight[spec.request_id] -= 1

    def _reserve(self, spec: SaveSpec) -> _SaveJob:
        handle = self.store.prepare_store(spec.metas, tier=self._host_name)
        block_of = {m.key: b for m, b in zip(spec.metas, spec.block_ids)}
        assert self._xfer is not None
        buf = self._xfer.new_save([block_of[m.key] for m in handle.metas], handle.slots)
        return _SaveJob(spec, handle, buf)

    def clear_connector_metadata(self) -> None:
        if self._meta is not None and len(self._step_layers) < self.layout.num_layers:
            if self._step_saves is None:
                for spec in self._meta.saves:
                    self._drop_unreserved(spec)
            else:
                for job in self._step_saves:
                    self._abandon(job)
        self._meta, self._step_loads, self._step_saves = None, [], []
        self._step_layers = set()

    # ----------------------------------------------------------------- loads

    def start_load_kv(self) -> None:
        if self._meta is None:
            raise InvalidArgument("no plan bound", hint="call bind_connector_metadata first")
        if self._step_loads:
            raise InvalidArgument("this step's loads were already started")
        assert self._xfer is not None
        gate = self._xfer.gate() if self._meta.loads else None
        for spec in self._meta.loads:
            job = _LoadJob(spec, _LayersQueued(), gate)
            with self._lock:
                self._jobs.append(job)
                if spec.load_async:
                    self._inflight[spec.request_id] += 1
                    self._tracked.add(spec.request_id)
            queued: tuple[int, str] | None = None
            if not spec.load_async:
                self._step_loads.append(job)
                if self._xfer.queue_on_caller:
                    # GPU copies are asynchronous: queue them here, on the engine thread, before
                    # its forward (a load thread would contend with it for the GIL while it
                    # launches the layers' kernels); the thread only waits for them to land.
                    try:
                        queued = self._resolve_and_queue(job, may_wait=self._cpu_inline)
                    except Exception as exc:  # noqa: BLE001 - a failed load is recomputed
                        queued, job.error = (0, "error"), exc  # reported by _run_load
                    job.queued = queued
            if spec.load_async:  # may wait on a prefetch for long: a thread of its own
                threading.Thread(target=self._run_load, args=(job, None), daemon=True,
                                 name=f"kvconnector-load-{spec.request_id}").start()
            elif self._cpu_inline:  # completed before the forward: no thread of ours wakes in it
                self._run_load(job, queued)
            else:
                self._loader.submit(self._run_load, job, queued)

    def wait_for_layer_load(self, layer: int) -> None:
        self._check_layer(layer)
        if not self.layerwise:
            layer = self.layout.num_layers - 1  # the whole load, before any layer computes
        xfer = self._xfer
        assert xfer is not None or not self._step_loads
        for job in self._step_loads:
            job.layers.wait(layer)
            if job.ctx is not None and (layer or not job.spec.skip_first_layer):
                xfer.wait_layer(job.ctx, layer)  # type: ignore[union-attr]

    def _resolve_and_queue(self, job: _LoadJob, *, may_wait: bool) -> tuple[int, str]:
        """Pin the pages' host slots through the store -- prefetching what is below host per
        the prefetch policy, when ``may_wait`` -- and queue (or, on the CPU, run) every layer's
        copy, marking each layer queued. Returns (how many blocks load, failure reason)."""
        spec, xfer = job.spec, self._xfer
        assert xfer is not None
        keys, n = spec.keys, len(spec.keys)
        good, reason = 0, ""
        if spec.lease is not None and spec.lease.expires_at <= self._clock():
            reason = "lease_expired"
        else:
            deadline = time.monotonic() + self.prefetch_timeout_s
            # without waiting, prepare_load pins the leading run host holds, a miss ends it;
            # pages the lookup found in host are there still (the lease): not asked again (over
            # the daemon a round trip, on the engine thread of a CPU engine)
            first_missing = (self._host.count_leading(keys)
                             if may_wait and spec.in_host < n else n)
            usable = n
            if first_missing < n:
                fut = self.store.prefetch(spec.namespace_id, keys[first_missing:], to=self._host_name)
                if self.prefetch_policy == "best_effort":
                    usable, reason = first_missing, "not_prefetched"  # fut warms host
                elif self.prefetch_policy == "wait_complete":
                    fut.result()
                else:
                    try:
                        fut.result(timeout=max(0.0, deadline - time.monotonic()))
                    except FutureTimeout:
                        reason = "timeout"
            job.handle = self.store.prepare_load(spec.namespace_id,
                                                 keys if usable == n else keys[:usable],
                                                 lease=spec.lease, tier=self._host_name)
            good = job.handle.num_blocks
            if good < n and not reason:
                reason = "unavailable" if job.handle.unavailable else "miss"
        if good:
            assert job.handle is not None
            job.ctx = xfer.load_context(job.gate, spec.block_ids[:good], job.handle.slots)
        skip = 1 if spec.skip_first_layer else 0  # the engine writes layer 0 itself
        for lyr in range(self.layout.num_layers):
            if good and lyr >= skip:
                xfer.load_layer(job.ctx, lyr)
            job.layers.reach(lyr + 1)
        return good, reason

    def _run_load(self, job: _LoadJob, queued: tuple[int, str] | None = None) -> None:
        """The load thread: pin and copy (unless ``queued`` already did), wait until the copies
        landed, complete the load (unpin, release the lease), report."""
        spec, xfer = job.spec, self._xfer
        assert xfer is not None
        good, reason = 0, ""
        try:
            good, reason = queued if queued is not None else self._resolve_and_queue(job, may_wait=True)
            if job.ctx is not None:
                xfer.finish_load(job.ctx)
        except Exception as exc:  # noqa: BLE001 - a failed load is recomputed, never fatal
            good, reason, job.error = 0, "error", exc
            if job.ctx is not None:
                try:  # queued copies must land before the blocks are recomputed
                    xfer.finish_load(job.ctx)
                except Exception:  # noqa: BLE001
                    pass
        finally:
            job.layers.reach(self.layout.num_layers)
            if job.handle is not None:
                try:
                    self.store.complete_load(job.handle)  # releases the lease too
                except Exception:  # noqa: BLE001 - the store closed under us: pins die with it
                    pass
            elif spec.lease is not None:
                try:
                    self.store.release(spec.lease)
                except Exception:  # noqa: BLE001 - expired, or the store closed
                    pass
            with self._lock:
                job.failed = list(spec.block_ids[good:])
                job.reason = reason
                self._loaded += good
                if job.failed:
                    self._failures[reason] += len(job.failed)
                    self._errors.update(job.failed)
                if spec.load_async:
                    self._inflight[spec.request_id] -= 1
            if job.failed:
                self._report("load", reason, spec.namespace_id, len(job.failed),
                             job.error or (job.handle.unavailable if job.handle else ""))
            job.done.set()

    # ----------------------------------------------------------------- saves

    def save_kv_layer(self, layer: int) -> None:
        self._check_layer(layer)
        if self._meta is None:
            raise InvalidArgument("no plan bound", hint="call bind_connector_metadata first")
        if layer in self._step_layers:
            raise InvalidArgument(f"layer {layer} was already saved this step")
        self._step_layers.add(layer)
        if not self._meta.saves:
            return
        L, xfer = self.layout.num_layers, self._xfer
        assert xfer is not None
        done = len(self._step_layers) == L
        if xfer.saves_whole_pages:
            # one copy of whole pages once every layer is written (DMA: no SMs taken from the
            # compute it overlaps); nothing to do before that
            if done:
                for job in self._reserve_step_saves():
                    xfer.save_pages(job.buf)
                    xfer.mark_saved(job.buf)
                    self._saver.submit(self._put, job)
            return
        jobs = self._reserve_step_saves()
        if jobs:
            xfer.begin_save_layer(layer)
        for job in jobs:
            xfer.save_layer(job.buf, layer)
            if done:
                xfer.mark_saved(job.buf)
                self._saver.submit(self._put, job)

    def wait_for_loads(self) -> None:
        for job in list(self._jobs):
            if not job.done.is_set():  # (the usual case after a step's token: no lock taken)
                job.done.wait()

    def settled_load_errors(self) -> set[int] | None:
        # A load queued on the caller pinned its pages first (a pinned slot keeps its bytes:
        # complete_load finds every page valid), so what fails is known at queue time; only a
        # device error in the copy itself can add to it, and then the device is lost anyway.
        if self._meta is None or any(spec.load_async for spec in self._meta.loads):
            return None
        bad: set[int] = set()
        for job in self._step_loads:
            if job.queued is None:
                return None
            bad.update(job.spec.block_ids[job.queued[0]:])
        return bad

    def wait_for_save(self) -> None:
        if self._xfer is not None:
            self._xfer.wait_for_save()

    def _put(self, job: _SaveJob) -> None:
        """Save thread: once the copies into the reserved slots landed, publish them."""
        assert self._xfer is not None
        try:
            self._xfer.wait_saved(job.buf)
            res = self.store.complete_store(job.handle)
            with self._lock:
                self._saved += res.stored
        except Exception as exc:  # noqa: BLE001 - a failed save is a cache miss later, never fatal
            with self._lock:
                self._abandoned += 1
                self._save_failures["error"] += len(job.spec.block_ids)
            self._report("save", "error", job.spec.metas[0].namespace_id,
                         len(job.spec.block_ids), exc)
            self._abort(job.handle)
        finally:
            self._xfer.release(job.buf)
            with self._lock:
                self._inflight[job.spec.request_id] -= 1

    def _report(self, what: str, reason: str, namespace_id: bytes, num_blocks: int,
                detail: object = "") -> None:
        """The one place a failed load or save leaves the worker (its own counters were bumped
        by the caller, under the lock): logged with its reason, rate-limited, and told to the
        store, which counts it for the namespace by reason -- over the daemon, in the
        daemon's stats (``kvstore stats``). Never raises: the store may be why it failed."""
        self._failure_log.failed(what, reason, num_blocks, detail)
        try:
            self.store.count_failed(namespace_id, what, reason, num_blocks)
        except Exception:  # noqa: BLE001 - closed or unreachable: counted and logged here
            pass

    def _abandon(self, job: _SaveJob) -> None:
        xfer = self._xfer
        assert xfer is not None
        xfer.mark_saved(job.buf)

        def drop() -> None:  # slots are freed only after the copies queued into them landed
            try:
                xfer.wait_saved(job.buf)
            finally:
                xfer.release(job.buf)
                self._abort(job.handle)

        self._saver.submit(drop)
        with self._lock:
            self._abandoned += 1
            self._inflight[job.spec.request_id] -= 1

    def _abort(self, handle: StoreHandle) -> None:
        try:
            self.store.abort(handle)
        except Exception:  # noqa: BLE001 - completed already, or the store closed
            pass

    # ----------------------------------------------------------------- completion

    def get_finished(self, finished_req_ids: Sequence[str]) -> FinishedRequests:
        with self._lock:
            recving = set()
            for job in [j for j in self._jobs if j.done.is_set()]:
                self._jobs.remove(job)
                if job.spec.load_async:
                    recving.add(job.spec.request_id)
            self._finishing.update(r for r in finished_req_ids if r in self._tracked)
            sending = {r for r in self._finishing if self._inflight[r] <= 0}
            for r in sending:
                self._finishing.discard(r)
                self._tracked.discard(r)
                self._inflight.pop(r, None)
        return FinishedRequests(frozenset(sending), frozenset(recving))

    def get_block_ids_with_load_errors(self) -> set[int]:
        with self._lock:
            errors, self._errors = self._errors, set()
        return errors

    def stats(self) -> ConnectorStats:
        with self._lock:
            return ConnectorStats(self._loaded, self._saved, self._abandoned,
                                  dict(self._failures), dict(self._save_failures))

    def close(self) -> None:
        """Wait for every load and save, then stop the save thread."""
        for job in list(self._jobs):
            job.done.wait()
        self._loader.shutdown(wait=True)
        self._saver.shutdown(wait=True)
        if self._xfer is not None:
            self._xfer.close()

    def _check_layer(self, layer: int) -> None:
        L = self.layout.num_layers
        if not isinstance(layer, int) or isinstance(layer, bool) or not 0 <= layer < L:
            raise InvalidArgument(f"layer {layer!r} is not in [0, {L})")


__all__ = ["InProcessScheduler", "InProcessWorker"]
