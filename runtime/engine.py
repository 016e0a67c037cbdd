"""The engine: requests in, tokens out, over a :class:`LlamaForPagedLM` and an hbm pool.

::

    add_request(prompt, params) -> request id         (validated here; bad input changes nothing)
    step():  Scheduler.schedule() -> chunks            (decodes first, then prefill chunks)
             build_batch(chunks) -> model(batch, pool.pool) -> logits of finishing chunks
             sample per request -> Scheduler.update()  (commit full blocks, finish, release)
             -> RequestOutputs of the requests that finished
    generate(prompts, params) = add_request * n, step() until done

The pool (:class:`~kvstore.tiers.hbm.HBMTier`) is the paged KV cache: its ``pool`` tensor is the
model's ``kv_pool``; prefix-cache entries are its committed blocks. Eviction of cached blocks goes
through the pool's owner — a :class:`~kvstore.store.TieredStore` (write-back to lower tiers) or,
for a bare pool, a :class:`~kvstore.tiers.hbm_owner.LocalOwner` the engine attaches.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from kvstore.errors import InvalidArgument
from kvstore.keys import Namespace
from kvstore.metrics import Metrics
from kvstore.store import TieredStore
from kvstore.tiers.base import Tier
from kvstore.tiers.hbm import HBMTier
from kvstore.tiers.hbm_owner import LocalOwner
from runtime.attention import DEFAULT_BACKEND
from runtime.batch import SeqInput, build_batch
from runtime.config import get_model_config
from runtime.model import LlamaForPagedLM
from runtime.request import Request, RequestOutput
from runtime.sampling import SamplingParams, sample
from runtime.scheduler import Scheduler, SchedulerConfig


class Engine:
    """Continuous-batching inference over one model and one hbm pool. Not thread-safe."""

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
    ) -> None:
        """Raises InvalidArgument when the pool does not fit the model or the namespace's layout
        differs from the pool's, or for a bad scheduler setting. A pool without an owner gets a
        :class:`LocalOwner` (LRU), so cached blocks can be reclaimed."""
        if not isinstance(pool, HBMTier):
            raise InvalidArgument(f"pool must be an HBMTier, got {type(pool).__name__}",
                                  hint="build it with kvstore.tiers.hbm.HBMTier")
        model.check_kv_pool(pool.pool, pool.layout.block_size)
        if namespace.layout != pool.layout:
            raise InvalidArgument(
                f"namespace layout {namespace.layout} differs from the pool's {pool.layout}",
                hint="build the namespace with the pool's layout",
            )
        self.model = model
        self.pool = pool
        self.namespace = namespace
        self.config = SchedulerConfig(max_num_batched_tokens, max_num_seqs, chunk_size,
                                      enable_prefix_caching)
        if pool.owner is None:
            pool.attach(LocalOwner(pool))
        self._clock = clock
        self.scheduler = Scheduler(pool, namespace, self.config, clock)
        self._ids = itertools.count()
        self._known_ids: set[str] = set()
        #: The store the pool belongs to when built by :meth:`from_config` (else None).
        self.store: TieredStore | None = None

    @classmethod
    def from_config(
        cls,
        config_name: str = "tiny",
        *,
        seed: int = 0,
        num_blocks: int = 256,
        block_size: int = 16,
        device: str | torch.device = "cpu",
        lower_tiers: Sequence[Tier] = (),
        write_policy: str = "write_back",
        backend: str = DEFAULT_BACKEND,
        **engine_kwargs: Any,
    ) -> Engine:
        """A random-weight model of a named config (``tiny``, ``small``, ...), an hbm pool of
        ``num_blocks`` blocks in a :class:`TieredStore` over ``[hbm, *lower_tiers]`` (exposed as
        ``engine.store``), and the engine (``engine_kwargs`` as for ``__init__``)."""
        cfg = get_model_config(config_name)
        model = LlamaForPagedLM.from_random(cfg, seed, backend=backend, device=device)
        layout = cfg.kv_layout(block_size)
        metrics = lower_tiers[0].metrics if lower_tiers else Metrics()
        pool = HBMTier("hbm", layout, num_blocks, metrics, device=device)
        store = TieredStore(layout, [pool, *lower_tiers], write_policy=write_policy)  # type: ignore[arg-type]
        engine = cls(model, pool, Namespace(f"random/{config_name}/{seed}", layout),
                     **engine_kwargs)
        engine.store = store
        return engine

    # ----------------------------------------------------------------- requests

    def add_request(
        self,
        prompt_token_ids: Sequence[int],
        params: SamplingParams | None = None,
        *,
        request_id: str | None = None,
        arrival_time: float | None = None,
    ) -> str:
        """Queue a request; returns its id. Raises InvalidArgument (and queues nothing) for an
        empty prompt, a token id outside ``[0, vocab_size)``, ``prompt + max_tokens`` longer than
        ``max_position_embeddings``, bad sampling params or a stop token outside the vocabulary,
        and a request id already used."""
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
        prompt = list(prompt_token_ids)
        if not prompt:
            raise InvalidArgument("the prompt is empty", hint="pass at least one token id")
        for t in prompt:
            if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < cfg.vocab_size:
                raise InvalidArgument(f"prompt token id {t!r} is outside [0, {cfg.vocab_size})",
                                      hint="tokenize with the model's tokenizer")
        params.check_vocab(cfg.vocab_size)
        if len(prompt) + params.max_tokens > cfg.max_position_embeddings:
            raise InvalidArgument(
                f"prompt ({len(prompt)} tokens) + max_tokens ({params.max_tokens}) exceeds "
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
        req = Request(request_id, prompt, params,
                      self._clock() if arrival_time is None else arrival_time)
        self._known_ids.add(request_id)
        self.scheduler.add(req)
        return request_id

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def step(self) -> list[RequestOutput]:
        """Run one scheduling step; returns the requests that finished in it."""
        chunks = self.scheduler.schedule()
        if chunks:
            seqs = [
                SeqInput(ch.request.token_ids[ch.start: ch.start + ch.num_tokens],
                         ch.request.block_ids, ch.start, "last" if ch.sample else "none")
                for ch in chunks
            ]
            batch = build_batch(seqs, self.model.config, block_size=self.pool.layout.block_size,
                                num_blocks=self.pool.num_blocks, device=self.pool.device)
            logits = self.model(batch, self.pool.pool)
            sampled: dict[str, int] = {}
            row = 0
            for ch in chunks:
                if ch.sample:
                    req = ch.request
                    sampled[req.request_id] = sample(logits[row], req.params, req.generator)
                    row += 1
            self.scheduler.update(chunks, sampled)
        done = self.scheduler.take_finished()
        for req in done:
            self._known_ids.discard(req.request_id)
        return [req.to_output() for req in done]

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
        want = set(ids)
        results: dict[str, RequestOutput] = {}
        while want - results.keys():
            if not self.has_unfinished():  # pragma: no cover - scheduler invariant
                raise RuntimeError("requests vanished from the scheduler")
            for out in self.step():
                results[out.request_id] = out
        return [results[i] for i in ids]

    def _abort(self, request_ids: Sequence[str]) -> None:
        """Drop still-waiting requests (used to undo a partly queued generate call)."""
        drop = set(request_ids)
        self.scheduler.waiting = type(self.scheduler.waiting)(
            r for r in self.scheduler.waiting if r.request_id not in drop)
        self._known_ids -= drop


__all__ = ["Engine", "RequestOutput", "SamplingParams"]
