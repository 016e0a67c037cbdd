"""The connector's scheduler side, :class:`InProcessScheduler`: it looks up each request's
prefix in the store, leases what it offers, and hands the worker a plan of loads and saves each
step (see :mod:`connector.inprocess`).

Load or recompute (scheduler side, ``recompute_tokens_per_s``): when given (the engine's
measured prefill speed), each matched block below the host tier is loaded only if reading its
page at the tier's measured bandwidth (:meth:`TieredStore.read_bandwidth`) takes no longer than
recomputing its ``block_size`` tokens; the match ends at the first block whose load does not pay
(a tier not measured yet is assumed to pay). Host-tier blocks always load. Each decided block is
counted in ``kvstore_connector_decisions_total{decision="load"|"recompute"}`` on the store's
registry and in :attr:`InProcessScheduler.decisions`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass

from connector.base import (
    ConnectorMetadata,
    KVConnectorScheduler,
    LoadMatch,
    LoadSpec,
    SaveSpec,
)
from connector.inprocess.block_ids import check_block_ids
from connector.pin_request import PinRequest
from kvstore.api import StoreAPI
from kvstore.checks import check_keys
from kvstore.errors import InvalidArgument, LeaseError
from kvstore.keys import BlockMeta, CheckedKeys, Namespace, chain_keys, token_bytes
from kvstore.results import Lease, LookupResult
from kvstore.retention import Pin


def _host_index(store: StoreAPI, host_tier: str) -> int:
    tier = store.staging_tier(host_tier)  # raises InvalidArgument naming the problem
    return store.tier_names.index(tier.name)


def _first_block(tiers: Sequence[str], wanted: Callable[[str], bool]) -> int:
    """The first block of a hit (``tiers``: its tier per block) whose tier is ``wanted``,
    else ``len(tiers)``: asked once per distinct tier, the blocks scanned in C (a 32K-token
    hit has 2048)."""
    return min((tiers.index(t) for t in set(tiers) if wanted(t)), default=len(tiers))


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

    def pin_prefix(self, token_ids: Sequence[int], want: PinRequest) -> Pin | None:
        """Keep the whole blocks of ``token_ids``' first ``want.tokens`` (all) cached for
        ``want.ttl_s`` in every tier (``StoreAPI.pin``; blocks not stored yet are kept once
        they arrive). None when the prefix holds no whole block. InvalidArgument when the
        store refuses (pins past ``store.max_pinned_fraction``), nothing pinned then."""
        n = want.blocks(len(token_ids), self.block_size)
        if n == 0:
            return None
        keys = self.namespace.chain(list(token_ids[: n * self.block_size])).keys
        return self.store.pin(self.namespace.id, keys, ttl_s=want.ttl_s)

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
        check_block_ids(ids, self.num_blocks)
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
        check_block_ids(block_ids, self.num_blocks)
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

