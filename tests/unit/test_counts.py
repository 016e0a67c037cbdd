"""take_one_each against a plain model: one count off per occurrence, zeros deleted, other
holders' counts kept -- on the fast path (every count 1) and on the general one."""

from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from kvstore.counts import take_one_each

items = st.lists(st.integers(0, 5), max_size=8)


@given(items, items)
def test_takes_one_count_per_occurrence(held_by_others: list[int], mine: list[int]) -> None:
    counts = Counter(held_by_others) + Counter(mine)
    take_one_each(counts, mine)
    assert counts == Counter(held_by_others)
    assert 0 not in counts.values()  # what reached zero is gone, not kept as a 0
