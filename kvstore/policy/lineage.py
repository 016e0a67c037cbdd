"""Leaf-first eviction over the prefix tree of tracked keys."""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from kvstore.policy.base import IsPinned, Key, never_pinned
from kvstore.policy.leaf_tree import LeafTreePolicy, TreeNode


class _Node(TreeNode):
    __slots__ = ("heap_tick",)

    def __init__(self, parent: Key | None, tick: int) -> None:
        super().__init__(parent, tick)
        self.heap_tick = tick  # tick of this key's newest entry in the leaf heap (-1: none)


class LineagePolicy(LeafTreePolicy):
    """Leaf-first LRU over the prefix tree that the ``parent`` arguments of ``insert`` describe.

    Why: a prefix lookup stops at the first missing block, so evicting the first block of a chain
    strands every block after it. This policy evicts chains from their ends.

    The tree is :mod:`kvstore.policy.leaf_tree`'s (a parent must be tracked when its child is
    inserted; a dropped key's children become roots).

    Victim order, one victim at a time:

    1. the unpinned leaf with the oldest last ``insert``/``access``;
    2. only if every leaf is pinned: the unpinned key (necessarily an inner node) with the oldest
       last ``insert``/``access``; its children become roots.

    Each eviction can turn the victim's parent into a leaf, which is then a candidate for the
    next victim of the same call, ranked by its own last use. Pinned keys are never victims and
    keep their place.

    Cost: ``insert``/``access``/``remove`` O(log n) amortised (a binary heap of leaves by last use,
    with lazy deletion and compaction when stale entries outnumber live keys; ``remove`` of an
    inner node is also O(its children)); ``evict`` O((victims + pinned leaves skipped) log n), plus
    a scan past pinned keys in LRU order for each victim taken under rule 2.
    """

    name = "lineage"

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        # (tick, key) for leaves; an entry is live iff its key is tracked, is a leaf and has
        # that tick. Ticks are unique, so keys themselves are never compared.
        self._heap: list[tuple[int, Key]] = []

    # -- contract --------------------------------------------------------------------------
    def insert(self, key: Key, parent: Key | None = None) -> None:
        if key in self._nodes:
            self.access(key)
            return
        parent_node = self._tracked_parent(parent)
        tick = self._tick()
        self._link(key, _Node(parent if parent_node is not None else None, tick), parent_node)
        self._push(tick, key)
        self._maybe_compact()

    def access(self, key: Key) -> None:
        node = self._nodes.get(key)
        if node is None:
            return
        self._touch(key, node)
        if node.children is None:
            assert isinstance(node, _Node)
            node.heap_tick = node.tick
            self._push(node.tick, key)
            self._maybe_compact()

    def access_many(self, keys: Sequence[Key]) -> None:
        # access() of each key with its steps inlined (a 32K-token hit touches 2048 keys), and
        # one compaction check at the end
        nodes, lru, heap = self._nodes, self._lru, self._heap
        for key in keys:
            node = nodes.get(key)
            if node is None:
                continue
            self._clock += 1
            node.tick = self._clock
            lru.move_to_end(key)
            if node.children is None:
                assert isinstance(node, _Node)
                node.heap_tick = node.tick
                heapq.heappush(heap, (node.tick, key))
        self._maybe_compact()

    def evict(self, n: int, is_pinned: IsPinned = never_pinned) -> list[Key]:
        victims: list[Key] = []
        held: list[tuple[int, Key]] = []  # live heap entries of pinned leaves, popped meanwhile
        heap = self._heap
        nodes = self._nodes
        try:
            while len(victims) < n:
                victim = None
                while heap:
                    tick, key = heapq.heappop(heap)
                    node = nodes.get(key)
                    if node is None or node.children is not None or node.tick != tick:
                        if isinstance(node, _Node) and node.heap_tick == tick:
                            node.heap_tick = -1  # its entry is gone
                        continue
                    if is_pinned(key):
                        held.append((tick, key))
                        continue
                    victim = key
                    break
                if victim is None:  # rule 2: every leaf is pinned
                    victim = self._oldest_unpinned(is_pinned)
                    if victim is None:
                        break  # everything is pinned
                self._drop(victim)
                victims.append(victim)
        finally:
            for entry in held:
                heapq.heappush(heap, entry)
        return victims

    # -- internals -------------------------------------------------------------------------
    def _push(self, tick: int, key: Key) -> None:
        heapq.heappush(self._heap, (tick, key))

    def _became_leaf(self, key: Key, node: TreeNode) -> None:
        assert isinstance(node, _Node)
        if node.heap_tick != node.tick:
            node.heap_tick = node.tick
            self._push(node.tick, key)

    def _maybe_compact(self) -> None:
        """Rebuild the heap from the live leaves once stale entries outnumber live keys: O(n),
        after at least n stale pushes. Never called inside ``evict``, which holds entries out."""
        if len(self._heap) <= 2 * len(self._nodes) + 1024:
            return
        heap = []
        for key, node in self._nodes.items():
            assert isinstance(node, _Node)
            if node.children is None:
                heap.append((node.tick, key))
                node.heap_tick = node.tick
            else:
                node.heap_tick = -1
        heapq.heapify(heap)
        self._heap[:] = heap
