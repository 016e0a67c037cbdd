"""Interleavings of two store operations, chosen by hypothesis, with ``check_integrity`` after
every step: the policies track exactly what their tiers hold, no leased page is lost, no read
returns wrong bytes.

The store does its tier I/O outside its lock, so another thread's operation can run between a
writer's choice of victims, their write-back, their deletion, its own write and the admission
of what it wrote -- and between a read and the policy update that follows it. Each step of the
state machine runs operation A on a thread that a gate stops at one chosen tier I/O call (before
or after a ``read`` or ``write`` of one tier: the points between which the store releases its
lock), runs operation B to completion meanwhile, then lets A finish. The interleaving is thus
deterministic (one thread runs at a time), hypothesis can shrink a failing one, and every step
ends between operations, where ``check_integrity`` holds.

Real host tiers (:class:`GatedHostTier` only adds the stop): the gate changes no behaviour.

Issue 42 added the windows of the lease guarantee (a page a leased lookup reported stays in
that tier until the lease ends): a gate in a tier's ``delete`` (which the store runs under its
lock, between a victim's choice and write-back and its removal), after a lookup's scan of a
tier (between the scan and the lease), between a leased lookup and its get (``lease_get``), and
in the copies A leaves to the store's mover and prefetch threads (between a promotion's or
prefetch's read and its write, and that write and its admission). While A is stopped holding
the store lock, B runs until it has to wait for that lock (:class:`WatchedLock` tells), then A
goes on; B's waiting is expected there, not a defect.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest
import xxhash
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from kvstore import KVLayout, Metrics, Namespace, TieredStore
from kvstore.keys import BlockMeta
from kvstore.tiers.host import HostTier

LAYOUT = KVLayout(1, 1, 4, 2, "float16")  # 32-byte pages
NS = Namespace("interleavings", LAYOUT)
CHAINS = [NS.chain([1, 2, 3, 4] + [p * 100 + i for i in range(4)]) for p in range(3)]  # 4 blocks each
METAS = {m.key: m for c in CHAINS for m in c.metas()}
KEYS = sorted(METAS)
#: how long one operation may wait for the other before the step counts as a deadlock
WAIT_S = 5.0


def page_of(key: bytes) -> np.ndarray:
    raw = b"".join(xxhash.xxh3_128_digest(key + bytes([i])) for i in range(2))
    return np.frombuffer(raw, dtype=np.uint8)


#: the store's own threads: A's background copies (promotions, prefetches) run there
STORE_THREADS = ("kvstore-mover", "kvstore-prefetch")


class Gate:
    """Stops operation A at the ``nth`` matching tier call until :meth:`open`: a call on A's
    thread, or on one of the store's threads while A runs (before B starts: its copies)."""

    def __init__(self, tier: str, method: str, phase: str, nth: int) -> None:
        self.where = (tier, method, phase)
        self.left = nth
        self.thread: threading.Thread | None = None
        #: the thread that stopped (A's, or a store thread running A's copy)
        self.stopped_thread: threading.Thread | None = None
        #: set when B starts: from then on only A's own thread matches
        self.b_started = False
        self.stopped = threading.Event()
        self._go = threading.Event()

    def at(self, tier: str, method: str, phase: str) -> None:
        me = threading.current_thread()
        ours = me is self.thread or (
            not self.b_started and me.name.startswith(STORE_THREADS))
        if not ours or (tier, method, phase) != self.where:
            return
        self.left -= 1
        if self.left == 0:
            self.stopped_thread = me
            self.stopped.set()
            assert self._go.wait(WAIT_S), "the gate was never opened"

    def open(self) -> None:
        self._go.set()


class WatchedLock:
    """The store's lock (an RLock) that tells who holds it and who waits for it, so the
    harness sees B waiting for a lock that A holds while stopped."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self.owner: threading.Thread | None = None
        self._depth = 0
        self.waiting: set[threading.Thread] = set()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        me = threading.current_thread()
        got = self._lock.acquire(blocking=False)
        if not got and blocking:
            self.waiting.add(me)
            try:
                got = self._lock.acquire(True, timeout)
            finally:
                self.waiting.discard(me)
        if got:
            self.owner = me
            self._depth += 1
        return got

    def release(self) -> None:
        self._depth -= 1
        if not self._depth:
            self.owner = None
        self._lock.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


class GatedHostTier(HostTier):
    """A host tier whose ``read`` and ``write`` pass the test's gate before and after the I/O."""

    gate: Gate | None = None

    def _pass(self, method: str, phase: str) -> None:
        if self.gate is not None:
            self.gate.at(self.name, method, phase)

    def read(self, namespace_id: bytes, keys: Sequence[bytes], outs: Sequence[np.ndarray],
             *tally: Any) -> list[bool]:
        self._pass("read", "before")
        found = super().read(namespace_id, keys, outs, *tally)
        self._pass("read", "after")
        return found

    def write(self, metas: Sequence[BlockMeta], pages: Sequence[np.ndarray]) -> list[bool]:
        self._pass("write", "before")
        stored = super().write(metas, pages)
        self._pass("write", "after")
        return stored

    def delete(self, keys: Sequence[bytes]) -> int:
        # the store deletes under its lock: a victim's removal, after its choice and write-back
        self._pass("delete", "before")
        n = super().delete(keys)
        self._pass("delete", "after")
        return n

    def count_leading_checked(self, keys: Sequence[bytes], *tally: Any) -> int:
        # a lookup's scan of this tier, without the store lock, before its lease
        self._pass("scan", "before")
        n = super().count_leading_checked(keys, *tally)
        self._pass("scan", "after")
        return n


keys_st = st.lists(st.sampled_from(KEYS), min_size=1, max_size=3)
op_st = st.one_of(
    st.tuples(st.just("put"), keys_st, st.sampled_from(["fast", "slow"])),
    st.tuples(st.just("get"), keys_st, st.just("")),
    st.tuples(st.just("lease"), st.integers(0, 2), st.just("")),
    st.tuples(st.just("evict"), st.integers(1, 3), st.sampled_from(["fast", "slow"])),
    st.tuples(st.just("stage_load"), keys_st, st.just("")),
    st.tuples(st.just("stage_store"), st.integers(0, 2), st.just("")),
    st.tuples(st.just("delete"), keys_st, st.just("")),
    st.tuples(st.just("lease_get"), st.integers(0, 2), st.just("")),
    st.tuples(st.just("prefetch"), keys_st, st.just("")),
)
gate_st = st.sampled_from(
    [(tier, method, phase, nth) for tier in ("fast", "slow")
     for method in ("read", "write", "delete", "scan") for phase in ("before", "after")
     for nth in (1, 2)]
    + [("store", "lease_get", "between", 1)]  # between a leased lookup and its get
)
lease_st = st.tuples(st.sampled_from(["lease", "lease_get"]), st.integers(0, 2), st.just(""))
#: B: any one or two operations, or a leased lookup first (its scan then runs while A is
#: stopped, whatever B does next) -- the lease windows' half of the draws
b_st = st.one_of(st.lists(op_st, min_size=1, max_size=2),
                 st.tuples(lease_st, st.lists(op_st, max_size=1)).map(lambda t: [t[0], *t[1]]))


class Interleavings(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        m = Metrics()
        self.fast = GatedHostTier.build("fast", LAYOUT, 4, m, pin_memory=False)
        self.slow = GatedHostTier.build("slow", LAYOUT, 8, m, pin_memory=False)
        self.store: TieredStore | None = None
        self.lock = WatchedLock()
        self.gate: Gate | None = None
        self.leases: list[Any] = []
        self.wrong = 0
        #: pages a lease_get's lookup reported that its tier lacked before the get, or that the
        #: get did not find
        self.evicted = self.lost = 0
        self.stopped = False  # whether the last step's gate stopped A
        self.prefetching: set[threading.Thread] = set()  # threads waiting for a prefetch
        self.loading: list[Any] = []  # leases of lease_get ops between their lookup and get

    @initialize(write_policy=st.sampled_from(["write_back", "write_through", "selective"]),
          policies=st.tuples(st.sampled_from(["lru", "s3fifo", "arc", "lineage"]),
                             st.sampled_from(["lru", "lineage_arc"])),
          promote=st.booleans())
    def open(self, write_policy: str, policies: tuple[str, str], promote: bool) -> None:
        self.store = TieredStore(LAYOUT, [self.fast, self.slow], list(policies),
                                 write_policy=write_policy,  # type: ignore[arg-type]
                                 selective_hits=1, promote_on_hit=promote, lease_ttl_s=600.0)
        self.store._st.lock = self.lock  # the same kind of lock, watched (no behaviour changes)

    def _run(self, op: tuple[str, Any, str]) -> None:
        s = self.store
        assert s is not None
        kind, arg, tier = op
        if kind == "put":
            s.put([METAS[k] for k in arg], np.stack([page_of(k) for k in arg]), tier=tier)
        elif kind == "get":
            out = np.zeros((len(arg), LAYOUT.page_bytes), np.uint8)
            res = s.get(NS.id, arg, out)
            self.wrong += sum(f and not np.array_equal(b, page_of(k))
                              for k, f, b in zip(arg, res.found, out))
        elif kind == "lease":
            res = s.lookup(CHAINS[arg].keys, lease=True)
            if res.lease is not None:
                self.leases.append((res.lease, res.tiers))
        elif kind == "lease_get":
            res = s.lookup(CHAINS[arg].keys, lease=True)
            if res.lease is None:
                return
            self.loading.append(res.lease)  # B's deletes spare its keys, as a lease's
            if self.gate is not None:
                self.gate.at("store", "lease_get", "between")
            keys = list(res.lease.keys)
            self.evicted += sum(not s.tier(t).contains([k])[0] for k, t in zip(keys, res.tiers))
            out = np.zeros((len(keys), LAYOUT.page_bytes), np.uint8)
            got = s.get(NS.id, keys, out, lease=res.lease)
            self.loading.remove(res.lease)
            self.lost += len(keys) - got.num_found
            self.wrong += sum(f and not np.array_equal(b, page_of(k))
                              for k, f, b in zip(keys, got.found, out))
        elif kind == "prefetch":
            me = threading.current_thread()
            self.prefetching.add(me)  # waits for a prefetch thread: see blocked_by_lock
            try:
                s.prefetch(NS.id, arg).result(WAIT_S)
            finally:
                self.prefetching.discard(me)
        elif kind == "evict":
            s.evict(arg, tier=tier)
        elif kind == "stage_load":
            h = s.prepare_load(NS.id, arg)
            self.wrong += sum(not np.array_equal(h.slab[i], page_of(k))
                              for k, i in zip(h.keys, h.slots))
            s.complete_load(h)
        elif kind == "stage_store":
            h = s.prepare_store(CHAINS[arg].metas())
            for meta, slot in zip(h.metas, h.slots):
                h.slab[slot] = page_of(meta.key)
            s.complete_store(h)
        elif kind == "delete":
            # a delete never takes a page a lease pins in this model (the store allows it: an
            # explicit delete is the caller's); leased pages are what the step checks
            pinned = {k for lease, _ in self.leases for k in lease.keys}
            pinned.update(k for lease in self.loading for k in lease.keys)
            keep = [k for k in arg if k not in pinned]
            if keep:
                s.delete(keep)

    @rule(a=op_st, gate=gate_st, b=b_st)
    def interleave(self, a: tuple[str, Any, str], gate: tuple[str, str, str, int],
                   b: list[tuple[str, Any, str]]) -> None:
        assert self.store is not None
        g = Gate(*gate)
        errors: list[BaseException] = []

        def run(*ops: tuple[str, Any, str], drain: bool = False) -> Callable[[], None]:
            def body() -> None:
                try:
                    for op in ops:
                        self._run(op)
                    if drain:  # A's background copies are part of A
                        assert self.store is not None and self.store.drain(2 * WAIT_S)
                except BaseException as exc:  # noqa: BLE001 - re-raised below
                    errors.append(exc)
            return body

        ta = threading.Thread(target=run(a, drain=True))
        g.thread = ta
        self.fast.gate = self.slow.gate = self.gate = g
        ta.start()
        while ta.is_alive() and not g.stopped.wait(0.01):
            pass  # A runs until the gate stops it, or to its end
        g.b_started = True
        # A stopped holding the store lock (a delete runs under it): B may have to wait for it
        a_locks = g.stopped.is_set() and self.lock.owner is g.stopped_thread
        # A's copy stopped on the mover: B's copies queue behind it
        a_moves = g.stopped.is_set() and g.stopped_thread is not ta
        tb = threading.Thread(target=run(*b))
        tb.start()
        deadline = time.monotonic() + WAIT_S
        while tb.is_alive() and time.monotonic() < deadline:
            if a_locks and self.blocked_by_lock(tb):
                break  # B ran up to the lock A holds
            tb.join(0.002)
        waits_for_lock = a_locks and self.blocked_by_lock(tb)
        stuck = False
        if not waits_for_lock:
            stuck = tb.is_alive() or (not a_locks and not a_moves
                                      and not self.store.drain(WAIT_S))  # B's copies too
        g.open()
        ta.join(2 * WAIT_S)
        tb.join(WAIT_S)
        self.fast.gate = self.slow.gate = self.gate = None
        self.stopped = g.stopped.is_set()
        assert not stuck, f"{b} waited for {a} stopped in tier I/O ({gate})"
        assert not ta.is_alive(), f"{a} never finished"
        assert not tb.is_alive(), f"{b} never finished"
        assert self.store.drain(WAIT_S), "background copies never finished"
        assert not errors, errors
        assert (self.evicted, self.lost) == (0, 0), (
            f"a lease_get's page left its tier ({self.evicted}) or was not read ({self.lost}) "
            f"during {a} / {b} at {gate}")
        # every page a lease pinned is still in the tier the lookup named, with its bytes
        for lease, tiers in self.leases:
            held = [self.store.tier(t).contains([k])[0] for k, t in zip(lease.keys, tiers)]
            assert all(held), f"a leased page was evicted during {a} / {b} at {gate}"
            out = np.zeros((len(lease.keys), LAYOUT.page_bytes), np.uint8)
            res = self.store.get(NS.id, list(lease.keys), out, lease=lease)
            assert all(res.found), f"a leased page was lost after {a} / {b} at {gate}"
            self.wrong += sum(not np.array_equal(b_, page_of(k)) for k, b_ in zip(lease.keys, out))
        self.leases.clear()
        assert self.wrong == 0, "a read returned wrong bytes"

    def blocked_by_lock(self, t: threading.Thread) -> bool:
        """Whether ``t`` waits for the store lock, itself or through the prefetch it waits for."""
        waiting = list(self.lock.waiting)
        return t in waiting or (t in self.prefetching and any(
            w.name.startswith("kvstore-prefetch") for w in waiting))

    @invariant()
    def integrity(self) -> None:
        if self.store is not None:
            self.store.check_integrity()
            for tier, policy in zip(self.store.tiers, self.store.policies):
                assert set(tier.keys()) == set(policy), f"{tier.name}: policy != pages held"

    def teardown(self) -> None:
        if self.store is not None:
            self.store.close()


TestInterleavings = settings(max_examples=200, stateful_step_count=10)(Interleavings).TestCase


FIRST = CHAINS[0].keys
OTHER = CHAINS[1].keys[-1]  # the chains share their first two blocks


# The interleavings behind the defects the fault campaign found (issue 16), each of which made
# ``check_integrity`` or a leased load fail before the store's fixes: (setup puts into "fast"),
# A, where the gate stops A, the operations B.
NAMED = {
    # a delete between a put's write and its admission: the policy tracked the deleted page
    "delete before admission": ([], ("put", [FIRST[0]], "fast"),
                                ("fast", "write", "after", 1), [("delete", [FIRST[0]], "")]),
    # a read hit on a victim whose write-back is in flight re-admitted it; then it was deleted
    "read hit on a retiring victim": (list(FIRST), ("put", [OTHER], "fast"),
                                      ("slow", "write", "before", 1), [("get", [FIRST[0]], "")]),
    # a miss read before a put of the same key removed the page the put had just admitted
    "stale miss": ([], ("get", [FIRST[0]], ""), ("fast", "read", "after", 1),
                   [("put", [FIRST[0]], "fast")]),
    # a victim leased (and read) while its write-back ran was deleted all the same
    "lease on a retiring victim": (list(FIRST), ("put", [OTHER], "fast"),
                                   ("slow", "write", "before", 1),
                                   [("lease", 0, ""), ("get", [FIRST[0]], "")]),
}


@pytest.mark.parametrize("name", sorted(NAMED))
def test_named_interleavings(name: str) -> None:
    setup, a, gate, b = NAMED[name]
    m = Interleavings()
    try:
        m.open("write_back", ("lru", "lru"), False)
        if setup:
            m._run(("put", setup, "fast"))
        m.interleave(a, gate, b)
        m.integrity()
    finally:
        m.teardown()


# The windows of the lease guarantee (issue 42): (where the setup puts FIRST, promote_on_hit),
# A, where the gate stops A, the operations B. The step then checks that every page a lease
# pinned is still in the tier its lookup reported, and that its leased get reads it.
LEASE_WINDOWS = {
    # the defect: the evictor bumped the removal count, then (lock held) deleted its victim;
    # a lookup that read the bumped count and found the victim still there leased it without a
    # re-check once the delete let go of the lock. Here the page survives below (written
    # back) but not in the tier the lookup reported.
    "lease while a victim's delete runs": (("fast", False), ("put", [OTHER], "fast"),
                                           ("fast", "delete", "before", 1), [("lease", 0, "")]),
    # the same in the last tier (nothing below to write back to): the leased get finds nothing
    # -- the symptom of the stress run
    "lease while a last-tier victim's delete runs": (("slow", False), ("evict", 1, "slow"),
                                                     ("slow", "delete", "before", 1),
                                                     [("lease_get", 0, "")]),
    # an eviction, a put and a promotion between a leased lookup and its get
    "evictions between a lookup and its get": (("fast", True), ("lease_get", 0, ""),
                                               ("store", "lease_get", "between", 1),
                                               [("evict", 3, "fast"), ("evict", 3, "slow"),
                                                ("put", list(CHAINS[2].keys), "fast")]),
    # an eviction between a lookup's scan of a tier and its lease
    "eviction between a scan and the lease": (("fast", False), ("lease_get", 0, ""),
                                              ("fast", "scan", "after", 1),
                                              [("evict", 2, "fast")]),
    # a write-back written below and not yet admitted there, its victim still retiring above
    "lease between a write-back and its admission": (("fast", False), ("put", [OTHER], "fast"),
                                                     ("slow", "write", "after", 1),
                                                     [("lease", 0, ""), ("evict", 3, "slow"),
                                                      ("evict", 3, "fast")]),
    # a promotion (on the mover) between its read and its write, and between its write and
    # its admission
    "lease between a promotion's read and its write": (("slow", True), ("get", [FIRST[0]], ""),
                                                       ("fast", "write", "before", 1),
                                                       [("lease", 0, ""), ("evict", 3, "slow")]),
    "lease between a promotion's write and its admission": (("slow", True),
                                                            ("get", [FIRST[0]], ""),
                                                            ("fast", "write", "after", 1),
                                                            [("lease_get", 0, ""),
                                                             ("evict", 3, "fast"),
                                                             ("evict", 3, "slow")]),
    # a prefetch (on the prefetch threads) between its write and its admission
    "lease between a prefetch's write and its admission": (("slow", False),
                                                           ("prefetch", list(FIRST), ""),
                                                           ("fast", "write", "after", 1),
                                                           [("lease", 0, ""),
                                                            ("evict", 3, "fast")]),
}


@pytest.mark.parametrize("name", sorted(LEASE_WINDOWS))
def test_lease_windows(name: str) -> None:
    (where, promote), a, gate, b = LEASE_WINDOWS[name]
    m = Interleavings()
    try:
        m.open("write_back", ("lru", "lru"), promote)
        m._run(("put", list(FIRST), where))
        m.interleave(a, gate, b)
        assert m.stopped, f"A never reached {gate}"
        m.integrity()
    finally:
        m.teardown()
