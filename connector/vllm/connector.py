"""kvstore's vLLM connector, :class:`KVStoreConnector`: one class for both of vLLM's sides
(see :mod:`connector.vllm` for its configuration and process layouts).

Scheduler side (vLLM's scheduler thread; never waits for a copy)::

    get_num_new_matched_tokens(request, n_local)  -> (tokens to load, load_async), or
        (None, False) while the lookup of a tier below host is in flight (vLLM asks again
        in a later step; the lookup never waits on disk or Redis)
        keys of request.all_token_ids in the request's namespace (below); a match from the host
        tier loads synchronously in the next step; one from disk or Redis asynchronously
        (vLLM parks the request until get_finished reports it in ``recving``) -- except on
        vLLM's CPU backend, where it loads synchronously too, its prefetch waited for on vLLM's
        thread: see :class:`connector.vllm_engine.EngineState` (``cpu_inline``) for why
    update_state_after_alloc(request, blocks, n)  -- every scheduled request; n > 0 hands the
        blocks after the local prefix (blocks[n_local/B : (n_local+n)/B]) to the match
    build_connector_meta(scheduler_output)       -- per scheduled request, the blocks that become
        full in this step: blocks [saved, (computed + scheduled) / B) are saved by this step's
        save_kv_layer calls (their K/V is final once the layer's attention ran)
    request_finished(request, block_ids)         -> (delay_free, None): delay while a save or an
        async load of the request is in flight
    update_connector_output(output)              -- the worker's step results: asynchronous
        loads ended; blocks that failed to load (``invalid_block_ids``) take their tokens out
        of the request's ``num_cached_tokens`` -- vLLM recomputes them, and it reports only
        what was loaded (:func:`count_loaded_only`)

Worker side: ``register_kv_caches`` describes vLLM's per-layer caches to the transfer code as
opaque blocks (:meth:`KVCacheSpec.layer_blocks`), ``start_load_kv`` / ``wait_for_layer_load`` /
``save_kv_layer`` / ``wait_for_save`` / ``get_finished`` / ``get_block_ids_with_load_errors``
map one to one onto the worker's calls, layer names onto layer indices (vLLM's model order).

Namespace of a request: the model (``model_id`` of the kvstore config, default vLLM's model
name), ``@revision`` when vLLM was given one, ``+lora:<name>`` for a LoRA request, and the
tenant salt of the config combined with the request's ``cache_salt`` -- two salts never share a
page. Requests with multimodal inputs or prompt embeddings are skipped (no load, no save) and
counted in :attr:`KVStoreVLLMStats.skipped_requests`.

Tensor parallelism (daemon mode): each of the ``tensor_parallel_size`` workers holds a shard of
the KV heads, and stores its share of a block as a page of its own, in the shard's namespace
(the model id with ``#tp<rank>/<world>``, :func:`~kvstore.keys.shard_model_id`; the daemon's
``[layout]`` is one worker's: ``num_kv_heads`` per rank). The scheduler side looks up every
shard's namespace and offers the run all of them hold -- a hit loads every shard or none; the
plan it builds holds each rank's loads and saves (:class:`KVStoreConnectorMetadata`), and each
worker binds its own. A block that fails on one rank is reported by that worker; vLLM unions the
workers' reports and recomputes the block on every rank. Pipeline parallelism is refused.

Stats: see :mod:`.stats`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)

from connector.base import ConnectorMetadata, KVCacheSpec, LoadSpec, SaveSpec
from connector.inprocess import InProcessScheduler
from connector.pin_request import PinRequest
from connector.vllm.layout import BLOCK_FORMATS, layout_for
from connector.vllm.request_state import RequestState, count_loaded_only
from connector.vllm.stats import KVStoreConnectorStats, KVStorePromMetrics
from connector.vllm_engine import (
    EngineState,
    KVStoreVLLMStats,
    attach,
    check_process_layout,
    daemon_target,
    detach,
    load_kvstore_config,
)
from kvstore.errors import ConfigError, InvalidArgument
from kvstore.keys import BlockMeta, Namespace, chain_keys, shard_model_id, token_bytes

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import PromMetric, PromMetricT

log = logging.getLogger("kvstore.vllm")


def _tensor_parallel_rank() -> int:
    """This worker's tensor-parallel rank (vLLM set up its process groups before it builds a
    worker's connector)."""
    from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

    return int(get_tensor_model_parallel_rank())


@dataclass
class KVStoreConnectorMetadata(KVConnectorMetadata):
    """One step's plan per tensor-parallel rank (``plans[rank]``, rank order): each worker
    binds its own shard's loads and saves."""

    plans: tuple[ConnectorMetadata, ...]


class KVStoreConnector(KVConnectorBase_V1):
    """kvstore's vLLM connector; see the module docstring."""

    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole,
                 kv_cache_config: KVCacheConfig | None = None) -> None:
        if kv_cache_config is None:
            raise ConfigError("this vLLM passes no KVCacheConfig to KV connectors",
                              hint="use vLLM >= 0.32")
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        tcfg = vllm_config.kv_transfer_config
        assert tcfg is not None  # the base class raised otherwise
        if getattr(tcfg, "kv_load_failure_policy", "recompute") != "recompute":
            raise ConfigError(
                f"kv_load_failure_policy is {tcfg.kv_load_failure_policy!r}: a page that fails "
                "its check would fail the request instead of being recomputed",
                hint='set kv_transfer_config.kv_load_failure_policy = "recompute"')
        par = vllm_config.parallel_config
        if par.pipeline_parallel_size > 1:
            raise ConfigError(
                f"pipeline_parallel_size is {par.pipeline_parallel_size}: kvstore's vLLM "
                "connector keeps tensor-parallel shards, not pipeline stages (each stage holds "
                "other layers of a block)",
                hint="use tensor_parallel_size for several workers; several engines on a node "
                "share one kvstore daemon (kv_connector_extra_config.daemon)")
        self._world = int(par.tensor_parallel_size)
        self._rank = _tensor_parallel_rank() if (
            role == KVConnectorRole.WORKER and self._world > 1) else 0
        self._layout, self._layer_names = layout_for(vllm_config, kv_cache_config)
        self._layer_index = {n: i for i, n in enumerate(self._layer_names)}
        self._block_size = self._layout.block_size
        mc = vllm_config.model_config
        extra = dict(tcfg.kv_connector_extra_config or {})
        cfg = load_kvstore_config(extra, self._layout, str(mc.served_model_name or mc.model))
        self._model_id = cfg.model_id + (f"@{mc.revision}" if mc.revision else "")
        self._secret = cfg.security.secret_bytes()
        self._tenant_salt = cfg.tenant_salt
        self._engine_id = str(tcfg.engine_id)
        num_blocks = int(kv_cache_config.num_blocks)
        daemon = daemon_target(extra)
        check_process_layout(par.distributed_executor_backend, self._world, daemon is not None)
        self._engine = attach(self._engine_id,
                              lambda: EngineState(cfg, self._layout, num_blocks, daemon))
        self._closed = False
        self._reported: dict[str, int] = {}  # counters as of the last get_kv_connector_stats
        # scheduler side
        self._scheds: dict[bytes, tuple[int, InProcessScheduler]] = {}  # ns id -> (rank, ...)
        self._reqs: dict[str, RequestState] = {}
        self._host = self._engine.host

    # ================================================================ scheduler side

    def _namespaces(self, request: Request) -> list[Namespace]:
        """The request's namespace per tensor-parallel shard, rank order (one without tensor
        parallelism)."""
        model = self._model_id
        lora = getattr(request, "lora_request", None)
        if lora is not None:
            model += f"+lora:{lora.lora_name}"
        salt = self._tenant_salt
        cache_salt = getattr(request, "cache_salt", None)
        if cache_salt is not None:  # length-prefixed: no two (tenant, cache) pairs collide
            salt = f"{len(salt)}:{salt}|{cache_salt}"
        return [Namespace(shard_model_id(model, r, self._world), self._layout, salt, self._secret)
                for r in range(self._world)]

    def _scheduler(self, ns: Namespace, rank: int) -> InProcessScheduler:
        entry = self._scheds.get(ns.id)
        if entry is None:
            entry = self._scheds[ns.id] = (rank, InProcessScheduler(
                self._engine.store_for(ns.id), ns,
                num_blocks=self._engine.num_blocks, host_tier=self._host,
                async_below_host=not self._engine.cpu_inline))
        return entry[1]

    def _skip_reason(self, request: Request) -> str | None:
        if getattr(request, "mm_features", None):
            return "multimodal"
        if request.prompt_token_ids is None:
            return "prompt_embeds"
        return None

    def _state(self, request: Request) -> RequestState | None:
        st = self._reqs.get(request.request_id)
        if st is None:
            reason = self._skip_reason(request)
            if reason is not None:
                self._engine.skipped[reason] += 1
                self._reqs[request.request_id] = st = RequestState(request, ())
                return None
            st = self._reqs[request.request_id] = RequestState(request, tuple(
                self._scheduler(ns, r) for r, ns in enumerate(self._namespaces(request))))
            self._pin(request, st)
        return st if st.scheds else None

    def _pin(self, request: Request, st: RequestState) -> None:
        """The request's ``kv_transfer_params`` may ask its prefix be pinned (see
        connector.pin_request): pinned in every shard's namespace. A bad ask or a pin the store
        refuses is logged and counted (stats ``pins:refused``); the request runs either way."""
        try:
            want = PinRequest.from_params(getattr(request, "kv_transfer_params", None))
            if want is None:
                return
            for sched in st.scheds:
                sched.pin_prefix(request.prompt_token_ids or [], want)
            self._engine.pins["made"] += 1
        except InvalidArgument as exc:
            self._engine.pins["refused"] += 1
            log.warning("request %s: its pin was not made: %s", request.request_id, exc)

    def get_num_new_matched_tokens(self, request: Request,
                                   num_computed_tokens: int) -> tuple[int | None, bool]:
        st = self._state(request)
        B = self._block_size
        if st is None or num_computed_tokens % B:
            return 0, False
        st.num_local = num_computed_tokens
        tokens = request.all_token_ids
        rid = request.request_id
        ms = [s.get_num_new_matched_tokens(rid, tokens, num_computed_tokens) for s in st.scheds]
        eng = self._engine
        if any(m.num_tokens is None for m in ms):  # a lookup below host is in flight: vLLM
            eng.pending += 1                       # asks again (and each shard looks up anew)
            return None, False
        # a hit loads every shard or none: the run all shards hold
        n = min(m.num_tokens or 0 for m in ms)
        if n == 0:
            for s, m in zip(st.scheds, ms):
                if m.num_tokens:  # release what the shard's lookup leased
                    s.update_state_after_alloc(rid, [], 0)
        for t in ms[0].tiers[:n // B]:
            eng.matched[t] += B
        eng.missed += max(0, (len(tokens) - 1) // B * B - num_computed_tokens - n)
        st.load_async = n > 0 and any(m.load_async for m in ms)
        return n, st.load_async

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks,
                                 num_external_tokens: int) -> None:
        st = self._state(request)
        if st is None:
            return
        ids = list(blocks.get_block_ids()[0])
        st.block_ids = ids  # every block of the request so far
        if num_external_tokens <= 0:
            return
        B = self._block_size
        first = st.num_local // B
        st.loading = tuple(ids[first:first + num_external_tokens // B])
        for s in st.scheds:  # every shard loads the same blocks, all in the step or all async
            s.update_state_after_alloc(request.request_id, list(st.loading),
                                       num_external_tokens, load_async=st.load_async)
        st.receiving = st.load_async

    def update_connector_output(self, connector_output: Any) -> None:
        for rid in connector_output.finished_recving or ():
            st = self._reqs.get(rid)
            if st is not None:
                st.receiving = False
        # The worker's failed blocks (get_block_ids_with_load_errors): vLLM truncates each
        # request's computed tokens at its first failed block and recomputes from there, but
        # the cached-token count it took from our offer at schedule time stays -- correct it.
        invalid = getattr(connector_output, "invalid_block_ids", None)
        if invalid:
            for st in self._reqs.values():
                if st.loading and not invalid.isdisjoint(st.loading):
                    loaded = next(i for i, b in enumerate(st.loading) if b in invalid)
                    st.loading = ()
                    count_loaded_only(st.request, st.num_local, loaded * self._block_size)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        sched_tokens = scheduler_output.num_scheduled_tokens
        for new in scheduler_output.scheduled_new_reqs:
            st = self._reqs.get(new.req_id)
            if st is None or not st.scheds:
                continue
            st.block_ids = list(new.block_ids[0])
            self._plan_saves(st, new.num_computed_tokens, sched_tokens.get(new.req_id, 0))
        cached = scheduler_output.scheduled_cached_reqs
        resumed: set[str] = getattr(cached, "resumed_req_ids", set())
        for i, rid in enumerate(cached.req_ids):
            st = self._reqs.get(rid)
            if st is None or not st.scheds:
                continue
            new_ids = cached.new_block_ids[i]
            if rid in resumed:
                st.block_ids = list(new_ids[0]) if new_ids is not None else []
                st.saved = None  # preempted: its blocks were recomputed into new ones
                st.loading = ()  # and the blocks it loaded into are not its own any more
            elif new_ids is not None:
                st.block_ids.extend(new_ids[0])
            self._plan_saves(st, cached.num_computed_tokens[i], sched_tokens.get(rid, 0))
        loads: list[list[LoadSpec]] = [[] for _ in range(self._world)]
        saves: list[list[SaveSpec]] = [[] for _ in range(self._world)]
        for rank, sched in self._scheds.values():
            plan = sched.build_connector_meta()
            loads[rank].extend(plan.loads)
            saves[rank].extend(plan.saves)
        self._gc_schedulers()
        return KVStoreConnectorMetadata(tuple(
            ConnectorMetadata(tuple(lo), tuple(sa)) for lo, sa in zip(loads, saves)))

    def _plan_saves(self, st: RequestState, num_computed: int, num_scheduled: int) -> None:
        """Hand the blocks that are full once this step ran to the scheduler's saves."""
        B = self._block_size
        if st.saved is None or num_computed < st.saved * B:
            # first scheduled: the blocks vLLM had or loaded are not saved; or vLLM recomputes
            # blocks it had counted (a synchronous load of them failed): they are saved anew
            st.saved = num_computed // B
        tokens = st.request.all_token_ids
        full = min(num_computed + num_scheduled, len(tokens), len(st.block_ids) * B) // B
        if full <= st.saved:
            return
        if not st.keys:
            st.keys = [[] for _ in st.scheds]
        data = token_bytes(tokens[st.saved * B:full * B])
        step = 4 * B
        # keys of every block up to `full` (computed once, extended as the request grows; the
        # shards' key lists grow together, so their new tokens are one slice)
        have = len(st.keys[0])
        grown = token_bytes(tokens[have * B:full * B]) if full > have else b""
        for sched, keys in zip(st.scheds, st.keys):  # each shard under its own namespace
            ns = sched.namespace
            if grown:
                keys.extend(chain_keys(keys[-1] if keys else ns.seed, grown, B))
            metas = [
                BlockMeta(ns.seed, keys[i], keys[i - 1] if i else ns.seed,
                          data[(i - st.saved) * step:(i - st.saved + 1) * step])
                for i in range(st.saved, full)
            ]
            sched.request_save(st.request.request_id, st.block_ids[st.saved:full], metas)
        st.saved = full

    def _gc_schedulers(self) -> None:
        live = {s.namespace.id for st in self._reqs.values() for s in st.scheds}
        for ns_id in [n for n in self._scheds if n not in live]:
            sched = self._scheds[ns_id][1]
            if not sched._matches and not sched._transfers and not sched._saves:
                del self._scheds[ns_id]

    def request_finished(self, request: Request,
                         block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        st = self._reqs.pop(request.request_id, None)
        if st is None or not st.scheds:
            return False, None
        for s in st.scheds:
            s.request_finished(request.request_id)
        # Saves need no delay: wait_for_save, at the end of every step, waits until the copies
        # out of the engine's blocks landed, so the blocks may be reused in the next step. An
        # asynchronous load still writing into them must end first.
        if st.receiving:
            self._engine.delayed.add(request.request_id)
            return True, None
        return False, None

    # ================================================================ worker side

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        names = self._layer_names
        if set(kv_caches) != set(names):
            raise InvalidArgument(
                f"vLLM registered KV caches for layers {sorted(kv_caches)}, its cache config "
                f"names {sorted(names)}")
        tensors = [kv_caches[n] for n in names]
        lay = self._layout
        shape_of = BLOCK_FORMATS.get(lay.block_format)
        want = shape_of(lay.num_kv_heads, lay.block_size, lay.head_dim) if shape_of else None
        for n, t in zip(names, tensors):
            if want is None or tuple(t.shape[1:]) != want or t.dtype != lay.torch_dtype:
                raise InvalidArgument(
                    f"vLLM's KV cache of layer {n!r} is {tuple(t.shape)} {t.dtype} on "
                    f"{t.device}; kvstore understands "
                    + ", ".join(f"{k}: [num_blocks, {', '.join(map(str, f(lay.num_kv_heads, lay.block_size, lay.head_dim)))}]"
                                for k, f in BLOCK_FORMATS.items())
                    + f" ({lay.dtype}), and this engine's format is {lay.block_format!r}",
                    hint="use vLLM's CPU backend, or another connector for this attention backend")
        self._engine.worker.register_kv_caches(KVCacheSpec.layer_blocks(tensors))

    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
        super().bind_connector_metadata(connector_metadata)
        assert isinstance(connector_metadata, KVStoreConnectorMetadata)
        self._engine.worker.bind_connector_metadata(connector_metadata.plans[self._rank])

    def clear_connector_metadata(self) -> None:
        super().clear_connector_metadata()
        self._engine.worker.clear_connector_metadata()

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        self._engine.worker.start_load_kv()

    def wait_for_layer_load(self, layer_name: str) -> None:
        self._engine.worker.wait_for_layer_load(self._layer_index[layer_name])

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any,
                      **kwargs: Any) -> None:
        self._engine.worker.save_kv_layer(self._layer_index[layer_name])

    def wait_for_save(self) -> None:
        self._engine.worker.wait_for_save()

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        done = self._engine.worker.get_finished(sorted(finished_req_ids))
        # vLLM expects `sending` only for requests whose request_finished said True
        delayed = self._engine.delayed
        sending = {r for r in done.sending if r in delayed}
        delayed.difference_update(sending)
        return sending or None, set(done.recving) or None

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self._engine.worker.get_block_ids_with_load_errors()

    def stats(self) -> KVStoreVLLMStats:
        return self._engine.stats()

    # ================================================================ vLLM's stats

    def get_kv_connector_stats(self) -> KVStoreConnectorStats | None:
        """This side's counters since the last call (scheduler side: hits by tier, misses,
        pending lookups, skipped requests; worker side: blocks loaded and saved, load errors by
        reason, daemon failures), or None when nothing changed. vLLM calls it on each side
        every step and hands the sum to its stat loggers and Prometheus."""
        now = self._engine.stats().counters(
            "scheduler" if self._role == KVConnectorRole.SCHEDULER else "worker")
        delta = {k: v - self._reported.get(k, 0) for k, v in now.items()
                 if v != self._reported.get(k, 0)}
        self._reported = now
        return KVStoreConnectorStats(data=delta) if delta else None

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> KVStoreConnectorStats:
        return KVStoreConnectorStats(data=dict(data or {}))

    @classmethod
    def build_prom_metrics(cls, vllm_config: VllmConfig,
                           metric_types: dict[type[PromMetric], type[PromMetricT]],
                           labelnames: list[str],
                           per_engine_labelvalues: dict[int, list[object]]) -> KVStorePromMetrics:
        return KVStorePromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        for _rank, sched in self._scheds.values():
            sched.close()
        self._scheds.clear()
        detach(self._engine_id)

