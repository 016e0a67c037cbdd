"""Per-namespace traffic in ``/v1/stats`` on a live daemon: lookups and reads of two tenants
through the daemon's wire give each namespace its exact hits, misses and hit rates; pages that
a real Redis expired (ttl_s) are counted as expired for the tier and for the namespace whose
lookup found them gone, and not as absent."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from connector.daemon.client import DaemonStore
from tests.admin.conftest import LAYOUT, AdminDaemon, namespace, pages
from tests.redis_servers import RedisServer

PAGE = LAYOUT.page_bytes


def test_each_namespace_gets_its_own_hits_misses_and_hit_rates(admin_daemon: AdminDaemon) -> None:
    a, b, idle = namespace("a"), namespace("b"), namespace("idle")
    ca = a.chain(list(range(6 * 16)))  # 6 blocks, the first 4 stored
    cb = b.chain(list(range(1000, 1000 + 4 * 16)))  # 4 blocks, the first 2 stored
    with DaemonStore(admin_daemon.target, a.id) as sa, DaemonStore(admin_daemon.target, b.id) as sb:
        assert sa.write_pages(ca.metas(0, 4), pages(4, 1)).stored == 4
        assert sb.write_pages(cb.metas(0, 2), pages(2, 2)).stored == 2
        assert sa.lookup(list(ca.keys)).num_blocks == 4  # 4 hit, 2 missed
        assert sa.lookup(list(ca.keys[:4])).num_blocks == 4  # 4 hit
        assert sb.lookup(list(cb.keys)).num_blocks == 2  # 2 hit, 2 missed
        sb.count_declined(b.id, 2)  # its load-or-recompute recomputes the 2 it matched
        assert sa.read_pages(list(ca.keys), np.empty((6, PAGE), np.uint8)) == 4  # 4 read, 2 not
        with DaemonStore(admin_daemon.target, idle.id) as si:  # looks up, finds nothing
            assert si.lookup(list(idle.chain(list(range(32))).keys)).num_blocks == 0
    with admin_daemon.client() as api:
        st = api.get("/v1/stats").json()
    rows = {r["namespace_id"]: r for r in st["namespaces"]}
    ra, rb, ri = rows[a.id.hex()], rows[b.id.hex()], rows[idle.id.hex()]
    assert (ra["lookup_hit_blocks"], ra["lookup_miss_blocks"]) == (8, 2)
    assert ra["hit_rate_1m"] == ra["hit_rate_15m"] == 0.8
    assert (ra["loaded_pages"], ra["load_missed_pages"]) == (4, 2)
    assert ra["misses"] == {"absent": 2, "corrupt": 0, "expired": 0, "timeout": 0, "declined": 0}
    assert (rb["lookup_hit_blocks"], rb["lookup_miss_blocks"]) == (2, 2)
    assert rb["hit_rate_1m"] == rb["hit_rate_15m"] == 0.5
    assert (rb["loaded_pages"], rb["load_missed_pages"]) == (0, 0)
    assert rb["misses"]["declined"] == 2  # told by the client: the daemon counts it too
    # a namespace with lookups and no pages is listed too, after those that hold pages
    assert ri["bytes"] == 0 and ri["pages"] == {} and ri["hit_rate_1m"] == 0.0
    assert (ri["lookup_hit_blocks"], ri["lookup_miss_blocks"]) == (0, 2)
    assert [r["namespace_id"] for r in st["namespaces"]][-1] == idle.id.hex()
    # the store-wide numbers are the sum (every lookup here named its namespace)
    assert (st["store"]["lookup_hit_blocks"], st["store"]["lookup_miss_blocks"]) == (10, 6)
    assert st["other_namespaces"]["calls"] == 0


def test_pages_redis_expired_count_as_expired_for_the_tier_and_the_namespace(
        tmp_path: Path, redis_server: RedisServer) -> None:
    """Write-back over a 10-page host and a 20-page disk tier sends the oldest blocks of a
    40-block prefix to Redis (10, and the disk's free reserve), with a TTL of 1 s; once it ran
    out, a lookup finds them gone."""
    ns = namespace()
    chain = ns.chain(list(range(40 * 16)))
    with AdminDaemon(tmp_path, redis_url=redis_server.url, host=f"{10 * PAGE}",
                     disk=f"{20 * PAGE}", write_policy="write_back", promote_on_hit=False,
                     redis_ttl_s=1.0) as d, DaemonStore(d.target, ns.id) as s, d.client() as api:
        assert s.write_pages(chain.metas(), pages(40, 3)).stored == 40
        found, looked = _settled_lookup(s, list(chain.keys))  # the disk's cleaner may move some
        in_redis = found.tiers.count("redis")
        assert found.num_blocks == 40 and found.tiers[:in_redis] == ("redis",) * in_redis
        assert 10 <= in_redis <= 12  # the disk keeps up to 2 of its 20 pages free
        time.sleep(1.5)
        assert s.lookup(list(chain.keys)).num_blocks == 0  # the prefix starts with expired pages
        st = api.get("/v1/stats").json()
    tiers = {t["name"]: t for t in st["tiers"]}
    assert tiers["redis"]["misses"]["expired"] == in_redis
    assert tiers["host"]["misses"]["expired"] is None and tiers["disk"]["misses"]["expired"] is None
    (row,) = st["namespaces"]
    assert row["misses"]["expired"] == in_redis and row["misses"]["absent"] == 40
    assert (row["lookup_hit_blocks"], row["lookup_miss_blocks"]) == (40 * looked, 40)
    assert row["hit_rate_1m"] == looked / (looked + 1)


def _settled_lookup(s: DaemonStore, keys: list[bytes]) -> tuple[Any, int]:
    """A lookup whose answer held still for 0.2 s (background write-back done), and how many
    lookups that took."""
    prev = s.lookup(keys)
    for looked in range(2, 52):
        time.sleep(0.2)
        found = s.lookup(keys)
        if found.tiers == prev.tiers:
            return found, looked
        prev = found
    raise AssertionError("the store kept moving pages")
