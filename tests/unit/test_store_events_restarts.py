"""The event log's whole promise, with every kind of change at once: over a real host tier, a real
disk tier and a real Redis tier, two tenants with byte budgets, random puts, reads
(promotions), evictions (demotions), deletes, pages the Redis server expires (found gone on
read: *expired*), corruptions found on read, and restarts of the store on the same disk and
Redis (as a daemon restarts) -- an Indexer fed only by the events (and by snapshots after a gap:
a log too small to keep up, or a restarted store's new epoch) holds what each tier holds after
every step, and the store's per-namespace accounting, which budgets judge by, agrees with it."""

from __future__ import annotations

import shutil
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule

from kvstore import KVLayout, Namespace, TieredStore, build_tier
from kvstore.indexer import Indexer
from tests.redis_servers import RedisServer

LAYOUT = KVLayout(num_layers=1, num_kv_heads=1, head_dim=16, block_size=4, dtype="float16")
SPACES = {"a": Namespace("events", LAYOUT, "a"), "b": Namespace("events", LAYOUT, "b")}
CHAINS = {t: ns.chain(list(range(4 * 20))) for t, ns in SPACES.items()}  # 20 pages per tenant
OWNER = {k: t for t, c in CHAINS.items() for k in c.keys}
HOST, DISK, REDIS = 6, 12, 24
_SERVER: RedisServer | None = None


def _server() -> RedisServer:
    global _SERVER
    if _SERVER is None:
        _SERVER = RedisServer()  # stopped at interpreter exit (tests.redis_servers)
        _SERVER.start()
    return _SERVER


def _page(tenant: str, i: int) -> np.ndarray:
    return np.random.default_rng([ord(tenant), i]).integers(0, 256, LAYOUT.page_bytes, np.uint8)


def _store(path: Path, url: str) -> TieredStore:
    host = build_tier({"kind": "host", "capacity": HOST * LAYOUT.page_bytes}, LAYOUT)
    disk = build_tier({"kind": "disk", "capacity": DISK * LAYOUT.page_bytes, "path": str(path),
                       "durability": "none"}, LAYOUT)
    redis = build_tier({"kind": "redis", "capacity": REDIS * LAYOUT.page_bytes, "url": url,
                        "timeout_s": 5.0}, LAYOUT)
    return TieredStore(LAYOUT, [host, disk, redis], write_policy="write_back",
                       free_reserve=0.0, event_log_events=8)  # small: consumers fall behind


class EveryChange(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.server = _server()
        self.server.client().flushall()
        self.dir = Path(tempfile.mkdtemp(prefix="kvstore-events-"))
        self.store = _store(self.dir / "disk", self.server.url)
        self.index = Indexer()
        first = self.store.read_events()
        self.cursor, self.epoch = first.next_cursor, first.epoch
        self.budgets: dict[tuple[str, str], int | None] = {}

    def teardown(self) -> None:
        try:
            self.caught_up()  # every run ends with a check
        finally:
            self.store.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    # ------------------------------------------------------------- what changes the store

    @rule(tenant=st.sampled_from("ab"), start=st.integers(0, 19), n=st.integers(1, 6))
    def put(self, tenant: str, start: int, n: int) -> None:
        idx = range(start, min(20, start + n))
        metas = [CHAINS[tenant].metas()[i] for i in idx]
        self.store.put(metas, np.stack([_page(tenant, i) for i in idx]))
        self.store.drain()

    @rule(tenant=st.sampled_from("ab"), start=st.integers(0, 19), n=st.integers(1, 6))
    def get(self, tenant: str, start: int, n: int) -> None:
        idx = list(range(start, min(20, start + n)))
        out = np.zeros((len(idx), LAYOUT.page_bytes), np.uint8)
        res = self.store.get(SPACES[tenant].id, [CHAINS[tenant].keys[i] for i in idx], out)
        for i, found, page in zip(idx, res.found, out):
            assert not found or np.array_equal(page, _page(tenant, i))  # never wrong KV
        self.store.drain()  # promotions

    @rule(tier=st.sampled_from(["host", "disk", "redis"]), n=st.integers(1, 4))
    def evict(self, tier: str, n: int) -> None:
        self.store.evict(n, tier=tier)
        self.store.drain()

    @rule(tenant=st.sampled_from("ab"), start=st.integers(0, 19), n=st.integers(1, 3))
    def delete(self, tenant: str, start: int, n: int) -> None:
        keys = [CHAINS[tenant].keys[i] for i in range(start, min(20, start + n))]
        self.store.delete(keys, namespace_id=SPACES[tenant].id)

    @rule(pick=st.integers(0, 39))
    def redis_expires_one(self, pick: int) -> None:
        """The server drops a page (its TTL ran out: a 1 ms PEXPIRE), then a read finds it gone."""
        redis = self.store.tier("redis")
        held = [k for k in OWNER if k in self.store.policies[2]]
        if not held:
            return
        key = held[pick % len(held)]
        name = redis._records.name(key)  # type: ignore[attr-defined]
        self.server.client().pexpire(name, 1)
        time.sleep(0.005)
        tenant = OWNER[key]
        self.get(tenant, CHAINS[tenant].keys.index(key), 1)

    @rule(tenant=st.sampled_from("ab"), tier=st.sampled_from(["host", "disk", "redis"]),
          pages=st.none() | st.integers(1, 8))
    def set_budget(self, tenant: str, tier: str, pages: int | None) -> None:
        self.budgets[tenant, tier] = pages
        self.store.set_budget(SPACES[tenant].id, tier,
                              None if pages is None else pages * LAYOUT.page_bytes)

    @rule()
    def restart(self) -> None:
        """Close the store and open a new one on the same disk and Redis (a daemon restart:
        host empties, disk is reopened, Redis pages show up as they are read)."""
        self.store.close()
        self.store = _store(self.dir / "disk", self.server.url)
        for (tenant, tier), pages in self.budgets.items():  # budgets are the operator's to set
            if pages is not None:
                self.store.set_budget(SPACES[tenant].id, tier, pages * LAYOUT.page_bytes)

    # ------------------------------------------------------------- the consumer

    @rule(limit=st.integers(1, 8))
    def read_some(self, limit: int) -> None:
        self._read(limit)

    def _read(self, limit: int) -> bool:
        batch = self.store.read_events(self.cursor, limit=limit, epoch=self.epoch)
        if batch.gap:  # behind the window, or another store's cursor: resynchronize
            snap = self.store.event_snapshot()
            self.index.apply_snapshot("node", snap)
            self.cursor, self.epoch = snap.cursor, snap.epoch
            return True
        for ev in batch.events:
            self.index.apply("node", ev)
        self.cursor = batch.next_cursor
        return bool(batch.events)

    @rule()
    def caught_up(self) -> None:
        while self._read(8):
            pass
        store = self.store
        real = {t.name: {k for k in OWNER if t.contains([k])[0]} for t in store.tiers[:2]}
        real["redis"] = {k for k in OWNER if k in store.policies[2]}  # what this node tracks
        known = self.index.contents("node")
        assert {t: known.get(t, set()) for t in real} == real
        for tenant, ns in SPACES.items():  # the accounting budgets judge by
            info = {t.tier: t.used_bytes // LAYOUT.page_bytes for t in store.retention(ns.id).tiers}
            held = Counter(name for name, keys in real.items() for k in keys if OWNER[k] == tenant)
            assert info == {t.name: held.get(t.name, 0) for t in store.tiers}, tenant


TestEveryChange = EveryChange.TestCase
TestEveryChange.settings = settings(max_examples=30, stateful_step_count=30, deadline=None)
