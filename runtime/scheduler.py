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

With a KV connector (:class:`EngineConnector`), admission asks it, after the hbm prefix, how
many more whole blocks the host tier (or a tier below it) can supply; blocks are allocated for
them and they count as computed (the engine loads them before the request's first forward reads
them; asynchronous loads are waited for in the same step). Blocks that become full in a chunk are
handed to ``request_save`` (saved layer by layer during that chunk's forward) unless the store is
write-through (the hbm commit already copied them down). A request's blocks are freed only once
the connector reports its transfers done (delayed free, see :meth:`Scheduler.free_delayed`). A
failed load rolls the request back to its first failed block (:meth:`apply_load_errors`).

No deadlock: a running request is only ever blocked by blocks that other running requests hold,
and those are preempted from the tail; a lone request fits by the admission check.
"""

from __future__ import annotations

import itertools
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from connector.base import KVConnectorScheduler, KVConnectorWorker
from kvstore.errors import InvalidArgument
from kvstore.keys import BlockMeta, CheckedKeys, Namespace, chain_keys, token_bytes
from kvstore.pool import HBMTier
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


@dataclass(frozen=True, slots=True)
class EngineConnector:
    """The two sides of a KV connector as one engine uses them. ``save``: hand full blocks to
    ``request_save`` (False when the store's write policy already copies every commit down)."""

    scheduler: KVConnectorScheduler
    worker: KVConnectorWorker
    save: bool = True


class Scheduler:
    """Owns the waiting queue, the running list and every block the engine holds in ``pool``.
    Not thread-safe: one engine loop drives it."""

    def __init__(self, pool: HBMTier, namespace: Namespace, config: SchedulerConfig,
                 clock: Callable[[], float], connector: EngineConnector | None = None) -> None:
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
        self.num_tokens_loaded = 0  # tokens loaded through the connector (successfully)
        self.num_tokens_load_failed = 0  # tokens whose load failed (recomputed)
        self.connector = connector
        #: the connector takes the keys this scheduler hashes (same namespace): hashed once
        self._same_namespace = (connector is not None
                                and connector.scheduler.keys_namespace_id == namespace.id)
        self._admissions = itertools.count()
        #: waiting requests the last schedule() skipped: their connector lookup is in flight
        self.num_pending_lookups = 0
        self._loading: list[Request] = []  # requests with a load in this step
        self._conn_finished: list[str] = []  # connector ids ended since take_connector_finished
        self._delayed: dict[str, list[int]] = {}  # connector id -> blocks freed once reported

    # ----------------------------------------------------------------- queue

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self._finished)

    @property
    def loading(self) -> list[Request]:
        """The requests admitted with a connector load in the last :meth:`schedule` (their
        ``load_start`` and ``load_block_ids`` name the blocks)."""
        return self._loading

    def take_finished(self) -> list[Request]:
        done, self._finished = self._finished, []
        return done

    # ----------------------------------------------------------------- schedule

    def schedule(self) -> list[ScheduledChunk]:
        self._loading = []
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
                self._request_saves(req, req.num_computed_tokens + n)
                budget -= n
                i += 1
        if preempted:
            return chunks
        skipped: list[Request] = []  # waiting on a connector lookup of a remote tier
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
            loaded = self._match_external(req, hits)
            if loaded is None:  # not known yet: the connector asks a remote tier; next step
                self._reset(req)
                skipped.append(self.waiting.popleft())
                continue
            n = min(req.num_tokens - req.num_computed_tokens, self.config.max_chunk_tokens,
                    budget)
            if not self._grow(req, n):
                if loaded:  # drop the connector's match: nothing is loaded
                    assert self.connector is not None and req.connector_id is not None
                    self.connector.scheduler.update_state_after_alloc(req.connector_id, [], 0)
                req.connector_id = None
                self._reset(req)
                if not self.running and not self._delayed:  # (blocks of finished requests
                    # whose saves are in flight come back soon: wait for them instead)
                    self.waiting.popleft()
                    self._finish(req, "error", error=(
                        f"request {req.request_id!r}: the KV pool has no free blocks even with "
                        "no request running (blocks are held outside this engine)"))
                    continue
                break
            self.waiting.popleft()
            req.num_tokens_reused["hbm"] += hits * self.block_size
            if self.connector is not None and req.connector_id is not None:
                req.num_tokens_reused.setdefault("host", 0)
                if loaded:
                    ntok = len(loaded) * self.block_size
                    self.connector.scheduler.update_state_after_alloc(
                        req.connector_id, loaded, ntok)
                    for tier, blocks in Counter(req.load_tiers).items():  # per tier, in C
                        req.num_tokens_reused[tier] = (req.num_tokens_reused.get(tier, 0)
                                                       + blocks * self.block_size)
                    self.num_tokens_loaded += ntok
                    req.load_start, req.load_block_ids = hits, loaded
                    self._loading.append(req)
                req.num_saved_blocks = hits + len(loaded)
            req.status = RequestStatus.RUNNING
            req.in_prefill = True
            self.running.append(req)
            chunks.append(ScheduledChunk(req, req.num_computed_tokens, n))
            self._request_saves(req, req.num_computed_tokens + n)
            budget -= n
        self.waiting.extendleft(reversed(skipped))
        self.num_pending_lookups = len(skipped)
        return chunks

    def _acquire_prefix(self, req: Request) -> int:
        """Take the cached blocks of the request's longest cached prefix (all but the last
        token); returns how many."""
        assert not req.block_ids and req.num_computed_tokens == 0
        if not self.config.enable_prefix_caching:
            return 0
        max_hit = (req.num_tokens - 1) // self.block_size
        self._ensure_keys(req, max_hit)
        # the keys are chain_keys' own 16-byte digests: checked by construction
        blocks = self.pool.acquire_prefix(CheckedKeys(req.block_keys[:max_hit])) if max_hit else []
        req.block_ids = blocks
        req.num_computed_tokens = len(blocks) * self.block_size
        req.num_committed_blocks = len(blocks)
        return len(blocks)

    def _match_external(self, req: Request, hits: int) -> list[int] | None:
        """Ask the connector for blocks past the hbm prefix; allocate blocks for them (they are
        loaded this step). Returns the allocated block ids (the match is left pending: the
        caller confirms it with ``update_state_after_alloc`` or drops it), or None when the
        connector does not know yet (the request keeps its admission id and is asked about
        again on a later step)."""
        conn = self.connector
        if conn is None or not self.config.enable_prefix_caching:
            return []
        if req.connector_id is None:
            req.connector_id = f"{req.request_id}#{next(self._admissions)}"
        cid = req.connector_id
        max_hit = (req.num_tokens - 1) // self.block_size
        self._ensure_keys(req, max_hit)  # hashed once: the connector gets them too
        match = conn.scheduler.get_num_new_matched_tokens(
            cid, req.token_ids, hits * self.block_size,
            block_keys=CheckedKeys(req.block_keys[:max_hit]) if self._same_namespace else None)
        if match.num_tokens is None:
            return None
        nblk = match.num_tokens // self.block_size
        if nblk == 0:
            return []
        req.load_tiers = tuple(match.tiers[:nblk]) if len(match.tiers) >= nblk else ("host",) * nblk
        got = self.pool.allocate(nblk)
        if got is None:  # no room to load into: recompute instead
            conn.scheduler.update_state_after_alloc(cid, [], 0)
            return []
        req.block_ids.extend(got)
        req.num_computed_tokens += nblk * self.block_size
        return got

    def _request_saves(self, req: Request, computed_after: int) -> None:
        """Hand the blocks that become full in this step's chunk to the connector (saved layer
        by layer during the forward). Not for a request loading this step: if its load fails,
        the chunk's K/V is garbage; those blocks are saved with its next chunk instead."""
        conn = self.connector
        if (conn is None or not conn.save or not self.config.enable_prefix_caching
                or req.connector_id is None or req in self._loading):
            return
        start, stop = req.num_saved_blocks, computed_after // self.block_size
        if stop <= start:
            return
        conn.scheduler.request_save(req.connector_id, req.block_ids[start:stop],
                                    self._metas(req, start, stop))
        req.num_saved_blocks = stop

    def apply_load_errors(self, bad_blocks: set[int]) -> set[str]:
        """Roll back every request of this step whose load failed to its first failed block
        (it recomputes from there). Returns the ids of the rolled-back requests (their chunk's
        results must be discarded)."""
        rolled: set[str] = set()
        for req in self._loading:
            idx = next((i for i, b in enumerate(req.load_block_ids) if b in bad_blocks), None)
            if idx is None:
                continue
            first = req.load_start + idx
            failed = (len(req.load_block_ids) - idx) * self.block_size
            req.num_computed_tokens = first * self.block_size
            req.num_saved_blocks = min(req.num_saved_blocks, first)
            for tier in req.load_tiers[idx:]:
                req.num_tokens_reused[tier] -= self.block_size
            req.num_tokens_load_failed += failed
            self.num_tokens_loaded -= failed
            self.num_tokens_load_failed += failed
            rolled.add(req.request_id)
        return rolled

    def take_connector_finished(self) -> list[str]:
        """Connector ids of requests ended (finished or preempted) since the last call, whose
        transfers may be in flight (pass them to the worker's ``get_finished``)."""
        done, self._conn_finished = self._conn_finished, []
        return done

    @property
    def num_connector_finished(self) -> int:
        """Requests ended since the last :meth:`take_connector_finished`."""
        return len(self._conn_finished)

    def free_delayed(self, connector_ids: Iterable[str]) -> None:
        """The connector reported these requests' transfers done: free their blocks."""
        for cid in connector_ids:
            blocks = self._delayed.pop(cid, None)
            if blocks:
                self.pool.release(blocks)

    @property
    def num_delayed_frees(self) -> int:
        return len(self._delayed)

    def _end_connector_request(self, req: Request, *, preempted: bool) -> bool:
        """Tell the connector the request's admission ended. True: its blocks were taken over
        (freed later by :meth:`free_delayed`, or now after waiting for copies out of them)."""
        conn, cid = self.connector, req.connector_id
        req.connector_id = None
        req.load_block_ids, req.load_tiers = [], ()
        if conn is None or cid is None:
            return False
        held = conn.scheduler.request_finished(cid)
        if held:
            self._conn_finished.append(cid)
        if preempted or not held:
            if held:  # the blocks are needed now: wait only for the copies out of them
                conn.worker.wait_for_save()
                self._delayed[cid] = []
            return False
        self._delayed[cid] = list(req.block_ids)
        req.block_ids = []
        req.num_computed_tokens = 0
        req.num_committed_blocks = 0
        return True

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
        self._end_connector_request(req, preempted=True)
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
            if not req.released:
                self._advance(ch)
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

    def _advance(self, ch: ScheduledChunk) -> None:
        """The chunk's tokens are computed: count them, commit the blocks they filled."""
        req = ch.request
        req.num_computed_tokens += ch.num_tokens
        if req.in_prefill:
            req.num_tokens_computed += ch.num_tokens
        self._commit_full_blocks(req)

    def release_ending(self, chunks: list[ScheduledChunk], skip: set[str]) -> None:
        """Give back now, while the GPU still runs the step, what the requests that this step's
        token ends by ``max_tokens`` hold (their blocks, their connector admission): which
        token it is (a stop token or not) changes only the finish reason, which :meth:`update`
        sets. Off the time to the token's return: a 32K-token request releases 2048 blocks.
        The engine calls this after :meth:`commit_prepared` (the blocks are committed and the
        step's writes queued before any is released; a later writer of a freed block is
        ordered after them on the device). ``skip``: rolled-back requests (no token)."""
        for ch in chunks:
            req = ch.request
            if (not ch.sample or req.request_id in skip or req.released
                    or req.num_tokens + 1 - req.num_prompt_tokens < req.params.max_tokens):
                continue
            self._advance(ch)
            req.prompt_out = req.output_prompt()  # the output's list, made here too
            self._release(req)

    def prepare_commits(self, chunks: list[ScheduledChunk]) -> None:
        """Build the identities of the full blocks each chunk completes, for :meth:`update` to
        commit: the engine calls this after launching a step's forward, so the per-block work
        (a 32K-token load commits 2048 blocks) runs while the GPU does, not after it."""
        if not self.config.enable_prefix_caching:
            return
        for ch in chunks:
            req = ch.request
            start = req.num_committed_blocks
            stop = (req.num_computed_tokens + ch.num_tokens) // self.block_size
            req.pending_metas = (start, stop, self._metas(req, start, stop)) if stop > start else None

    def commit_prepared(self, chunks: list[ScheduledChunk], skip: set[str]) -> None:
        """Commit the full blocks :meth:`prepare_commits` identified, before the step's logits
        are read: the engine calls this once the step's loads have landed (or failed; the
        requests in ``skip`` were rolled back), while the GPU may still run the forward -- a
        32K-token hit commits 2048 blocks, off the time to its first token. A reader of a
        committed block is ordered after the queued writes (the engine's stream, the pool's
        copy-outs wait for :meth:`~kvstore.pool.HBMTier.note_queued_writes`)."""
        for ch in chunks:
            req = ch.request
            pending = req.pending_metas
            if pending is None:
                continue
            if req.request_id in skip or pending[0] != req.num_committed_blocks:
                req.pending_metas = None  # rolled back, or stale: update decides
                continue
            req.pending_metas = None
            self._commit(req, pending[0], pending[1], pending[2])

    def _commit_full_blocks(self, req: Request) -> None:
        pending, req.pending_metas = req.pending_metas, None
        if not self.config.enable_prefix_caching:
            return
        start, stop = req.num_committed_blocks, req.num_computed_tokens // self.block_size
        if stop <= start:
            return
        if pending is not None and pending[:2] == (start, stop):
            metas = pending[2]
        else:  # not prepared (or the step was rolled back since)
            metas = self._metas(req, start, stop)
        self._commit(req, start, stop, metas)

    def _commit(self, req: Request, start: int, stop: int, metas: list[BlockMeta]) -> None:
        results = self.pool.commit(req.block_ids[start:stop], metas)
        waited = False
        for i, r in enumerate(results, start):
            if r.duplicate:  # another request committed these tokens first: share its block
                mine = req.block_ids[i]
                req.block_ids[i] = r.block_id
                if self.connector is not None and not waited:
                    self.connector.worker.wait_for_save()  # a save may still copy out of it
                    waited = True
                self.pool.release([mine])
        req.num_committed_blocks = stop

    def _metas(self, req: Request, start: int, stop: int) -> list[BlockMeta]:
        """Identities of the request's full blocks ``[start, stop)``."""
        self._ensure_keys(req, stop)
        step = self.block_size * 4
        data = _token_data(req, start * self.block_size, stop * self.block_size)
        return [
            BlockMeta(self.namespace.seed, req.block_keys[i],
                      req.block_keys[i - 1] if i else self.namespace.seed,
                      data[(i - start) * step: (i - start + 1) * step])
            for i in range(start, stop)
        ]

    def _ensure_keys(self, req: Request, num_blocks: int) -> None:
        """Extend ``req.block_keys`` to cover its first ``num_blocks`` full blocks."""
        have = len(req.block_keys)
        if have >= num_blocks:
            return
        parent = req.block_keys[-1] if have else self.namespace.seed
        data = _token_data(req, have * self.block_size, num_blocks * self.block_size)
        req.block_keys.extend(chain_keys(parent, data, self.block_size))

    def _release(self, req: Request) -> None:
        """What an ending request holds goes back (its transfers may delay the blocks)."""
        self._end_connector_request(req, preempted=False)
        self._reset(req)
        req.released = True

    def abort(self, request_id: str) -> bool:
        """End request ``request_id`` before it finishes (between steps): a waiting one leaves
        the queue (a connector lookup in flight for it ends too), a running one gives its
        blocks back (transfers in flight delay them, as for any ending request). It is
        reported finished with reason "abort". False when no unfinished request has that id."""
        for req in self.waiting:
            if req.request_id == request_id:
                self.waiting.remove(req)
                self._finish(req, "abort")
                return True
        for req in self.running:
            if req.request_id == request_id:
                self._finish(req, "abort")
                return True
        return False

    def _finish(self, req: Request, reason: str, *, error: str | None = None) -> None:
        if req in self.running:
            self.running.remove(req)
        if not req.released:
            self._release(req)
        req.status = RequestStatus.FINISHED
        req.finish_reason = reason  # type: ignore[assignment]
        req.error = error
        req.finished_time = self._clock()
        self._finished.append(req)


def _token_data(req: Request, start: int, stop: int) -> bytes:
    """int32le bytes of the request's tokens ``[start, stop)`` (as block keys hash them): a
    slice of the prompt's bytes where they cover it, else converted (output tokens)."""
    if stop * 4 <= len(req.prompt_bytes):
        return req.prompt_bytes[start * 4: stop * 4]
    return token_bytes(req.token_ids[start:stop])


__all__ = ["EngineConnector", "ScheduledChunk", "Scheduler", "SchedulerConfig"]
