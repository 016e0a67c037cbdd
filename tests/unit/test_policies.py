"""Eviction policies: the shared contract for every registered policy, exact victim orders, and
the registry. Pure in-memory; Hypothesis runs the profile ``tests/conftest.py`` loads."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstore.errors import UnknownComponent
from kvstore.policy import POLICIES, EvictionPolicy, available_policies, make_policy
from kvstore.policy.arc import ARCPolicy
from kvstore.policy.fifo import FIFOPolicy
from kvstore.policy.lfu import LFUPolicy
from kvstore.policy.lineage import LineagePolicy
from kvstore.policy.lineage_arc import LineageARCPolicy
from kvstore.policy.lru import LRUPolicy
from kvstore.policy.s3fifo import S3FIFOPolicy

ALL = available_policies()

# ---------------------------------------------------------------------------------------------
# Random operation sequences
# ---------------------------------------------------------------------------------------------

NUM_KEYS = 12  # a small universe, so operations collide
UNTRACKED_PARENT = 999  # never inserted: a parent the policy does not track

# An operation is one of
#   ("insert", key, parent_spec): parent_spec -1 -> None, NUM_KEYS -> UNTRACKED_PARENT, otherwise
#       an index (mod len) into the currently tracked keys, sorted;
#   ("access", key) / ("remove", key);
#   ("evict", n, pinned_mask): key k is pinned iff bit k of the mask is set.
# Hypothesis draws one integer per operation (several times cheaper to generate than a tuple of
# choices, which keeps the file fast) and shrinks it towards 0 = ("insert", 0, None).


def _decode(x: int) -> tuple[Any, ...]:
    kind, key = x & 7, (x >> 3) % NUM_KEYS
    if kind <= 2:
        return ("insert", key, (x >> 7) % (NUM_KEYS + 2) - 1)
    if kind <= 4:
        return ("access", key)
    if kind == 5:
        return ("remove", key)
    return ("evict", (x >> 7) % 7, (x >> 12) & (2**NUM_KEYS - 1))


OPS = st.lists(st.integers(0, 2**24 - 1), min_size=25, max_size=150).map(
    lambda xs: [_decode(x) for x in xs]
)


def _parent(spec: int, tracked: set[int]) -> int | None:
    if spec < 0:
        return None
    if spec >= NUM_KEYS or not tracked:
        return UNTRACKED_PARENT
    keys = sorted(tracked)
    return keys[spec % len(keys)]


def _pinned(mask: int) -> Callable[[Any], bool]:
    return lambda key: isinstance(key, int) and 0 <= key < NUM_KEYS and bool(mask >> key & 1)


def _random_ops(seed: int, n: int, num_keys: int) -> Iterator[tuple[Any, ...]]:
    """A long deterministic sequence in the same format (for sizes Hypothesis would not reach)."""
    rng = random.Random(seed)
    for _ in range(n):
        r = rng.random()
        key = rng.randrange(num_keys)
        if r < 0.4:
            yield ("insert", key, rng.randrange(-1, NUM_KEYS + 1))
        elif r < 0.75:
            yield ("access", key)
        elif r < 0.85:
            yield ("remove", key)
        else:
            mask = rng.getrandbits(NUM_KEYS) & rng.getrandbits(NUM_KEYS)  # ~1/4 of keys pinned
            yield ("evict", rng.randrange(0, 8), mask)


# ---------------------------------------------------------------------------------------------
# The contract, for every registered policy
# ---------------------------------------------------------------------------------------------


def _check_contract(policy: EvictionPolicy, ops: Sequence[tuple[Any, ...]]) -> None:
    model: set[int] = set()  # the keys the policy must track
    for op in ops:
        if op[0] == "insert":
            _, key, spec = op
            policy.insert(key, _parent(spec, model))
            model.add(key)
        elif op[0] == "access":
            policy.access(op[1])
        elif op[0] == "remove":
            policy.remove(op[1])
            model.discard(op[1])
        else:
            _, n, mask = op
            pinned = _pinned(mask)
            victims = policy.evict(n, pinned)
            assert len(victims) == len(set(victims)), f"a key returned twice: {victims}"
            assert set(victims) <= model, f"returned untracked keys: {set(victims) - model}"
            assert not any(pinned(k) for k in victims), f"returned a pinned key: {victims}"
            evictable = sum(1 for k in model if not pinned(k))
            assert len(victims) == min(n, evictable), (victims, n, evictable)
            model -= set(victims)
            assert not any(k in policy for k in victims)
        assert len(policy) == len(model)
        assert set(policy) == model
        assert len(list(policy)) == len(model)  # __iter__ yields each key once
        for k in range(NUM_KEYS):
            assert (k in policy) == (k in model)
        assert UNTRACKED_PARENT not in policy


@pytest.mark.parametrize("name", ALL)
@settings(max_examples=200, deadline=None)
@given(ops=OPS, capacity=st.integers(1, 8))
def test_contract_under_random_operations(name: str, ops: list[tuple[Any, ...]],
                                          capacity: int) -> None:
    _check_contract(make_policy(name, capacity), ops)


@pytest.mark.parametrize("name", ALL)
def test_contract_on_a_long_sequence(name: str) -> None:
    # Long enough for S3-FIFO's and ARC's ghost trimming and the lineage heap's compaction.
    _check_contract(make_policy(name, 5), list(_random_ops(seed=7, n=6000, num_keys=NUM_KEYS)))


@pytest.mark.parametrize("name", ALL)
def test_store_like_use_stays_within_capacity(name: str) -> None:
    """Evict-before-insert, as the store does: the policy never holds more than ``capacity``."""
    rng = random.Random(3)
    policy = make_policy(name, 16)
    prev = None
    for _ in range(4000):
        key = rng.randrange(64)
        if key in policy:
            policy.access(key)
        else:
            if len(policy) >= policy.capacity:
                assert len(policy.evict(len(policy) - policy.capacity + 1)) >= 1
            policy.insert(key, prev)
        prev = key if rng.random() < 0.7 else None
        assert len(policy) <= policy.capacity


@pytest.mark.parametrize("name", ALL)
def test_everything_pinned_terminates_and_keeps_every_key(name: str) -> None:
    policy = make_policy(name, 8)
    for k in range(20):
        policy.insert(k, k - 1 if k % 5 else None)
        if k % 3 == 0:
            policy.access(k)
    assert policy.evict(5, lambda _k: True) == []
    assert policy.evict(0) == []
    assert set(policy) == set(range(20))
    # Pinning does not change what comes next: the same victims as a fresh twin's.
    twin = make_policy(name, 8)
    for k in range(20):
        twin.insert(k, k - 1 if k % 5 else None)
        if k % 3 == 0:
            twin.access(k)
    assert policy.evict(20) == twin.evict(20)


@pytest.mark.parametrize("name", ALL)
def test_untracked_keys_are_no_ops(name: str) -> None:
    policy = make_policy(name, 4)
    policy.access("nope")
    policy.remove("nope")
    assert len(policy) == 0 and list(policy) == [] and "nope" not in policy
    assert policy.evict(3) == []


def test_capacity_must_be_positive() -> None:
    for name in ALL:
        with pytest.raises(ValueError, match="capacity"):
            make_policy(name, 0)


# ---------------------------------------------------------------------------------------------
# LRU and FIFO against reference models, exactly
# ---------------------------------------------------------------------------------------------


class _ListModel:
    """LRU (``recency=True``) or FIFO as a plain list, oldest first; O(n) everything."""

    def __init__(self, recency: bool) -> None:
        self.order: list[Any] = []
        self.recency = recency

    def insert(self, key: Any, parent: Any = None) -> None:
        if key in self.order:
            self.access(key)
        else:
            self.order.append(key)

    def access(self, key: Any) -> None:
        if self.recency and key in self.order:
            self.order.remove(key)
            self.order.append(key)

    def remove(self, key: Any) -> None:
        if key in self.order:
            self.order.remove(key)

    def evict(self, n: int, is_pinned: Callable[[Any], bool]) -> list[Any]:
        victims = [k for k in self.order if not is_pinned(k)][: max(n, 0)]
        for k in victims:
            self.order.remove(k)
        return victims


class _LineageModel:
    """Leaf-first LRU, straight from LineagePolicy's docstring; O(n) per victim."""

    def __init__(self) -> None:
        self.clock = 0
        self.tick: dict[Any, int] = {}
        self.parent: dict[Any, Any] = {}
        self.children: dict[Any, set[Any]] = {}

    def insert(self, key: Any, parent: Any = None) -> None:
        if key in self.tick:
            self.access(key)
            return
        self.clock += 1
        self.tick[key] = self.clock
        self.parent[key] = parent if parent in self.tick else None
        if self.parent[key] is not None:
            self.children.setdefault(parent, set()).add(key)

    def access(self, key: Any) -> None:
        if key in self.tick:
            self.clock += 1
            self.tick[key] = self.clock

    def remove(self, key: Any) -> None:
        if key not in self.tick:
            return
        del self.tick[key]
        for child in self.children.pop(key, set()):
            self.parent[child] = None
        parent = self.parent.pop(key)
        if parent is not None:
            self.children[parent].discard(key)

    def leaves(self) -> set[Any]:
        return {k for k in self.tick if not self.children.get(k)}

    def evict(self, n: int, is_pinned: Callable[[Any], bool]) -> list[Any]:
        victims: list[Any] = []
        while len(victims) < n:
            leaves = [k for k in self.leaves() if not is_pinned(k)]
            pool = leaves or [k for k in self.tick if not is_pinned(k)]
            if not pool:
                break
            victim = min(pool, key=self.tick.__getitem__)
            self.remove(victim)
            victims.append(victim)
        return victims


def _replay_against(policy: EvictionPolicy, model: Any, ops: Sequence[tuple[Any, ...]]) -> None:
    tracked: set[int] = set()
    for op in ops:
        if op[0] == "insert":
            parent = _parent(op[2], tracked)
            policy.insert(op[1], parent)
            model.insert(op[1], parent)
            tracked.add(op[1])
        elif op[0] == "access":
            policy.access(op[1])
            model.access(op[1])
        elif op[0] == "remove":
            policy.remove(op[1])
            model.remove(op[1])
            tracked.discard(op[1])
        else:
            pinned = _pinned(op[2])
            got = policy.evict(op[1], pinned)
            assert got == model.evict(op[1], pinned)
            tracked -= set(got)


@settings(max_examples=200, deadline=None)
@given(ops=OPS)
def test_lru_matches_reference_exactly(ops: list[tuple[Any, ...]]) -> None:
    _replay_against(LRUPolicy(4), _ListModel(recency=True), ops)


@settings(max_examples=200, deadline=None)
@given(ops=OPS)
def test_fifo_matches_reference_exactly(ops: list[tuple[Any, ...]]) -> None:
    _replay_against(FIFOPolicy(4), _ListModel(recency=False), ops)


@settings(max_examples=200, deadline=None)
@given(ops=OPS)
def test_lineage_matches_reference_exactly(ops: list[tuple[Any, ...]]) -> None:
    _replay_against(LineagePolicy(4), _LineageModel(), ops)


@pytest.mark.parametrize(
    ("policy", "model"),
    [
        (LRUPolicy, lambda: _ListModel(recency=True)),
        (FIFOPolicy, lambda: _ListModel(recency=False)),
        (LineagePolicy, _LineageModel),
    ],
    ids=["lru", "fifo", "lineage"],
)
def test_exact_reference_on_a_long_sequence(policy: type[EvictionPolicy],
                                            model: Callable[[], Any]) -> None:
    # Many accesses to few keys: the lineage heap goes through several compactions.
    _replay_against(policy(8), model(), list(_random_ops(seed=11, n=8000, num_keys=NUM_KEYS)))


@pytest.mark.parametrize("cls", [LineagePolicy, LineageARCPolicy], ids=["lineage", "lineage_arc"])
@settings(max_examples=200, deadline=None)
@given(ops=OPS)
def test_lineage_never_evicts_an_inner_node_while_an_unpinned_leaf_exists(
    cls: type[LineagePolicy] | type[LineageARCPolicy], ops: list[tuple[Any, ...]],
) -> None:
    policy = cls(4)
    tree = _LineageModel()  # only its tree is used here
    tracked: set[int] = set()
    for op in ops:
        if op[0] == "insert":
            parent = _parent(op[2], tracked)
            policy.insert(op[1], parent)
            tree.insert(op[1], parent)
            tracked.add(op[1])
        elif op[0] == "remove":
            policy.remove(op[1])
            tree.remove(op[1])
            tracked.discard(op[1])
        elif op[0] == "access":
            policy.access(op[1])
        else:
            pinned = _pinned(op[2])
            # One victim at a time, so the tree is checked as each eviction changes it.
            for _ in range(op[1]):
                unpinned_leaves = {k for k in tree.leaves() if not pinned(k)}
                got = policy.evict(1, pinned)
                if not got:
                    assert all(pinned(k) for k in tracked)
                    break
                (victim,) = got
                if unpinned_leaves:
                    assert victim in unpinned_leaves, (victim, unpinned_leaves)
                tree.remove(victim)
                tracked.discard(victim)
        for k in tracked:  # the policy's view of the tree is the model's
            assert policy.parent(k) == tree.parent[k]
            assert policy.is_leaf(k) == (not tree.children.get(k))


# ---------------------------------------------------------------------------------------------
# Hand-worked victim orders
# ---------------------------------------------------------------------------------------------


def test_lfu_order() -> None:
    p = LFUPolicy(10)
    for k in "abcd":
        p.insert(k)
    p.access("b")  # b: 2, reached before a
    p.access("a")  # a: 2
    p.access("d")
    p.insert("d")  # re-inserting a tracked key counts as an access: d: 3
    assert [p.frequency(k) for k in "abcd"] == [2, 2, 1, 3]
    # Frequency 1: c, pinned, skipped (keeps its count); frequency 2: b (got there first), a.
    assert p.evict(2, lambda k: k == "c") == ["b", "a"]
    assert p.frequency("c") == 1
    p.insert("e")  # e: 1
    p.access("c")  # c: 2
    assert p.evict(3) == ["e", "c", "d"]
    assert len(p) == 0


def test_s3fifo_order() -> None:
    p = S3FIFOPolicy(10)  # small queue 1, main 9, ghost 9
    assert (p.small_capacity, p.main_capacity, p.ghost_capacity) == (1, 9, 9)
    for k in "abc":
        p.insert(k)  # S: a b c, counts 0
    p.access("a")
    p.access("a")  # a: 2
    p.access("b")  # b: 1
    # M is within its share, so S is swept: a (count 2) moves to M with count 0; b (count 1 < 2)
    # is the victim and enters the ghost.
    assert p.evict(1) == ["b"]
    p.insert("b")  # ghost hit: straight into M (after a)
    p.insert("d")  # S: c d
    assert p.evict(2) == ["c", "d"]  # S is swept first; both go to the ghost
    p.access("a")  # a: 1 in M
    # S is empty, so M: a (count 1) goes round with count 0, b (count 0) is the victim.
    assert p.evict(1) == ["b"]
    assert p.evict(1) == ["a"]
    # Pinned keys keep their place: x stays at the head of S; y goes.
    p.insert("x")
    p.insert("y")
    assert p.evict(1, lambda k: k == "x") == ["y"]
    p.insert("z")
    assert p.evict(2) == ["x", "z"]
    # c went to the ghost above: re-inserting it lands in M, not in S.
    p.insert("c")
    p.insert("w")  # S: w
    p.access("w")
    p.access("w")  # w: 2 -> will be promoted, not evicted
    # M is within its share, so S is swept first: w (count 2) is promoted, not evicted; S is
    # then empty and M is swept: c (count 0) is the victim.
    assert p.evict(1) == ["c"]
    assert list(p) == ["w"]


def test_arc_order_and_adaptation() -> None:
    p = ARCPolicy(4)
    for k in "abc":
        p.insert(k)  # T1: a b c
    p.access("a")  # T2: a; T1: b c
    p.insert("d")  # T1: b c d
    assert p.evict(1) == ["b"]  # |T1| = 3 > p = 0: LRU of T1; B1: b
    p.insert("b")  # B1 hit: p += max(|B2|/|B1|, 1) = 1; b -> T2: a b
    assert p.p == 1.0
    assert p.evict(1) == ["c"]  # |T1| = 2 > 1: LRU of T1 (c); B1: c
    assert p.evict(1) == ["a"]  # |T1| = 1, not > 1: LRU of T2 (a); B2: a
    p.insert("a")  # B2 hit: p -= max(|B1|/|B2|, 1) = 1 -> 0; a -> T2: b a
    assert p.p == 0.0
    assert p.evict(2) == ["d", "b"]  # |T1| = 1 > 0: d; then |T1| = 0: LRU of T2, b
    # Pinned keys are passed over in place; the list choice still counts them.
    p.insert("e")
    p.insert("f")  # T1: e f; T2: a
    assert p.evict(1, lambda k: k == "e") == ["f"]
    assert p.evict(1, lambda k: k == "e") == ["a"]  # T1 has only pinned e: fall back to T2
    assert p.evict(1) == ["e"]


def test_arc_list_choice_counts_pinned_keys() -> None:
    p = ARCPolicy(8)
    p.insert("x")
    p.insert("y")
    assert p.evict(1) == ["x"]
    p.insert("x")  # B1 hit: p = 1; T2: x
    assert p.p == 1.0
    for k in "efg":
        p.insert(k)  # T1: y e f g
    pinned = {"y", "e"}.__contains__
    # |T1| = 4 > 1: f (y and e pinned). Then |T1| is still 3 with the pinned keys, > 1: g.
    assert p.evict(2, pinned) == ["f", "g"]
    # |T1| = 2 > 1, but both are pinned: T2's x.
    assert p.evict(1, pinned) == ["x"]
    assert p.evict(5) == ["y", "e"]


def test_lineage_order() -> None:
    p = LineagePolicy(16)
    p.insert("r")
    p.insert("a", "r")
    p.insert("b", "a")
    p.insert("c", "r")
    p.insert("d", "c")
    p.insert("x", "not-tracked")  # its parent is not tracked: x is a root
    assert p.parent("x") is None
    p.access("r")
    p.access("a")  # last uses: b 3 < c 4 < d 5 < x 6 < r 7 < a 8
    # Leaves b, d, x: b is the LRU leaf (r, the LRU key overall, is an inner node).
    assert p.evict(1) == ["b"]
    # a is now a leaf (last use 8). Leaves a, d, x: d; then c becomes a leaf with last use 4,
    # older than every other leaf, so it goes next.
    assert p.evict(2) == ["d", "c"]
    assert p.evict(1) == ["x"]
    assert p.evict(2) == ["a", "r"]  # a, then r (a leaf now)
    assert len(p) == 0


def test_lineage_arc_order_and_adaptation() -> None:
    p = LineageARCPolicy(4)
    assert p.p == 0.0
    p.insert("r")  # a root with no history: probation
    p.insert("a", "r")  # r is on probation: a too
    p.access("r")  # r: protected (an inner node)
    p.insert("b", "r")  # r is protected but not a leaf (a is its child): b on probation
    assert [p.is_protected(k) for k in "rab"] == [True, False, False]
    # Probation holds 2 > p = 0 keys: its oldest leaf, a (r is protected and inner). B1: a.
    assert p.evict(1) == ["a"]
    p.access("b")  # b: protected
    p.insert("c", "b")  # extends a protected leaf: protected
    assert p.is_protected("c")
    # Probation is empty: the protected leaves are c only (b and r are inner). B2: c.
    assert p.evict(1) == ["c"]
    p.insert("a")  # B1 hit: p += max(|B2| / |B1|, 1) = 1; a protected, a root now
    assert p.p == 1.0 and p.is_protected("a") and p.parent("a") is None
    p.insert("d")  # probation: d
    # Probation holds 1, not > p = 1: protected leaves b (last use 5) and a (7): b; r becomes a
    # leaf with last use 3 and goes next. B2: c b r.
    assert p.evict(2) == ["b", "r"]
    p.insert("c")  # B2 hit: p -= max(|B1| / |B2|, 1) = max(0 / 3, 1) -> 0
    assert p.p == 0.0
    # Probation (d) is over p, but d is pinned: the other segment's oldest leaf, a.
    assert p.evict(1, lambda k: k == "d") == ["a"]
    assert p.evict(2) == ["d", "c"]
    assert len(p) == 0


def test_lineage_arc_falls_back_to_inner_nodes_when_every_leaf_is_pinned() -> None:
    p = LineageARCPolicy(16)
    p.insert("r")
    p.insert("a", "r")
    p.insert("b", "a")
    p.access("r")
    pinned = {"b"}.__contains__
    # The only leaf is pinned: the LRU unpinned key, a (r was used since); b becomes a root.
    assert p.evict(1, pinned) == ["a"]
    assert p.parent("b") is None and p.is_leaf("r")
    assert p.evict(3, pinned) == ["r"]
    assert p.evict(1) == ["b"]


def test_lineage_falls_back_to_inner_nodes_when_every_leaf_is_pinned() -> None:
    p = LineagePolicy(16)
    p.insert("r")
    p.insert("a", "r")
    p.insert("b", "a")
    p.insert("s")
    p.insert("t", "s")
    pinned = {"b", "t"}.__contains__
    # Every leaf is pinned: LRU unpinned key, r; its child a becomes a root.
    assert p.evict(1, pinned) == ["r"]
    assert p.parent("a") is None
    assert p.evict(3, pinned) == ["a", "s"]
    assert p.evict(1, pinned) == []
    assert set(p) == {"b", "t"}
    assert p.evict(2) == ["b", "t"]


def test_lineage_remove_detaches_children() -> None:
    p = LineagePolicy(16)
    p.insert("r")
    p.insert("a", "r")
    p.insert("b", "a")
    p.insert("c", "r")
    p.remove("a")  # an inner node: b becomes a root; r keeps c
    assert p.parent("b") is None and not p.is_leaf("r")
    p.insert("a", "r")  # back, but it does not adopt b
    assert p.parent("b") is None and p.is_leaf("a")
    p.remove("c")
    p.remove("a")
    assert p.is_leaf("r")
    assert p.evict(5) == ["r", "b"]


# ---------------------------------------------------------------------------------------------
# Registry
# ---------------------------------------------------------------------------------------------


class TinyPolicy(EvictionPolicy):
    """Most recently inserted first: a user's own policy, loaded by import path."""

    name = "tiny"

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.keys: list[Any] = []

    def insert(self, key: Any, parent: Any = None) -> None:
        if key not in self.keys:
            self.keys.append(key)

    def access(self, key: Any) -> None:
        pass

    def remove(self, key: Any) -> None:
        if key in self.keys:
            self.keys.remove(key)

    def evict(self, n: int, is_pinned: Callable[[Any], bool] = lambda _k: False) -> list[Any]:
        victims = [k for k in reversed(self.keys) if not is_pinned(k)][:n]
        for k in victims:
            self.keys.remove(k)
        return victims

    def __contains__(self, key: object) -> bool:
        return key in self.keys

    def __len__(self) -> int:
        return len(self.keys)

    def __iter__(self) -> Iterator[Any]:
        return iter(list(self.keys))


class NotAPolicy:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity


def test_registry_names() -> None:
    assert ALL == sorted(["lru", "fifo", "lfu", "s3fifo", "arc", "lineage", "lineage_arc"])
    assert set(POLICIES) == set(ALL)
    for name in ALL:
        policy = make_policy(name, 8)
        assert isinstance(policy, EvictionPolicy)
        assert policy.name == name
        assert policy.capacity == 8
        assert POLICIES[name].endswith(":" + type(policy).__name__)
    assert isinstance(make_policy(" LRU ", 2), LRUPolicy)


def test_registry_import_path() -> None:
    policy = make_policy("tests.unit.test_policies:TinyPolicy", 3)
    assert type(policy).__name__ == "TinyPolicy" and policy.capacity == 3
    _check_contract(policy, list(_random_ops(seed=5, n=300, num_keys=NUM_KEYS)))
    assert isinstance(make_policy("kvstore.policy.lru:LRUPolicy", 2), LRUPolicy)


def test_registry_unknown_name_lists_known_names() -> None:
    with pytest.raises(UnknownComponent) as exc:
        make_policy("mru", 4)
    for name in ALL:
        assert name in str(exc.value)
    assert exc.value.hint


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("tests.unit.test_policies:NotAPolicy", "not an EvictionPolicy"),
        ("collections:OrderedDict", "not an EvictionPolicy"),
        ("kvstore.policy.base:never_pinned", "not an EvictionPolicy"),
        ("tests.unit.test_policies:NoSuchClass", "no attribute"),
        ("no_such_package.policies:Mine", "cannot import"),
        (":LRUPolicy", "malformed"),
        ("kvstore.policy.lru:", "malformed"),
        ("", "non-empty"),
    ],
)
def test_registry_bad_specs(spec: str, match: str) -> None:
    with pytest.raises(UnknownComponent, match=match):
        make_policy(spec, 4)


@pytest.mark.parametrize("name", sorted(POLICIES))
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_access_many_is_access_of_each_key_in_order(name: str, data: Any) -> None:
    # the bulk path a long prefix hit takes must leave the policy exactly as single accesses do
    n = data.draw(st.integers(2, 24))
    parents = [None] + [data.draw(st.sampled_from([None, i - 1])) for i in range(1, n)]
    hits = data.draw(st.lists(st.integers(0, n + 3), max_size=3 * n))  # > n: untracked keys
    one, bulk = make_policy(name, n), make_policy(name, n)
    for p in (one, bulk):
        for i in range(n):
            p.insert(i, parents[i])
    for k in hits:
        one.access(k)
    bulk.access_many(hits)
    assert one.evict(n) == bulk.evict(n)
