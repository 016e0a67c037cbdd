"""The host tier's slot pins (``pin_leading`` / ``unpin``, the staging path's copy-out): the
leading run stops at a miss or at another namespace's page, every pinned slot keeps its bytes
through a delete, and the slot frees only when its last reader leaves."""

from __future__ import annotations

import numpy as np

from kvstore import KVLayout, Namespace
from kvstore.tiers.host import HostTier


def _put(host: HostTier, ns: Namespace, tokens: list[int], fill: int) -> list[bytes]:
    metas = ns.chain(tokens).metas()
    page = np.full(host.layout.page_bytes, fill, np.uint8)
    assert host.write(metas, [page] * len(metas)) == [True] * len(metas)
    return [m.key for m in metas]


def test_leading_run_stops_at_a_miss_and_at_another_namespace(layout: KVLayout) -> None:
    host = HostTier.build("host", layout, 16, pin_memory=False)
    a, b = Namespace("m", layout, "a"), Namespace("m", layout, "b")
    B = layout.block_size
    keys = _put(host, a, list(range(4 * B)), 1)
    assert host.pin_leading(keys, a.id) == [host.slot_of(k) for k in keys]
    assert host.pin_leading(keys, b.id) == []  # a's pages, asked for as b's: no run
    missing = b"\x07" * 16
    assert host.pin_leading(keys[:2] + [missing] + keys[2:], a.id) == [
        host.slot_of(k) for k in keys[:2]]
    # b's page under a key a asks for (a forged or colliding record): the run ends before it
    forged = b.chain(list(range(4 * B))).metas()[2]
    host.delete([keys[2]])
    fake = type(forged)(b.id, keys[2], forged.parent, forged.token_ids)
    assert host.write([fake], [np.zeros(layout.page_bytes, np.uint8)]) == [True]
    assert host.pin_leading(keys, a.id) == [host.slot_of(k) for k in keys[:2]]


def test_pinned_slot_keeps_its_bytes_until_the_last_reader_leaves(layout: KVLayout) -> None:
    host = HostTier.build("host", layout, 4, pin_memory=False)
    ns = Namespace("m", layout)
    keys = _put(host, ns, list(range(2 * layout.block_size)), 9)
    first = host.pin_leading(keys, ns.id)
    second = host.pin_leading(keys[:1], ns.id)  # two readers of slot 0
    assert host.delete(keys) == 2  # unlinked at once ...
    assert host.pin_leading(keys, ns.id) == []
    assert host.used_pages == 2  # ... not freed: both are still read
    host.unpin(first)
    assert host.used_pages == 1  # slot 1 had one reader; slot 0 still has one
    assert (host.slab[second[0]] == 9).all()  # its bytes held for the last reader
    host.unpin(second)
    assert host.used_pages == 0


def test_pages_per_namespace_are_counted_exactly(layout: KVLayout) -> None:
    """``pages_of`` (a quota's question) follows writes, replacements, deletes and pinned
    deletes, namespace by namespace."""
    host = HostTier.build("host", layout, 16, pin_memory=False)
    a, b = Namespace("m", layout, "a"), Namespace("m", layout, "b")
    B = layout.block_size
    ka = _put(host, a, list(range(5 * B)), 1)
    kb = _put(host, b, list(range(3 * B)), 2)
    assert (host.pages_of(a.id), host.pages_of(b.id)) == (5, 3)
    _put(host, a, list(range(5 * B)), 9)  # the same keys again: replaced, not added
    assert host.pages_of(a.id) == 5
    slots = host.pin_leading(ka[:2], a.id)
    host.delete(ka[:3])  # two of them pinned: unlinked now, freed later
    assert host.pages_of(a.id) == 2
    host.unpin(slots)
    assert host.pages_of(a.id) == 2 and host.pages_of(b.id) == 3
    host.delete(kb + ka)
    assert (host.pages_of(a.id), host.pages_of(b.id)) == (0, 0)
    assert host.pages_of(b"\x00" * 16) == 0
