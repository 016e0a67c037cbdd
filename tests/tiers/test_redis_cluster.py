"""Redis tier on a real 3-master Redis Cluster (created by the fixture with redis-cli): pages
spread over the shards, one exchange per shard per batch, nodes sharing one cache, a slot that
moves, a shard that dies and comes back."""

from __future__ import annotations

import time

import numpy as np
import pytest
from redis.crc import key_slot

from kvstore.errors import ConfigError
from kvstore.keys import Namespace
from kvstore.layout import KVLayout
from kvstore.record import stored_meta
from kvstore.tiers.redis import RedisTier
from tests.redis_servers import RedisClusterProcs, RedisServer

pytestmark = pytest.mark.timeout(120)

LAYOUT = KVLayout(2, 1, 64, 16, "float16")  # 8 KiB pages
BIG = KVLayout(32, 8, 128, 16, "bfloat16")  # 2 MiB pages


def data(layout: KVLayout, n: int, start: int = 0):
    ns = Namespace("m", layout)
    ch = ns.chain(np.arange(start, start + n * layout.block_size) % 60_000)
    pages = np.random.default_rng(start).integers(0, 256, (n, layout.page_bytes), dtype=np.uint8)
    return ns, ch, pages


def make(cluster: RedisClusterProcs, layout: KVLayout = LAYOUT, seeds=None, **kw) -> RedisTier:
    kw.setdefault("timeout_s", 5.0)
    return RedisTier.build("redis", layout, 10_000, cluster_nodes=seeds or cluster.nodes, **kw)


def holds(server: RedisServer, name: bytes) -> bool:
    """Whether ``server`` stores ``name`` (asked without triggering a MOVED answer)."""
    return bool(server.client().execute_command("CLUSTER", "COUNTKEYSINSLOT", key_slot(name)))


def exchanges(t: RedisTier) -> dict[str, int]:
    return {s.server: s.exchanges for s in t.server_stats()}


def test_pages_spread_over_every_shard_and_round_trip(redis_cluster: RedisClusterProcs) -> None:
    ns, ch, pages = data(LAYOUT, 300)
    t = make(redis_cluster)
    try:
        assert t.write(ch.metas(), list(pages)) == [True] * 300
        sizes = [s.client().dbsize() for s in redis_cluster.servers]
        assert sum(sizes) == 300 and min(sizes) > 50, sizes  # no hash tag: spread by key
        assert t.count_leading(ch.keys) == 300
        outs = np.empty_like(pages)
        assert t.read(ns.id, ch.keys, list(outs)) == [True] * 300
        assert np.array_equal(outs, pages)
        assert t.meta(ch.keys[123]) == stored_meta(ch.meta(123), False)
        assert t.delete(ch.keys[:100]) == 100
        assert t.count_leading(ch.keys) == 0
        assert t.contains(ch.keys[100:]) == [True] * 200
        assert t.used_pages == 200
    finally:
        t.close()


def test_big_pages_round_trip(redis_cluster: RedisClusterProcs) -> None:
    ns, ch, pages = data(BIG, 12)
    t = make(redis_cluster, BIG)
    try:
        assert all(t.write(ch.metas(), list(pages)))
        outs = np.empty_like(pages)
        assert all(t.read(ns.id, ch.keys, list(outs)))
        assert np.array_equal(outs, pages)
    finally:
        t.close()


def test_a_batch_is_one_exchange_per_shard(redis_cluster: RedisClusterProcs) -> None:
    ns, ch, pages = data(LAYOUT, 200)
    t = make(redis_cluster)
    try:
        t.contains(ch.keys)  # pools exist for every shard
        for call, per_shard in (
            (lambda: t.write(ch.metas(), list(pages)), t.put_lanes),  # lanes run at once
            (lambda: t.count_leading(ch.keys), 1),
            (lambda: t.read(ns.id, ch.keys, list(np.empty_like(pages))), 1),
        ):
            before = exchanges(t)
            call()
            after = exchanges(t)
            assert len(after) == 3
            assert {k: after[k] - before.get(k, 0) for k in after} == dict.fromkeys(
                after, per_shard
            )
    finally:
        t.close()


def test_another_node_sees_the_pages(redis_cluster: RedisClusterProcs) -> None:
    ns, ch, pages = data(LAYOUT, 40)
    a = make(redis_cluster, seeds=redis_cluster.nodes[:1])
    b = make(redis_cluster, seeds=redis_cluster.nodes[2:])
    try:
        assert all(a.write(ch.metas(), list(pages)))
        assert b.count_leading(ch.keys) == 40
        assert b.meta(ch.keys[5]) == stored_meta(ch.meta(5), False)
        outs = np.empty_like(pages)
        assert all(b.read(ns.id, ch.keys, list(outs)))
        assert np.array_equal(outs, pages)
    finally:
        a.close()
        b.close()


def test_a_moved_slot_is_followed(redis_cluster: RedisClusterProcs) -> None:
    """Migrate the slot of one page to another shard behind the tier's back: the old owner
    answers MOVED, the tier re-reads the slot map and reads the page from the new owner."""
    ns, ch, pages = data(LAYOUT, 3)
    t = make(redis_cluster)
    try:
        assert all(t.write(ch.metas(), list(pages)))
        name = b"kvstore:" + ch.keys[0].hex().encode()
        slot = key_slot(name)
        src = next(s for s in redis_cluster.servers if holds(s, name))
        dst = next(s for s in redis_cluster.servers if s is not src)
        src_id = src.client().execute_command("CLUSTER", "MYID")
        dst_id = dst.client().execute_command("CLUSTER", "MYID")
        dst.client().execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
        src.client().execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)
        src.client().execute_command("MIGRATE", "127.0.0.1", dst.port, "", 0, 5000, "KEYS", name)
        for s in redis_cluster.servers:
            s.client().execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)
        outs = np.empty_like(pages)
        assert t.read(ns.id, ch.keys, list(outs)) == [True] * 3
        assert np.array_equal(outs, pages)
        assert t.stats().errors == 0
    finally:
        t.close()


def test_a_dead_shard_costs_only_its_pages_and_comes_back(
    redis_cluster: RedisClusterProcs,
) -> None:
    ns, ch, pages = data(LAYOUT, 60)
    t = make(redis_cluster, timeout_s=0.3, connect_timeout_s=0.2, breaker_failures=2,
             breaker_cooldown_s=0.3)
    try:
        assert all(t.write(ch.metas(), list(pages)))
        victim = redis_cluster.servers[1]
        on_victim = [holds(victim, b"kvstore:" + k.hex().encode()) for k in ch.keys]
        assert 0 < sum(on_victim) < 60
        victim.kill()
        outs = list(np.empty_like(pages))
        for _ in range(4):
            t0 = time.monotonic()
            found = t.read(ns.id, ch.keys, outs)
            assert time.monotonic() - t0 < 0.3 + 0.3
            assert found == [not v for v in on_victim]
        assert t.stats().errors == 4
        stats = {s.server: s for s in t.server_stats()}
        assert stats[victim.node].breaker in ("open", "half_open")
        victim.restart()  # rejoins from its nodes.conf, empty
        redis_cluster.wait_ok()
        _, ch2, pages2 = data(LAYOUT, 30, start=10_000)

        def recovered() -> bool:
            return all(t.write(ch2.metas(), list(pages2))) and all(
                t.read(ns.id, ch2.keys, list(np.empty_like(pages2)))
            )

        t0 = time.monotonic()
        while not recovered():
            assert time.monotonic() - t0 < 10, "the tier did not recover"
            time.sleep(0.05)
    finally:
        t.close()


def test_kind_mismatches_are_config_errors(
    redis_cluster: RedisClusterProcs, redis_server: RedisServer
) -> None:
    with pytest.raises(ConfigError, match="cluster"):
        RedisTier.build("r", LAYOUT, 10, url=f"redis://{redis_cluster.nodes[0]}/0")
    with pytest.raises(ConfigError, match="not in cluster mode"):
        RedisTier.build("r", LAYOUT, 10, cluster_nodes=[redis_server.node])
