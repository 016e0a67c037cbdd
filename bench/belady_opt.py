"""Belady's offline optimum (OPT) as an :class:`~kvstore.policy.base.EvictionPolicy`: the
reference ``bench.policies`` holds every online policy against. It reads the whole trace ahead
(the next use of every block), so it is a bench tool, not a registered policy.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator

from bench.policy_traces import Trace
from kvstore.policy.base import EvictionPolicy, IsPinned, Key, never_pinned

OPT = "belady_opt"


class BeladyOPT(EvictionPolicy):
    """Offline optimum: evicts the tracked key whose next use is farthest in the future; keys
    never used again first, deeper keys first among those. Needs the whole trace: the simulator
    calls ``step(pos)`` before each block it touches, ``pos`` indexing the flattened trace."""

    name = OPT

    def __init__(self, capacity: int, trace: Trace,
                 tables: tuple[list[int], list[int]] | None = None) -> None:
        super().__init__(capacity)
        self._next_use, self._depth = tables if tables is not None else self.tables(trace)
        self._nu: dict[Key, int] = {}
        self._heap: list[tuple[int, int, Key]] = []  # (-next use, -depth, key), lazily deleted
        self._pos = 0

    @staticmethod
    def tables(trace: Trace) -> tuple[list[int], list[int]]:
        """Per position of the flattened trace: the next position of the same key (or the
        trace's length), and the key's depth in its request. Shared by the runs of all sizes."""
        flat = [k for r in trace.requests for k in r]
        never = len(flat)
        next_use = [never] * len(flat)
        last: dict[int, int] = {}
        for pos in range(len(flat) - 1, -1, -1):
            next_use[pos] = last.get(flat[pos], never)
            last[flat[pos]] = pos
        return next_use, [i for r in trace.requests for i in range(len(r))]

    def step(self, pos: int) -> None:
        self._pos = pos

    def insert(self, key: Key, parent: Key | None = None) -> None:
        nu = self._next_use[self._pos]
        self._nu[key] = nu
        heapq.heappush(self._heap, (-nu, -self._depth[self._pos], key))
        if len(self._heap) > 4 * len(self._nu) + 1024:
            live = [e for e in self._heap if self._nu.get(e[2]) == -e[0]]
            heapq.heapify(live)
            self._heap = live

    def access(self, key: Key) -> None:
        if key in self._nu:
            self.insert(key)

    def remove(self, key: Key) -> None:
        self._nu.pop(key, None)

    def evict(self, n: int, is_pinned: IsPinned = never_pinned) -> list[Key]:
        victims: list[Key] = []
        held = []
        while self._heap and len(victims) < n:
            entry = heapq.heappop(self._heap)
            neg_nu, _, key = entry
            if self._nu.get(key) != -neg_nu:
                continue
            if is_pinned(key):
                held.append(entry)
                continue
            del self._nu[key]
            victims.append(key)
        for entry in held:
            heapq.heappush(self._heap, entry)
        return victims

    def __contains__(self, key: object) -> bool:
        return key in self._nu

    def __len__(self) -> int:
        return len(self._nu)

    def __iter__(self) -> Iterator[Key]:
        return iter(self._nu)
