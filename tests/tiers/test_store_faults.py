"""The store under a stalled Redis below it (SIGSTOP, a real stall): a victim leased while its
write-back hangs is kept, never deleted; the policy never tracks a page the tier dropped; a get
never waits for a write-back. These are the store-core defects of the fault campaign."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from kvstore import Metrics, Namespace, TieredStore
from kvstore.layout import KVLayout
from kvstore.tiers.host import HostTier
from kvstore.tiers.redis import RedisTier
from tests.redis_servers import RedisServer

pytestmark = pytest.mark.timeout(120)

LAYOUT = KVLayout(1, 1, 8, 4, "float16")  # 64-byte pages
NS = Namespace("store-faults", LAYOUT)
CHAIN = NS.chain(list(range(4 * 6)))
PAGES = np.random.default_rng(3).integers(0, 256, (6, LAYOUT.page_bytes), dtype=np.uint8)


def over_redis(server: RedisServer, host_pages: int, timeout_s: float, **kw: object) -> TieredStore:
    m = Metrics()
    host = HostTier.build("host", LAYOUT, host_pages, m)
    redis = RedisTier.build("redis", LAYOUT, 100, m, url=server.url, timeout_s=timeout_s,
                      connect_timeout_s=timeout_s)
    return TieredStore(LAYOUT, [host, redis], ["lru", "lru"], **kw)  # type: ignore[arg-type]


def wait_until(cond, timeout_s: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.002)


def test_a_victim_leased_during_its_write_back_is_kept(redis_server: RedisServer) -> None:
    store = over_redis(redis_server, 2, timeout_s=1.0, write_policy="write_back")
    k1 = CHAIN.keys[0]
    store.put(CHAIN.metas(0, 2), PAGES[:2])  # host full: k1, k2
    redis_server.pause()  # the write-back of the next victim hangs, then fails
    results = []
    writer = threading.Thread(target=lambda: results.append(
        store.put([CHAIN.meta(2)], PAGES[2:3])))
    writer.start()
    wait_until(lambda: k1 not in store.policies[0])  # k1 chosen; its write-back is in flight
    leased = store.lookup([k1], lease=True)  # still in host: leased
    assert leased.num_blocks == 1
    out = np.zeros((1, LAYOUT.page_bytes), np.uint8)
    assert store.get(NS.id, [k1], out).found == (True,)  # a read hit while it retires
    writer.join()
    redis_server.resume()
    got = store.get(NS.id, [k1], out, lease=leased.lease)
    assert got.found == (True,) and got.tiers == ("host",)  # the leased page was kept
    assert np.array_equal(out[0], PAGES[0])
    assert results[0].refused == 1  # its room was the leased page: the write is refused
    store.check_integrity()
    store.close()


def test_a_get_never_runs_a_write_back(redis_server: RedisServer) -> None:
    store = over_redis(redis_server, 4, timeout_s=2.0, write_policy="selective",
                       selective_hits=1)
    store.put(CHAIN.metas(0, 2), PAGES[:2])
    redis = store.tier("redis")
    redis_server.pause()
    out = np.zeros((2, LAYOUT.page_bytes), np.uint8)
    res = store.get(NS.id, CHAIN.keys[:2], out)  # hits that reach selective_hits: copy down
    # the get returned with its pages while the copy down to the stalled server still waits
    assert res.found == (True, True) and np.array_equal(out, PAGES[:2])
    assert redis.stats().errors == 0
    assert store.drain(timeout_s=30)
    assert redis.stats().errors >= 1  # the copy down ran afterwards, on the mover thread
    redis_server.resume()
    store.check_integrity()
    store.close()


def test_a_write_through_put_reports_pages_a_lower_tier_refused() -> None:
    m = Metrics()
    store = TieredStore(LAYOUT, [HostTier.build("a", LAYOUT, 4, m), HostTier.build("b", LAYOUT, 1, m)],
                        write_policy="write_through")
    store.put([CHAIN.meta(5)], PAGES[5:6], tier="b")
    pin = store.lookup([CHAIN.keys[5]], lease=True)  # b's only slot is pinned
    assert pin.lease is not None
    res = store.put(CHAIN.metas(0, 2), PAGES[:2])
    assert (res.stored, res.existing, res.refused) == (2, 0, 2)
    # the staging path's save reports the same (it returned refused=0)
    handle = store.prepare_store(CHAIN.metas(2, 4))
    for slot, page in zip(handle.slots, PAGES[2:4]):
        store.staging_tier().slab[slot] = page
    res = store.complete_store(handle)
    assert (res.stored, res.existing, res.refused) == (2, 0, 2)
    store.release(pin.lease)
    store.check_integrity()
    store.close()
