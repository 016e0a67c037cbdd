"""Leaf-first eviction with ARC's adaptive split between probationary and protected blocks."""

from __future__ import annotations

import heapq
from collections import OrderedDict

from kvstore.policy.base import IsPinned, Key, never_pinned
from kvstore.policy.leaf_tree import LeafTreePolicy, TreeNode

_PROBATION, _PROTECTED = 0, 1


class _Node(TreeNode):
    __slots__ = ("seg",)

    def __init__(self, parent: Key | None, tick: int, seg: int) -> None:
        super().__init__(parent, tick)
        self.seg = seg  # _PROBATION or _PROTECTED


class LineageARCPolicy(LeafTreePolicy):
    """Leaf-first eviction (as ``lineage``) over two segments whose split adapts as ARC's does.

    Why: a prefix lookup stops at the first missing block, so chains are evicted from their ends
    (``lineage``); and blocks used once (unique questions, rare document combinations) should go
    before blocks used again (ARC, S3-FIFO). But a frequency policy sees the new tail of a
    conversation, which the next turn will reuse exactly when it reuses the rest, as a one-hit
    wonder. So a block that *extends a reused chain* starts protected.

    The tree is ``lineage``'s (:mod:`kvstore.policy.leaf_tree`): a parent must be tracked when
    its child is inserted; a dropped key's children become roots. Every tracked key is in one segment,
    *probation* or *protected*, and has a last-use time. Ghost lists ``B1``/``B2`` remember the keys
    last evicted from probation/protected (keys only, each at most ``capacity``, oldest forgotten
    first). ``p`` (0 <= p <= capacity, starts at 0) is the target size of probation.

    * ``insert`` of a new key: if in ``B1``, p += max(|B2| / |B1|, 1) (capped at capacity); if in
      ``B2``, p -= max(|B1| / |B2|, 1) (floored at 0); either way it leaves the ghost and is
      protected. Otherwise it is protected iff its parent is tracked, protected and a leaf (the
      key extends the end of a reused chain), else it is on probation.
    * ``access`` (and ``insert`` of a tracked key): the key becomes protected; last use = now.

    Victim order, one victim at a time:

    1. the segment is probation if it holds more than ``p`` keys (pinned and inner keys
       included), else protected; the victim is that segment's unpinned leaf with the oldest last
       use; if it has none, the other segment's;
    2. only if every leaf is pinned: the unpinned key with the oldest last use; its children become
       roots.

    The victim's key enters ``B1`` or ``B2`` after its segment. An eviction can make the victim's
    parent a leaf, a candidate for the next victim of the same call.

    Parameters: none tuned. ``p``'s rule and start, and ghost lists as large as the cache, are
    ARC's (Megiddo & Modha, FAST 2003; ARC bounds |T1|+|B1| <= c and the total <= 2c, here each
    ghost is bounded by c). The "extends a protected leaf" rule was chosen among three variants
    (always inherit the parent's segment / only from a leaf parent / never) by their hit ratios on
    ``bench.policies``' traces at 0.5 x peak live set: never inheriting loses to LRU on chat,
    always inheriting gives up the RAG gain.

    Cost: ``insert``/``access``/``remove`` O(log n) amortised (a binary heap of leaves by last use
    per segment, lazy deletion, compaction when stale entries outnumber live keys; ``remove`` of an
    inner node is also O(its children)); ``evict`` O((victims + pinned leaves skipped) log n),
    plus a scan past pinned keys in LRU order for each victim taken under rule 2.
    """

    name = "lineage_arc"

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.p = 0.0
        # Per segment, (tick, key) of leaves; an entry is live iff its key is tracked, is a leaf,
        # is in that segment and has that tick. Ticks are unique, so keys are never compared.
        self._heaps: tuple[list[tuple[int, Key]], list[tuple[int, Key]]] = ([], [])
        self._ghosts: tuple[OrderedDict[Key, None], OrderedDict[Key, None]] = (
            OrderedDict(), OrderedDict())  # B1 (from probation), B2 (from protected)
        self._probation = 0  # tracked keys on probation

    # -- contract --------------------------------------------------------------------------
    def insert(self, key: Key, parent: Key | None = None) -> None:
        if key in self._nodes:
            self.access(key)
            return
        b1, b2 = self._ghosts
        parent_node = self._tracked_parent(parent)
        if key in b1:
            self.p = min(float(self.capacity), self.p + max(len(b2) / len(b1), 1.0))
            del b1[key]
            seg = _PROTECTED
        elif key in b2:
            self.p = max(0.0, self.p - max(len(b1) / len(b2), 1.0))
            del b2[key]
            seg = _PROTECTED
        elif (isinstance(parent_node, _Node) and parent_node.seg == _PROTECTED
              and parent_node.children is None):
            seg = _PROTECTED
        else:
            seg = _PROBATION
        tick = self._tick()
        self._link(key, _Node(parent if parent_node is not None else None, tick, seg), parent_node)
        if seg == _PROBATION:
            self._probation += 1
        heapq.heappush(self._heaps[seg], (tick, key))
        self._maybe_compact()

    def access(self, key: Key) -> None:
        node = self._nodes.get(key)
        if node is None:
            return
        assert isinstance(node, _Node)
        self._touch(key, node)
        if node.seg == _PROBATION:
            node.seg = _PROTECTED
            self._probation -= 1
        if node.children is None:
            heapq.heappush(self._heaps[_PROTECTED], (node.tick, key))
            self._maybe_compact()

    def evict(self, n: int, is_pinned: IsPinned = never_pinned) -> list[Key]:
        victims: list[Key] = []
        held: list[tuple[int, tuple[int, Key]]] = []  # (segment, live entry) of pinned leaves
        try:
            while len(victims) < n:
                first = _PROBATION if self._probation > self.p else _PROTECTED
                victim = self._pop_leaf(first, is_pinned, held)
                if victim is None:
                    victim = self._pop_leaf(1 - first, is_pinned, held)
                if victim is None:  # rule 2: every leaf is pinned
                    victim = self._oldest_unpinned(is_pinned)
                    if victim is None:
                        break  # everything is pinned
                ghost = self._ghosts[self._seg(victim)]
                ghost[victim] = None
                if len(ghost) > self.capacity:
                    ghost.popitem(last=False)
                self._drop(victim)
                victims.append(victim)
        finally:
            for seg, entry in held:
                heapq.heappush(self._heaps[seg], entry)
        return victims

    def is_protected(self, key: Key) -> bool:
        """Whether a tracked key is in the protected segment; for tests and debugging."""
        return self._seg(key) == _PROTECTED

    # -- internals -------------------------------------------------------------------------
    def _seg(self, key: Key) -> int:
        node = self._nodes[key]
        assert isinstance(node, _Node)
        return node.seg

    def _pop_leaf(self, seg: int, is_pinned: IsPinned,
                  held: list[tuple[int, tuple[int, Key]]]) -> Key | None:
        heap = self._heaps[seg]
        nodes = self._nodes
        while heap:
            entry = heapq.heappop(heap)
            tick, key = entry
            node = nodes.get(key)
            if (not isinstance(node, _Node) or node.children is not None or node.tick != tick
                    or node.seg != seg):
                continue  # stale
            if is_pinned(key):
                held.append((seg, entry))
                continue
            return key
        return None

    def _maybe_compact(self) -> None:
        """Rebuild both heaps from the live leaves once stale entries outnumber live keys: O(n),
        after at least n stale pushes. Never called inside ``evict``, which holds entries out."""
        if len(self._heaps[0]) + len(self._heaps[1]) <= 2 * len(self._nodes) + 1024:
            return
        heaps: tuple[list[tuple[int, Key]], list[tuple[int, Key]]] = ([], [])
        for key, node in self._nodes.items():
            if node.children is None:
                assert isinstance(node, _Node)
                heaps[node.seg].append((node.tick, key))
        for old, new in zip(self._heaps, heaps):
            heapq.heapify(new)
            old[:] = new

    def _drop(self, key: Key) -> None:
        if self._seg(key) == _PROBATION:
            self._probation -= 1
        self._unlink(key)

    def _became_leaf(self, key: Key, node: TreeNode) -> None:
        assert isinstance(node, _Node)
        heapq.heappush(self._heaps[node.seg], (node.tick, key))
