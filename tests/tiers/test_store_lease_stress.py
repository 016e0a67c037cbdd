"""The lease guarantee under load (issue 42): a page that ``lookup(..., lease=True)`` reported
stays in the tier it was reported in, and readable, until the lease is released -- while puts,
gets with promotion, prefetches, write-backs and evictions of the same keys run on other
threads.

The shape of the run that found the defect: eight threads over a host tier of 24 pages above a
disk tier of 64 (real files, LMDB index), write-back, a few prefix chains that share their first
blocks; random puts, gets, leased lookups each followed by its leased get, prefetches and stats;
no deletes. The tiers here widen the store's race windows: each ``read``, ``write``, ``delete``
and lookup scan (``count_leading_checked``) of a tier may pause before or after it, and a
leased lookup may pause before its get. So a thread stops, more often than by chance,

* between a lookup's scan of the tiers and its lease (scan -> lease),
* between a leased lookup and its get,
* between a victim's choice and its removal (the write-back's read and write, and the delete
  itself, which the store runs under its lock),
* between a write-back's or a promotion's write and its admission to the tier's policy,
* between a promotion's (or a prefetch's) read and its write.

Each leased lookup checks, before its get, that every reported tier still holds its page
(``evicted``), and the get must find every page (``lost``) with its bytes (``wrong``).
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kvstore import KVLayout, Metrics, Namespace, TieredStore
from kvstore.keys import BlockMeta
from kvstore.tiers.base import MissTally
from kvstore.tiers.disk import DiskTier
from kvstore.tiers.host import HostTier
from tests.store_ops import page_of, put_or_get

LAYOUT = KVLayout(1, 1, 8, 4, "float16")  # 128-byte pages
NS = Namespace("lease-stress", LAYOUT)
# six chains of 8 blocks that share their first block: 43 keys over 24 + 64 pages
CHAINS = [NS.chain([3, 3, 3, 3] + [c * 1000 + i for i in range(4 * 7)]) for c in range(6)]
#: how long one pause lasts at most, and how often a tier call pauses
PAUSE_S = 0.002
PAUSE_P = 0.05
DELETE_P = 0.5


def pause(p: float = PAUSE_P) -> None:
    if random.random() < p:
        time.sleep(random.uniform(0, PAUSE_S))


class Widening:
    """Pauses around a tier's calls (mixed into a real tier: behaviour unchanged)."""

    def count_leading_checked(self, keys: Sequence[bytes], tally: MissTally | None = None) -> int:
        n = super().count_leading_checked(keys, tally)  # type: ignore[misc]
        pause()  # between a lookup's scan and its lease
        return n

    def read(self, namespace_id: bytes, keys: Sequence[bytes], outs: Sequence[np.ndarray],
             tally: MissTally | None = None) -> list[bool]:
        pause()
        found = super().read(namespace_id, keys, outs, tally)  # type: ignore[misc]
        pause()  # between a promotion's or write-back's read and its write
        return found

    def write(self, metas: Sequence[BlockMeta], pages: Sequence[np.ndarray]) -> list[bool]:
        pause()
        stored = super().write(metas, pages)  # type: ignore[misc]
        pause()  # between a write and its admission
        return stored

    def delete(self, keys: Sequence[bytes]) -> int:
        pause(DELETE_P)  # between a victim's choice (and write-back) and its removal: under the lock
        return super().delete(keys)  # type: ignore[misc]


class WideHost(Widening, HostTier):
    pass


class WideDisk(Widening, DiskTier):
    pass


def worker(store: TieredStore, seed: int, deadline: float, tally: Counter[str]) -> None:
    rng = random.Random(seed)
    while time.monotonic() < deadline:
        chain = rng.choice(CHAINS)
        n = rng.randint(1, len(chain.keys))
        keys = list(chain.keys[:n])
        op = rng.random()
        if put_or_get(store, NS, chain, n, op, tally):
            continue
        if op < 0.8:
            hit = store.lookup(keys, lease=True)
            if hit.lease is None:
                continue
            pause()  # between the lookup and its get
            held = keys[: hit.num_blocks]
            where = [store.tier(t).contains([k])[0] for k, t in zip(held, hit.tiers)]
            out = np.zeros((hit.num_blocks, LAYOUT.page_bytes), np.uint8)
            res = store.get(NS.id, held, out, lease=hit.lease)
            tally["leased"] += hit.num_blocks
            tally["evicted"] += where.count(False)
            tally["lost"] += hit.num_blocks - res.num_found
            tally["wrong"] += sum(f and not np.array_equal(b, page_of(k))
                                  for k, f, b in zip(held, res.found, out))
        elif op < 0.95:
            store.prefetch(NS.id, keys).result()
        else:
            store.stats()
        tally["ops"] += 1


def hammer(tmp: Path, seconds: float, seed: int = 0) -> Counter[str]:
    random.seed(seed)
    m = Metrics()
    store = TieredStore(
        LAYOUT,
        [WideHost.build("host", LAYOUT, 24, m, pin_memory=False),
         WideDisk.build("disk", LAYOUT, 64, m, path=tmp / "disk", durability="none")],
        ["lru", "lru"], write_policy="write_back", lease_ttl_s=600.0)
    tally: Counter[str] = Counter()
    errors: list[BaseException] = []
    lock = threading.Lock()
    deadline = time.monotonic() + seconds

    def run(seed: int) -> None:
        local: Counter[str] = Counter()
        try:
            worker(store, seed, deadline, local)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            with lock:
                tally.update(local)

    threads = [threading.Thread(target=run, args=(seed * 100 + s,)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert not errors, errors[:3]
        store.check_integrity()
        assert store.stats().active_leases == 0
    finally:
        store.close()
    return tally


def _summary(tally: Counter[str]) -> dict[str, Any]:
    return {k: tally[k] for k in ("ops", "leased", "evicted", "lost", "wrong")}


def test_leased_pages_stay_readable_under_load(tmp_path: Path) -> None:
    tally = hammer(tmp_path, 10.0)
    assert tally["leased"] > 500, _summary(tally)
    assert (tally["evicted"], tally["lost"], tally["wrong"]) == (0, 0, 0), _summary(tally)


@pytest.mark.slow
def test_leased_pages_stay_readable_for_a_minute(tmp_path: Path) -> None:
    tally = hammer(tmp_path, 60.0)
    assert (tally["evicted"], tally["lost"], tally["wrong"]) == (0, 0, 0), _summary(tally)
