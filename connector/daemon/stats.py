"""The daemon's stats as :meth:`~connector.daemon.client.DaemonStore.stats` returns them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class DaemonTierStats:
    name: str
    kind: str
    capacity_pages: int
    used_pages: int
    free_pages: int
    hits: int
    misses: int
    writes: int
    evictions: int


@dataclass(frozen=True, slots=True)
class DaemonStats:
    tiers: tuple[DaemonTierStats, ...]
    lookup_hit_blocks: int
    lookup_miss_blocks: int
    active_leases: int
    sessions: int
    open_load_handles: int
    open_store_handles: int
    integrity_checked: bool
    integrity_error: str

    def tier(self, name: str) -> DaemonTierStats:
        return next(t for t in self.tiers if t.name == name)
