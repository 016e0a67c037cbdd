"""The store built from configuration over real lower tiers."""

from __future__ import annotations

import numpy as np
import pytest

from kvstore import ConfigError, Namespace, build_store, load_config
from tests.conftest import random_pages

LAYOUT = {"num_layers": 2, "num_kv_heads": 2, "head_dim": 4, "block_size": 4, "dtype": "float16"}


def test_host_over_redis_from_config(redis_server) -> None:  # noqa: ANN001
    cfg = load_config(overrides={
        "model_id": "m",
        "layout": LAYOUT,
        "store": {"write_policy": "write_back"},
        "tiers": [
            {"kind": "host", "capacity": 4 * 256, "policy": "lineage"},
            {"kind": "redis", "url": redis_server.url, "capacity": "1MiB", "policy": "lru"},
        ],
    })
    with build_store(cfg) as store:
        ns = Namespace("m", store.layout)
        chain = ns.chain(list(range(4 * 10)))
        pages = random_pages(store.layout, 10)
        store.put(chain.metas(), pages)
        found = store.lookup(chain.keys)
        assert found.num_blocks == 10
        assert found.blocks_in("redis") >= 6 and found.blocks_in("host") == 4
        out = np.zeros_like(pages)
        res = store.get(ns.id, chain.keys, out)
        assert res.num_found == 10 and np.array_equal(out, pages)
        store.check_integrity()
    # a second "node" over the same Redis finds the written-back pages
    with build_store(cfg) as other:
        assert other.lookup(chain.keys).num_blocks >= 6


def test_wrong_password_stops_the_start(redis_server) -> None:  # noqa: ANN001
    redis_server.client().config_set("requirepass", "right")
    cfg = load_config(overrides={
        "layout": LAYOUT,
        "tiers": [{"kind": "redis", "url": redis_server.url, "password": "wrong", "capacity": "1MiB"}],
    })
    with pytest.raises(ConfigError, match="password"):
        build_store(cfg)
