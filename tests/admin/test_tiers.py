"""Where-is lookups and namespace flushes over host, disk and a real Redis: the lookup agrees
with what a load through the daemon finds, and a flush removes one namespace's pages from every
tier while every page of another namespace stays, byte for byte."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from connector.daemon.client import DaemonStore
from kvstore import Metrics, load_config
from kvstore.tiers import make_tier
from tests.admin.conftest import LAYOUT, AdminDaemon, namespace, pages
from tests.redis_servers import RedisServer

PAGE = LAYOUT.page_bytes


@pytest.fixture
def spread(tmp_path: Path, redis_server: RedisServer) -> Iterator[AdminDaemon]:
    """Write-back over a 10-page host tier and a 20-page disk tier: a long prefix ends up with
    its oldest blocks in Redis, the middle on disk and the newest in host memory. No promotion:
    the loads that check the lookup leave the pages where they are."""
    with AdminDaemon(tmp_path, redis_url=redis_server.url, host=f"{10 * PAGE}",
                     disk=f"{20 * PAGE}", write_policy="write_back", promote_on_hit=False) as d:
        yield d


def test_lookup_agrees_with_a_load_over_host_disk_and_redis(spread: AdminDaemon) -> None:
    ns = namespace()
    tokens = list(range(40 * 16))
    chain = ns.chain(tokens)
    keys = list(chain.keys)
    with DaemonStore(spread.target, ns.id) as s, spread.client() as api:
        assert s.write_pages(chain.metas(), pages(40, 7)).stored == 40
        where = api.post("/v1/lookup", json={"token_ids": tokens}).json()
        assert where["namespace_id"] == ns.id.hex() and where["num_blocks"] == 40
        tiers = [b["tier"] for b in where["blocks"]]
        assert {"host", "disk", "redis"} <= set(tiers), tiers  # the prefix is spread
        assert tiers == list(s.lookup(keys).tiers)  # what the connector's lookup says
        assert [b["key"] for b in where["blocks"]] == [k.hex() for k in keys]
        assert where["num_leading"] == 40 == s.read_pages(keys, np.empty((40, PAGE), np.uint8))

        # a hole: the load stops there, and the lookup says why each later block is not loaded
        gap = tiers.index("disk")
        s.delete([keys[gap]])
        by_key = api.post("/v1/lookup", json={"block_keys": [k.hex() for k in keys],
                                              "namespace_id": ns.id.hex()}).json()
        out = np.empty((40, PAGE), np.uint8)
        assert by_key["num_leading"] == gap == s.read_pages(keys, out)
        reasons = [b["reason"] for b in by_key["blocks"]]
        assert reasons == ["loadable"] * gap + ["absent"] + ["after_miss"] * (39 - gap)
        assert np.array_equal(out[:gap], pages(40, 7)[:gap])
        # another tenant's lookup of the same tokens finds nothing of this one's
        other = api.post("/v1/lookup", json={"token_ids": tokens,
                                             "namespace": {"tenant_salt": "other"}}).json()
        assert other["num_leading"] == 0 and {b["tier"] for b in other["blocks"]} == {None}


def test_flushing_a_namespace_leaves_the_others_intact_on_every_tier(
        tmp_path: Path, redis_server: RedisServer) -> None:
    a, b = namespace("tenant-a"), namespace("tenant-b")
    ca, cb = a.chain(list(range(6 * 16))), b.chain(list(range(6 * 16)))
    pa, pb = pages(6, 1), pages(6, 2)
    with AdminDaemon(tmp_path, redis_url=redis_server.url) as d:  # write-through: every tier
        with DaemonStore(d.target, a.id) as sa, DaemonStore(d.target, b.id) as sb:
            assert sa.write_pages(ca.metas(), pa).stored == 6
            assert sb.write_pages(cb.metas(), pb).stored == 6
            assert redis_server.client().dbsize() == 12
            with d.client() as api:
                r = api.delete(f"/v1/namespaces/{a.id.hex()}")
            assert r.status_code == 200, r.text
            job = r.json()
            assert job["state"] == "done" and job["namespace_id"] == a.id.hex()
            assert {t["tier"]: (t["matched"], t["done"]) for t in job["tiers"]} == {
                "host": (6, True), "disk": (0, True), "redis": (0, True)}  # host's pass took all
            assert job["deleted"] == 18  # 6 pages x 3 tiers
            for tier in ("host", "disk", "redis"):
                assert sa.tier(tier).contains(list(ca.keys)) == [False] * 6, tier
                assert sb.tier(tier).contains(list(cb.keys)) == [True] * 6, tier
            assert redis_server.client().dbsize() == 6
            out = np.empty((6, PAGE), np.uint8)
            assert sb.read_pages(list(cb.keys), out) == 6 and np.array_equal(out, pb)  # host
        d.stop()
    # disk and Redis, read directly with the daemon's own settings: B's pages, byte for byte
    cfg = load_config(d.config)
    for tcfg in cfg.tiers[1:]:
        tier = make_tier(tcfg, LAYOUT, Metrics())
        try:
            out = np.zeros((6, PAGE), np.uint8)
            assert tier.read(b.id, list(cb.keys), list(out)) == [True] * 6, tcfg.kind
            assert np.array_equal(out, pb), tcfg.kind
            assert tier.contains(list(ca.keys)) == [False] * 6, tcfg.kind
        finally:
            tier.close()
