"""HBM tier: a GPU page pool that is at once a tier of the store and the engine's block manager.

In the bundled runtime the paged KV cache *is* this pool (vLLM's BlockPool): the engine allocates
blocks for its running requests, writes K/V into ``pool`` directly, and commits full blocks under
their keys, which makes them prefix-cache entries the store sees like any tier's pages.

::

    pool      torch tensor [num_blocks, num_layers, 2, block_size, num_kv_heads, head_dim]
              (layout.torch_dtype, on ``device``); block b's page is pool[b]
    pool_bytes  the same memory as uint8 [num_blocks, page_bytes]

Block states (every block is in exactly one)::

    free        on the free list: refcount 0, no key, no tier reader
    held        refcount > 0, no key (a running request fills it)
    committed   has a key; refcount > 0 (in use, never evicted) or 0 (cached, evictable)
    draining    no key, refcount 0, tier readers > 0 (its key was deleted during a read);
                it joins the free list when the last reader is done

    allocate -> held --commit--> committed --release to 0--> cached --delete--> free
    held --release to 0--> free          committed --delete--> held / draining / free

Guarantees:

* **Durability** — none; pages live as long as the pool.
* **Safety** — a block with refcount > 0 is never freed: ``delete`` of its key only unlinks the
  key, and the block is freed when its requests release it. So neither the store's eviction nor a
  bad owner can hand a running request's block to another one.
* **Concurrency** — one lock guards the index, refcounts and free list; it is never held during
  a copy nor while calling the owner (see :mod:`kvstore.tiers.hbm_owner`), so the owner may call
  back into the pool. A tier read pins its blocks by a reader count; a tier write fills free
  blocks and publishes their keys afterwards, so readers never see half-written pages. Bytes the
  engine writes into ``pool`` are the engine's to order (it commits a block only once its K/V is
  written, and on CUDA after the writing stream is synchronized or ordered before any read).
* **Identity** — like the host tier: each committed block keeps its :class:`BlockMeta`; a read
  checks the namespace asked for; no checksums (HBM is process memory).

On CUDA, tier reads and writes (write-back, write-through and promotion traffic) move pages in
chunks through one pinned bounce buffer the tier allocates once: the transfer engine's page copy
(:func:`kvstore.transfer_cuda.copy_pages`, the path a connector's saves take: one DMA per run of
adjacent blocks, else the gather/scatter kernel) between pool blocks and bounce rows on the
tier's own stream, then a memcpy to or from the caller's buffers -- no per-call pinned
allocation, no wait on the engine's stream. On the CPU device the pool is host memory and pages are copied directly.
"""

from __future__ import annotations

import threading
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import repeat, starmap
from operator import is_
from typing import Any

import numpy as np
import torch

from kvstore.errors import InvalidArgument
from kvstore.keys import KEY_BYTES, BlockMeta
from kvstore.layout import KVLayout
from kvstore.metrics import Metrics
from kvstore.ops import copy_spans
from kvstore.checks import check_keys
from kvstore.tiers.base import Tier
from kvstore.tiers.hbm_config import HBMTierConfig
from kvstore.tiers.hbm_owner import OwnedPool, PoolOwner
from kvstore.tiers.slots import SlotReads
from kvstore.transfer_cuda import copy_pages

#: How often ``allocate`` asks its owner to reclaim before it reports back-pressure (another
#: thread may take the blocks an eviction freed before this one does).
_RECLAIM_ATTEMPTS = 3


@dataclass(frozen=True, slots=True)
class CommitResult:
    """What :meth:`HBMTier.commit` did with one block.

    ``block_id`` holds ``key`` now. ``duplicate`` is False when it is the block passed in, True
    when ``key`` was already committed in another block: then ``block_id`` is that block, the
    caller holds one more reference on it, and should point its block table at it and
    :meth:`~HBMTier.release` the block it passed (which stays uncommitted)."""

    block_id: int
    key: bytes
    duplicate: bool


class HBMTier(SlotReads, Tier, OwnedPool):
    kind = "hbm"
    config_model = HBMTierConfig

    def __init__(
        self, config: HBMTierConfig, layout: KVLayout, metrics: Metrics | None = None
    ) -> None:
        super().__init__(config, layout, metrics)
        name, capacity_pages, device = self.name, self.capacity_pages, config.device
        dev = torch.device(device if device is not None else _default_device())
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise InvalidArgument(
                f"hbm tier {name!r} asks for device {dev}, and torch sees no GPU",
                hint="leave the hbm tier's device unset (CPU when there is no GPU)",
            )
        self.device = dev
        #: The page pool, ``[num_blocks, *layout.page_shape]``; the engine's paged KV cache.
        self.pool = torch.zeros(
            (capacity_pages, *layout.page_shape), dtype=layout.torch_dtype, device=dev
        )
        #: ``pool`` as uint8 ``[num_blocks, page_bytes]`` (same memory).
        self.pool_bytes = self.pool.view(capacity_pages, -1).view(torch.uint8)
        assert self.pool_bytes.shape == (capacity_pages, layout.page_bytes)
        # On the CPU device, a numpy view of the pool: tier copies go through memcpy directly.
        self._host_view: np.ndarray | None = (
            self.pool_bytes.numpy() if dev.type == "cpu" else None
        )
        self._lock = threading.Lock()
        self._owner: PoolOwner | None = None
        self._index: dict[bytes, int] = {}  # committed key -> block
        self._metas: list[BlockMeta | None] = [None] * capacity_pages  # None: no key
        self._refs = [0] * capacity_pages
        self._readers = [0] * capacity_pages  # tier reads in flight
        self._cached: set[int] = set()  # committed with refcount 0: evictable
        self._free: deque[int] = deque(range(capacity_pages))  # allocate takes from the left
        self._bounce: _Bounce | None = None  # CUDA only, allocated on first use
        self._bounce_lock = threading.Lock()  # one tier copy through the bounce at a time
        self._queued_writes: Any = None  # CUDA: an event after the engine's queued writes

    # ----------------------------------------------------------------- block manager API

    @property
    def num_blocks(self) -> int:
        return self.capacity_pages

    @property
    def num_free(self) -> int:
        """Blocks on the free list (neither held, committed, nor draining)."""
        return len(self._free)

    @property
    def num_evictable(self) -> int:
        """Committed blocks at refcount 0: what an owner may reclaim (leases aside)."""
        return len(self._cached)

    @property
    def owner(self) -> PoolOwner | None:
        """Who chooses this pool's victims (see :meth:`attach`), or None."""
        return self._owner

    def attach(self, owner: PoolOwner | None) -> None:
        """Make ``owner`` choose this pool's victims (see :mod:`kvstore.tiers.hbm_owner`); a
        ``TieredStore`` attaches itself to its pool tiers. None detaches."""
        with self._lock:
            self._owner = owner

    def allocate(self, num_blocks: int) -> list[int] | None:
        """``num_blocks`` blocks for a running request, each held with refcount 1, uncommitted,
        their bytes unspecified. Free blocks are taken first; the rest are reclaimed through the
        owner, which evicts cached (refcount-0 committed) blocks by its policy.

        Returns None — back-pressure, not an error — when not enough blocks can be had: then
        no block was allocated. Nothing is evicted when the free and cached blocks together are
        too few; otherwise the owner may have evicted some cached blocks (written back per its
        write policy) before the pool found the rest were leased. Raises InvalidArgument for a
        negative count."""
        if not isinstance(num_blocks, int) or num_blocks < 0:
            raise InvalidArgument(f"allocate takes a block count >= 0, got {num_blocks!r}")
        if num_blocks == 0:
            return []
        for _ in range(_RECLAIM_ATTEMPTS):
            with self._lock:
                got = self._take(num_blocks)
                owner = self._owner
            if got is not None:
                if owner is not None:
                    owner.on_allocate()
                return got
            with self._lock:
                short = num_blocks - len(self._free)
                owner = self._owner
                if owner is None or short > len(self._cached):
                    return None
            if owner.reclaim(short) <= 0:
                break
        with self._lock:
            return self._take(num_blocks)

    def note_queued_writes(self) -> None:
        """The engine is about to commit blocks that its queued work (on the calling thread's
        stream) still writes: the tier's own copies out of the pool wait for that work. (A
        copy-out already waits for the stream of the thread that asks for it; the engine may
        run on another one.) Nothing to do on the CPU, where writes are done when queued."""
        if self._host_view is None:
            ev = torch.cuda.Event()
            ev.record(torch.cuda.current_stream(self.device))
            self._queued_writes = ev

    def commit(self, block_ids: Sequence[int], metas: Sequence[BlockMeta]) -> list[CommitResult]:
        """Publish held blocks whose K/V is final as prefix-cache entries under ``metas[i].key``.

        The caller must hold each block (refcount > 0). Committing a block again under its own
        key changes nothing (``duplicate`` False). A key already committed in another block keeps
        that block: see :class:`CommitResult` for what the caller does then. New entries are
        reported to the owner (``on_commit``) after the pool's lock is released. Raises
        InvalidArgument, before anything changes, for an unknown or unheld block, a block
        committed under another key, a malformed meta, or one block twice in the batch."""
        ids = list(block_ids)
        if len(ids) != len(metas):
            raise InvalidArgument(f"{len(ids)} blocks but {len(metas)} block identities")
        tokens_bytes = 4 * self.layout.block_size
        for m in metas:
            if not isinstance(m, BlockMeta) or len(m.key) != KEY_BYTES:
                raise InvalidArgument(f"commit takes BlockMeta identities, got {m!r:.80}")
            if len(m.token_ids) != tokens_bytes:
                raise InvalidArgument(
                    f"block {m.key.hex()} carries {len(m.token_ids) // 4} tokens, "
                    f"layout block_size is {self.layout.block_size}"
                )
        if len(set(ids)) != len(ids):
            raise InvalidArgument(f"a block appears twice in one commit: {ids}")
        results: list[CommitResult] = []
        fresh: list[BlockMeta] = []
        with self._lock:
            refs, own = self._refs, self._metas
            # the usual case checked in bulk (a 32K-token load commits 2048 blocks at once)
            if not (ids and set(map(type, ids)) == {int} and min(ids) >= 0
                    and max(ids) < self.capacity_pages and all(map(refs.__getitem__, ids))):
                for b in ids:
                    self._check_held(b, "commit")
            for b, m in zip(ids, metas):
                mine = own[b]
                if mine is not None and mine.key != m.key:
                    raise InvalidArgument(
                        f"block {b} is committed under key {mine.key.hex()}, not {m.key.hex()}",
                        hint="commit each block once, under the key of the tokens it holds",
                    )
            for b, m in zip(ids, metas):
                there = self._index.get(m.key)
                if there is None:
                    self._link(b, m)
                    fresh.append(m)
                    results.append(CommitResult(b, m.key, False))
                elif there == b:
                    results.append(CommitResult(b, m.key, False))
                else:
                    self._incref(there)
                    results.append(CommitResult(there, m.key, True))
            owner = self._owner
        if owner is not None and fresh:
            owner.on_commit(fresh)
        return results

    def acquire_prefix(self, keys: Sequence[bytes]) -> list[int]:
        """The blocks of the longest run of leading ``keys`` committed here, each with one more
        reference (the caller now uses them, and must release them). Stops at the first key
        not committed; ``[]`` when the first is absent. Reports the hits to the owner
        (``on_hit``, deepest block first) after the lock is released."""
        check_keys(keys)
        with self._lock:
            found = list(map(self._index.get, keys))  # C-speed; cut at the first miss
            blocks: list[int] = found[: found.index(None)] if None in found else found  # type: ignore[assignment]
            # one reference more each, in bulk (a 32K-token hit is 2048 blocks): a block that
            # had none leaves the evictable set
            refs = self._refs
            for b in blocks:
                refs[b] += 1
            self._cached.difference_update(blocks)
            owner = self._owner
        if owner is not None and blocks:
            owner.on_hit(list(reversed(keys[: len(blocks)])))
        return blocks

    def acquire(self, block_ids: Sequence[int]) -> None:
        """One more reference on each of these blocks, which the caller must already hold (a
        request forking from another shares its blocks). Raises InvalidArgument, before anything
        changes, for a block nobody holds."""
        with self._lock:
            for b in block_ids:
                self._check_held(b, "acquire")
            for b in block_ids:
                self._incref(b)

    def release(self, block_ids: Sequence[int]) -> None:
        """Drop one reference per listed block (a block listed twice loses two). A committed
        block that reaches refcount 0 stays cached (evictable); an uncommitted one returns to the
        free list. Raises InvalidArgument, before anything changes, when a block would drop below
        zero (a double release)."""
        ids = list(block_ids)
        with self._lock:
            if self._release_each_once(ids):
                return
            counts = Counter(ids)
            for b, n in counts.items():
                self._check_block(b)
                if self._refs[b] < n:
                    raise InvalidArgument(
                        f"release of block {b} x{n}, which has refcount {self._refs[b]}",
                        hint="release each block exactly as often as it was allocated or acquired",
                    )
            for b, n in counts.items():
                for _ in range(n):
                    self._decref(b)

    def _release_each_once(self, ids: list[int]) -> bool:
        """:meth:`release`'s usual case, in bulk (lock held): valid block ids, each listed once
        and held. False (nothing changed) for anything else, which the checked path handles."""
        n = self.capacity_pages
        if not ids or set(map(type, ids)) != {int} or min(ids) < 0 or max(ids) >= n:
            return False
        refs = self._refs
        held = list(map(refs.__getitem__, ids))
        if len(set(ids)) != len(ids) or 0 in held:
            return False
        metas, cached = self._metas, self._cached
        # ``is`` in C: ``None in metas`` would call each BlockMeta's dataclass __eq__ in Python
        if held.count(1) == len(ids) and not any(map(is_, map(metas.__getitem__, ids),
                                                     repeat(None))):
            # a finished request's committed blocks, each its alone: all cached, in C loops
            deque(map(refs.__setitem__, ids, repeat(0)), maxlen=0)
            cached.update(ids)
            return True
        for b in ids:
            r = refs[b] - 1
            refs[b] = r
            if not r:
                if metas[b] is not None:
                    cached.add(b)
                else:
                    self._maybe_free(b)
        return True

    def refcount(self, block_id: int) -> int:
        with self._lock:
            self._check_block(block_id)
            return self._refs[block_id]

    def block_of(self, key: bytes) -> int | None:
        """The block committed under ``key``, or None. Unreferenced: hold it (``acquire_prefix``)
        before using its bytes."""
        with self._lock:
            return self._index.get(key)

    def key_of(self, block_id: int) -> bytes | None:
        """The key ``block_id`` is committed under, or None."""
        with self._lock:
            self._check_block(block_id)
            meta = self._metas[block_id]
            return None if meta is None else meta.key

    def is_in_use(self, key: bytes) -> bool:
        with self._lock:
            b = self._index.get(key)
            return b is not None and self._refs[b] > 0

    def check_integrity(self) -> None:
        """Assert the block-state invariants of the module docstring. For tests."""
        with self._lock:
            free = list(self._free)
            assert len(set(free)) == len(free), "a block is on the free list twice"
            for b in free:
                assert self._refs[b] == 0, f"free block {b} is referenced"
                assert self._metas[b] is None, f"free block {b} is committed"
                assert self._readers[b] == 0, f"free block {b} is being read"
            for key, b in self._index.items():
                meta = self._metas[b]
                assert meta is not None and meta.key == key, f"index and block {b} disagree"
            committed = [b for b, m in enumerate(self._metas) if m is not None]
            assert len(committed) == len(self._index), "a committed block is not indexed"
            assert self._cached == {b for b in committed if self._refs[b] == 0}, "cached set"
            fset = set(free)
            for b in range(self.capacity_pages):
                if b not in fset:
                    assert self._refs[b] or self._metas[b] or self._readers[b], f"block {b} leaked"
            assert all(r >= 0 for r in self._refs) and all(r >= 0 for r in self._readers)

    # ----------------------------------------------------------------- tier hooks

    def _copy_out(self, slots: list[int], outs: list[np.ndarray]) -> None:
        self._gather(slots, outs)

    def _after_unpin(self, slot: int) -> None:
        self._maybe_free(slot)

    def _write(self, metas: Sequence[BlockMeta], pages: Sequence[np.ndarray]) -> list[bool]:
        # Fill free blocks held at refcount 1 (so nothing can take them), then publish the keys
        # and drop the reference: the pages become cached entries. No eviction: the store (or
        # the owner) decides that and deletes first.
        with self._lock:
            n = min(len(metas), len(self._free))
            got = [self._free.popleft() for _ in range(n)]
            for b in got:
                self._refs[b] = 1
        try:
            if got:
                self._scatter(got, pages[:n])
        except BaseException:
            with self._lock:
                for b in got:
                    self._decref(b)  # uncommitted at refcount 0: back to the free list
            raise
        with self._lock:
            for b, meta in zip(got, metas):
                if meta.key in self._index:  # replace (also a key twice in one batch: last wins)
                    self._unlink(meta.key)
                self._link(b, meta)
                self._decref(b)
        return [i < n for i in range(len(metas))]

    def _delete(self, keys: Sequence[bytes]) -> int:
        n = 0
        with self._lock:
            for key in keys:
                if key in self._index:
                    self._unlink(key)
                    n += 1
        return n

    def _used(self) -> int:
        # Every block not on the free list: held, committed or draining. used + free == capacity.
        return self.capacity_pages - len(self._free)

    # ----------------------------------------------------------------- copies (unlocked)

    def _gather(self, blocks: list[int], outs: list[np.ndarray]) -> None:
        """outs[i][:] = pool_bytes[blocks[i]]."""
        if self._host_view is not None:
            view = self._host_view
            copy_spans([(out, view[b]) for b, out in zip(blocks, outs)])
            return
        with self._bounce_lock:
            bounce = self._cuda_bounce()
            for at in range(0, len(blocks), bounce.rows):
                part = blocks[at : at + bounce.rows]
                bounce.move(bounce.pages, self.pool_bytes, part, to_host=True,
                            after=self._queued_writes)
                copy_spans([(out, bounce.host[i]) for i, out in enumerate(outs[at : at + len(part)])])

    def _scatter(self, blocks: list[int], pages: Sequence[np.ndarray]) -> None:
        """pool_bytes[blocks[i]] = pages[i]; landed when this returns (keys publish after)."""
        if self._host_view is not None:
            view = self._host_view
            copy_spans([(view[b], page) for b, page in zip(blocks, pages)])
            return
        with self._bounce_lock:
            bounce = self._cuda_bounce()
            for at in range(0, len(blocks), bounce.rows):
                part = blocks[at : at + bounce.rows]
                copy_spans([(bounce.host[i], page) for i, page in enumerate(pages[at : at + len(part)])])
                bounce.move(self.pool_bytes, bounce.pages, part, to_host=False,
                            after=self._queued_writes)

    def _cuda_bounce(self) -> _Bounce:
        if self._bounce is None:
            rows = max(1, min(self.capacity_pages, BOUNCE_BYTES // self.layout.page_bytes))
            self._bounce = _Bounce(rows, self.layout.page_bytes, self.device)
        return self._bounce

    # ----------------------------------------------------------------- block states (locked)

    def _take(self, n: int) -> list[int] | None:
        if len(self._free) < n:
            return None
        # C loops: a 32K-token request takes 2048 blocks before its load can start
        got = list(starmap(self._free.popleft, repeat((), n)))
        # ascending: blocks freed together come back in eviction order (a chain's tail first,
        # so descending), and a load copies a run of adjacent blocks as one DMA, not one each
        got.sort()
        refs = self._refs
        deque(map(refs.__setitem__, got, repeat(1)), maxlen=0)
        return got

    def _incref(self, b: int) -> None:
        if self._refs[b] == 0:
            self._cached.discard(b)
        self._refs[b] += 1

    def _decref(self, b: int) -> None:
        self._refs[b] -= 1
        if self._refs[b] == 0:
            if self._metas[b] is not None:
                self._cached.add(b)
            else:
                self._maybe_free(b)

    def _link(self, b: int, meta: BlockMeta) -> None:
        self._index[meta.key] = b
        self._metas[b] = meta
        if self._refs[b] == 0:
            self._cached.add(b)

    def _unlink(self, key: bytes) -> None:
        b = self._index.pop(key)
        self._metas[b] = None
        self._cached.discard(b)
        self._maybe_free(b)

    def _maybe_free(self, b: int) -> None:
        # Called exactly when one of the three conditions may just have become true; a block
        # meeting all three was not free before (each transition leaves a non-free state).
        if self._metas[b] is None and self._refs[b] == 0 and self._readers[b] == 0:
            self._free.append(b)

    def _check_block(self, b: Any) -> None:
        if not isinstance(b, int) or isinstance(b, bool) or not 0 <= b < self.capacity_pages:
            raise InvalidArgument(
                f"block id {b!r} is not in [0, {self.capacity_pages})",
                hint="use block ids returned by allocate or acquire_prefix",
            )

    def _check_held(self, b: Any, what: str) -> None:
        self._check_block(b)
        if self._refs[b] == 0:
            raise InvalidArgument(
                f"{what} of block {b}, which no request holds",
                hint="allocate or acquire a block before committing or sharing it",
            )


#: bytes of the pinned bounce buffer a CUDA pool's tier copies go through (in chunks)
BOUNCE_BYTES = 64 << 20


class _Bounce:
    """A pinned ``(rows, page_bytes)`` buffer and a stream: pool blocks move to and from it by
    the transfer engine's :func:`~kvstore.transfer_cuda.copy_pages` (the copy engine for runs of
    adjacent blocks, else the gather/scatter kernel), and the calling thread waits only for
    that stream."""

    def __init__(self, rows: int, page_bytes: int, device: torch.device) -> None:
        self.rows = rows
        self.pages = torch.empty((rows, page_bytes), dtype=torch.uint8, pin_memory=True)
        self.host = self.pages.numpy()
        self.stream = torch.cuda.Stream(device)
        self._rows_idx = torch.arange(rows, dtype=torch.int64).pin_memory()
        self._ids = torch.empty(rows, dtype=torch.int64).pin_memory()  # under the bounce lock

    def move(self, dst: torch.Tensor, src: torch.Tensor, blocks: list[int], *, to_host: bool,
             after: torch.cuda.Event | None = None) -> None:
        """``dst[rows] = src[blocks]`` (to_host) or ``dst[blocks] = src[rows]``; waits for it.
        ``after``: an event the copy waits for too (the engine's queued writes)."""
        n = len(blocks)
        ids = self._ids[:n]
        ids.numpy()[:] = blocks  # numpy converts the ints in C; the last copy has ended
        rows = self._rows_idx[:n]
        # after the engine's queued work (pool blocks it wrote); the engine never waits on us
        self.stream.wait_stream(torch.cuda.current_stream(self.stream.device))
        if after is not None:
            self.stream.wait_event(after)
        if to_host:
            copy_pages(dst, src, rows, ids, stream=self.stream)
        else:
            copy_pages(dst, src, ids, rows, stream=self.stream)
        self.stream.synchronize()


def _default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


__all__ = ["CommitResult", "HBMTier"]

