"""Byte budgets and a namespace's retention (``StoreAPI.set_budget`` / ``retention``), held by
both implementations: the in-process ``TieredStore`` and ``DaemonStore``, a client of a real
``kvstore serve`` subprocess (its ``SetBudget`` / ``Retention`` RPCs).

Contracts: a namespace at its budget in a tier makes room among its own pages there and never
evicts another's; its pinned pages stay however far past its budget it writes (what it cannot
make room for is refused); ``retention`` tells its pins and, per tier, the bytes it holds, its
pinned bytes there and its budget (whole pages; None: none, which 0 is not); bad input is
refused with InvalidArgument and changes nothing; ``set_budget(..., None)`` removes a budget."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kvstore import InvalidArgument, Namespace
from tests.server.daemon_proc import DaemonProc, write_config
from tests.store_api.conftest import LAYOUT, PAGES
from tests.store_api.test_conformance import _page, _save

PAGE = LAYOUT.page_bytes
TOKENS = list(range(100, 100 + 6 * LAYOUT.block_size))


def _ns(salt: str) -> Namespace:
    return Namespace("budgets", LAYOUT, salt)


def _tokens(chain: int, pages: int) -> list[int]:
    """The tokens of ``pages`` pages, a prefix of its own per ``chain`` (no two share a page)."""
    start = 10_000 + chain * 1_000 * LAYOUT.block_size
    return list(range(start, start + pages * LAYOUT.block_size))


def _load(store: Any, ns: Namespace, keys: tuple[bytes, ...]) -> list[bool]:
    """Leased lookup then load; per key whether its exact bytes came back (a miss: False)."""
    found = store.lookup(keys, lease=True, namespace_id=ns.id)
    h = store.prepare_load(ns.id, keys[: found.num_blocks], lease=found.lease)
    ok = [bool(np.array_equal(h.slab[s], _page(k))) for k, s in zip(h.keys, h.slots)]
    assert store.complete_load(h) == h.num_blocks
    return ok + [False] * (len(keys) - len(ok))


def _first(store: Any, ns: Namespace) -> Any:
    """``ns``'s retention in the store's first tier."""
    tiers = store.retention(ns.id).tiers
    assert [t.tier for t in tiers] == list(store.tier_names)
    return tiers[0]


def test_a_namespace_at_its_budget_evicts_its_own_pages_never_anothers(store: Any) -> None:
    a, b = _ns("budget-a"), _ns("budget-b")
    host = store.tier_names[0]
    n = PAGES // 8  # A's budget: 16 pages
    b_chains = [b.chain(_tokens(i, 16)).keys for i in range(6)]  # 96 pages of B
    for i in range(6):
        assert _save(store, b, _tokens(i, 16)).stored == 16
    store.set_budget(a.id, host, n * PAGE)
    # 3N pages of A: with B's, more than the tier holds -- without the budget, B's would go
    assert 6 * 16 + 3 * n > PAGES
    for i in range(3 * n // 8):
        r = _save(store, a, _tokens(100 + i, 8))
        assert (r.stored, r.refused) == (8, 0)  # room made among its own pages, not refused
        assert _first(store, a).used_bytes <= n * PAGE
    for keys in b_chains:
        assert _load(store, b, keys) == [True] * 16
    mine = _first(store, a)
    assert (mine.used_bytes, mine.budget_bytes) == (n * PAGE, n * PAGE)
    assert _load(store, a, a.chain(_tokens(100 + 3 * n // 8 - 1, 8)).keys) == [True] * 8
    theirs = _first(store, b)
    assert (theirs.used_bytes, theirs.budget_bytes) == (96 * PAGE, None)
    store.check_integrity()


def test_retention_tells_pins_use_and_budget(store: Any) -> None:
    ns, idle = _ns("retention"), _ns("retention-idle")
    host = store.tier_names[0]
    keys = ns.chain(TOKENS).keys
    assert _save(store, ns, TOKENS).stored == 6
    later = ns.chain(TOKENS + _tokens(1, 1)).keys[-1]  # not stored yet: pinned, holds nothing
    held = store.pin(ns.id, [*keys[:4], later], ttl_s=600)
    store.set_budget(ns.id, host, 10 * PAGE + PAGE // 2)  # whole pages: 10
    info = store.retention(ns.id)
    assert info.namespace_id == ns.id
    assert [(p.id, p.namespace_id, p.keys) for p in info.pins] == \
        [(held.id, ns.id, (*keys[:4], later))]
    # the pin's expiry on this process's monotonic clock, as pin() gave it
    assert abs(info.pins[0].expires_at - held.expires_at) < 5
    assert 590 < info.pins[0].expires_at - time.monotonic() <= 600
    t = info.tiers[0]
    assert (t.tier, t.used_bytes, t.pinned_bytes, t.budget_bytes) == \
        (host, 6 * PAGE, 4 * PAGE, 10 * PAGE)
    # a namespace that holds nothing: no pins, nothing used, no budget
    assert store.retention(idle.id).pins == ()
    assert all((t.used_bytes, t.pinned_bytes, t.budget_bytes) == (0, 0, None)
               for t in store.retention(idle.id).tiers)
    # a budget of 0 is a budget, not none
    store.set_budget(ns.id, host, 0)
    assert _first(store, ns).budget_bytes == 0
    store.set_budget(ns.id, host, None)
    assert _first(store, ns).budget_bytes is None
    assert store.unpin(held) is True
    info = store.retention(ns.id)
    assert info.pins == () and (info.tiers[0].used_bytes, info.tiers[0].pinned_bytes) == \
        (6 * PAGE, 0)


def test_a_pinned_page_survives_its_namespace_writing_far_past_its_budget(store: Any) -> None:
    ns = _ns("pinned-budget")
    host = store.tier_names[0]
    keys = ns.chain(TOKENS).keys
    _save(store, ns, TOKENS)
    store.pin(ns.id, keys, ttl_s=600)
    store.set_budget(ns.id, host, 8 * PAGE)
    stored = 0
    for i in range(16):  # 128 pages: a whole tier, 16 times the budget
        stored += _save(store, ns, _tokens(i, 8)).stored
        assert _first(store, ns).used_bytes <= 8 * PAGE
    assert stored > 0  # its two unpinned pages of room were used, again and again
    assert _load(store, ns, keys) == [True] * 6
    t = _first(store, ns)
    assert (t.used_bytes, t.pinned_bytes) == (8 * PAGE, 6 * PAGE)
    # lowered below its pins: the pins stay, and what it cannot make room for is refused
    store.set_budget(ns.id, host, 4 * PAGE)
    r = _save(store, ns, _tokens(50, 8))
    assert (r.stored, r.refused) == (0, 8)
    assert _load(store, ns, keys) == [True] * 6
    t = _first(store, ns)
    assert (t.used_bytes, t.pinned_bytes, t.budget_bytes) == (6 * PAGE, 6 * PAGE, 4 * PAGE)
    store.check_integrity()


def _sent(store: Any) -> int:
    """Calls a daemon client sent (0 in process)."""
    return sum(getattr(store, "calls", {}).values())


def test_bad_budgets_are_refused_and_change_nothing(store: Any) -> None:
    ns, other = _ns("bad-budget"), _ns("bad-budget-other")
    host = store.tier_names[0]
    store.set_budget(ns.id, host, 8 * PAGE)
    before = store.retention(ns.id)
    sent = _sent(store)
    bad: list[tuple[Any, Any, Any]] = [
        (ns.id, "nope", PAGE), (ns.id, "", PAGE), (ns.id, 0, PAGE), (ns.id, None, PAGE),
        (ns.id, b"host", PAGE), (ns.id, host, -1), (ns.id, host, -PAGE), (ns.id, host, 1.5),
        (ns.id, host, float(PAGE)), (ns.id, host, True), (ns.id, host, "4096"),
        (ns.id, "nope", None), (b"short", host, PAGE), (other.id, 0, None)]
    for args in bad:
        with pytest.raises(InvalidArgument):
            store.set_budget(*args)
    assert _sent(store) == sent  # the client could tell each: nothing was sent
    with pytest.raises(InvalidArgument):
        store.retention(b"short")
    assert store.retention(ns.id) == before
    assert _first(store, ns).budget_bytes == 8 * PAGE
    assert all(t.budget_bytes is None for t in store.retention(other.id).tiers)
    # held to 8 pages: a save of 16 stores 8
    r = _save(store, ns, _tokens(0, 16))
    assert (r.stored, r.refused) == (8, 8)
    # None removes the budget: the next 16 all stay
    store.set_budget(ns.id, host, None)
    assert _first(store, ns).budget_bytes is None
    assert _save(store, ns, _tokens(1, 16)).stored == 16
    assert _first(store, ns).used_bytes == 24 * PAGE
    store.set_budget(ns.id, host, None)  # none to remove: no error


def test_the_daemon_checks_what_a_client_did_not(tmp_path: Path) -> None:
    """The daemon refuses a bad SetBudget however it was sent (a client of another language,
    an old one): an unknown tier or namespace is INVALID_ARGUMENT, raised as InvalidArgument;
    an unset size removes the budget, and 0 is one."""
    from connector.daemon import DaemonStore
    from connector.proto import kvstore_daemon_pb2 as pb

    ns = _ns("raw")
    with DaemonProc(write_config(tmp_path, host="1MiB", disk=None)) as d, \
            DaemonStore(d.target) as client:
        call = client._session.call
        for req in (pb.SetBudgetRequest(namespace_id=ns.id, tier="nope", nbytes=PAGE),
                    pb.SetBudgetRequest(namespace_id=ns.id, tier="", nbytes=PAGE),
                    pb.SetBudgetRequest(namespace_id=b"short", tier="host", nbytes=PAGE)):
            with pytest.raises(InvalidArgument):
                call("SetBudget", req)
        with pytest.raises(InvalidArgument):
            call("Retention", pb.RetentionRequest(namespace_id=b""))
        assert all(t.budget_bytes is None for t in client.retention(ns.id).tiers)
        call("SetBudget", pb.SetBudgetRequest(namespace_id=ns.id, tier="host", nbytes=0))
        assert client.retention(ns.id).tiers[0].budget_bytes == 0
        call("SetBudget", pb.SetBudgetRequest(namespace_id=ns.id, tier="host"))
        assert client.retention(ns.id).tiers[0].budget_bytes is None
