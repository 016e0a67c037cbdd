"""Typed results of the store's operations."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvstore.metrics import TierStats


@dataclass(frozen=True, slots=True)
class Lease:
    """Pins the pages of a lookup until released or until ``expires_at`` (monotonic seconds)."""

    id: int  # unique in the process
    keys: tuple[bytes, ...]
    expires_at: float
    owner: int = 0  # the lease table (store) that granted it; another store refuses it
    #: a daemon's lease: the bytes that let another process's client of the same daemon take
    #: it over (vLLM's scheduler leases, its worker loads); b"" for an in-process store's
    ticket: bytes = b""


@dataclass(frozen=True, slots=True)
class LookupResult:
    """The longest run of leading keys present in some tier, and the fastest tier of each."""

    num_blocks: int
    tiers: tuple[str, ...]
    lease: Lease | None = None

    def blocks_in(self, tier: str) -> int:
        return sum(1 for t in self.tiers if t == tier)


@dataclass(frozen=True, slots=True)
class PutResult:
    stored: int  # newly written to the target tier
    existing: int  # already there: not written again
    refused: int  # no room (everything evictable was pinned) or the medium refused


@dataclass(frozen=True, slots=True)
class GetResult:
    """Which keys were read into the caller's buffers, and from which tier."""

    found: tuple[bool, ...]
    tiers: tuple[str | None, ...]

    @property
    def num_found(self) -> int:
        return sum(self.found)

    @property
    def num_leading(self) -> int:
        """How many leading keys were read — what a prefix load can use."""
        n = 0
        for f in self.found:
            if not f:
                break
            n += 1
        return n


@dataclass(frozen=True, slots=True)
class StoreStats:
    tiers: tuple[TierStats, ...]
    lookup_hit_blocks: int
    lookup_miss_blocks: int
    active_leases: int
    copies: dict[str, int] = field(default_factory=dict)

    @property
    def lookup_hit_ratio(self) -> float:
        total = self.lookup_hit_blocks + self.lookup_miss_blocks
        return self.lookup_hit_blocks / total if total else 0.0
