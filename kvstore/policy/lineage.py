"""Leaf-first eviction over the prefix tree of tracked keys."""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Iterator

from kvstore.policy.base import EvictionPolicy, IsPinned, Key, never_pinned


class _Node:
    __slots__ = ("parent", "children", "tick", "heap_tick")

    def __init__(self, parent: Key | None, tick: int) -> None:
        self.parent = parent  # a tracked key, or None for a root
        self.children: set[Key] | None = None  # tracked children; None when there are none
        self.tick = tick  # time of the last insert/access
        self.heap_tick = tick  # tick of this key's newest entry in the leaf heap (-1: none)


class LineagePolicy(EvictionPolicy):
    """Leaf-first LRU over the prefix tree that the ``parent`` arguments of ``insert`` describe.

    Why: a prefix lookup stops at the first missing block, so evicting the first block of a chain
    strands every block after it. This policy evicts chains from their ends.

    The tree: ``insert(key, parent)`` makes ``key`` a child of ``parent`` if ``parent`` is tracked
    at that moment, else a root (a parent inserted later does not adopt it). When a key stops
    being tracked (``remove`` or eviction) while it still has tracked children, they become roots.
    A *leaf* is a tracked key with no tracked children.

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
        self._nodes: dict[Key, _Node] = {}
        self._lru: OrderedDict[Key, None] = OrderedDict()  # every tracked key, oldest first
        # (tick, key) for leaves; an entry is live iff its key is tracked, is a leaf and has
        # that tick. Ticks are unique, so keys themselves are never compared.
        self._heap: list[tuple[int, Key]] = []
        self._clock = 0

    # -- contract --------------------------------------------------------------------------
    def insert(self, key: Key, parent: Key | None = None) -> None:
        if key in self._nodes:
            self.access(key)
            return
        self._clock += 1
        parent_node = None if parent is None else self._nodes.get(parent)
        node = _Node(parent if parent_node is not None else None, self._clock)
        if parent_node is not None:
            if parent_node.children is None:
                parent_node.children = {key}
            else:
                parent_node.children.add(key)
        self._nodes[key] = node
        self._lru[key] = None
        self._push(self._clock, key)
        self._maybe_compact()

    def access(self, key: Key) -> None:
        node = self._nodes.get(key)
        if node is None:
            return
        self._clock += 1
        node.tick = self._clock
        self._lru.move_to_end(key)
        if node.children is None:
            node.heap_tick = self._clock
            self._push(self._clock, key)
            self._maybe_compact()

    def remove(self, key: Key) -> None:
        if key in self._nodes:
            self._drop(key)

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
                        if node is not None and node.heap_tick == tick:
                            node.heap_tick = -1  # its entry is gone
                        continue
                    if is_pinned(key):
                        held.append((tick, key))
                        continue
                    victim = key
                    break
                if victim is None:  # rule 2: every leaf is pinned
                    victim = next((k for k in self._lru if not is_pinned(k)), None)
                    if victim is None:
                        break  # everything is pinned
                self._drop(victim)
                victims.append(victim)
        finally:
            for entry in held:
                heapq.heappush(heap, entry)
        return victims

    def parent(self, key: Key) -> Key | None:
        """The tracked parent of a tracked key (None for a root); for tests and debugging."""
        return self._nodes[key].parent

    def is_leaf(self, key: Key) -> bool:
        """Whether a tracked key has no tracked children; for tests and debugging."""
        return self._nodes[key].children is None

    def __contains__(self, key: object) -> bool:
        return key in self._nodes

    def __len__(self) -> int:
        return len(self._nodes)

    def __iter__(self) -> Iterator[Key]:
        return iter(self._nodes)

    # -- internals -------------------------------------------------------------------------
    def _push(self, tick: int, key: Key) -> None:
        heapq.heappush(self._heap, (tick, key))

    def _maybe_compact(self) -> None:
        """Rebuild the heap from the live leaves once stale entries outnumber live keys: O(n),
        after at least n stale pushes. Never called inside ``evict``, which holds entries out."""
        if len(self._heap) <= 2 * len(self._nodes) + 1024:
            return
        heap = []
        for key, node in self._nodes.items():
            if node.children is None:
                heap.append((node.tick, key))
                node.heap_tick = node.tick
            else:
                node.heap_tick = -1
        heapq.heapify(heap)
        self._heap[:] = heap

    def _drop(self, key: Key) -> None:
        """Stop tracking ``key``: its children become roots, its parent may become a leaf."""
        node = self._nodes.pop(key)
        del self._lru[key]
        if node.children is not None:
            for child in node.children:
                self._nodes[child].parent = None
        if node.parent is not None:
            parent_node = self._nodes[node.parent]
            siblings = parent_node.children
            assert siblings is not None and key in siblings
            siblings.discard(key)
            if not siblings:
                parent_node.children = None
                if parent_node.heap_tick != parent_node.tick:
                    parent_node.heap_tick = parent_node.tick
                    self._push(parent_node.tick, node.parent)
