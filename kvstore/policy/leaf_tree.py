"""The prefix tree that leaf-first policies (``lineage``, ``lineage_arc``) keep over their keys.

``insert(key, parent)`` makes ``key`` a child of ``parent`` if ``parent`` is tracked at that
moment, else a root (a parent inserted later does not adopt it). When a key stops being tracked
(``remove`` or eviction) while it still has tracked children, they become roots. A *leaf* is a
tracked key with no tracked children. Every tracked key also has a place in one LRU order (for
the fallback victim when every leaf is pinned) and a unique last-use tick.

Subclasses own the victim order (their heaps of leaves); they are told when a key becomes a
leaf because its last child left (:meth:`LeafTreePolicy._became_leaf`).
"""

from __future__ import annotations

from abc import abstractmethod
from collections import OrderedDict
from collections.abc import Iterator, Sequence

from kvstore.policy.base import EvictionPolicy, IsPinned, Key


class TreeNode:
    __slots__ = ("parent", "children", "tick")

    def __init__(self, parent: Key | None, tick: int) -> None:
        self.parent = parent  # a tracked key, or None for a root
        self.children: set[Key] | None = None  # tracked children; None when there are none
        self.tick = tick  # time of the last insert/access (unique)


class LeafTreePolicy(EvictionPolicy):
    """Tree bookkeeping shared by leaf-first policies; see the module docstring."""

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self._nodes: dict[Key, TreeNode] = {}
        self._lru: OrderedDict[Key, None] = OrderedDict()  # every tracked key, oldest first
        self._clock = 0

    # -- for subclasses ----------------------------------------------------------------------
    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def _tracked_parent(self, parent: Key | None) -> TreeNode | None:
        return None if parent is None else self._nodes.get(parent)

    def _link(self, key: Key, node: TreeNode, parent_node: TreeNode | None) -> None:
        """Start tracking ``key`` as ``node`` (whose ``parent`` is set iff ``parent_node``)."""
        if parent_node is not None:
            if parent_node.children is None:
                parent_node.children = {key}
            else:
                parent_node.children.add(key)
        self._nodes[key] = node
        self._lru[key] = None

    def _touch(self, key: Key, node: TreeNode) -> None:
        """A use of a tracked key: a new last-use tick, the newest place in LRU order."""
        node.tick = self._tick()
        self._lru.move_to_end(key)

    def _unlink(self, key: Key) -> TreeNode:
        """Stop tracking ``key``: its children become roots; a parent left without children
        becomes a leaf (reported to :meth:`_became_leaf`). Returns the key's node."""
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
                self._became_leaf(node.parent, parent_node)
        return node

    def _oldest_unpinned(self, is_pinned: IsPinned) -> Key | None:
        """The fallback victim when every leaf is pinned: the unpinned key used longest ago."""
        return next((k for k in self._lru if not is_pinned(k)), None)

    @abstractmethod
    def _became_leaf(self, key: Key, node: TreeNode) -> None:
        """``key`` just lost its last tracked child: make it a leaf candidate."""

    # -- contract and introspection --------------------------------------------------------
    def remove(self, key: Key) -> None:
        if key in self._nodes:
            self._drop(key)

    def _drop(self, key: Key) -> None:
        self._unlink(key)

    def parent(self, key: Key) -> Key | None:
        """The tracked parent of a tracked key (None for a root); for tests and debugging."""
        return self._nodes[key].parent

    def is_leaf(self, key: Key) -> bool:
        """Whether a tracked key has no tracked children; for tests and debugging."""
        return self._nodes[key].children is None

    def __contains__(self, key: object) -> bool:
        return key in self._nodes

    def tracks_all(self, keys: Sequence[Key]) -> bool:
        return all(map(self._nodes.__contains__, keys))

    def __len__(self) -> int:
        return len(self._nodes)

    def __iter__(self) -> Iterator[Key]:
        return iter(self._nodes)
