"""The reference indexer mirrors a node exactly from its event stream alone (gaps included), and
answers longest-prefix queries across nodes."""

from __future__ import annotations

import threading
import time
from typing import Any
from collections.abc import Callable

from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule

from kvstore.event_log import EventBatch, EventLog, Snapshot, snapshot_events
from kvstore.indexer import Indexer, Match

TIERS = ("hbm", "host", "disk")  # fastest first
KEYS = tuple(b"k%d" % i for i in range(6))
NAMESPACES = (b"a", b"b")

Model = dict[str, dict[bytes, bytes | None]]


def _snapshot(model: Model, log: EventLog) -> Snapshot:
    return snapshot_events({t: list(m.items()) for t, m in model.items()}, log.head, time.time())


def _expected(model: Model) -> dict[str, set[bytes]]:
    return {t: set(m) for t, m in model.items() if m}


class IndexerMachine(RuleBasedStateMachine):
    """A model store whose every mutation is appended to a small log (so a lagging consumer
    meets gaps); an Indexer fed only through read() batches, resynchronized from snapshots of
    the model, must end up knowing exactly the model's contents."""

    @initialize()
    def start(self) -> None:
        self.model: Model = {t: {} for t in TIERS}
        self.log = EventLog(capacity=8)
        self.indexer = Indexer()
        self.indexer.apply_snapshot("node", _snapshot(self.model, self.log))
        self.cursor = self.log.head
        #: cursor -> what the indexer knows once it has applied every event before it
        self.expected_at: dict[int, dict[str, set[bytes]]] = {self.cursor: {}}
        # a second node the stream never touches: its knowledge must stay put
        other = snapshot_events({"host": [(b"k0", b"a")]}, 1, 0.0)
        self.indexer.apply_snapshot("other", other)

    def _append(self, *args: Any, **kwargs: Any) -> None:
        seq = self.log.append(*args, **kwargs)
        self.expected_at[seq + 1] = _expected(self.model)

    def _present(self, tier: str, keys: list[bytes]) -> list[bytes]:
        return [k for k in keys if k in self.model[tier]]

    @rule(tier=st.sampled_from(TIERS), ns=st.sampled_from(NAMESPACES),
          keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=4, unique=True))
    def store(self, tier: str, ns: bytes, keys: list[bytes]) -> None:
        self.model[tier].update(dict.fromkeys(keys, ns))
        self._append("stored", tier, keys, [ns] * len(keys))

    @rule(tier=st.sampled_from(TIERS), keys=st.lists(st.sampled_from(KEYS), unique=True),
          reason=st.sampled_from(["evicted", "deleted", "expired", "corrupt"]),
          known=st.booleans())
    def remove(self, tier: str, keys: list[bytes], reason: str, known: bool) -> None:
        keys = self._present(tier, keys)
        if keys:
            ids = [self.model[tier].pop(k) for k in keys]
            self._append("removed", tier, keys, ids if known else [None] * len(keys),
                            reason=reason)

    @rule(src=st.sampled_from(TIERS), dst=st.sampled_from(TIERS),
          keys=st.lists(st.sampled_from(KEYS), unique=True), known=st.booleans())
    def move(self, src: str, dst: str, keys: list[bytes], known: bool) -> None:
        keys = self._present(src, keys)
        if src == dst or not keys:
            return
        reason = "demoted" if TIERS.index(dst) > TIERS.index(src) else "promoted"
        ids = []
        for k in keys:
            ns = self.model[src].pop(k)
            self.model[dst][k] = ns
            ids.append(ns if known else None)  # None: the indexer keeps what it knew
        self._append("moved", src, keys, ids, reason=reason, to_tier=dst)

    @rule(src=st.sampled_from(TIERS[1:]), keys=st.lists(st.sampled_from(KEYS), unique=True))
    def promote_by_copy(self, src: str, keys: list[bytes]) -> None:
        """A copy up that keeps the lower copy is a "stored" event in the upper tier."""
        keys = self._present(src, keys)
        if keys:
            dst = TIERS[TIERS.index(src) - 1]
            ids = [self.model[src][k] for k in keys]
            self.model[dst].update(zip(keys, ids))
            self._append("stored", dst, keys, ids)

    @rule(tier=st.sampled_from(("", *TIERS)), ns=st.sampled_from((None, *NAMESPACES)))
    def clear(self, tier: str, ns: bytes | None) -> None:
        for t in TIERS if not tier else (tier,):
            for k in [k for k, n in self.model[t].items() if ns is None or n == ns]:
                del self.model[t][k]
        self._append("cleared", tier, [], [], namespace_id=ns)

    @rule(n=st.integers(5, 12), tier=st.sampled_from(TIERS))
    def fall_behind(self, n: int, tier: str) -> None:
        """A burst the consumer does not read: it skips reading while the ring moves on."""
        for i in range(n):
            self.store(tier, NAMESPACES[i % 2], [KEYS[i % len(KEYS)]])

    @rule(limit=st.integers(1, 6))
    def read(self, limit: int) -> None:
        batch = self.log.read(self.cursor, limit=limit)
        if batch.gap:
            event("gap")
            snap = _snapshot(self.model, self.log)
            self.indexer.apply_snapshot("node", snap)
            self.cursor = snap.cursor
            return
        assert [e.seq for e in batch.events] == list(range(self.cursor, batch.next_cursor))
        for e in batch.events:
            self.indexer.apply("node", e)
        self.cursor = batch.next_cursor
        assert self.indexer.contents("node") == self.expected_at[self.cursor]

    @rule(limit=st.integers(1, 6))
    def catch_up(self, limit: int) -> None:
        while self.cursor < self.log.head:
            self.read(limit)
        assert self.indexer.contents("node") == _expected(self.model)
        for key in KEYS:
            assert self.indexer.tiers_of("node", key) == {
                t for t in TIERS if key in self.model[t]}

    def teardown(self) -> None:
        if hasattr(self, "log"):
            self.catch_up(3)
            assert self.indexer.contents("other") == {"host": {b"k0"}}


IndexerMachine.TestCase.settings = settings(
    settings.get_profile(settings._current_profile or "ci"),
    stateful_step_count=40,
)
TestIndexerMachine = IndexerMachine.TestCase


def _feed(indexer: Indexer, node: str, contents: dict[str, list[bytes]]) -> None:
    log = EventLog()
    for tier, keys in contents.items():
        log.append("stored", tier, keys, [b"ns"] * len(keys))
    for e in log.read(1).events:
        indexer.apply(node, e)


def test_longest_prefix_across_nodes() -> None:
    indexer = Indexer()
    _feed(indexer, "node-b", {"host": [b"k0"], "disk": [b"k0", b"k1"]})
    _feed(indexer, "node-a", {"hbm": [b"k0", b"k1"], "disk": [b"k1", b"k2"], "host": [b"k4"]})
    _feed(indexer, "node-d", {"disk": [b"k0", b"k1"]})
    _feed(indexer, "node-c", {"hbm": [b"k1", b"k2", b"k3"]})  # lacks k0: matches nothing
    query = [b"k0", b"k1", b"k2", b"k3", b"k4"]
    assert indexer.longest_prefix(query, tier_order=TIERS) == [
        Match("node-a", 3, ("hbm", "hbm", "disk")),  # k4 is held, but the run stopped at k3
        Match("node-b", 2, ("host", "disk")),
        Match("node-d", 2, ("disk", "disk")),
    ]
    # without an order, a key in several tiers reports them by name; unnamed tiers go last
    assert indexer.longest_prefix(query)[0] == Match("node-a", 3, ("hbm", "disk", "disk"))
    assert indexer.longest_prefix(query[:2], tier_order=["host"])[:2] == [
        Match("node-a", 2, ("hbm", "disk")), Match("node-b", 2, ("host", "disk"))]
    assert indexer.longest_prefix([b"zz"]) == []
    indexer.forget("node-a")
    assert [m.node for m in indexer.longest_prefix(query)] == ["node-b", "node-d"]


def test_moves_keep_the_namespace_and_clears_spare_unknown_ones() -> None:
    log, indexer = EventLog(), Indexer()
    log.append("stored", "hbm", [b"x", b"y"], [b"a", None])
    log.append("moved", "hbm", [b"x", b"y"], [None, None], reason="demoted", to_tier="host")
    log.append("cleared", "", [], [], namespace_id=b"a")  # x was a's; y's namespace is unknown
    for e in log.read(1).events:
        indexer.apply("n", e)
    assert indexer.contents("n") == {"host": {b"y"}}


def test_a_clear_reaches_only_its_tier_and_namespace() -> None:
    indexer = Indexer()
    stored = EventLog()
    for tier in TIERS:
        stored.append("stored", tier, [b"x", b"y"], [b"a", b"b"])
    cases: list[tuple[str, bytes | None, dict[str, set[bytes]]]] = [
        ("host", None, {"hbm": {b"x", b"y"}, "disk": {b"x", b"y"}}),
        ("host", b"a", {"hbm": {b"x", b"y"}, "host": {b"y"}, "disk": {b"x", b"y"}}),
        ("", b"a", {t: {b"y"} for t in TIERS}),
        ("", None, {}),
    ]
    for tier, ns, expected in cases:
        log = EventLog()
        log.append("cleared", tier, [], [], namespace_id=ns)
        for e in stored.read(1).events + log.read(1).events:
            indexer.apply(f"{tier}/{ns!r}", e)
        assert indexer.contents(f"{tier}/{ns!r}") == expected, (tier, ns)


class _Source:
    """A node: a model store and its log, mutated and snapshotted under one lock."""

    def __init__(self, capacity: int) -> None:
        self.lock = threading.Lock()
        self.model: Model = {t: {} for t in TIERS}
        self.log = EventLog(capacity=capacity)
        self.snapshots = 0

    def store(self, tier: str, key: bytes) -> None:
        with self.lock:
            self.model[tier][key] = b"ns"
            self.log.append("stored", tier, [key], [b"ns"])

    def demote(self, key: bytes) -> None:
        with self.lock:
            self.model["host"][key] = self.model["hbm"].pop(key)
            self.log.append("moved", "hbm", [key], [None], reason="demoted", to_tier="host")

    def snapshot(self) -> Snapshot:
        with self.lock:
            self.snapshots += 1
            return _snapshot(self.model, self.log)

    def read(self, cursor: int, timeout_s: float) -> EventBatch:
        return self.log.read(cursor, timeout_s=timeout_s)


class _Node:
    """A _Source as Indexer.follow reads a store: read_events / event_snapshot."""

    def __init__(self, src: _Source, read: Callable[[int, float], EventBatch]) -> None:
        self.src, self.read = src, read

    def read_events(self, cursor: int | None = None, *, limit: int = 1024,
                    timeout_s: float = 0.0, epoch: bytes | None = None,
                    namespace_id: bytes | None = None) -> EventBatch:
        assert cursor is not None
        return self.read(cursor, timeout_s)

    def event_snapshot(self, *, namespace_id: bytes | None = None) -> Snapshot:
        return self.src.snapshot()


def _follow(indexer: Indexer, read: Callable[[int, float], EventBatch], src: _Source,
            stop: threading.Event) -> threading.Thread:
    t = threading.Thread(target=indexer.follow, args=("node", _Node(src, read)),
                         kwargs={"stop": stop, "timeout_s": 0.05}, daemon=True)
    t.start()
    return t


def _eventually(check: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "the indexer never caught up"
        time.sleep(0.005)


def test_follow_mirrors_a_node_until_stopped() -> None:
    src, indexer, stop = _Source(capacity=64), Indexer(), threading.Event()
    src.store("disk", b"old")  # before following: arrives through the first snapshot
    thread = _follow(indexer, src.read, src, stop)
    for i in range(20):
        src.store("hbm", b"k%d" % i)
    for i in range(0, 20, 2):
        src.demote(b"k%d" % i)
    _eventually(lambda: indexer.contents("node") == _expected(src.model))
    stop.set()
    thread.join(5)
    assert not thread.is_alive()
    assert src.snapshots == 1


def test_follow_resynchronizes_after_a_gap_and_ends_when_the_log_closes() -> None:
    src, indexer, stop = _Source(capacity=4), Indexer(), threading.Event()
    in_read, go = threading.Event(), threading.Event()

    def slow_read(cursor: int, timeout_s: float) -> EventBatch:
        if not go.is_set():  # hold the first read until the ring has moved past its cursor
            in_read.set()
            go.wait(10)
        return src.read(cursor, timeout_s)

    thread = _follow(indexer, slow_read, src, stop)
    assert in_read.wait(10)
    for i in range(10):
        src.store("hbm", b"k%d" % i)
    go.set()
    _eventually(lambda: indexer.contents("node") == _expected(src.model))
    assert src.snapshots == 2  # the start, then the gap
    src.store("disk", b"late")
    _eventually(lambda: indexer.contents("node") == _expected(src.model))
    src.log.close()
    thread.join(5)
    assert not thread.is_alive() and not stop.is_set()
