"""The lease table against a model: whatever the order of grants, releases, narrows, expiries
and reads of the pins -- pins are counted lazily, when read -- the pins always equal the count
of each key over the live leases, and a released or expired lease pins nothing."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from kvstore.errors import LeaseError
from kvstore.leases import LeaseTable
from kvstore.metrics import Metrics

KEYS = [bytes([i]) * 16 for i in range(6)]

op = st.one_of(
    st.tuples(st.just("grant"), st.lists(st.sampled_from(KEYS), max_size=5)),
    st.tuples(st.just("release"), st.integers(0, 7)),
    st.tuples(st.just("narrow"), st.integers(0, 7), st.integers(0, 5)),
    st.tuples(st.just("pins")),
    st.tuples(st.just("tick")),  # time passes: the oldest leases may expire
)


@settings(max_examples=300, deadline=None)
@given(st.lists(op, max_size=40))
def test_pins_always_count_the_live_leases(ops: list[tuple]) -> None:
    now = [0.0]
    table = LeaseTable(3.0, lambda: now[0], Metrics())
    granted = []  # every lease handed out, live or not

    def expected() -> Counter[bytes]:
        live = [g for g in granted if table.is_live(g)]
        return Counter(k for g in live for k in g.keys)

    for o in ops:
        if o[0] == "grant":
            granted.append(table.grant(o[1]))
        elif o[0] == "tick":
            now[0] += 1.0
        elif o[0] == "pins":  # a read counts what was granted since the last one
            assert table.pins == expected()
        elif granted:
            lease = granted[o[1] % len(granted)]
            try:
                if o[0] == "release":
                    table.release(lease)
                else:
                    granted[o[1] % len(granted)] = table.narrow(lease, min(o[2], len(lease.keys)))
            except LeaseError:
                assert not table.is_live(lease)  # released, or expired: refused
    assert table.pins == expected()
    table.check()
    for g in granted:
        if table.is_live(g):
            table.release(g)
    assert not table.pins
