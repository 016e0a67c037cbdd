"""``TieredStore.set_policy``: a tier's eviction policy switched at run time keeps the tier's
pages tracked, and from then on victims follow the new policy."""

from __future__ import annotations

import numpy as np
import pytest

from kvstore import KVLayout, Metrics, Namespace, TieredStore
from kvstore.errors import InvalidArgument, UnknownComponent
from kvstore.policy.fifo import FIFOPolicy
from kvstore.policy.lru import LRUPolicy
from kvstore.tiers.host import HostTier

LAYOUT = KVLayout(1, 1, 8, 4, "float16")  # 64-byte pages
NS = Namespace("set-policy", LAYOUT)


def pages(n: int) -> np.ndarray:
    return np.random.default_rng(n).integers(0, 256, (n, LAYOUT.page_bytes), dtype=np.uint8)


def held(s: TieredStore, keys: list[bytes]) -> list[bool]:
    return s.tier("host").contains(keys)


@pytest.mark.parametrize("spec, survivor", [("lru", 0), ("fifo", 1)])
def test_victims_follow_the_new_policy(spec: str, survivor: int) -> None:
    s = TieredStore(LAYOUT, [HostTier.build("host", LAYOUT, 4, Metrics())], ["lru" if spec == "fifo" else "fifo"])
    old = NS.chain(list(range(16)))
    s.put(old.metas(), pages(4))
    s.set_policy("host", spec)
    assert isinstance(s.policies[0], LRUPolicy if spec == "lru" else FIFOPolicy)
    assert set(s.policies[0]) == set(old.keys)  # the tier's pages stay tracked
    s.check_integrity()
    new = NS.chain(list(range(100, 120)))  # 5 blocks: 4 fill the tier, the 5th evicts one
    s.put(new.metas()[:4], pages(4))
    assert held(s, old.keys) == [False] * 4
    s.get(NS.id, [new.keys[0]], np.zeros((1, LAYOUT.page_bytes), np.uint8))  # touch the oldest
    s.put(new.metas()[4:], pages(1))
    # LRU spares the page just read (evicts new[1]); FIFO evicts the first one in (new[0])
    assert held(s, new.keys[:2]) == [survivor == 0, survivor == 1]
    s.check_integrity()


def test_a_bad_switch_is_refused_and_changes_nothing() -> None:
    s = TieredStore(LAYOUT, [HostTier.build("host", LAYOUT, 4, Metrics())], ["lru"])
    s.put(NS.chain(list(range(8))).metas(), pages(2))
    before = s.policies[0]
    with pytest.raises(UnknownComponent, match="unknown eviction policy 'nope'"):
        s.set_policy("host", "nope")
    with pytest.raises(InvalidArgument, match="no tier named 'disk'"):
        s.set_policy("disk", "lru")
    assert s.policies[0] is before and len(before) == 2
