"""The store's contracts, held by both implementations an engine may be given: the in-process
``TieredStore`` and ``DaemonStore``, a client of a real ``kvstore serve`` subprocess. Every test
runs against both (issue 36 grows this into the one conformance suite of the store's face).

Contracts: a save is a reservation written then completed (or aborted), stored once; a leased
lookup finds the leading run and pins it; a load returns exactly the bytes saved under that
namespace and key, or a miss; a load under another namespace gets nothing; a delete removes; a
lease narrows and releases; a handle completes once; bad keys and a save of two namespaces are
refused; a closed store refuses."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kvstore import InvalidArgument, Namespace, TieredStore
from kvstore.tiers.host import HostTier
from tests.server.daemon_proc import DaemonProc, write_config
from tests.store_api.conftest import LAYOUT, PAGES



def _ns(salt: str) -> Namespace:
    return Namespace("conformance", LAYOUT, salt)


def _page(key: bytes) -> np.ndarray:
    rng = np.random.default_rng(int.from_bytes(key[:8], "little"))
    return rng.integers(0, 256, LAYOUT.page_bytes, dtype=np.uint8)


def _save(store: Any, ns: Namespace, tokens: list[int], n: int | None = None) -> Any:
    metas = ns.chain(tokens).metas()[:n]
    h = store.prepare_store(metas)
    for m, slot in zip(h.metas, h.slots):
        h.slab[slot] = _page(m.key)
    return store.complete_store(h)


def _load(store: Any, ns: Namespace, keys: tuple[bytes, ...]) -> list[bool]:
    """Leased lookup then load; per key whether its exact bytes came back."""
    found = store.lookup(keys, lease=True, namespace_id=ns.id)
    h = store.prepare_load(ns.id, keys[: found.num_blocks], lease=found.lease)
    ok = [bool(np.array_equal(h.slab[s], _page(k))) for k, s in zip(h.keys, h.slots)]
    assert store.complete_load(h) == h.num_blocks
    return ok


TOKENS = list(range(100, 100 + 6 * LAYOUT.block_size))


def test_a_save_is_found_and_loads_its_exact_bytes(store: Any) -> None:
    ns = _ns("a")
    keys = ns.chain(TOKENS).keys
    assert store.lookup(keys, namespace_id=ns.id).num_blocks == 0
    r = _save(store, ns, TOKENS)
    assert (r.stored, r.existing, r.refused) == (6, 0, 0)
    assert _load(store, ns, keys) == [True] * 6


def test_a_page_is_stored_once(store: Any) -> None:
    ns = _ns("once")
    _save(store, ns, TOKENS, 3)
    r = _save(store, ns, TOKENS)
    assert (r.stored, r.existing) == (3, 3)


def test_an_aborted_save_stores_nothing(store: Any) -> None:
    ns = _ns("abort")
    h = store.prepare_store(ns.chain(TOKENS).metas())
    store.abort(h)
    assert store.lookup(ns.chain(TOKENS).keys, namespace_id=ns.id).num_blocks == 0
    assert _save(store, ns, TOKENS).stored == 6  # the reservation was given back


def test_another_namespace_loads_nothing(store: Any) -> None:
    a, b = _ns("tenant-a"), _ns("tenant-b")
    _save(store, a, TOKENS)
    # b's own keys of the same tokens differ: nothing found
    assert store.lookup(b.chain(TOKENS).keys, namespace_id=b.id).num_blocks == 0
    # a's keys (unguessable hashes of a's seed) asked under b: a lookup may report them, but a
    # load under b gets none of a's bytes
    h = store.prepare_load(b.id, a.chain(TOKENS).keys)
    assert h.num_blocks == 0
    store.complete_load(h)
    assert _load(store, a, a.chain(TOKENS).keys) == [True] * 6


def test_the_leading_run_only(store: Any) -> None:
    ns = _ns("run")
    keys = ns.chain(TOKENS).keys
    _save(store, ns, TOKENS, 4)
    found = store.lookup(keys, lease=True, namespace_id=ns.id)
    assert found.num_blocks == 4 and found.lease is not None
    narrowed = store.narrow(found.lease, 2)
    assert tuple(narrowed.keys) == tuple(keys[:2])
    store.release(narrowed)


def test_a_delete_removes(store: Any) -> None:
    ns = _ns("delete")
    keys = ns.chain(TOKENS).keys
    _save(store, ns, TOKENS)
    kw = {"namespace_id": ns.id} if not isinstance(store, TieredStore) else {}
    assert store.delete(keys[3:], **kw) == 3
    assert store.lookup(keys, namespace_id=ns.id).num_blocks == 3
    assert _load(store, ns, keys) == [True] * 3


def test_a_closed_store_refuses_naming_it(store: Any) -> None:
    from kvstore.errors import KVStoreError

    ns = _ns("closed")
    store.close()
    with pytest.raises(KVStoreError, match="closed"):
        store.lookup(ns.chain(TOKENS).keys, namespace_id=ns.id)
    with pytest.raises(KVStoreError, match="closed"):
        store.prepare_store(ns.chain(TOKENS).metas())
    store.close()  # idempotent


def test_a_handle_completes_once(store: Any) -> None:
    from kvstore.errors import KVStoreError

    ns = _ns("twice")
    h = store.prepare_store(ns.chain(TOKENS).metas())
    for m, slot in zip(h.metas, h.slots):
        h.slab[slot] = _page(m.key)
    assert store.complete_store(h).stored == 6
    with pytest.raises(KVStoreError):
        store.complete_store(h)
    with pytest.raises(KVStoreError):
        store.abort(h)
    assert _load(store, ns, ns.chain(TOKENS).keys) == [True] * 6


def test_a_load_handle_completes_once(store: Any) -> None:
    from kvstore.errors import KVStoreError

    ns = _ns("load-twice")
    _save(store, ns, TOKENS)
    h = store.prepare_load(ns.id, ns.chain(TOKENS).keys)
    assert store.complete_load(h) == 6
    with pytest.raises(KVStoreError):
        store.complete_load(h)


def test_bad_keys_are_refused_naming_them(store: Any) -> None:

    ns = _ns("bad")
    with pytest.raises(InvalidArgument):
        store.lookup([b"short"], namespace_id=ns.id)
    with pytest.raises(InvalidArgument):
        store.prepare_load(ns.id, [b"\0" * 15])


def test_one_save_takes_one_namespace(store: Any) -> None:

    a, b = _ns("one-a"), _ns("one-b")
    metas = a.chain(TOKENS).metas()[:2] + b.chain(TOKENS).metas()[:2]
    with pytest.raises(InvalidArgument, match="one prepare_store call takes blocks of one namespace"):
        store.prepare_store(metas)


def test_a_released_lease_cannot_be_used_again(store: Any) -> None:
    from kvstore.errors import LeaseError

    ns = _ns("released")
    _save(store, ns, TOKENS)
    found = store.lookup(ns.chain(TOKENS).keys, lease=True, namespace_id=ns.id)
    store.release(found.lease)
    with pytest.raises(LeaseError):
        store.narrow(found.lease, 1)


@pytest.fixture(params=["in-process", "daemon", "daemon-staging"])
def copying_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """A store that copies the caller's pages itself: in-process; over the daemon by peer copy
    (it reads and writes this process's memory); and over a daemon with ``peer_copy = false``,
    where the client copies through its staging rows."""
    if request.param == "in-process":
        s = TieredStore(LAYOUT, [HostTier.build("host", LAYOUT, PAGES, pin_memory=False)])
        yield s
        s.close()
        return
    from connector.daemon import DaemonStore

    peer = request.param == "daemon"
    extra = "" if peer else "peer_copy = false"
    with DaemonProc(write_config(tmp_path, host="1MiB", disk=None, extra_daemon=extra)) as d:
        c = DaemonStore(d.target)
        assert c.peer_copy is peer  # same user, no Yama restriction: the probe succeeds
        yield c
        c.close()


def test_the_store_copies_the_callers_pages_both_ways(copying_store: Any) -> None:
    store, ns = copying_store, _ns("copy")
    metas = ns.chain(TOKENS).metas()
    pages = np.stack([_page(m.key) for m in metas])
    h = store.prepare_store(metas[:4])
    r = store.complete_store(h, pages=pages[:4])
    assert (r.stored, r.refused) == (4, 0)
    # a batch of tensors-as-arrays, or one page at a time: both are pages as put() takes them
    h = store.prepare_store(metas)
    assert [m.key for m in h.metas] == [m.key for m in metas[4:]]
    assert store.complete_store(h, pages=[pages[4], pages[5]]).stored == 2
    found = store.lookup([m.key for m in metas], lease=True, namespace_id=ns.id)
    lh = store.prepare_load(ns.id, [m.key for m in metas][: found.num_blocks], lease=found.lease)
    out = np.zeros_like(pages)
    assert store.complete_load(lh, into=out) == 6
    assert np.array_equal(out, pages)  # exactly the bytes saved, in key order
    assert _load(store, ns, tuple(m.key for m in metas)) == [True] * 6


def test_pages_that_do_not_fit_the_handle_are_refused_and_change_nothing(copying_store: Any) -> None:

    store, ns = copying_store, _ns("misfit")
    metas = ns.chain(TOKENS).metas()
    pages = np.stack([_page(m.key) for m in metas])
    h = store.prepare_store(metas)
    with pytest.raises(InvalidArgument, match="5|6|page"):
        store.complete_store(h, pages=pages[:5])  # one short
    with pytest.raises(InvalidArgument):
        store.complete_store(h, pages=pages[:, :-1])  # pages one byte short
    # the handle is still open and still completes
    assert store.complete_store(h, pages=pages).stored == 6
    found = store.lookup([m.key for m in metas], lease=True, namespace_id=ns.id)
    lh = store.prepare_load(ns.id, [m.key for m in metas], lease=found.lease)
    with pytest.raises(InvalidArgument):
        store.complete_load(lh, into=np.zeros((6, LAYOUT.page_bytes), np.uint8)[:, ::2])
    read_only = np.zeros((6, LAYOUT.page_bytes), np.uint8)
    read_only.flags.writeable = False
    with pytest.raises(InvalidArgument):
        store.complete_load(lh, into=read_only)
    out = np.zeros_like(pages)
    assert store.complete_load(lh, into=out) == 6 and np.array_equal(out, pages)


def test_pages_for_another_stores_handle_are_refused(copying_store: Any) -> None:

    store, ns = copying_store, _ns("foreign")
    other = TieredStore(LAYOUT, [HostTier.build("host", LAYOUT, PAGES, pin_memory=False)])
    try:
        metas = ns.chain(TOKENS).metas()
        h = other.prepare_store(metas)
        pages = np.stack([_page(m.key) for m in metas])
        with pytest.raises(InvalidArgument, match="another store"):
            store.complete_store(h, pages=pages)
        assert other.complete_store(h).stored == 6  # still open on its own store
    finally:
        other.close()


def test_a_lookup_gives_its_runs_and_what_loading_each_would_cost(store: Any) -> None:
    ns = _ns("runs")
    _save(store, ns, TOKENS)
    keys = ns.chain(TOKENS).keys
    found = store.lookup(keys[:4], namespace_id=ns.id)
    assert found.runs == (("host", 4),)
    assert len(found.load_s) == 1  # one estimate per run
    assert found.load_s[0] is None or found.load_s[0] > 0  # None until the tier was read
    assert store.lookup([b"\x09" * 16], namespace_id=ns.id).load_s == ()


def test_open_saves_are_counted_until_they_end(store: Any) -> None:
    ns = _ns("open")
    metas = ns.chain(TOKENS).metas()
    assert store.open_store_handles == 0
    a, b = store.prepare_store(metas[:3]), store.prepare_store(metas[3:])
    assert store.open_store_handles == 2
    store.complete_store(a)
    store.abort(b)
    assert store.open_store_handles == 0
    store.check_integrity()


def test_the_event_log_tells_a_namespace_its_own_pages_in_order(store: Any) -> None:
    """read_events / event_snapshot: a save is a stored event of its keys, a delete a removed
    one (reason deleted), with contiguous sequence numbers; another namespace's pages never
    show; a snapshot holds the namespace's pages and the cursor to go on from; a cursor of
    another log is a gap."""
    a, b = _ns("events-a"), _ns("events-b")
    start = store.read_events(namespace_id=a.id)
    assert start.events == () and not start.gap and start.epoch
    _save(store, a, TOKENS)
    _save(store, b, TOKENS)  # b's pages: not a's business
    keys = a.chain(TOKENS).keys
    store.delete([keys[-1]], namespace_id=a.id)
    batch = store.read_events(start.next_cursor, limit=100, timeout_s=1.0, epoch=start.epoch,
                              namespace_id=a.id)
    assert not batch.gap
    stored = [k for e in batch.events if e.kind == "stored" for k in e.keys]
    assert stored == list(keys)
    (gone,) = [e for e in batch.events if e.kind == "removed"]
    assert (gone.reason, gone.keys, gone.namespace_ids) == ("deleted", (keys[-1],), (a.id,))
    seqs = [e.seq for e in batch.events]
    assert seqs == sorted(seqs) and seqs[0] >= start.next_cursor
    assert all(n == a.id for e in batch.events for n in e.namespace_ids)
    snap = store.event_snapshot(namespace_id=a.id)
    assert {k for e in snap.events for k in e.keys} == set(keys[:-1])
    assert snap.cursor >= batch.next_cursor and snap.epoch == start.epoch
    assert store.read_events(snap.cursor, epoch=b"another log", namespace_id=a.id).gap


def _flood(store: Any, ns: Namespace, pages: int) -> None:
    """Save ``pages`` unique pages of ``ns`` (64 at a time): every unpinned page is evicted."""
    for start in range(0, pages, 64):
        _save(store, ns, list(range(10_000 + start * LAYOUT.block_size,
                                    10_000 + (start + 64) * LAYOUT.block_size)))


def test_a_pinned_prefix_survives_a_flood_and_goes_once_unpinned(store: Any) -> None:
    """pin / unpin: a pinned prefix stays through ten times the tier's pages of other saves
    and loads its exact bytes afterwards; unpinned, the next flood takes it. A pin of another
    namespace's pages, or with a TTL out of bounds, is refused."""
    ns, other = _ns("pinned"), _ns("pinned-other")
    keys = ns.chain(TOKENS).keys
    _save(store, ns, TOKENS)
    held = store.pin(ns.id, keys, ttl_s=600)
    _flood(store, ns, 10 * PAGES)
    assert _load(store, ns, keys) == [True] * 6
    with pytest.raises(InvalidArgument, match="another namespace"):
        store.pin(other.id, keys, ttl_s=60)
    assert store.unpin(held.id, namespace_id=other.id) is False  # not told, not removed
    for bad in (0, -1, 1e9, float("nan")):
        with pytest.raises(InvalidArgument, match="ttl_s"):
            store.pin(ns.id, keys, ttl_s=bad)
    with pytest.raises(InvalidArgument, match="pin"):
        store.pin(ns.id, [bytes([i % 256, i // 256]) * 8 for i in range(PAGES)], ttl_s=60)
    assert store.unpin(held) is True and store.unpin(held) is False
    _flood(store, ns, 2 * PAGES)
    assert store.lookup(keys, namespace_id=ns.id).num_blocks == 0
