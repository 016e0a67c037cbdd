"""The store's background threads and the engine's thread share one GIL: once the mover runs,
the interpreter's switch interval is at most ``store.switch_interval_ms``, so an engine thread
waits that long at most behind the store's bookkeeping (bench.writeback shows the p99)."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import numpy as np
import pytest

from kvstore import InvalidArgument, KVLayout, Namespace, TieredStore, build_tier
from kvstore.config import StoreConfig
from kvstore.mover import lower_switch_interval

LAYOUT = KVLayout(num_layers=1, num_kv_heads=1, head_dim=16, block_size=4, dtype="float16")


@pytest.fixture(autouse=True)
def _restore() -> Iterator[None]:
    before = sys.getswitchinterval()
    sys.setswitchinterval(0.005)  # the interpreter's default
    yield
    sys.setswitchinterval(before)


def _store(**kw: float) -> TieredStore:
    host = build_tier({"kind": "host", "name": "a", "capacity": 40 * LAYOUT.page_bytes}, LAYOUT)
    below = build_tier({"kind": "host", "name": "b", "capacity": 400 * LAYOUT.page_bytes}, LAYOUT)
    return TieredStore(LAYOUT, [host, below], **kw)  # type: ignore[arg-type]


def _fill(store: TieredStore) -> None:
    ns = Namespace("si", LAYOUT)
    chain = ns.chain(list(range(4 * 120)))
    pages = np.zeros((40, LAYOUT.page_bytes), np.uint8)
    for at in range(0, 120, 40):  # a fills, then evicts: its cleaner runs on the mover
        store.put(chain.metas()[at: at + 40], pages)
    store.drain()


def test_the_interval_is_lowered_once_the_mover_runs_and_only_then() -> None:
    store = _store()
    try:
        assert sys.getswitchinterval() == pytest.approx(0.005)  # no background thread yet
        _fill(store)
        assert sys.getswitchinterval() == pytest.approx(StoreConfig().switch_interval_ms / 1e3)
    finally:
        store.close()


def test_zero_leaves_the_interpreter_alone_and_a_lower_interval_is_never_raised() -> None:
    store = _store(switch_interval_ms=0)
    try:
        _fill(store)
        assert sys.getswitchinterval() == pytest.approx(0.005)
    finally:
        store.close()
    sys.setswitchinterval(0.0001)
    lower_switch_interval(0.5)
    assert sys.getswitchinterval() == pytest.approx(0.0001)


@pytest.mark.parametrize("bad", [-1, 6, True, "0.5"])
def test_a_bad_interval_names_the_setting(bad: object) -> None:
    with pytest.raises(InvalidArgument, match="switch_interval_ms"):
        _store(switch_interval_ms=bad)  # type: ignore[arg-type]
