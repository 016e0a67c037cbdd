"""What the store's jobs share: the tiers, their policies, and the bookkeeping the store lock
guards. :class:`~kvstore.store.TieredStore` composes its jobs around one of these -- lookups and
leases (:mod:`kvstore.lookups`), reads (:mod:`kvstore.reads`), admission and eviction
(:mod:`kvstore.room`), the staging path (:mod:`kvstore.staging_path`) -- and the store's module
docstring states the invariants they keep together.

Only in-memory bookkeeping runs under ``lock``; tier I/O never does (local index checks aside).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from kvstore.bandwidth import BandwidthMeter
from kvstore.buffers import aligned_pages
from kvstore.errors import InvalidArgument, StoreClosed
from kvstore.event_log import EventKind, EventLog
from kvstore.layout import KVLayout
from kvstore.leases import LeaseTable
from kvstore.metrics import Metrics
from kvstore.mover import COPIES, Mover
from kvstore.namespace_stats import NamespaceCounters
from kvstore.policy import EvictionPolicy
from kvstore.budgets import Budgets
from kvstore.retention import Retention
from kvstore.tiers.base import MissTally, Tier


class StoreState:
    def __init__(
        self,
        layout: KVLayout,
        tiers: Sequence[Tier],
        policies: Sequence[EvictionPolicy],
        *,
        write_policy: str,
        selective_hits: int,
        promote_on_hit: bool,
        leases: LeaseTable,
        bandwidth: BandwidthMeter,
        metrics: Metrics,
        prefetch_workers: int,
        switch_interval_ms: float,
        event_log_events: int,
        retention: Retention,
        event_token_ids: frozenset[bytes] = frozenset(),
    ) -> None:
        self.layout = layout
        self.tiers: list[Tier] = list(tiers)
        self.policies: list[EvictionPolicy] = list(policies)
        self.by_name = {t.name: i for i, t in enumerate(tiers)}
        self.write_policy = write_policy
        self.selective_hits = selective_hits
        self.promote_on_hit = promote_on_hit
        self.metrics = metrics
        self.leases = leases
        self.bw = bandwidth
        self.lock = threading.RLock()
        #: every change of where a page lives, with a store-wide sequence number (None: off);
        #: appended under ``lock``, so a snapshot taken under it lines up with the log's head
        self.events: EventLog | None = EventLog(event_log_events) if event_log_events else None
        #: namespaces whose "stored" events carry token ids (the operator's opt-in)
        self.event_token_ids = event_token_ids
        #: retention pins: keys no eviction takes until their pins lapse (see kvstore.retention)
        self.retention = retention
        #: which namespace owns each page of each tier, and its byte budgets (kvstore.budgets);
        #: fed by :meth:`record`, so it follows every change the event log sees
        self.budgets = Budgets([t.name for t in tiers], layout.page_bytes)
        #: each tier's hit counts of ``selective`` (a page copied down at selective_hits)
        self.hits: list[dict[bytes, int]] = [{} for _ in tiers]
        #: room claimed by writers that have not published yet
        self.claimed = [0] * len(tiers)
        #: victims chosen, not yet deleted
        self.retiring: list[set[bytes]] = [set() for _ in tiers]
        #: keys a tier is deleting outside the lock (untracked already; counted per delete in
        #: flight), and how many such deletes run (see Room.begin_delete)
        self.deleting: list[Counter[bytes]] = [Counter() for _ in tiers]
        self.deletes_in_flight = 0
        #: bumped (lock held) whenever a page leaves a tier's policy or retiring set, and only
        #: once the tier has deleted it (same hold of the lock): a leased lookup reads it before
        #: asking the tiers, and one that sees no bump when it leases skips re-checking its run
        #: (see kvstore.leases, "What a lease promises")
        self.removals = 0
        #: pages of each tier whose copy has reached the tier below since they entered it:
        #: evicting one writes nothing back, even where the tier below has dropped its copy
        #: since (its policy judged it colder than what it keeps: a write-back would undo that)
        self.clean: list[set[bytes]] = [set() for _ in tiers]
        #: keys of open store handles, by tier
        self.writing: list[set[bytes]] = [set() for _ in tiers]
        #: lookups, loads and misses per namespace, of the calls that name one (see
        #: :mod:`kvstore.namespace_stats`)
        self.namespace_counts = NamespaceCounters()
        self.mover = Mover(switch_interval_ms)  # its threads start with its first job
        self.executor = ThreadPoolExecutor(prefetch_workers, thread_name_prefix="kvstore-prefetch")
        self.closed = False

    def unclaim(self, ti: int, n: int, namespace_id: bytes | None) -> None:
        """Give back ``n`` pages of room a writer of ``namespace_id`` claimed in tier ``ti``
        (lock held): it admitted them, or will not write them."""
        self.claimed[ti] -= n
        if namespace_id is not None:
            self.budgets.release(ti, namespace_id, n)

    def check_open(self) -> None:
        if self.closed:
            raise StoreClosed()

    def tier_index(self, name: str | None) -> int:
        """The index of tier ``name`` (None: the fastest). InvalidArgument names the tiers."""
        if name is None:
            return 0
        try:
            return self.by_name[name]
        except (KeyError, TypeError):
            raise InvalidArgument(
                f"no tier named {name!r}", hint=f"tiers are {list(self.by_name)}"
            ) from None

    def background(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the mover's copies lane (in submission order)."""
        if not self.closed:
            self.mover.submit(fn, *args, lane=COPIES)

    def timed_read(
        self, tier: Tier, ns: bytes, keys: Sequence[bytes], outs: Sequence[np.ndarray],
        tally: MissTally | None = None,
    ) -> list[bool]:
        """``tier.read``, feeding the tier's bandwidth average when it returned pages."""
        t0 = time.perf_counter()
        found = tier.read(ns, keys, outs, tally)
        self.bw.sample(tier.name, sum(found) * self.layout.page_bytes, time.perf_counter() - t0)
        return found

    def record(self, kind: EventKind, ti: int, keys: Sequence[bytes],
               namespace_ids: Sequence[bytes | None], *, reason: str | None = None,
               to: int | None = None, token_ids: Sequence[bytes] = ()) -> None:
        """Account for a change of tier ``ti`` (lock held; nothing when ``keys`` is empty) and
        append it to the event log when that is on. ``to``: a move's destination tier. A
        removal's unknown namespaces (a shared tier's) are filled from the accounting."""
        if not keys:
            return
        if len(namespace_ids) != len(keys):
            namespace_ids = [None] * len(keys)
        budgets = self.budgets
        if kind == "stored":
            budgets.entered(ti, keys, namespace_ids)
        else:  # removed or moved: the page left tier ti
            known = budgets.left(ti, keys)
            namespace_ids = [n if n is not None else k for n, k in zip(namespace_ids, known)]
            if to is not None:
                budgets.entered(to, keys, namespace_ids)
        if self.events is not None:
            told: Sequence[bytes] = ()
            if token_ids and self.event_token_ids:  # only the namespaces opted in
                optin = self.event_token_ids
                told = [t if n in optin else b"" for t, n in zip(token_ids, namespace_ids)]
                if not any(told):
                    told = ()
            try:
                self.events.append(kind, self.tiers[ti].name, keys, namespace_ids,
                                   reason=reason,
                                   to_tier=None if to is None else self.tiers[to].name,
                                   token_ids=told)
            except StoreClosed:
                pass  # a background job ending after close(): nobody reads the log any more

    def namespaces_of(self, tier: Tier, keys: Sequence[bytes]) -> list[bytes | None]:
        """The namespace that owns each of ``keys`` in ``tier`` (lock held; None: not known
        there), from the accounting: no tier call, so a shared tier's keys are answered too."""
        ti = self.by_name[tier.name]
        owner = self.budgets.owner
        return [owner(ti, k) for k in keys]

    def scratch(self, n: int) -> list[np.ndarray]:
        """``n`` page buffers, 4 KiB aligned, so copies through a disk tier need no bounce."""
        return list(aligned_pages(n, self.layout.page_bytes))


__all__ = ["StoreState"]
