"""The event log's contract: contiguous seqs, a bounded ring whose overflow readers see as a gap,
blocking reads, validation that names the problem, and snapshots to resynchronize from."""

from __future__ import annotations

import threading
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvstore.errors import InvalidArgument, StoreClosed
from kvstore.event_log import (
    SNAPSHOT_CHUNK_KEYS,
    CacheEvent,
    EventBatch,
    EventLog,
    snapshot_events,
)


def _store(log: EventLog, i: int, tier: str = "host") -> int:
    return log.append("stored", tier, [b"k%d" % i], [b"ns"])


def _read_all(log: EventLog, cursor: int) -> list[CacheEvent]:
    out: list[CacheEvent] = []
    while cursor < log.head:
        batch = log.read(cursor, limit=7)
        assert not batch.gap
        out.extend(batch.events)
        cursor = batch.next_cursor
    return out


def test_seqs_start_at_one_and_are_contiguous() -> None:
    log = EventLog(capacity=16)
    assert (log.head, log.oldest) == (1, 1)
    seqs = [_store(log, i) for i in range(10)]
    assert seqs == list(range(1, 11))
    assert (log.head, log.oldest, log.dropped) == (11, 1, 0)
    batch = log.read(1, limit=100)
    assert [e.seq for e in batch.events] == seqs
    assert [e.keys for e in batch.events] == [(b"k%d" % i,) for i in range(10)]
    assert batch.next_cursor == 11 and not batch.gap
    assert log.read(4, limit=3).events == batch.events[3:6]
    assert log.read(11) == EventBatch((), 11, False, epoch=log.epoch)


def test_event_fields() -> None:
    log = EventLog()
    before = time.time()
    log.append("moved", "hbm", [b"a", b"b"], [b"n", None], reason="demoted", to_tier="host")
    log.append("cleared", "", [], [], namespace_id=b"n")
    moved, cleared = log.read(1).events
    assert moved == CacheEvent(1, moved.at, "moved", "hbm", (b"a", b"b"), (b"n", None),
                               "demoted", "host", None)
    assert before <= moved.at <= cleared.at <= time.time()
    assert (cleared.kind, cleared.tier, cleared.keys, cleared.namespace_id) == (
        "cleared", "", (), b"n")


def test_ring_overflow_reports_a_gap_exactly_past_the_window() -> None:
    log = EventLog(capacity=4)
    for i in range(10):
        _store(log, i)
    assert (log.head, log.oldest, log.dropped) == (11, 7, 6)
    for cursor in range(1, 7):
        assert log.read(cursor) == EventBatch((), 7, True, epoch=log.epoch)
    batch = log.read(7)
    assert [e.seq for e in batch.events] == [7, 8, 9, 10] and not batch.gap
    # the window wraps the ring: a read across the wrap keeps its order
    assert [e.seq for e in log.read(8, limit=3).events] == [8, 9, 10]


def test_a_reader_past_the_window_resynchronizes_from_a_snapshot() -> None:
    log = EventLog(capacity=3)
    model: dict[str, dict[bytes, bytes | None]] = {"host": {}}
    cursor = log.head
    for i in range(6):
        model["host"][b"k%d" % i] = b"ns"
        _store(log, i)
    batch = log.read(cursor)
    assert batch.gap and batch.events == () and batch.next_cursor == log.oldest == 4
    snap = snapshot_events({t: list(m.items()) for t, m in model.items()}, log.head, time.time())
    assert snap.cursor == 7
    assert [(e.seq, e.kind, set(e.keys)) for e in snap.events] == [
        (0, "stored", {b"k%d" % i for i in range(6)})]
    _store(log, 6)
    after = log.read(snap.cursor)
    assert [e.keys for e in after.events] == [(b"k6",)] and not after.gap


def test_snapshot_groups_by_tier_and_namespace_in_chunks() -> None:
    n = SNAPSHOT_CHUNK_KEYS + 5
    contents: dict[str, list[tuple[bytes, bytes | None]]] = {
        "hbm": [(b"x%d" % i, b"a") for i in range(n)] + [(b"y", None), (b"z", b"b")],
        "disk": [],
        "host": [(b"w", b"a")],
    }
    snap = snapshot_events(contents, 5, 12.5)
    assert snap.cursor == 5
    assert [(e.tier, len(e.keys), e.namespace_ids[0]) for e in snap.events] == [
        ("hbm", SNAPSHOT_CHUNK_KEYS, b"a"), ("hbm", 5, b"a"), ("hbm", 1, None),
        ("hbm", 1, b"b"), ("host", 1, b"a")]
    assert all(e.seq == 0 and e.at == 12.5 and e.kind == "stored" for e in snap.events)
    assert all(len(e.namespace_ids) == len(e.keys) for e in snap.events)
    assert [k for e in snap.events[:2] for k in e.keys] == [k for k, _ in contents["hbm"][:n]]
    with pytest.raises(InvalidArgument, match="cursor"):
        snapshot_events({}, 0, 0.0)


def test_bad_arguments_are_rejected() -> None:
    with pytest.raises(InvalidArgument, match="capacity"):
        EventLog(capacity=0)
    log = EventLog()
    _store(log, 0)
    with pytest.raises(InvalidArgument, match=r"cursor 3 is outside \[1, head=2\]"):
        log.read(3)
    with pytest.raises(InvalidArgument, match="cursor 0"):
        log.read(0)
    with pytest.raises(InvalidArgument, match="limit"):
        log.read(1, limit=0)
    with pytest.raises(InvalidArgument, match="timeout_s"):
        log.read(1, timeout_s=-1)


@pytest.mark.parametrize(("args", "kwargs", "message"), [
    (("evicted", "host", [b"k"], [None]), {}, "unknown event kind 'evicted'"),
    (("stored", "host", [b"k"], [None]), {"reason": "evicted"}, "'stored' event takes no reason"),
    (("removed", "host", [b"k"], [None]), {}, "'removed' event takes a reason in"),
    (("removed", "host", [b"k"], [None]), {"reason": "demoted"}, "got reason='demoted'"),
    (("moved", "host", [b"k"], [None]), {"reason": "evicted", "to_tier": "disk"},
     "'moved' event takes a reason in \\['demoted', 'promoted'\\]"),
    (("moved", "host", [b"k"], [None]), {"reason": "demoted"}, "needs a to_tier"),
    (("moved", "host", [b"k"], [None]), {"reason": "demoted", "to_tier": "host"},
     "to_tier other than its tier 'host'"),
    (("stored", "host", [b"k"], [None]), {"to_tier": "disk"}, "only a 'moved' event has a to_tier"),
    (("stored", "host", [], []), {}, "needs at least one key"),
    (("removed", "host", [b"k", b"j"], [None]), {"reason": "deleted"},
     "2 keys, 1 namespace ids"),
    (("stored", "", [b"k"], [None]), {}, "needs a tier"),
    (("stored", "host", [b"k"], [None]), {"namespace_id": b"n"},
     "only a 'cleared' event has a namespace_id"),
    (("cleared", "host", [b"k"], [None]), {}, "'cleared' event carries no keys"),
    (("cleared", "host", [], []), {"reason": "deleted"}, "'cleared' event takes no reason"),
])
def test_bad_combinations_name_the_problem(args: tuple, kwargs: dict, message: str) -> None:
    log = EventLog()
    with pytest.raises(InvalidArgument, match=message):
        log.append(*args, **kwargs)
    assert log.head == 1  # nothing appended


def _read_in_thread(log: EventLog, cursor: int, timeout_s: float) -> tuple[threading.Thread,
                                                                           list[EventBatch]]:
    got: list[EventBatch] = []
    t = threading.Thread(target=lambda: got.append(log.read(cursor, timeout_s=timeout_s)))
    t.start()
    deadline = time.monotonic() + 5
    while log._waiters == 0 and time.monotonic() < deadline:  # until it blocks
        time.sleep(0.001)
    assert log._waiters == 1
    return t, got


def test_a_blocking_read_wakes_on_append() -> None:
    log = EventLog()
    start = time.monotonic()
    t, got = _read_in_thread(log, 1, timeout_s=30)
    _store(log, 0)
    t.join(10)
    assert not t.is_alive() and time.monotonic() - start < 10
    assert [e.seq for e in got[0].events] == [1] and got[0].next_cursor == 2
    assert log._waiters == 0


def test_a_blocking_read_wakes_on_close_and_a_closed_log_drains_then_ends() -> None:
    log = EventLog()
    _store(log, 0)
    t, got = _read_in_thread(log, 2, timeout_s=30)
    log.close()
    t.join(10)
    assert not t.is_alive()
    assert got == [EventBatch((), 2, False, True, log.epoch)]
    start = time.monotonic()
    drained = log.read(1, timeout_s=30)  # what is retained, at once
    assert [e.seq for e in drained.events] == [1]
    assert (drained.next_cursor, drained.gap, drained.closed) == (2, False, True)
    assert log.read(2, timeout_s=30) == EventBatch((), 2, False, True, log.epoch)
    assert time.monotonic() - start < 5
    with pytest.raises(StoreClosed, match="the event log is closed"):
        _store(log, 1)


def test_a_blocking_read_times_out_empty() -> None:
    log = EventLog()
    start = time.monotonic()
    assert log.read(1, timeout_s=0.05) == EventBatch((), 1, False, epoch=log.epoch)
    assert time.monotonic() - start >= 0.04


def test_concurrent_appends_are_contiguous_and_lose_nothing() -> None:
    threads, per_thread = 8, 400
    log = EventLog(capacity=threads * per_thread)
    barrier = threading.Barrier(threads)

    def work(t: int) -> None:
        barrier.wait()
        for i in range(per_thread):
            log.append("stored", "host", [b"%d:%d" % (t, i)], [None])

    workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(30)
    events = _read_all(log, 1)
    assert [e.seq for e in events] == list(range(1, threads * per_thread + 1))
    assert log.dropped == 0
    for t in range(threads):  # each appender's events, all present, in its own order
        mine = [e.keys[0] for e in events if e.keys[0].startswith(b"%d:" % t)]
        assert mine == [b"%d:%d" % (t, i) for i in range(per_thread)]


_ops = st.lists(st.one_of(
    st.tuples(st.just("append"), st.integers(1, 4)),
    st.tuples(st.just("read"), st.integers(1, 5)),
), max_size=60)


@given(capacity=st.integers(1, 6), ops=_ops)
def test_a_reader_sees_every_event_in_order_or_a_gap_exactly_when_it_lost_some(
        capacity: int, ops: list[tuple[str, int]]) -> None:
    log = EventLog(capacity=capacity)
    history: list[CacheEvent] = []  # every event ever appended; history[s - 1].seq == s
    cursor = log.head
    seen: list[CacheEvent] = []  # what the reader got since it (re)started at `origin`
    origin = cursor
    for op, n in ops:
        if op == "append":
            for _ in range(n):
                seq = _store(log, len(history))
                history.append(log.read(seq).events[0])
            continue
        batch = log.read(cursor, limit=n)
        lost = cursor < len(history) + 1 - capacity  # an event it had not read was dropped
        assert batch.gap == lost
        if batch.gap:
            assert batch.events == () and batch.next_cursor == log.oldest
            assert seen == history[origin - 1:cursor - 1]
            cursor = origin = log.head  # resynchronize: a snapshot's cursor is the head
            seen = []
            continue
        assert batch.events == tuple(history[cursor - 1:cursor - 1 + n])
        assert batch.next_cursor == cursor + len(batch.events)
        seen.extend(batch.events)
        cursor = batch.next_cursor
    if cursor >= log.oldest:  # drain: the concatenation is exactly the history from origin
        seen.extend(_read_all(log, cursor))
        assert seen == history[origin - 1:]
        assert [e.seq for e in seen] == list(range(origin, len(history) + 1))


def test_a_cursor_of_another_log_is_a_gap_never_a_misreading() -> None:
    """A restarted store's log numbers its events from 1 again: a consumer's cursor from the
    old one must not read the new one's events as if nothing happened in between."""
    old, new = EventLog(8), EventLog(8)
    for log in (old, new):
        for _ in range(3):
            log.append("stored", "host", [b"k" * 16], [None])
    assert old.epoch != new.epoch
    batch = new.read(2, epoch=old.epoch)
    assert batch.gap and batch.events == () and batch.epoch == new.epoch
    assert not new.read(2, epoch=new.epoch).gap
