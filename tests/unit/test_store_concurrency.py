"""Eight threads of mixed store operations at once -- puts, gets, leased lookups followed by
leased loads, evictions, prefetches, staging loads and saves -- over two host tiers, or a host tier
over a disk tier (whose deletes run outside the store lock), under write-back and promotion. Afterwards ``check_integrity`` holds (every policy tracks exactly
what its tier holds), no read returned wrong bytes, and no page a lease pinned went missing
before its load. Bounded in CI; ``-m slow`` runs it for a minute."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from kvstore import KVLayout, Metrics, Namespace, TieredStore
from kvstore.errors import LeaseError
from kvstore.tiers.disk import DiskTier
from kvstore.tiers.host import HostTier
from tests.store_ops import page_of, put_or_get

LAYOUT = KVLayout(1, 1, 8, 4, "float16")  # 64-byte pages
NS = Namespace("concurrency", LAYOUT)
CHAINS = [NS.chain([7, 7, 7, 7] + [c * 1000 + i for i in range(4 * 7)]) for c in range(6)]


def worker(store: TieredStore, seed: int, deadline: float, tally: Counter[str]) -> None:
    rng = random.Random(seed)
    while time.monotonic() < deadline:
        chain = rng.choice(CHAINS)
        n = rng.randint(1, len(chain.keys))
        keys = list(chain.keys[:n])
        op = rng.random()
        if put_or_get(store, NS, chain, n, op, tally):
            continue
        if op < 0.7:
            hit = store.lookup(keys, lease=True)
            if hit.lease is None:
                continue
            out = np.zeros((hit.num_blocks, LAYOUT.page_bytes), np.uint8)
            res = store.get(NS.id, keys[: hit.num_blocks], out, lease=hit.lease)
            tally["leased"] += hit.num_blocks
            tally["lost"] += hit.num_blocks - res.num_found
            tally["wrong"] += sum(f and not np.array_equal(b, page_of(k))
                                  for k, f, b in zip(keys, res.found, out))
        elif op < 0.8:
            store.evict(rng.randint(1, 3), tier=rng.choice(["fast", "slow"]))
        elif op < 0.9:
            load = store.prepare_load(NS.id, keys)
            tally["wrong"] += sum(not np.array_equal(load.slab[s], page_of(k))
                                  for k, s in zip(load.keys, load.slots))
            store.complete_load(load)
        else:
            h = store.prepare_store(chain.metas(0, n))
            for m, s in zip(h.metas, h.slots):
                h.slab[s] = page_of(m.key)
            if rng.random() < 0.2:
                store.abort(h)
            else:
                store.complete_store(h)
        tally["ops"] += 1


def hammer(seconds: float, disk: Path | None = None) -> Counter[str]:
    m = Metrics()
    slow = (HostTier.build("slow", LAYOUT, 30, m) if disk is None else
            DiskTier.build("slow", LAYOUT, 30, m, path=disk, durability="none", preallocate=False))
    store = TieredStore(LAYOUT, [HostTier.build("fast", LAYOUT, 12, m), slow],
                        ["lru", "s3fifo"], write_policy="write_back", lease_ttl_s=60.0)
    tally: Counter[str] = Counter()
    errors: list[BaseException] = []
    deadline = time.monotonic() + seconds

    def run(seed: int) -> None:
        local: Counter[str] = Counter()
        try:
            worker(store, seed, deadline, local)
        except LeaseError as exc:  # never: leases last 60 s here
            errors.append(exc)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            with lock:
                tally.update(local)

    lock = threading.Lock()
    threads = [threading.Thread(target=run, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
    store.check_integrity()
    assert store.stats().active_leases == 0
    store.close()
    return tally


@pytest.mark.parametrize("lower", ["host", "disk"])
def test_eight_threads_keep_the_store_consistent(lower: str, tmp_path: Path) -> None:
    tally = hammer(4.0, tmp_path / "disk" if lower == "disk" else None)
    assert tally["ops"] > 200 and tally["leased"] > 0
    assert (tally["wrong"], tally["lost"]) == (0, 0)


@pytest.mark.slow
def test_eight_threads_for_a_minute() -> None:
    tally = hammer(60.0)
    assert (tally["wrong"], tally["lost"]) == (0, 0)
