"""Namespace accounting and byte budgets: which namespace owns each page of each tier, how many
pages each namespace holds there, and the most it may hold.

Why one table: a budget is enforced where a page enters a tier (``Room``), and judged by what
the namespace holds there now. The store's every change of where a page lives already passes
through one call (``StoreState.record``, which also feeds the event log), so the table follows
that stream -- the same stream the event-log property test proves equal to the tiers' real
contents -- instead of asking tiers (a shared tier's metadata is a network call away).

A namespace at its budget in a tier makes room among *its own* pages there (by the tier's
policy, sparing pinned and leased pages); it never evicts another namespace's page to stay
within it. What it cannot make room for is refused (counted as refused, as a full tier's is).

Not thread-safe on its own: the store calls it under its lock.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from kvstore.errors import InvalidArgument


class Budgets:
    def __init__(self, tiers: Sequence[str], page_bytes: int) -> None:
        self.tiers = list(tiers)
        self.page_bytes = page_bytes
        #: per tier: key -> the namespace that owns it there
        self._owner: list[dict[bytes, bytes]] = [{} for _ in tiers]
        #: per tier: namespace -> pages it holds there
        self._held: list[Counter[bytes]] = [Counter() for _ in tiers]
        #: per tier: namespace -> pages of its writes in flight (room claimed, not admitted)
        self._reserved: list[Counter[bytes]] = [Counter() for _ in tiers]
        #: per tier: namespace -> most pages it may hold there
        self._limit: list[dict[bytes, int]] = [{} for _ in tiers]
        #: bumped by every change of the budgets (a saved copy is stale when older)
        self.version = 0

    # ------------------------------------------------------------------ what is held

    def entered(self, ti: int, keys: Sequence[bytes], namespace_ids: Sequence[bytes | None]) -> None:
        owner, held = self._owner[ti], self._held[ti]
        for k, ns in zip(keys, namespace_ids):
            if ns is None or k in owner:
                continue
            owner[k] = ns
            held[ns] += 1

    def left(self, ti: int, keys: Sequence[bytes]) -> list[bytes | None]:
        """Forget ``keys`` in tier ``ti``; the namespace each had there (None: unknown)."""
        owner, held = self._owner[ti], self._held[ti]
        out: list[bytes | None] = []
        for k in keys:
            ns = owner.pop(k, None)
            if ns is not None:
                held[ns] -= 1
                if held[ns] <= 0:
                    del held[ns]
            out.append(ns)
        return out

    def cleared(self, ti: int | None, namespace_id: bytes | None) -> None:
        for i in range(len(self.tiers)) if ti is None else (ti,):
            if namespace_id is None:
                self._owner[i].clear()
                self._held[i].clear()
            else:
                self.left(i, [k for k, ns in self._owner[i].items() if ns == namespace_id])

    def reserve(self, ti: int, namespace_id: bytes, n: int) -> None:
        """``n`` pages of ``namespace_id`` are being written to tier ``ti`` (room claimed):
        they count against its budget until :meth:`release`, so concurrent writers of one
        namespace cannot overshoot it together."""
        if n > 0:
            self._reserved[ti][namespace_id] += n

    def release(self, ti: int, namespace_id: bytes, n: int) -> None:
        reserved = self._reserved[ti]
        left = reserved.get(namespace_id, 0) - n
        if left > 0:
            reserved[namespace_id] = left
        else:
            reserved.pop(namespace_id, None)

    def owner(self, ti: int, key: bytes) -> bytes | None:
        return self._owner[ti].get(key)

    def pages(self, ti: int, namespace_id: bytes) -> int:
        return self._held[ti].get(namespace_id, 0)

    # ------------------------------------------------------------------ budgets

    def set(self, ti: int, namespace_id: bytes, nbytes: int | None) -> None:
        """Hold ``namespace_id`` to ``nbytes`` of tier ``ti`` (whole pages, rounded down;
        None: no budget). InvalidArgument for a negative or non-integer size."""
        if nbytes is not None and (
                isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0):
            raise InvalidArgument(f"a budget is a whole number of bytes >= 0, got {nbytes!r}")
        self.version += 1
        if nbytes is None:
            self._limit[ti].pop(namespace_id, None)
            return
        self._limit[ti][namespace_id] = nbytes // self.page_bytes

    def limit(self, ti: int, namespace_id: bytes) -> int | None:
        """Pages ``namespace_id`` may hold in tier ``ti``; None: no budget."""
        return self._limit[ti].get(namespace_id)

    def over(self, ti: int, namespace_id: bytes, adding: int) -> int:
        """How many of its own pages ``namespace_id`` must give up in tier ``ti`` to add
        ``adding`` within its budget (0 without one)."""
        cap = self._limit[ti].get(namespace_id)
        if cap is None:
            return 0
        held = self.pages(ti, namespace_id) + self._reserved[ti].get(namespace_id, 0)
        return max(0, held + adding - cap)

    def all(self) -> list[tuple[int, bytes, int]]:
        """Every budget: (tier index, namespace, pages)."""
        return [(ti, ns, pages) for ti, limits in enumerate(self._limit)
                for ns, pages in limits.items()]

    def any(self, ti: int) -> bool:
        return bool(self._limit[ti])


__all__ = ["Budgets"]
