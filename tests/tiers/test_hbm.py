"""HBMTier as the engine's block manager (refcounts, prefix cache, eviction through an owner) and
as a store tier. CPU device; the conformance suite covers the tier contract (factory ``hbm``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvstore import (
    BlockChain,
    InvalidArgument,
    KVLayout,
    Metrics,
    Namespace,
    TieredStore,
)
from kvstore.tiers import tier_class
from kvstore.tiers.hbm import CommitResult, HBMTier
from kvstore.local_owner import LocalOwner
from kvstore.tiers.host import HostTier
from tests.conftest import random_pages


def fill(pool: HBMTier, blocks: list[int], seed: int) -> np.ndarray:
    """The engine writes K/V of ``blocks`` straight into the pool tensor; returns the bytes."""
    pages = random_pages(pool.layout, len(blocks), seed)
    for b, page in zip(blocks, pages):
        pool.pool_bytes[b] = torch.from_numpy(page)
    return pages


def block_bytes(pool: HBMTier, b: int) -> np.ndarray:
    return pool.pool_bytes[b].numpy().copy()


@pytest.fixture
def pool(layout: KVLayout) -> HBMTier:
    return HBMTier.build("hbm", layout, 8, Metrics(), device="cpu")


def test_registry_and_pool_shape(layout: KVLayout, pool: HBMTier) -> None:
    assert tier_class("hbm") is HBMTier
    assert pool.pool.shape == (8, *layout.page_shape) and pool.pool.dtype == torch.float16
    assert pool.pool_bytes.shape == (8, layout.page_bytes)
    assert pool.pool_bytes.data_ptr() == pool.pool.data_ptr()
    assert pool.device.type == "cpu"


def test_allocate_release_cycle(pool: HBMTier) -> None:
    a = pool.allocate(3)
    assert a == [0, 1, 2] and [pool.refcount(b) for b in a] == [1, 1, 1]
    assert (pool.num_free, pool.used_pages, pool.free_pages) == (5, 3, 5)
    assert pool.allocate(0) == []
    pool.release(a)
    assert pool.num_free == 8 and pool.num_evictable == 0 and pool.used_pages == 0
    pool.check_integrity()


def test_commit_share_and_release(pool: HBMTier, ns: Namespace) -> None:
    chain = ns.chain(list(range(4 * 3)))
    req_a = pool.allocate(3)
    pages = fill(pool, req_a, seed=1)
    res = pool.commit(req_a, chain.metas())
    assert res == [CommitResult(b, k, False) for b, k in zip(req_a, chain.keys)]
    assert [pool.block_of(k) for k in chain.keys] == req_a
    assert pool.contains(chain.keys) == [True] * 3 and pool.num_evictable == 0
    # request B shares A's prefix (a longer prompt: the 4th key is not cached)
    longer = ns.chain(list(range(4 * 4)))
    req_b = pool.acquire_prefix(longer.keys)
    assert req_b == req_a and [pool.refcount(b) for b in req_a] == [2, 2, 2]
    assert all(pool.is_in_use(k) for k in chain.keys)
    pool.release(req_a)
    assert [pool.refcount(b) for b in req_a] == [1, 1, 1] and pool.num_evictable == 0
    pool.release(req_b)
    # committed blocks at refcount 0 stay cached, readable by the tier API
    assert pool.num_evictable == 3 and pool.num_free == 5 and pool.used_pages == 3
    assert not pool.is_in_use(chain.keys[0])
    out = np.zeros((3, pool.layout.page_bytes), np.uint8)
    assert pool.read(ns.id, chain.keys, list(out)) == [True] * 3
    assert np.array_equal(out, pages)
    assert pool.meta(chain.keys[1]) == chain.meta(1)
    # and reusable: a third request acquires them again
    assert pool.acquire_prefix(chain.keys[:2]) == req_a[:2]
    assert pool.num_evictable == 1
    pool.check_integrity()


def test_acquire_prefix_stops_at_first_miss(pool: HBMTier, ns: Namespace) -> None:
    chain = ns.chain(list(range(4 * 3)))
    b = pool.allocate(3)
    pool.commit([b[0], b[2]], [chain.meta(0), chain.meta(2)])
    assert pool.acquire_prefix(chain.keys) == [b[0]]
    assert pool.acquire_prefix(chain.keys[1:]) == []
    assert pool.refcount(b[0]) == 2 and pool.refcount(b[2]) == 1


def test_duplicate_commit_keeps_existing(pool: HBMTier, ns: Namespace) -> None:
    meta = ns.chain(list(range(4))).meta(0)
    a, b = pool.allocate(1)[0], pool.allocate(1)[0]
    page = fill(pool, [a], seed=2)[0]
    fill(pool, [b], seed=3)
    assert pool.commit([a], [meta]) == [CommitResult(a, meta.key, False)]
    assert pool.commit([a], [meta]) == [CommitResult(a, meta.key, False)]  # idempotent
    # B computed the same block concurrently: it is told to use A's and holds a reference on it
    assert pool.commit([b], [meta]) == [CommitResult(a, meta.key, True)]
    assert pool.refcount(a) == 2 and pool.refcount(b) == 1 and pool.key_of(b) is None
    pool.release([b])  # B drops its duplicate: uncommitted -> free
    assert pool.refcount(b) == 0 and pool.num_free == 7
    assert pool.block_of(meta.key) == a and np.array_equal(block_bytes(pool, a), page)
    pool.release([a, a])
    assert pool.num_evictable == 1
    pool.check_integrity()


def test_misuse_raises_and_changes_nothing(pool: HBMTier, ns: Namespace) -> None:
    chain = ns.chain(list(range(8)))
    b = pool.allocate(2)
    with pytest.raises(InvalidArgument):
        pool.release([b[0], b[0]])  # refcount is 1
    with pytest.raises(InvalidArgument):
        pool.release([99])
    for bad in ([b[0], b[1], 5], [b[1], -1], [b[0], True], [b[1], 2.0]):  # the bulk path too:
        with pytest.raises(InvalidArgument):  # one unheld or bad id spoils the whole call
            pool.release(bad)
    with pytest.raises(InvalidArgument):
        pool.commit([b[0], 5], chain.metas())  # block 5 is free
    with pytest.raises(InvalidArgument):
        pool.commit([b[0], b[0]], chain.metas())
    with pytest.raises(InvalidArgument):
        pool.allocate(-1)
    pool.commit([b[0]], [chain.meta(0)])
    with pytest.raises(InvalidArgument):
        pool.commit([b[0]], [chain.meta(1)])  # already committed under another key
    with pytest.raises(InvalidArgument):
        pool.acquire([5])
    assert [pool.refcount(x) for x in b] == [1, 1] and pool.key_of(b[1]) is None
    assert pool.num_free == 6
    pool.check_integrity()


def test_delete_of_a_block_in_use_only_unlinks(pool: HBMTier, ns: Namespace) -> None:
    """The store (or an admin) deleting a key a request still uses must not free the block."""
    meta = ns.chain(list(range(4))).meta(0)
    b = pool.allocate(1)
    page = fill(pool, b, seed=4)[0]
    pool.commit(b, [meta])
    assert pool.delete([meta.key]) == 1
    assert pool.contains([meta.key]) == [False] and pool.refcount(b[0]) == 1
    assert pool.allocate(7) is not None and pool.allocate(1) is None  # b was not handed out
    assert np.array_equal(block_bytes(pool, b[0]), page)
    pool.release(b)
    assert pool.num_free == 1
    pool.check_integrity()


def _committed_pool(
    layout: KVLayout, ns: Namespace, policy: str
) -> tuple[HBMTier, LocalOwner, list[BlockChain]]:
    """A 6-block pool full of two released 3-block chains committed by two requests."""
    pool = HBMTier.build("hbm", layout, 6, Metrics(), device="cpu")
    owner = LocalOwner(pool, policy)
    pool.attach(owner)
    chains = [ns.chain([p] + list(range(1, 12))) for p in (1, 2)]
    for chain in chains:
        blocks = pool.allocate(3)
        fill(pool, blocks, seed=len(chain.keys))
        pool.commit(blocks, chain.metas())
        pool.release(blocks)
    assert pool.num_free == 0 and pool.num_evictable == 6
    return pool, owner, chains


def test_eviction_follows_the_policy_order(layout: KVLayout, ns: Namespace) -> None:
    pool, owner, (c1, c2) = _committed_pool(layout, ns, "lru")
    # a hit touches the reused prefix deepest-first: c1 becomes most recent, its tail older
    pool.release(pool.acquire_prefix(c1.keys))
    got = pool.allocate(2)
    assert got is not None and owner.evicted == [c2.keys[0], c2.keys[1]]
    assert pool.contains(c2.keys) == [False, False, True]
    pool.release(got)  # uncommitted: straight back to the free list, so 1 more eviction is due
    assert pool.allocate(3) is not None
    assert owner.evicted[2:] == [c2.keys[2]]
    assert pool.allocate(2) is not None
    assert owner.evicted[3:] == [c1.keys[2], c1.keys[1]]
    assert pool.stats().evictions == 5
    pool.check_integrity()


def test_leaf_first_policy_evicts_chain_ends(layout: KVLayout, ns: Namespace) -> None:
    pool, owner, (c1, c2) = _committed_pool(layout, ns, "lineage")
    assert pool.allocate(2) is not None
    # the oldest leaf, then its parent (now the oldest leaf): chains shrink from their ends
    assert owner.evicted == [c1.keys[2], c1.keys[1]]
    assert pool.count_leading(c1.keys) == 1 and pool.count_leading(c2.keys) == 3


def test_blocks_come_back_ascending_after_a_leaf_first_eviction(
        layout: KVLayout, ns: Namespace) -> None:
    """Leaf-first eviction frees a chain tail first (descending block ids); an allocation
    still takes its blocks in ascending order, so a load into them copies one run by DMA
    (kvstore/transfer_cuda.py) instead of one block at a time."""
    pool, owner, (c1, c2) = _committed_pool(layout, ns, "lineage")
    got = pool.allocate(6)  # evicts both chains, each tail first
    assert got == [0, 1, 2, 3, 4, 5]
    assert owner.evicted[:3] == [c1.keys[2], c1.keys[1], c1.keys[0]]
    pool.check_integrity()


def test_only_unreferenced_committed_blocks_are_evicted(layout: KVLayout, ns: Namespace) -> None:
    pool, owner, (c1, c2) = _committed_pool(layout, ns, "fifo")
    in_use = pool.acquire_prefix(c1.keys[:2])  # the two oldest blocks, now in use
    pool.acquire(in_use[:1])  # a forked request shares the first: refcount 2
    assert pool.refcount(in_use[0]) == 2
    got = pool.allocate(3)
    assert got is not None and owner.evicted == [c1.keys[2], c2.keys[0], c2.keys[1]]
    assert pool.contains(c1.keys[:2]) == [True, True]
    # back-pressure: 5 blocks referenced, 1 cached -> 2 cannot be had, and nothing is evicted
    assert pool.allocate(2) is None
    assert len(owner.evicted) == 3 and pool.num_evictable == 1 and pool.num_free == 0
    assert pool.allocate(1) is not None and owner.evicted[3:] == [c2.keys[2]]
    assert pool.allocate(1) is None
    pool.release([*in_use, in_use[0]])
    assert pool.num_evictable == 2 and pool.allocate(2) is not None
    assert owner.evicted[4:] == c1.keys[:2]
    pool.check_integrity()


def test_without_owner_allocate_uses_free_blocks_only(pool: HBMTier, ns: Namespace) -> None:
    chain = ns.chain(list(range(4 * 8)))
    blocks = pool.allocate(8)
    pool.commit(blocks, chain.metas())
    pool.release(blocks)
    assert pool.owner is None and pool.allocate(1) is None and pool.num_evictable == 8


def test_runtime_blocks_serve_a_store(layout: KVLayout, ns: Namespace) -> None:
    """What the runtime commits, the (unchanged) store looks up, reads and writes back below."""
    m = Metrics()
    hbm = HBMTier.build("hbm", layout, 4, m, device="cpu")
    host = HostTier.build("host", layout, 8, m, pin_memory=False)
    with TieredStore(layout, [hbm, host], write_policy="write_back") as store:
        chain = ns.chain(list(range(4 * 3)))
        blocks = hbm.allocate(3)
        pages = fill(hbm, blocks, seed=5)
        hbm.commit(blocks, chain.metas())
        found = store.lookup(chain.keys)
        assert found.num_blocks == 3 and found.tiers == ("hbm",) * 3
        out = np.zeros_like(pages)
        assert store.get(ns.id, chain.keys, out).num_found == 3 and np.array_equal(out, pages)
        hbm.release(blocks)
        # the get adopted the keys into the store's policy: eviction writes them back
        assert store.evict(3, tier="hbm") == 3
        assert host.contains(chain.keys) == [True] * 3 and hbm.num_free == 4
        out[:] = 0
        assert store.get(ns.id, chain.keys, out).tiers == ("host",) * 3
        assert np.array_equal(out, pages)
        store.check_integrity()
        hbm.check_integrity()


# ----------------------------------------------------------------- stateful


CAPACITY = 6
_NS = Namespace("hbm-stateful", KVLayout(1, 1, 4, 2, "float16"))  # 32-byte pages
# three prompts sharing their first block, 4 blocks each
CHAINS = [_NS.chain([7, 7] + [p * 100 + i for i in range(6)]) for p in range(3)]


class PoolMachine(RuleBasedStateMachine):
    """Requests allocate, fill, commit, share and release blocks while keys are deleted and the
    owner evicts. Model: the bytes committed under each key; each request's block table and the
    bytes each of its blocks must hold."""

    def __init__(self) -> None:
        super().__init__()
        self.pool = HBMTier.build("hbm", _NS.layout, CAPACITY, Metrics(), device="cpu")
        self.owner = LocalOwner(self.pool, "lru")
        self.pool.attach(self.owner)
        self.committed: dict[bytes, np.ndarray] = {}  # key -> bytes committed under it
        # request id -> (chain index, [(block, expected bytes, committed?)])
        self.requests: dict[int, tuple[int, list[tuple[int, np.ndarray, bool]]]] = {}
        self.next_id = 0

    def _sync_evictions(self, referenced_before: set[bytes]) -> None:
        gone = {k for k in self.committed if self.pool.block_of(k) is None}
        assert not gone & referenced_before, "a key in use was evicted"
        for k in gone:
            del self.committed[k]

    def _referenced_keys(self) -> set[bytes]:
        return {k for k in self.committed if self.pool.is_in_use(k)}

    @rule(chain=st.integers(0, 2), num_blocks=st.integers(1, 4), seed=st.integers(0, 2**16))
    def start(self, chain: int, num_blocks: int, seed: int) -> None:
        keys = CHAINS[chain].keys[:num_blocks]
        hit = self.pool.acquire_prefix(keys)
        for b, k in zip(hit, keys):  # an acquired prefix holds exactly the committed bytes
            assert np.array_equal(block_bytes(self.pool, b), self.committed[k])
        table = [(b, self.committed[k], True) for b, k in zip(hit, keys)]
        need = num_blocks - len(hit)
        room = self.pool.num_free + self.pool.num_evictable
        in_use = self._referenced_keys()
        new = self.pool.allocate(need)
        self._sync_evictions(in_use)
        if new is None:
            assert room < need, f"refused {need} blocks with {room} free or evictable"
            self.pool.release(hit)
            return
        pages = fill(self.pool, new, seed)
        table += [(b, page, False) for b, page in zip(new, pages)]
        self.requests[self.next_id] = (chain, table)
        self.next_id += 1

    @precondition(lambda self: self.requests)
    @rule(data=st.data())
    def commit_next(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.requests)))
        chain, table = self.requests[rid]
        pos = next((i for i, (_, _, done) in enumerate(table) if not done), None)
        if pos is None:
            return
        b, page, _ = table[pos]
        meta = CHAINS[chain].meta(pos)
        (res,) = self.pool.commit([b], [meta])
        if res.duplicate:
            assert meta.key in self.committed and res.block_id != b
            table[pos] = (res.block_id, self.committed[meta.key], True)
            self.pool.release([b])
        else:
            assert meta.key not in self.committed and res.block_id == b
            self.committed[meta.key] = page
            table[pos] = (b, page, True)

    @precondition(lambda self: self.requests)
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.requests)))
        _, table = self.requests.pop(rid)
        self.pool.release([b for b, _, _ in table])

    @precondition(lambda self: self.committed)
    @rule(data=st.data())
    def delete(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.committed)))
        assert self.pool.delete([key]) == 1
        del self.committed[key]

    @precondition(lambda self: self.committed)
    @rule(data=st.data())
    def tier_read(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.committed)))
        out = np.zeros(_NS.layout.page_bytes, np.uint8)
        assert self.pool.read(_NS.id, [key], [out]) == [True]
        assert np.array_equal(out, self.committed[key])

    @rule(n=st.integers(1, CAPACITY))
    def evict(self, n: int) -> None:
        in_use = self._referenced_keys()
        cached = len(self.committed) - len(in_use)
        freed = self.owner.reclaim(n)
        assert freed == min(n, cached)
        self._sync_evictions(in_use)

    @invariant()
    def pool_matches_model(self) -> None:
        pool = self.pool
        pool.check_integrity()
        assert pool.used_pages + pool.num_free == CAPACITY
        assert set(pool.keys()) == set(self.committed)
        refs: dict[int, int] = {}
        for _, table in self.requests.values():
            for b, page, _ in table:
                refs[b] = refs.get(b, 0) + 1
                assert np.array_equal(block_bytes(pool, b), page), f"block {b} lost its bytes"
        for b in range(CAPACITY):
            assert pool.refcount(b) == refs.get(b, 0)
        assert pool.num_evictable == len(self.committed) - len(self._referenced_keys())


TestPoolMachine = PoolMachine.TestCase


# ----------------------------------------------------------------- the store as the pool's owner


def _store_pair(layout: KVLayout, write_policy: str) -> tuple[TieredStore, HBMTier, HostTier]:
    m = Metrics()
    hbm = HBMTier.build("hbm", layout, 4, m, device="cpu")
    host = HostTier.build("host", layout, 8, m, pin_memory=False)
    store = TieredStore(layout, [hbm, host], ["lru", "lru"], write_policy=write_policy)
    assert hbm.owner is not None  # the store attached itself as the pool's owner
    return store, hbm, host


def test_store_evicts_pool_blocks_by_its_policy(layout: KVLayout, ns: Namespace) -> None:
    store, hbm, host = _store_pair(layout, "write_back")
    with store:
        chain = ns.chain(list(range(4 * 4)))
        blocks = hbm.allocate(4)
        pages = fill(hbm, blocks, seed=6)
        hbm.commit(blocks, chain.metas())
        assert store.evict(4, tier="hbm") == 0  # every block is in use
        hbm.release(blocks[2:])
        lease = store.lookup(chain.keys[2:3], lease=True).lease
        assert lease is not None
        # key 2 is leased, keys 0-1 in use: the runtime's allocation evicts key 3, written back
        assert hbm.allocate(1) is not None
        assert hbm.contains(chain.keys) == [True, True, True, False]
        assert host.contains(chain.keys) == [False, False, False, True]
        assert hbm.allocate(1) is None and hbm.contains(chain.keys[2:3]) == [True]
        store.release(lease)
        assert hbm.allocate(1) is not None and host.contains(chain.keys[2:3]) == [True]
        out = np.zeros_like(pages)
        res = store.get(ns.id, chain.keys, out)
        assert res.tiers == ("hbm", "hbm", "host", "host") and np.array_equal(out, pages)
        store.check_integrity()
        hbm.check_integrity()


def test_store_writes_commits_through(layout: KVLayout, ns: Namespace) -> None:
    store, hbm, host = _store_pair(layout, "write_through")
    with store:
        chain = ns.chain(list(range(4 * 2)))
        blocks = hbm.allocate(2)
        pages = fill(hbm, blocks, seed=7)
        hbm.commit(blocks, chain.metas())
        store.drain()  # the copy down runs on the store's mover, off the engine thread
        assert host.contains(chain.keys) == [True, True]
        out = np.zeros_like(pages)
        assert host.read(ns.id, chain.keys, list(out)) == [True, True]
        assert np.array_equal(out, pages)
        store.check_integrity()
    assert hbm.owner is None  # closing the store detaches it
