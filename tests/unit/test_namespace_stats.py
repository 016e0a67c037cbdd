"""Per-namespace counters: the cap on tracked namespaces, and what the store counts for each
namespace through its public API (lookups, gets, staging loads, load-or-recompute declines,
records dropped by verification)."""

from __future__ import annotations

import numpy as np
import pytest

from kvstore import InvalidArgument, KVLayout, Metrics, Namespace, TieredStore
from kvstore.namespace_stats import NamespaceCounters, NamespaceCounts
from kvstore.tiers.host import HostTier
from tests.conftest import random_pages


def test_counts_add_up_per_namespace_and_past_the_cap_into_other() -> None:
    c = NamespaceCounters(max_namespaces=2)
    a, b, x, y = (bytes([i]) * 16 for i in range(4))
    c.add(a, NamespaceCounts(lookup_hit=3, lookup_miss=1))
    c.add(b, NamespaceCounts(declined=2))
    c.add(x, NamespaceCounts(lookup_hit=5))  # past the cap
    c.add(y, NamespaceCounts(lookup_miss=7, corrupt=1))
    c.add(a, NamespaceCounts(lookup_hit=1, expired=4))  # a tracked one still counts on its own
    snap = c.snapshot()
    assert len(c) == 2 and set(snap.rows) == {a, b}
    assert snap.get(a) == NamespaceCounts(lookup_hit=4, lookup_miss=1, expired=4)
    assert snap.get(b) == NamespaceCounts(declined=2)
    assert snap.get(x) == NamespaceCounts()  # untracked: only in other
    assert snap.other == NamespaceCounts(lookup_hit=5, lookup_miss=7, corrupt=1)
    assert snap.other_calls == 2


def test_snapshots_share_the_rows_that_did_not_change() -> None:
    c = NamespaceCounters()
    a, b = b"a" * 16, b"b" * 16
    c.add(a, NamespaceCounts(lookup_hit=1))
    c.add(b, NamespaceCounts(lookup_hit=1))
    first = c.snapshot()
    c.add(b, NamespaceCounts(lookup_miss=1))
    second = c.snapshot()
    assert second.rows[a] is first.rows[a]  # memory of the sampler's 15 minutes of samples
    assert first.get(b) == NamespaceCounts(lookup_hit=1)  # a snapshot never changes after
    assert second.get(b) == NamespaceCounts(lookup_hit=1, lookup_miss=1)


def test_a_cap_of_zero_counts_everything_as_other_and_a_bad_cap_is_refused() -> None:
    c = NamespaceCounters(max_namespaces=0)
    c.add(b"a" * 16, NamespaceCounts(lookup_hit=2))
    assert c.snapshot().rows == {} and c.snapshot().other.lookup_hit == 2
    with pytest.raises(InvalidArgument, match="max_namespaces"):
        NamespaceCounters(max_namespaces=-1)


def store_of(layout: KVLayout) -> TieredStore:
    m = Metrics()
    return TieredStore(layout, [HostTier.build("host", layout, 16, m, pin_memory=False),
                                HostTier.build("slow", layout, 64, m, pin_memory=False)])


def test_the_store_counts_lookups_loads_and_declines_per_namespace(layout: KVLayout) -> None:
    a, b = Namespace("m", layout, "a"), Namespace("m", layout, "b")
    store = store_of(layout)
    ca = a.chain(list(range(4 * 6)))  # 6 blocks, 4 stored
    cb = b.chain(list(range(100, 100 + 4 * 3)))  # 3 blocks, 1 stored
    store.put(ca.metas(0, 4), random_pages(layout, 4))
    store.put(cb.metas(0, 1), random_pages(layout, 1, seed=1))

    assert store.lookup(ca.keys, namespace_id=a.id).num_blocks == 4  # 4 hit, 2 miss
    assert store.lookup(ca.keys[:2], namespace_id=a.id).num_blocks == 2  # 2 hit
    assert store.lookup(cb.keys, namespace_id=b.id).num_blocks == 1  # 1 hit, 2 miss
    assert store.lookup_async(cb.keys, namespace_id=b.id).result().num_blocks == 1
    store.lookup(ca.keys)  # no namespace named: the store-wide counters only
    out = np.zeros((3, layout.page_bytes), dtype=np.uint8)
    assert store.get(b.id, cb.keys, out).num_found == 1  # 1 read, 2 missed
    h = store.prepare_load(a.id, ca.keys)  # pins 4 of 6
    store.complete_load(h)
    store.count_declined(b.id, 3)
    store.count_declined(b.id, 0)

    snap = store.namespace_counts.snapshot()
    assert snap.get(a.id) == NamespaceCounts(lookup_hit=6, lookup_miss=2, load_hit=4, load_miss=2)
    assert snap.get(b.id) == NamespaceCounts(lookup_hit=2, lookup_miss=4, load_hit=1, load_miss=2,
                                             declined=3)
    st = store.stats()  # the store-wide counters have every lookup, the unnamed one too
    assert (st.lookup_hit_blocks, st.lookup_miss_blocks) == (6 + 2 + 4, 2 + 4 + 2)
    with pytest.raises(InvalidArgument):
        store.lookup(ca.keys, namespace_id=b"short")
    with pytest.raises(InvalidArgument):
        store.count_declined(a.id, -1)
    store.close()


def test_a_record_read_under_the_wrong_namespace_counts_as_corrupt_for_the_reader(
        layout: KVLayout) -> None:
    a, b = Namespace("m", layout, "a"), Namespace("m", layout, "b")
    store = store_of(layout)
    ca = a.chain(list(range(8)))
    store.put(ca.metas(), random_pages(layout, 2))
    out = np.zeros((2, layout.page_bytes), dtype=np.uint8)
    # b asks for a's keys (a caller bug or a probe): each tier that holds them refuses them
    assert store.get(b.id, ca.keys, out).num_found == 0
    snap = store.namespace_counts.snapshot()
    assert snap.get(b.id) == NamespaceCounts(load_miss=2, corrupt=2)
    assert snap.get(a.id) == NamespaceCounts()
    assert store.stats().tiers[0].corrupt == 2
    store.close()
