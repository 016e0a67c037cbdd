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
"""

from __future__ import annotations

import threading
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


class Gate:
    """Stops one thread at the ``nth`` matching tier call until :meth:`open`."""

    def __init__(self, tier: str, method: str, phase: str, nth: int) -> None:
        self.where = (tier, method, phase)
        self.left = nth
        self.thread: threading.Thread | None = None
        self.stopped = threading.Event()
        self._go = threading.Event()

    def at(self, tier: str, method: str, phase: str) -> None:
        if threading.current_thread() is not self.thread or (tier, method, phase) != self.where:
            return
        self.left -= 1
        if self.left == 0:
            self.stopped.set()
            assert self._go.wait(WAIT_S), "the gate was never opened"

    def open(self) -> None:
        self._go.set()


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


keys_st = st.lists(st.sampled_from(KEYS), min_size=1, max_size=3)
op_st = st.one_of(
    st.tuples(st.just("put"), keys_st, st.sampled_from(["fast", "slow"])),
    st.tuples(st.just("get"), keys_st, st.just("")),
    st.tuples(st.just("lease"), st.integers(0, 2), st.just("")),
    st.tuples(st.just("evict"), st.integers(1, 3), st.sampled_from(["fast", "slow"])),
    st.tuples(st.just("stage_load"), keys_st, st.just("")),
    st.tuples(st.just("stage_store"), st.integers(0, 2), st.just("")),
    st.tuples(st.just("delete"), keys_st, st.just("")),
)
gate_st = st.tuples(st.sampled_from(["fast", "slow"]), st.sampled_from(["read", "write"]),
                    st.sampled_from(["before", "after"]), st.integers(1, 2))


class Interleavings(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        m = Metrics()
        self.fast = GatedHostTier("fast", LAYOUT, 4, m, pin_memory=False)
        self.slow = GatedHostTier("slow", LAYOUT, 8, m, pin_memory=False)
        self.store: TieredStore | None = None
        self.leases: list[Any] = []
        self.wrong = 0

    @initialize(write_policy=st.sampled_from(["write_back", "write_through", "selective"]),
          policies=st.tuples(st.sampled_from(["lru", "s3fifo", "arc", "lineage"]),
                             st.sampled_from(["lru", "lineage_arc"])),
          promote=st.booleans())
    def open(self, write_policy: str, policies: tuple[str, str], promote: bool) -> None:
        self.store = TieredStore(LAYOUT, [self.fast, self.slow], list(policies),
                                 write_policy=write_policy,  # type: ignore[arg-type]
                                 selective_hits=1, promote_on_hit=promote, lease_ttl_s=600.0)

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
            keep = [k for k in arg if k not in pinned]
            if keep:
                s.delete(keep)

    @rule(a=op_st, gate=gate_st, b=st.lists(op_st, min_size=1, max_size=2))
    def interleave(self, a: tuple[str, Any, str], gate: tuple[str, str, str, int],
                   b: list[tuple[str, Any, str]]) -> None:
        assert self.store is not None
        g = Gate(*gate)
        errors: list[BaseException] = []

        def run(*ops: tuple[str, Any, str]) -> Callable[[], None]:
            def body() -> None:
                try:
                    for op in ops:
                        self._run(op)
                except BaseException as exc:  # noqa: BLE001 - re-raised below
                    errors.append(exc)
            return body

        ta = threading.Thread(target=run(a))
        g.thread = ta
        self.fast.gate = self.slow.gate = g
        ta.start()
        while ta.is_alive() and not g.stopped.wait(0.01):
            pass  # A runs until the gate stops it, or to its end
        tb = threading.Thread(target=run(*b))
        tb.start()
        tb.join(WAIT_S)
        stuck = tb.is_alive() or not self.store.drain(WAIT_S)  # B's background copies too
        g.open()
        ta.join(WAIT_S)
        tb.join(WAIT_S)
        self.fast.gate = self.slow.gate = None
        assert not stuck, f"{b} waited for {a} stopped in tier I/O ({gate})"
        assert not ta.is_alive(), f"{a} never finished"
        assert not errors, errors
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
