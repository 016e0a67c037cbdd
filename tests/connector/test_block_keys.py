"""The scheduler side takes the keys its caller already hashed (``block_keys``): the same match
as hashing them itself, and keys of another namespace, of other tokens or too few are refused
with a named error that changes nothing."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from connector import InProcessScheduler
from kvstore import InvalidArgument, KVLayout, Namespace, TieredStore
from kvstore.tiers.host import HostTier

N = 6  # full blocks before the last token


@pytest.fixture
def store(layout: KVLayout) -> Iterator[TieredStore]:
    s = TieredStore(layout, [HostTier.build("host", layout, 32, pin_memory=False)])
    yield s
    s.close()


def _tokens(layout: KVLayout) -> list[int]:
    return [int(x) for x in np.random.default_rng(3).integers(0, 30000, N * layout.block_size + 1)]


def _stored(store: TieredStore, ns: Namespace, tokens: list[int], n: int) -> None:
    metas = ns.chain(tokens).metas(0, n)
    page = np.zeros(store.layout.page_bytes, np.uint8)
    assert store.put(metas, [page] * n).stored == n


def test_given_keys_match_like_hashed_ones(store: TieredStore, ns: Namespace) -> None:
    tokens = _tokens(store.layout)
    _stored(store, ns, tokens, 4)
    sched = InProcessScheduler(store, ns, num_blocks=16)
    assert sched.keys_namespace_id == ns.id
    keys = ns.chain(tokens).keys
    hashed = sched.get_num_new_matched_tokens("a", tokens, 0)
    given = sched.get_num_new_matched_tokens("b", tokens, 0, block_keys=keys)
    assert given.num_tokens == hashed.num_tokens == 4 * store.layout.block_size
    assert given.tiers == hashed.tiers == ("host",) * 4
    # past the engine's own hits, and with more keys than needed (a decode-time chain)
    assert sched.get_num_new_matched_tokens(
        "c", tokens, 2 * store.layout.block_size,
        block_keys=keys + [b"\0" * 16]).num_tokens == 2 * store.layout.block_size
    for rid in "abc":
        sched.request_finished(rid)
    assert not any(store.is_pinned(k) for k in keys)  # every match's lease was released


@pytest.mark.parametrize("case", ["other namespace", "other tokens", "too few", "not keys"])
def test_wrong_keys_are_refused_and_change_nothing(store: TieredStore, ns: Namespace,
                                                   case: str) -> None:
    layout = store.layout
    tokens = _tokens(layout)
    _stored(store, ns, tokens, N)
    sched = InProcessScheduler(store, ns, num_blocks=16)
    keys = list(ns.chain(tokens).keys)
    if case == "other namespace":
        bad: object = Namespace("test-model", layout, "tenant-b").chain(tokens).keys
        match = "block_keys\\[0\\] is not the key"
    elif case == "other tokens":  # the last block's tokens differ: its key does not hash
        other = list(tokens)
        other[(N - 1) * layout.block_size] += 1
        bad, tokens = keys, other
        match = f"block_keys\\[{N - 1}\\] is not the key"
    elif case == "too few":
        bad, match = keys[:N - 1], f"has {N - 1} keys, the prompt has {N} full blocks"
    else:
        bad, match = b"".join(keys), "must be a sequence of keys"
    with pytest.raises(InvalidArgument, match=match):
        sched.get_num_new_matched_tokens("r", tokens, 0, block_keys=bad)  # type: ignore[arg-type]
    assert sched.build_connector_meta().loads == ()  # no match was planned
    with pytest.raises(InvalidArgument, match="no pending match"):
        sched.update_state_after_alloc("r", [0], layout.block_size)
    assert not any(store.is_pinned(k) for k in keys)  # nothing was leased
    assert store.evict(N, tier="host") == N
