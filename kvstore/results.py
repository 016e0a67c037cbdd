"""Typed results of the store's operations."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
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
    """The longest run of leading keys present in some tier, the fastest tier of each, and
    what loading each run of one tier is estimated to cost -- so a caller weighs load against
    recompute with this answer alone."""

    num_blocks: int
    tiers: tuple[str, ...]
    lease: Lease | None = None
    #: per run of :attr:`runs`: seconds to read it at its tier's measured read bandwidth, None
    #: where the tier has no measurement yet
    load_s: tuple[float | None, ...] = ()

    def blocks_in(self, tier: str) -> int:
        return sum(1 for t in self.tiers if t == tier)

    @property
    def runs(self) -> tuple[tuple[str, int], ...]:
        """The hit as ``(tier, blocks)`` runs of one tier, in order."""
        return runs_of(self.tiers)


def runs_of(tiers: Sequence[str]) -> tuple[tuple[str, int], ...]:
    """``tiers`` (one per block) as ``(tier, count)`` runs of one tier."""
    return merge_runs(((t, 1) for t in tiers), len(tiers))


def merge_runs(runs: Iterable[tuple[str, int]], limit: int) -> tuple[tuple[str, int], ...]:
    """``(tier, count)`` runs with neighbours of one tier merged, cut at ``limit`` blocks (a
    store's runs, a few: no walk over every block)."""
    out: list[tuple[str, int]] = []
    for tier, n in runs:
        n = min(n, limit)
        if n <= 0:
            break
        limit -= n
        if out and out[-1][0] == tier:
            out[-1] = (tier, out[-1][1] + n)
        else:
            out.append((tier, n))
    return tuple(out)


def load_estimates(runs: Sequence[tuple[str, int]], page_bytes: int,
                   bandwidth: Callable[[str], float | None]) -> tuple[float | None, ...]:
    """Seconds to read each run at ``bandwidth(tier)`` bytes/s (None: not measured yet)."""
    out: list[float | None] = []
    for tier, n in runs:
        bw = bandwidth(tier)
        out.append(n * page_bytes / bw if bw else None)
    return tuple(out)


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
