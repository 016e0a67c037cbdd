"""Continuous batching with chunked prefill over the hbm pool (vLLM v1 style).

Each :meth:`Scheduler.schedule` call spends a token budget (``max_num_batched_tokens``):

1. **Running requests first**, in admission order: a decoding request gets its one new token, a
   partially prefilled one its next chunk (at most ``chunk_size`` tokens). Blocks are allocated
   lazily for exactly the tokens scheduled. When the pool has no block (``allocate`` returns
   None), the most recently admitted running request is preempted — its blocks released, its
   state reset, put back at the head of the waiting queue — until the allocation succeeds or the
   request itself was the one preempted.
2. **Then waiting requests**, FIFO, while budget and ``max_num_seqs`` allow (not in a step that
   preempted). On admission the request's block keys (over prompt *and* any output so far) are
   looked up with ``acquire_prefix``; at most ``(num_tokens - 1) // block_size`` blocks are
   reused, so the last token is always recomputed and yields logits. A request whose blocks can
   never fit the pool (``ceil((prompt + max_tokens - 1) / block_size) > num_blocks``) finishes
   with ``"error"``; so does one that cannot get blocks while nothing else runs (blocks held
   outside this engine) — the others keep being served.

After the model ran, :meth:`Scheduler.update` advances ``num_computed_tokens``, commits every
block that became full under its key (a duplicate switches the table to the existing block and
releases ours), appends sampled tokens, and finishes requests (stop token / ``max_tokens``),
releasing their blocks — committed ones stay cached in the pool for later hits.

No deadlock: a running request is only ever blocked by blocks that other running requests hold,
and those are preempted from the tail; a lone request fits by the admission check.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from kvstore.errors import InvalidArgument
from kvstore.keys import BlockMeta, Namespace, chain_keys, token_bytes
from kvstore.tiers.hbm import HBMTier
from runtime.request import Request, RequestStatus


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """``max_num_batched_tokens``: tokens per step (>= 1). ``max_num_seqs``: running requests at
    most. ``chunk_size``: prefill tokens per request per step (None: the step budget).
    ``enable_prefix_caching``: look up and commit block keys (False: every prompt is computed
    and every block is freed on release)."""

    max_num_batched_tokens: int = 512
    max_num_seqs: int = 64
    chunk_size: int | None = None
    enable_prefix_caching: bool = True

    def __post_init__(self) -> None:
        for name in ("max_num_batched_tokens", "max_num_seqs", "chunk_size"):
            v = getattr(self, name)
            if name == "chunk_size" and v is None:
                continue
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise InvalidArgument(f"{name} must be an int >= 1, got {v!r}",
                                      hint=f"set {name} to a positive token/request count")
        if not isinstance(self.enable_prefix_caching, bool):
            raise InvalidArgument(
                f"enable_prefix_caching must be a bool, got {self.enable_prefix_caching!r}")

    @property
    def max_chunk_tokens(self) -> int:
        return self.chunk_size if self.chunk_size is not None else self.max_num_batched_tokens


@dataclass(frozen=True, slots=True)
class ScheduledChunk:
    """Run ``token_ids[start : start + num_tokens]`` of ``request``; ``sample`` when the chunk
    ends at the request's last token (it then gets logits and one new token)."""

    request: Request
    start: int
    num_tokens: int

    @property
    def sample(self) -> bool:
        return self.start + self.num_tokens == self.request.num_tokens


class Scheduler:
    """Owns the waiting queue, the running list and every block the engine holds in ``pool``.
    Not thread-safe: one engine loop drives it."""

    def __init__(self, pool: HBMTier, namespace: Namespace, config: SchedulerConfig,
                 clock: Callable[[], float]) -> None:
        self.pool = pool
        self.namespace = namespace
        self.config = config
        self.block_size = pool.layout.block_size
        self._clock = clock
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # admission order; the tail is preempted first
        self._finished: list[Request] = []  # finished since the last take_finished()
        #: Totals over the engine's life (for tests and stats).
        self.num_preemptions = 0

    # ----------------------------------------------------------------- queue

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self._finished)

    def take_finished(self) -> list[Request]:
        done, self._finished = self._finished, []
        return done

    # ----------------------------------------------------------------- schedule

    def schedule(self) -> list[ScheduledChunk]:
        budget = self.config.max_num_batched_tokens
        chunks: list[ScheduledChunk] = []
        preempted = False
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            n = min(req.num_tokens - req.num_computed_tokens, self.config.max_chunk_tokens,
                    budget)
            assert n > 0, "a running request always has a token to run"
            while not self._grow(req, n):
                victim = self.running.pop()
                self._preempt(victim)
                preempted = True
                if victim is req:
                    break
            else:
                chunks.append(ScheduledChunk(req, req.num_computed_tokens, n))
                budget -= n
                i += 1
        if preempted:
            return chunks
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            req = self.waiting[0]
            never = -(-req.max_kv_tokens() // self.block_size)
            if never > self.pool.num_blocks:
                self.waiting.popleft()
                self._finish(req, "error", error=(
                    f"request {req.request_id!r} needs {never} KV blocks of "
                    f"{self.block_size} tokens (prompt {req.num_prompt_tokens} + max_tokens "
                    f"{req.params.max_tokens}), the pool has {self.pool.num_blocks}"))
                continue
            hits = self._acquire_prefix(req)
            n = min(req.num_tokens - req.num_computed_tokens, self.config.max_chunk_tokens,
                    budget)
            if not self._grow(req, n):
                self._reset(req)
                if not self.running:
                    self.waiting.popleft()
                    self._finish(req, "error", error=(
                        f"request {req.request_id!r}: the KV pool has no free blocks even with "
                        "no request running (blocks are held outside this engine)"))
                    continue
                break
            self.waiting.popleft()
            req.num_tokens_reused["hbm"] += hits * self.block_size
            req.status = RequestStatus.RUNNING
            req.in_prefill = True
            self.running.append(req)
            chunks.append(ScheduledChunk(req, req.num_computed_tokens, n))
            budget -= n
        return chunks

    def _acquire_prefix(self, req: Request) -> int:
        """Take the cached blocks of the request's longest cached prefix (all but the last
        token); returns how many."""
        assert not req.block_ids and req.num_computed_tokens == 0
        if not self.config.enable_prefix_caching:
            return 0
        max_hit = (req.num_tokens - 1) // self.block_size
        self._ensure_keys(req, max_hit)
        blocks = self.pool.acquire_prefix(req.block_keys[:max_hit]) if max_hit else []
        req.block_ids = blocks
        req.num_computed_tokens = len(blocks) * self.block_size
        req.num_committed_blocks = len(blocks)
        return len(blocks)

    def _grow(self, req: Request, num_new_tokens: int) -> bool:
        """Allocate the blocks ``num_new_tokens`` more tokens need; False on back-pressure."""
        need = -(-(req.num_computed_tokens + num_new_tokens) // self.block_size)
        short = need - len(req.block_ids)
        if short <= 0:
            return True
        got = self.pool.allocate(short)
        if got is None:
            return False
        req.block_ids.extend(got)
        return True

    def _reset(self, req: Request) -> None:
        if req.block_ids:
            self.pool.release(req.block_ids)
        req.block_ids = []
        req.num_computed_tokens = 0
        req.num_committed_blocks = 0

    def _preempt(self, req: Request) -> None:
        # Output tokens are kept: on re-admission prompt + output are recomputed (or hit).
        self._reset(req)
        req.status = RequestStatus.WAITING
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)

    # ----------------------------------------------------------------- update

    def update(self, chunks: list[ScheduledChunk], sampled: dict[str, int]) -> None:
        """Account for a model step: ``chunks`` ran; ``sampled[request_id]`` is the new token of
        every chunk with ``sample``."""
        now = self._clock()
        for ch in chunks:
            req = ch.request
            req.num_computed_tokens += ch.num_tokens
            if req.in_prefill:
                req.num_tokens_computed += ch.num_tokens
            self._commit_full_blocks(req)
            if not ch.sample:
                continue
            req.in_prefill = False
            token = sampled[req.request_id]
            req.token_ids.append(token)
            if req.first_token_time is None:
                req.first_token_time = now
            if token in req.params.stop_token_ids:
                self._finish(req, "stop")
            elif len(req.token_ids) - req.num_prompt_tokens >= req.params.max_tokens:
                self._finish(req, "length")

    def _commit_full_blocks(self, req: Request) -> None:
        if not self.config.enable_prefix_caching:
            return
        start, stop = req.num_committed_blocks, req.num_computed_tokens // self.block_size
        if stop <= start:
            return
        self._ensure_keys(req, stop)
        step = self.block_size * 4
        data = token_bytes(req.token_ids[start * self.block_size: stop * self.block_size])
        metas = [
            BlockMeta(self.namespace.seed, req.block_keys[i],
                      req.block_keys[i - 1] if i else self.namespace.seed,
                      data[(i - start) * step: (i - start + 1) * step])
            for i in range(start, stop)
        ]
        results = self.pool.commit(req.block_ids[start:stop], metas)
        for i, r in enumerate(results, start):
            if r.duplicate:  # another request committed these tokens first: share its block
                mine = req.block_ids[i]
                req.block_ids[i] = r.block_id
                self.pool.release([mine])
        req.num_committed_blocks = stop

    def _ensure_keys(self, req: Request, num_blocks: int) -> None:
        """Extend ``req.block_keys`` to cover its first ``num_blocks`` full blocks."""
        have = len(req.block_keys)
        if have >= num_blocks:
            return
        parent = req.block_keys[-1] if have else self.namespace.seed
        data = token_bytes(req.token_ids[have * self.block_size: num_blocks * self.block_size])
        req.block_keys.extend(chain_keys(parent, data, self.block_size))

    def _finish(self, req: Request, reason: str, *, error: str | None = None) -> None:
        if req in self.running:
            self.running.remove(req)
        self._reset(req)
        req.status = RequestStatus.FINISHED
        req.finish_reason = reason  # type: ignore[assignment]
        req.error = error
        req.finished_time = self._clock()
        self._finished.append(req)


__all__ = ["ScheduledChunk", "Scheduler", "SchedulerConfig"]
