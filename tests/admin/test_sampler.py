"""The sampler's retention: an hour of samples at its interval, in two fixed-length deques
(bounded memory), only the newest 15 minutes with their namespaces' rows."""

from __future__ import annotations

import pytest

from kvstore.namespace_stats import ZERO, NamespaceCounts, NamespaceSnapshot
from server.admin import sampler as sm


def test_an_hour_is_kept_and_only_15_minutes_of_namespace_rows(
        monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter(range(10**6))
    rows = NamespaceSnapshot({b"n" * 16: NamespaceCounts(lookup_hit=1)}, ZERO, 0)

    def take(_: object) -> sm.Sample:
        t = float(next(clock)) * 2.0
        return sm.Sample(1e9 + t, t, {}, {}, t, 0.0, rows)

    monkeypatch.setattr(sm, "take", take)
    s = sm.Sampler(object(), interval_s=2.0)  # type: ignore[arg-type]
    for _ in range(3 * 3600):  # three hours of samples
        s.sample()
    got = s.samples()
    assert len(got) <= 3600 / 2 + 4  # bounded: an hour's worth, and a sample either side
    now = got[-1]
    assert now.mono - got[0].mono >= sm.RETAIN_S
    assert [b.mono - a.mono for a, b in zip(got, got[1:])] == [2.0] * (len(got) - 1)
    recent = [x for x in got if now.mono - x.mono <= sm.WINDOW_15M_S]
    assert all(x.namespaces is rows for x in recent)  # the namespaces' windows reach 15 minutes
    assert all(x.namespaces.rows == {} for x in got if now.mono - x.mono > sm.WINDOW_15M_S + 4)
    assert s.since(now, sm.WINDOW_15M_S).namespaces is rows
    assert now.mono - s.since(now, sm.RETAIN_S).mono >= sm.RETAIN_S - 1
    s.now()  # a request's sample is not kept: it would take a periodic one's place
    assert s.samples() == got
