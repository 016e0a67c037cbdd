"""Write-back writes a page down once: a page whose copy reached the tier below since it entered
its tier is clean, and evicting it writes nothing back -- even where the tier below has dropped
that copy since (its policy judged it colder than what it keeps; writing it back would undo
that, evicting warmer pages). A page never written below is written back on eviction."""

from __future__ import annotations

import numpy as np

from kvstore import KVLayout, Metrics, Namespace, TieredStore
from kvstore.tiers.host import HostTier

LAYOUT = KVLayout(num_layers=1, num_kv_heads=1, head_dim=16, block_size=4, dtype="float16")
NS = Namespace("write-back-once", LAYOUT)


def _chain(start: int, n: int) -> list:
    return NS.chain(list(range(start * 4, (start + n) * 4))).metas()


def _pages(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, LAYOUT.page_bytes), np.uint8)


def test_a_page_copied_down_once_is_not_written_back_after_the_tier_below_dropped_it() -> None:
    m = Metrics()
    s = TieredStore(LAYOUT, [HostTier.build("top", LAYOUT, 8, m, pin_memory=False),
                             HostTier.build("below", LAYOUT, 4, m, pin_memory=False)],
                    write_policy="write_back", free_reserve=0.0, metrics=m)
    top, below = s.tier("top"), s.tier("below")
    try:
        a, b, c = _chain(0, 4), _chain(10, 4), _chain(20, 8)
        s.put(a, _pages(4, 1), tier="top")
        s.put(a, _pages(4, 1), tier="below")  # a's copy reaches the tier below: clean in top
        s.put(b, _pages(4, 2), tier="below")  # below drops a for b
        assert below.contains([x.key for x in a]) == [False] * 4
        s.put(c, _pages(8, 3), tier="top")  # top evicts a: clean, nothing written back
        assert top.contains([x.key for x in a]) == [False] * 4
        assert below.contains([x.key for x in b]) == [True] * 4  # b was not pushed out
        assert m.value("kvstore_copies_total", reason="write_back", tier="below") == 0

        d = _chain(40, 4)
        s.put(d, _pages(4, 4), tier="top")  # top evicts 4 of c: never below, written back
        gone = [x.key for x in c if not top.contains([x.key])[0]]
        assert len(gone) == 4 and below.contains(gone) == [True] * 4
        assert m.value("kvstore_copies_total", reason="write_back", tier="below") == 4
        s.check_integrity()
    finally:
        s.close()
