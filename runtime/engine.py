"""The engine: requests in, tokens out, over a :class:`LlamaForPagedLM` and an hbm pool.

::

    add_request(prompt, params) -> request id         (validated here; bad input changes nothing)
    step():  Scheduler.schedule() -> chunks            (decodes first, then prefill chunks)
             build_batch(chunks) -> model(batch, pool.pool) -> logits of finishing chunks
             sample per request -> Scheduler.update()  (commit full blocks, finish, release)
             -> RequestOutputs of the requests that finished
    generate(prompts, params) = add_request * n, step() until done

The pool (:class:`~kvstore.pool.HBMTier`) is the paged KV cache: its ``pool`` tensor is the
model's ``kv_pool``; prefix-cache entries are its committed blocks. Eviction of cached blocks goes
through the pool's owner — a :class:`~kvstore.store.TieredStore` (write-back to lower tiers) or,
for a bare pool, a :class:`~kvstore.pool.LocalOwner` the engine attaches.

With a KV connector (``connector=(InProcessScheduler, InProcessWorker)``, built automatically by
:meth:`Engine.from_config` when a host tier is among the lower tiers), a step becomes::

    schedule()  (admission: hbm prefix, then connector match -> allocate -> update_state_after_alloc;
                 request_save for blocks that become full in this step's chunks)
    build_connector_meta -> bind -> start_load_kv   (async loads: waited for here, same step)
    model forward with layer hooks: wait_for_layer_load(l) | attention(l) | save_kv_layer(l)
    wait until this step's loads ended -> get_block_ids_with_load_errors -> clear metadata
    failed loads: the request rolls back to its first failed block, its chunk is discarded
    commit; release what the requests this step ends by max_tokens hold (the GPU still runs)
    sample, update; get_finished(ended requests) -> free blocks whose transfers are done

Load or recompute: the engine measures its prefill speed (``prefill_tokens_per_s``, an
exponentially weighted average of tokens/s over steps that run prefill chunks and load nothing).
With ``load_or_recompute=True`` it hands every new estimate to the connector's scheduler side
(``recompute_tokens_per_s``), which then declines loads slower than recomputing.

The first layer from the tokens: a load copies layers 1.. of its pages only, and the engine
writes layer 0's K/V of the loaded blocks itself, right after ``start_load_kv`` (the copies are
queued) and before the forward (``LlamaForPagedLM.write_first_layer_kv``). Layer 0's K/V depend
on the token ids alone -- one embedding, norm, K/V projection and RoPE per token, no attention
-- so the GPU makes them beside the copies, in a fraction of the time their share of the host
link would take; every later layer's K/V needs the attention of the layer below over the whole
prefix, a prefill. A layer-wise hit's first waited-for copy is then layer 1's, and the link
moves 1/L less (Llama-3-8B: 1/32, 0.3 ms of a 4K-token hit on the H200). The written K/V are
the model's for those tokens, as a forward would write them; they may differ from the loaded
page's in the last bits (a product over another number of rows), as two forwards' may.
``first_layer_from_tokens=False`` copies every layer.

Start: with step graphs (``runtime.step_graphs``; mode ``"cuda"`` on a GPU by default) the
engine prepares, before its first request, every step shape its scheduler limits can produce
(:func:`~runtime.step_graphs.reachable_shapes`): on a GPU it captures their CUDA graphs, with a
progress bar on stderr and one log line, so no request pays a capture (measured:
``bench.ttft``, "first hbm hit after start"). Steps longer than the graphs take
(``max_num_batched_tokens`` over ``runtime.step_graphs.MAX_TOKENS``) run eagerly through the
model's backend; the engine runs one of each kernel specialisation they can hit once
(:func:`~runtime.step_graphs.eager_warm_steps`, over a scratch block: the pool is neither read
nor written), so no request pays a JIT compile or a first launch ("first request after
start"). :attr:`Engine.startup` reports the times. ``capture_graphs_at_start=False`` leaves
capture and first launches to each shape's first step.

Saves are not waited for at the end of a step (only where blocks are freed early: a preempted
request, a duplicate block released at commit); finished requests' blocks are freed when the
connector reports them in ``sending`` (:meth:`Engine.drain` waits for all of them).
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from connector.base import KVCacheSpec, KVConnectorScheduler, KVConnectorWorker, LoadSpec
from connector.inprocess import InProcessScheduler
from connector.pin_request import PinRequest
from kvstore.errors import InvalidArgument
from kvstore.keys import Namespace
from kvstore.pool import HBMTier, LocalOwner
from kvstore.store import TieredStore
from runtime import engine_build
from runtime.batch import SeqInput, build_batch, first_bad_id, id_array, int32le
from runtime.engine_startup import StartupReport, prepare_steps
from runtime.model import LlamaForPagedLM
from runtime.request import Request, RequestOutput
from runtime.readout import HostReadout, HostUpload
from runtime.sampling import SamplingParams, sample_rows
from runtime.scheduler import EngineConnector, Scheduler, SchedulerConfig
from runtime.tokenizer import Tokenizer


_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class _ConnectorHooks:
    """Per-layer model hooks: wait for the layer's loads before its attention, save after."""

    worker: KVConnectorWorker

    def before(self, layer: int) -> None:
        self.worker.wait_for_layer_load(layer)

    def after(self, layer: int) -> None:
        self.worker.save_kv_layer(layer)


class Engine:
    """Continuous-batching inference over one model and one hbm pool. Not thread-safe."""

    #: The checkpoint's tokenizer when built by :meth:`from_pretrained` from a directory with a
    #: ``tokenizer.json``; None otherwise (prompts and outputs are token ids).
    tokenizer: Tokenizer | None = None

    def __init__(
        self,
        model: LlamaForPagedLM,
        pool: HBMTier,
        namespace: Namespace,
        *,
        max_num_batched_tokens: int = 512,
        max_num_seqs: int = 64,
        chunk_size: int | None = None,
        enable_prefix_caching: bool = True,
        clock: Callable[[], float] = time.perf_counter,
        connector: tuple[KVConnectorScheduler, KVConnectorWorker] | None = None,
        load_or_recompute: bool = False,
        first_layer_from_tokens: bool = True,
        capture_graphs_at_start: bool = True,
    ) -> None:
        """Raises InvalidArgument when the pool does not fit the model or the namespace's layout
        differs from the pool's, or for a bad scheduler setting. A pool without an owner gets a
        :class:`LocalOwner` (LRU), so cached blocks can be reclaimed.

        ``connector``: the scheduler and worker sides of a KV connector over the store the pool
        belongs to (built for ``namespace`` and ``pool.num_blocks``); the pool is registered
        with the worker as a page-first KV cache. Full blocks are handed to ``request_save``
        unless the connector's store is write-through (its commits are copied down already).
        ``load_or_recompute``: feed the measured prefill speed to the connector's scheduler side
        (its ``recompute_tokens_per_s``; see the module docstring).
        ``first_layer_from_tokens``: a load copies layers 1.. only; the engine writes layer 0's
        K/V of the loaded blocks from their token ids (see the module docstring); needs a
        connector whose worker honours ``LoadSpec.skip_first_layer`` and whose scheduler side
        sets it (the in-process connector's), else loads copy every layer.
        ``capture_graphs_at_start``: prepare every step shape these limits can produce now
        (on a GPU: capture its CUDA graphs; see the module docstring), not on the first request
        that meets it; reported in :attr:`startup`."""
        t0 = time.perf_counter()
        if not isinstance(capture_graphs_at_start, bool):
            raise InvalidArgument(
                f"capture_graphs_at_start must be a bool, got {capture_graphs_at_start!r}",
                hint="True (the default) captures at start; False captures on first use")
        if not isinstance(first_layer_from_tokens, bool):
            raise InvalidArgument(
                f"first_layer_from_tokens must be a bool, got {first_layer_from_tokens!r}")
        if not isinstance(pool, HBMTier):
            raise InvalidArgument(f"pool must be an HBMTier, got {type(pool).__name__}",
                                  hint="build it with kvstore.pool.HBMTier")
        model.check_kv_pool(pool.pool, pool.layout.block_size)
        if namespace.layout != pool.layout:
            raise InvalidArgument(
                f"namespace layout {namespace.layout} differs from the pool's {pool.layout}",
                hint="build the namespace with the pool's layout",
            )
        self.model = model
        self.pool = pool
        self._readout = HostReadout(pool.device)
        self._upload = HostUpload(pool.device)
        self.namespace = namespace
        self.config = SchedulerConfig(max_num_batched_tokens, max_num_seqs, chunk_size,
                                      enable_prefix_caching)
        if pool.owner is None:
            pool.attach(LocalOwner(pool))
        # before any request: a capture must be the only CUDA work queued while it runs
        prepared = (prepare_steps(model, pool, self.config) if capture_graphs_at_start
                    else (0.0, 0, 0, 0.0, 0))
        self._clock = clock
        self.connector: EngineConnector | None = None
        if connector is not None:
            csched, worker = connector
            if not isinstance(csched, KVConnectorScheduler) or not isinstance(worker, KVConnectorWorker):
                raise InvalidArgument(
                    "connector must be (KVConnectorScheduler, KVConnectorWorker), got "
                    f"({type(csched).__name__}, {type(worker).__name__})")
            worker.register_kv_caches(KVCacheSpec.page_first(pool.pool))
            self.connector = EngineConnector(csched, worker, csched.wants_saves)
            if hasattr(csched, "skip_first_layer"):
                # the engine writes layer 0 of every load that skips it (see step); a worker
                # that copies it anyway would race that write, so it is asked of none other
                csched.skip_first_layer = first_layer_from_tokens and worker.skips_first_layer
        if load_or_recompute and (
            connector is None or not hasattr(connector[0], "recompute_tokens_per_s")
        ):
            raise InvalidArgument(
                "load_or_recompute needs a connector whose scheduler side takes "
                "recompute_tokens_per_s", hint="use InProcessScheduler, or leave it off")
        self.load_or_recompute = load_or_recompute
        #: Measured prefill speed (tokens/s), None until a prefill step without loads ran.
        self.prefill_tokens_per_s: float | None = None
        self.scheduler = Scheduler(pool, namespace, self.config, clock, self.connector)
        self._ids = itertools.count()
        self._known_ids: set[str] = set()
        #: The store the pool belongs to when built by :meth:`from_config` (else None).
        self.store: TieredStore | None = None
        #: The daemon client when built by :meth:`from_config` with ``daemon`` (else None).
        self.daemon: Any = None
        #: How this engine started (:class:`StartupReport`).
        self.startup = StartupReport(time.perf_counter() - t0, *prepared)
        if capture_graphs_at_start and self.model.step_graphs is not None:
            up = self.startup
            _log.info("engine started in %.2f s: %d step shapes prepared (%s), %d captured as "
                      "CUDA graphs in %.2f s; %d long steps warmed eagerly in %.2f s",
                      up.seconds, up.num_shapes, self.model.step_graphs.mode, up.num_captured,
                      up.capture_s, up.num_warm_steps, up.warm_s)

    # construction over a store (runtime/engine_build.py)
    from_config = classmethod(engine_build.from_config)
    from_pretrained = classmethod(engine_build.from_pretrained)
    _over_store = classmethod(engine_build.over_store)

    # ----------------------------------------------------------------- requests

    def add_request(
        self,
        prompt_token_ids: Sequence[int],
        params: SamplingParams | None = None,
        *,
        request_id: str | None = None,
        arrival_time: float | None = None,
        pin: PinRequest | None = None,
    ) -> str:
        """Queue a request; returns its id. Raises InvalidArgument (and queues nothing) for an
        empty prompt, a token id outside ``[0, vocab_size)``, ``prompt + max_tokens`` longer than
        ``max_position_embeddings``, bad sampling params or a stop token outside the vocabulary,
        and a request id already used. ``pin``: keep the prompt's prefix cached in every tier
        of the connector's store (:class:`~connector.pin_request.PinRequest`), pinned before
        the request is queued; a pin the store refuses (past its bound) queues nothing."""
        cfg = self.model.config
        if params is None:
            params = SamplingParams()
        if not isinstance(params, SamplingParams):
            raise InvalidArgument(f"params must be SamplingParams, got {type(params).__name__}",
                                  hint="build them with runtime.sampling.SamplingParams(...)")
        if isinstance(prompt_token_ids, (str, bytes)) or not isinstance(prompt_token_ids, Sequence):
            raise InvalidArgument(
                f"a prompt is a sequence of token ids, got {type(prompt_token_ids).__name__}",
                hint="tokenize the text first (e.g. runtime.tokenizer.ByteTokenizer)")
        if not len(prompt_token_ids):
            raise InvalidArgument("the prompt is empty", hint="pass at least one token id")
        ids = id_array(prompt_token_ids, cfg.vocab_size)
        if ids is None:
            bad = first_bad_id(list(prompt_token_ids), cfg.vocab_size)
            raise InvalidArgument(f"prompt token id {bad!r} is outside [0, {cfg.vocab_size})",
                                  hint="tokenize with the model's tokenizer")
        params.check_vocab(cfg.vocab_size)
        if len(ids) + params.max_tokens > cfg.max_position_embeddings:
            raise InvalidArgument(
                f"prompt ({len(ids)} tokens) + max_tokens ({params.max_tokens}) exceeds "
                f"max_position_embeddings={cfg.max_position_embeddings}",
                hint="shorten the prompt or lower max_tokens")
        if request_id is None:
            request_id = f"req-{next(self._ids)}"
            while request_id in self._known_ids:
                request_id = f"req-{next(self._ids)}"
        elif not isinstance(request_id, str) or not request_id:
            raise InvalidArgument(f"request_id must be a non-empty str, got {request_id!r}")
        elif request_id in self._known_ids:
            raise InvalidArgument(f"request id {request_id!r} is already in use",
                                  hint="leave request_id unset to get a fresh one")
        if pin is not None:
            self._pin(ids, pin)
        # the checked array itself: the request copies it (outputs get plain ints from it)
        req = Request(request_id, ids, params,
                      self._clock() if arrival_time is None else arrival_time,
                      prompt_bytes=int32le(ids))
        self._known_ids.add(request_id)
        self.scheduler.add(req)
        return request_id

    def _pin(self, ids: Sequence[int], pin: PinRequest) -> None:
        if not isinstance(pin, PinRequest):
            raise InvalidArgument(f"pin must be a PinRequest, got {type(pin).__name__}")
        scheduler = self.connector.scheduler if self.connector is not None else None
        if not isinstance(scheduler, InProcessScheduler):
            raise InvalidArgument("a pin needs the engine's connector to the store",
                                  hint="build the engine with a kvstore connector")
        scheduler.pin_prefix(ids, pin)

    def abort(self, request_id: str) -> bool:
        """End a request before it finishes -- its client went away: it leaves the queue, or
        gives its blocks back (transfers in flight delay them), and the next :meth:`step`
        reports it with finish reason "abort". False when no unfinished request has that id
        (finished already, or never added). Call it between steps (the engine is not
        thread-safe)."""
        return self.scheduler.abort(request_id)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def step(self) -> list[RequestOutput]:
        """Run one scheduling step; returns the requests that finished in it."""
        chunks = self.scheduler.schedule()
        if not chunks and (self.scheduler.num_pending_lookups or self.scheduler.num_delayed_frees):
            time.sleep(0.0005)  # waiting on a remote lookup or on saves to free blocks: no spin
        conn = self.connector
        bound = False
        rolled: set[str] = set()
        settled: set[int] | None = None
        sampled: dict[str, int] = {}
        if conn is not None:
            meta = conn.scheduler.build_connector_meta()
            if meta.loads or meta.saves:
                conn.worker.bind_connector_metadata(meta)
                bound = True
        try:
            if bound:
                assert conn is not None
                conn.worker.start_load_kv()
                self._write_first_layers(meta.loads)  # on the GPU beside the copies
                if any(ld.load_async for ld in meta.loads):
                    self._wait_loads()  # loads from below host: waited for in this step
            hooks = _ConnectorHooks(conn.worker) if bound and conn is not None else None
            t0 = time.perf_counter()
            logits = self._forward(chunks, hooks)
            if not (bound and meta.loads) and any(ch.num_tokens > 1 for ch in chunks):
                self._measure_prefill(sum(ch.num_tokens for ch in chunks),
                                      time.perf_counter() - t0)
            self.scheduler.prepare_commits(chunks)  # while the GPU runs the step
            if bound:
                assert conn is not None
                settled = conn.worker.settled_load_errors() if meta.loads and chunks else None
                if settled is not None:
                    # the loads' outcome is known before their copies land: commit now, while
                    # they run (a 32K-token hit commits 2048 blocks), not after them
                    rolled = self.scheduler.apply_load_errors(settled) if settled else set()
                    self._commit(chunks, rolled)
                    self.scheduler.release_ending(chunks, rolled)
                    self._reap()  # the requests that ended so far: not after the token
                    # and sample: the forward's layers wait for their copies on the device, so
                    # its logits are read as soon as it is done, while the load threads still
                    # complete the loads (unpin, report); a late device error raises below,
                    # before anything sampled is used
                    assert logits is not None
                    sampled = self._sample(chunks, logits, rolled)
                self._wait_loads()
                errors = conn.worker.get_block_ids_with_load_errors()
                if settled is not None and errors - settled:
                    raise RuntimeError(
                        f"{len(errors - settled)} blocks failed to load after their copies were "
                        "queued (a device error): their blocks were committed")
                if settled is None and errors:
                    rolled = self.scheduler.apply_load_errors(errors)
        finally:
            if bound and conn is not None:
                conn.worker.clear_connector_metadata()
        if chunks:
            if settled is None:
                self._commit(chunks, rolled)
                self.scheduler.release_ending(chunks, rolled)
                assert logits is not None
                sampled = self._sample(chunks, logits, rolled)
            self.scheduler.update([ch for ch in chunks if ch.request.request_id not in rolled],
                                  sampled)
        if conn is not None and (settled is None or self.scheduler.num_connector_finished):
            self._reap()
        done = self.scheduler.take_finished()
        for req in done:
            self._known_ids.discard(req.request_id)
        return [req.to_output() for req in done]

    def _sample(self, chunks: list[Any], logits: torch.Tensor, rolled: set[str]) -> dict[str, int]:
        """The next token of each sampling chunk's request (the rolled-back ones left out)."""
        reqs = [ch.request for ch in chunks if ch.sample]
        rows = [i for i, req in enumerate(reqs) if req.request_id not in rolled]
        if not rows:
            return {}
        # read through the readout: never behind a save's DMA (runtime/readout.py)
        picked = [reqs[i] for i in rows]
        toks = sample_rows(logits if len(rows) == len(reqs) else logits[rows],
                           [r.params for r in picked], [r.generator for r in picked],
                           self._readout)
        return {r.request_id: t for r, t in zip(picked, toks)}

    def _commit(self, chunks: list[Any], rolled: set[str]) -> None:
        """Commit the full blocks of the step's chunks (not of the rolled-back requests); the
        pool's copies out of them wait for the work queued so far."""
        self.pool.note_queued_writes()
        self.scheduler.commit_prepared(chunks, rolled)

    def _forward(self, chunks: list[Any], hooks: _ConnectorHooks | None) -> torch.Tensor | None:
        """Run the chunks through the model (with the connector's layer hooks); without
        chunks, still walk the hooks so a bound plan's loads and saves run."""
        if not chunks:
            if hooks is not None:
                for lyr in range(self.model.config.num_layers):
                    hooks.before(lyr)
                    hooks.after(lyr)
            return None
        seqs = [
            SeqInput(ch.request.token_ids[ch.start: ch.start + ch.num_tokens],
                     ch.request.block_ids, ch.start, "last" if ch.sample else "none")
            for ch in chunks
        ]
        batch = build_batch(seqs, self.model.config, block_size=self.pool.layout.block_size,
                            num_blocks=self.pool.num_blocks, device=self.pool.device)
        return self.model(batch, self.pool.pool, layer_hooks=hooks)

    def _write_first_layers(self, loads: Sequence[LoadSpec]) -> None:
        """Layer 0's K/V of the blocks of every load that does not copy it, from their tokens
        (after the loads' copies are queued: anything before them would delay the first; the
        ids go up by a kernel, never behind those copies)."""
        skipping = [spec for spec in loads if spec.skip_first_layer]
        if not skipping:
            return
        by_id = {req.connector_id: req for req in self.scheduler.loading}
        B = self.pool.layout.block_size
        for spec in skipping:
            req = by_id[spec.request_id]
            start, stop = req.load_start * B, (req.load_start + len(spec.block_ids)) * B
            self.model.write_first_layer_kv(self.pool.pool, req.token_ids[start:stop], start,
                                            spec.block_ids, upload=self._upload.upload)

    def _measure_prefill(self, num_tokens: int, elapsed_s: float) -> None:
        sample_tps = num_tokens / max(elapsed_s, 1e-9)
        old = self.prefill_tokens_per_s
        self.prefill_tokens_per_s = sample_tps if old is None else 0.3 * sample_tps + 0.7 * old
        if self.load_or_recompute and self.connector is not None:
            self.connector.scheduler.recompute_tokens_per_s = self.prefill_tokens_per_s  # type: ignore[attr-defined]

    def _wait_loads(self) -> None:
        """Block until every load handed to the worker has ended, so its failed blocks are all
        reported before the step's results are used."""
        if self.connector is not None:
            self.connector.worker.wait_for_loads()

    def _reap(self) -> None:
        """Pass ended requests to the worker; free the blocks of those whose transfers are done."""
        assert self.connector is not None
        fin = self.connector.worker.get_finished(self.scheduler.take_connector_finished())
        if fin.sending:
            self.scheduler.free_delayed(fin.sending)

    @property
    def num_pending_frees(self) -> int:
        """Ended requests whose blocks wait for the connector's transfers (delayed free)."""
        return self.scheduler.num_delayed_frees

    def drain(self, timeout_s: float = 10.0) -> None:
        """Wait until every delayed free happened (all saves of ended requests are stored).
        Raises TimeoutError after ``timeout_s``."""
        if self.connector is None:
            return
        deadline = time.monotonic() + timeout_s
        self.connector.worker.wait_for_save()
        self._reap()
        while self.scheduler.num_delayed_frees:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.scheduler.num_delayed_frees} requests still wait for "
                                   "their KV transfers")
            time.sleep(0.001)
            self._reap()

    def close(self) -> None:
        """Drain the connector and stop its threads (no-op without one)."""
        if self.connector is None:
            return
        self.drain()
        self.connector.worker.close()
        self.connector.scheduler.close()
        if self.daemon is not None:
            self.daemon.close()

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Generate for every prompt (batched continuously); outputs in prompt order. All prompts
        are validated before any is queued. Requests queued earlier with :meth:`add_request` run
        too, but their outputs are not returned here (drive :meth:`step` yourself to get them)."""
        if params is None or isinstance(params, SamplingParams):
            plist = [params] * len(prompts)
        else:
            plist = list(params)
            if len(plist) != len(prompts):
                raise InvalidArgument(f"{len(prompts)} prompts but {len(plist)} SamplingParams",
                                      hint="pass one SamplingParams, or one per prompt")
        ids: list[str] = []
        try:
            for prompt, p in zip(prompts, plist):
                ids.append(self.add_request(prompt, p))
        except InvalidArgument:
            self._abort(ids)
            raise
        pending = set(ids)
        results: dict[str, RequestOutput] = {}
        while pending:
            if not self.has_unfinished():  # pragma: no cover - scheduler invariant
                raise RuntimeError("requests vanished from the scheduler")
            for out in self.step():
                results[out.request_id] = out
                pending.discard(out.request_id)
        return [results[i] for i in ids]

    def _abort(self, request_ids: Sequence[str]) -> None:
        """Drop still-waiting requests (used to undo a partly queued generate call)."""
        drop = set(request_ids)
        self.scheduler.waiting = type(self.scheduler.waiting)(
            r for r in self.scheduler.waiting if r.request_id not in drop)
        self._known_ids -= drop


__all__ = ["Engine", "RequestOutput", "SamplingParams", "StartupReport"]
