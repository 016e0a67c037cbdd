"""A hypothesis state machine drives TieredStore against a model: every get returns exactly the
bytes put under that key, or a miss; leased pages are never lost; deleted pages never return."""

from __future__ import annotations

import numpy as np
import xxhash
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
)

from kvstore import KVLayout, Metrics, Namespace, TieredStore
from kvstore.tiers.host import HostTier

LAYOUT = KVLayout(1, 1, 4, 2, "float16")  # 32-byte pages
NS = Namespace("stateful", LAYOUT)
# three prompts sharing a prefix, 8 blocks each
CHAINS = [NS.chain([1, 2, 3, 4] + [p * 100 + i for i in range(12)]) for p in range(3)]
METAS = {m.key: m for c in CHAINS for m in c.metas()}
KEYS = sorted(METAS)


def page_of(key: bytes) -> np.ndarray:
    """The page content is a function of the key, as KV is a function of the prefix."""
    raw = b"".join(xxhash.xxh3_128_digest(key + bytes([i])) for i in range(2))
    return np.frombuffer(raw, dtype=np.uint8)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class StoreMachine(RuleBasedStateMachine):
    leases = Bundle("leases")

    def __init__(self) -> None:
        super().__init__()
        self.clock = Clock()
        self.store: TieredStore | None = None
        self.active: dict[int, tuple[tuple[bytes, ...], float]] = {}
        self.deleted: set[bytes] = set()

    @rule(
        write_policy=st.sampled_from(["write_back", "write_through", "selective"]),
        policies=st.tuples(
            st.sampled_from(["lru", "fifo", "lfu", "s3fifo", "arc", "lineage", "lineage_arc"]),
            st.sampled_from(["lru", "lineage", "s3fifo", "lineage_arc"]),
        ),
        sizes=st.tuples(st.integers(2, 6), st.integers(3, 12)),
        promote=st.booleans(),
    )
    @precondition(lambda self: self.store is None)
    def open(self, write_policy, policies, sizes, promote) -> None:
        m = Metrics()
        self.store = TieredStore(
            LAYOUT,
            [HostTier.build("fast", LAYOUT, sizes[0], m), HostTier.build("slow", LAYOUT, sizes[1], m)],
            list(policies),
            write_policy=write_policy,
            selective_hits=2,
            promote_on_hit=promote,
            lease_ttl_s=10.0,
            clock=self.clock,
        )

    def _pinned(self) -> set[bytes]:
        return {k for keys, exp in self.active.values() if exp > self.clock.now for k in keys}

    @precondition(lambda self: self.store is not None)
    @rule(idx=st.lists(st.integers(0, len(KEYS) - 1), min_size=1, max_size=6),
          tier=st.sampled_from([None, "slow"]))
    def put(self, idx, tier) -> None:
        keys = [KEYS[i] for i in idx]
        res = self.store.put([METAS[k] for k in keys], np.stack([page_of(k) for k in keys]), tier=tier)
        assert res.stored + res.existing + res.refused >= 1
        self.deleted -= set(keys)

    @precondition(lambda self: self.store is not None)
    @rule(chain=st.integers(0, 2), n=st.integers(1, 8))
    def put_prefix(self, chain, n) -> None:
        metas = CHAINS[chain].metas(0, n)
        self.store.put(metas, np.stack([page_of(m.key) for m in metas]))
        self.deleted -= {m.key for m in metas}

    @precondition(lambda self: self.store is not None)
    @rule(idx=st.lists(st.integers(0, len(KEYS) - 1), min_size=1, max_size=8))
    def get(self, idx) -> None:
        keys = [KEYS[i] for i in idx]
        out = np.full((len(keys), LAYOUT.page_bytes), 0xAB, dtype=np.uint8)
        res = self.store.get(NS.id, keys, out)
        pinned = self._pinned()
        for k, f, buf in zip(keys, res.found, out):
            if f:
                assert np.array_equal(buf, page_of(k)), "wrong bytes returned"
                assert k not in self.deleted, "a deleted page came back"
            else:
                assert k not in pinned, "a leased page was lost"

    @precondition(lambda self: self.store is not None)
    @rule(target=leases, chain=st.integers(0, 2), lease=st.booleans())
    def lookup(self, chain, lease):
        keys = CHAINS[chain].keys
        res = self.store.lookup(keys, lease=lease)
        for k in keys[: res.num_blocks]:
            assert k not in self.deleted
        if res.num_blocks < len(keys):
            assert not self.store.tier("fast").contains([keys[res.num_blocks]])[0]
        if res.lease is not None:
            self.active[res.lease.id] = (res.lease.keys, res.lease.expires_at)
            return res.lease.id
        return -1

    @precondition(lambda self: self.store is not None)
    @rule(lease_id=leases)
    def release(self, lease_id) -> None:
        entry = self.active.pop(lease_id, None)
        if entry is None or entry[1] <= self.clock.now:
            return  # unknown or expired: release raises, covered by unit tests
        self.store.release(lease_id)

    @precondition(lambda self: self.store is not None)
    @rule(dt=st.floats(0.5, 12.0))
    def tick(self, dt) -> None:
        self.clock.now += dt

    @precondition(lambda self: self.store is not None)
    @rule(n=st.integers(1, 4), tier=st.sampled_from(["fast", "slow"]))
    def evict(self, n, tier) -> None:
        pinned = self._pinned()
        before = set(self.store.tier(tier).keys())
        self.store.evict(n, tier=tier)
        after = set(self.store.tier(tier).keys())
        assert not (before - after) & pinned, "a pinned page was evicted"

    @precondition(lambda self: self.store is not None and not self._pinned())
    @rule(idx=st.lists(st.integers(0, len(KEYS) - 1), min_size=1, max_size=3))
    def delete(self, idx) -> None:
        keys = [KEYS[i] for i in idx]
        self.store.delete(keys)
        self.deleted |= set(keys)

    @invariant()
    def integrity(self) -> None:
        if self.store is not None:
            self.store.check_integrity()
            for t in self.store.tiers:
                assert t.used_pages <= t.capacity_pages

    def teardown(self) -> None:
        if self.store is not None:
            self.store.close()


StoreMachine.TestCase.settings = settings(
    settings.get_profile(settings._current_profile or "ci"),
    max_examples=60,
    stateful_step_count=40,
)
TestStoreMachine = StoreMachine.TestCase
