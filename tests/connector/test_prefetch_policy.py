"""Prefetch policies (best_effort / wait_complete / timeout) for pages still below the host tier,
and load-or-recompute: per-tier read bandwidth in the store against the engine's prefill speed."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch

from connector import InProcessScheduler, InProcessWorker, KVCacheSpec
from kvstore import InvalidArgument, KVLayout, Namespace, TieredStore
from kvstore.tiers.disk import DiskTier
from kvstore.tiers.host import HostTier
from tests.connector.test_inprocess import FakeClock, N, Rig, tokens_for


class Setup:
    """Host over a real disk tier (write-through); N blocks saved, blocks 2.. only on disk."""

    def __init__(self, layout: KVLayout, ns: Namespace, clock: FakeClock, path: Any) -> None:
        self.disk = DiskTier.build("disk", layout, 32, path=path, o_direct=False, durability="none",
                             check_index=False)
        self.store = TieredStore(layout, [HostTier.build("host", layout, 32, pin_memory=False), self.disk],
                                 write_policy="write_through", promote_on_hit=False, clock=clock)
        self.ns, self.clock, self.layout = ns, clock, layout
        self.rig = Rig(self.store, ns, clock)
        self.tokens = tokens_for(N, layout.block_size)
        self.keys = ns.chain(self.tokens).keys
        self.src = [0, 1, 2, 3]
        self.rig.fill(self.src)
        self.rig.save("w", self.tokens, self.src)
        self.rig.wait_sent("w")
        assert self.disk.count_leading(self.keys) == N
        self.store.tier("host").delete(self.keys[2:])  # blocks 2, 3 now only on disk

    def slow_disk(self, monkeypatch: pytest.MonkeyPatch, delay_s: float) -> None:
        real = self.disk._read

        def slow(*a: Any, **k: Any) -> Any:
            time.sleep(delay_s)
            return real(*a, **k)

        monkeypatch.setattr(self.disk, "_read", slow)

    def close(self) -> None:
        self.rig.worker.close()
        self.rig.sched.close()
        self.store.close()


@pytest.fixture
def setup(layout: KVLayout, ns: Namespace, clock: FakeClock,
          tmp_path: os.PathLike[str]) -> Iterator[Setup]:
    s = Setup(layout, ns, clock, os.path.join(tmp_path, "disk"))
    yield s
    s.close()


def _load(s: Setup, rig: Rig, dst: list[int]) -> set[int]:
    assert rig.plan_load("r", s.tokens, dst) == (N * s.layout.block_size, True)
    rig.run_load_step()
    rig.worker.wait_for_loads()
    deadline = time.monotonic() + 5
    while "r" not in rig.worker.get_finished([]).recving:
        assert time.monotonic() < deadline
        time.sleep(0.005)
    return rig.worker.get_block_ids_with_load_errors()


@pytest.mark.parametrize(
    ("policy", "timeout_s", "good", "reason"),
    [
        ("best_effort", 5.0, 2, "not_prefetched"),
        ("wait_complete", 0.01, N, ""),  # its timeout is not consulted
        ("timeout", 0.05, 2, "timeout"),
        ("timeout", 5.0, N, ""),
    ],
)
def test_prefetch_policy_loaded_vs_failed(setup: Setup, monkeypatch: pytest.MonkeyPatch,
                                          policy: str, timeout_s: float, good: int,
                                          reason: str) -> None:
    s = setup
    s.slow_disk(monkeypatch, 0.3)
    rig = Rig(s.store, s.ns, s.clock)
    rig.worker.close()
    rig.worker = InProcessWorker(s.store, clock=s.clock, prefetch_policy=policy,  # type: ignore[arg-type]
                                 prefetch_timeout_s=timeout_s)
    rig.worker.register_kv_caches(KVCacheSpec.page_first(rig.pool))
    dst = [12, 13, 14, 15]
    errors = _load(s, rig, dst)
    assert errors == set(dst[good:])
    st = rig.worker.stats()
    assert st.blocks_loaded == good
    assert st.load_failures == ({reason: N - good} if good < N else {})
    for a, b in zip(s.src[:good], dst[:good]):
        assert torch.equal(rig.block(b), s.rig.block(a))
    for b in dst[good:]:
        assert not rig.block(b).any()
    rig.worker.close()  # waits for nothing of the prefetch; the store's close does
    if policy == "best_effort":  # the background prefetch still warms host for next time
        deadline = time.monotonic() + 5
        while s.store.tier("host").count_leading(s.keys) < N:
            assert time.monotonic() < deadline
            time.sleep(0.01)
    rig.sched.close()


def test_prefetch_policy_is_validated(setup: Setup) -> None:
    with pytest.raises(InvalidArgument, match="prefetch policy"):
        InProcessWorker(setup.store, prefetch_policy="eventually")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="prefetch_timeout_s"):
        InProcessWorker(setup.store, prefetch_timeout_s=0)
    w = InProcessWorker(setup.store)
    assert w.prefetch_policy == "timeout"
    w.close()


def test_store_measures_read_bandwidth_per_tier(setup: Setup,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    s = setup
    assert s.store.read_bandwidth("disk") is None
    with pytest.raises(InvalidArgument):
        s.store.read_bandwidth("nope")
    out = np.zeros((2, s.layout.page_bytes), dtype=np.uint8)
    assert s.store.get(s.ns.id, s.keys[2:], out).found == (True, True)
    fast = s.store.read_bandwidth("disk")
    assert fast is not None and fast > 0
    s.slow_disk(monkeypatch, 0.2)
    for _ in range(3):
        s.store.get(s.ns.id, s.keys[2:], out)
    slow = s.store.read_bandwidth("disk")
    # EWMA, alpha 0.3: three slow samples leave 0.7**3 of the fast estimate, plus the rest of
    # theirs: each read of 2 pages took >= 0.2 s (the bound holds however slow the machine is)
    assert slow is not None
    assert slow <= 0.7 ** 3 * fast + (1 - 0.7 ** 3) * 2 * s.layout.page_bytes / 0.2 + 1e-6


def _decisions(store: TieredStore, decision: str) -> float:
    return store.metrics.value("kvstore_connector_decisions_total", decision=decision)


@pytest.mark.parametrize(("bandwidth", "matched_blocks"), [(1e3, 2), (1e12, N), (None, N)])
def test_load_or_recompute(setup: Setup, monkeypatch: pytest.MonkeyPatch,
                           bandwidth: float | None, matched_blocks: int) -> None:
    s = setup
    monkeypatch.setattr(s.store, "read_bandwidth", lambda name: bandwidth)
    # 1e4 tokens/s: a 4-token block recomputes in 0.4 ms; its 1 KiB page takes 1 s at 1 KB/s
    sched = InProcessScheduler(s.store, s.ns, num_blocks=16, recompute_tokens_per_s=1e4)
    m = sched.get_num_new_matched_tokens("r", s.tokens, 0)
    assert m.num_tokens == matched_blocks * s.layout.block_size
    assert m.load_async is (matched_blocks > 2)
    declined = N - matched_blocks
    assert sched.decisions["recompute"] == declined
    assert sched.decisions["load"] == N - 2 - declined
    assert _decisions(s.store, "recompute") == declined
    assert _decisions(s.store, "load") == N - 2 - declined
    # the namespace's own counts: the declines, and the scheduler's lookup of all N blocks
    counts = s.store.namespace_counts.snapshot().get(s.ns.id)
    assert (counts.declined, counts.lookup_hit, counts.lookup_miss) == (declined, N, 0)
    sched.close()
    assert s.store.stats().active_leases == 0


def test_without_recompute_speed_everything_loads(setup: Setup,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    s = setup
    monkeypatch.setattr(s.store, "read_bandwidth", lambda name: 1.0)
    sched = InProcessScheduler(s.store, s.ns, num_blocks=16)
    assert sched.get_num_new_matched_tokens("r", s.tokens, 0).num_tokens == N * s.layout.block_size
    assert not sched.decisions
    with pytest.raises(InvalidArgument, match="recompute_tokens_per_s"):
        sched.recompute_tokens_per_s = 0
    sched.recompute_tokens_per_s = 1e4  # the engine updates its measured prefill speed
    assert sched.get_num_new_matched_tokens("r", s.tokens, 0).num_tokens == 2 * s.layout.block_size
    sched.close()


# ----------------------------------------------------------------- through the engine

BS = 16


@pytest.fixture(scope="module")
def model() -> Any:
    from runtime import LlamaForPagedLM, get_model_config

    return LlamaForPagedLM.from_random(get_model_config("tiny"), seed=7)


def _engine(model: Any, path: Any, **worker_kw: Any) -> tuple[Any, TieredStore, DiskTier]:
    from kvstore.metrics import Metrics
    from kvstore.tiers.hbm import HBMTier
    from runtime.engine import Engine

    layout = model.config.kv_layout(BS)
    m = Metrics()
    pool = HBMTier.build("hbm", layout, 32, m, device="cpu")
    host = HostTier.build("host", layout, 16, m)
    disk = DiskTier.build("disk", layout, 32, m, path=path, o_direct=False, durability="none")
    store = TieredStore(layout, [pool, host, disk], write_policy="write_back")  # type: ignore[list-item]
    ns = Namespace("test/tiny/7", layout)
    load_or_recompute = worker_kw.pop("load_or_recompute", False)
    engine = Engine(model, pool, ns, load_or_recompute=load_or_recompute,
                    connector=(InProcessScheduler(store, ns, num_blocks=32),
                               InProcessWorker(store, **worker_kw)))
    engine.store = store
    return engine, store, disk


def _to_disk(engine: Any, store: TieredStore) -> None:
    engine.drain()
    store.evict(engine.pool.num_blocks, tier="hbm")  # write-back: hbm -> host
    store.evict(16, tier="host")  # host -> disk


@pytest.mark.parametrize(
    ("policy", "timeout_s", "reused"),
    [("best_effort", 5.0, 0), ("wait_complete", 0.01, 48), ("timeout", 0.05, 0), ("timeout", 5.0, 48)],
)
def test_engine_output_identical_under_each_policy(
    model: Any, tmp_path: os.PathLike[str], monkeypatch: pytest.MonkeyPatch,
    policy: str, timeout_s: float, reused: int,
) -> None:
    import random

    from runtime.sampling import SamplingParams

    greedy = SamplingParams(max_tokens=8)
    engine, store, disk = _engine(model, os.path.join(tmp_path, "disk"),
                                  prefetch_policy=policy, prefetch_timeout_s=timeout_s)
    p = [random.Random(9).randrange(3, 512) for _ in range(53)]
    (ref,) = engine.generate([p], greedy)  # computed from scratch
    _to_disk(engine, store)
    real = disk._read

    def slow(*a: Any, **k: Any) -> Any:
        time.sleep(0.3)
        return real(*a, **k)

    monkeypatch.setattr(disk, "_read", slow)
    (o,) = engine.generate([p], greedy)
    assert o.output_token_ids == ref.output_token_ids
    assert o.metrics.num_tokens_reused.get("disk", 0) == reused  # loaded through host
    failed = engine.connector.worker.stats().load_failures
    assert sum(failed.values()) == (3 - reused // BS)
    engine.drain()
    engine.close()
    store.close()


def test_engine_feeds_prefill_speed_and_declines_slow_loads(
    model: Any, tmp_path: os.PathLike[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import random

    from runtime.sampling import SamplingParams

    greedy = SamplingParams(max_tokens=8)
    engine, store, _ = _engine(model, os.path.join(tmp_path, "disk"), load_or_recompute=True)
    sched = engine.connector.scheduler
    p = [random.Random(9).randrange(3, 512) for _ in range(53)]
    (ref,) = engine.generate([p], greedy)
    assert engine.prefill_tokens_per_s is not None and engine.prefill_tokens_per_s > 0
    assert sched.recompute_tokens_per_s == engine.prefill_tokens_per_s
    _to_disk(engine, store)
    monkeypatch.setattr(store, "read_bandwidth", lambda name: 1.0)  # 1 B/s: never pays
    (o,) = engine.generate([p], greedy)
    assert o.output_token_ids == ref.output_token_ids
    assert o.metrics.num_tokens_reused.get("disk", 0) == 0
    assert sched.decisions == {"recompute": 3}
    assert _decisions(store, "recompute") == 3
    assert engine.connector.worker.stats().load_failures == {}
    engine.drain()
    engine.close()
    store.close()


def test_synchronous_load_below_host_waits_on_the_engine_thread(setup: Setup) -> None:
    """``async_below_host=False`` with ``cpu_inline`` (vLLM's CPU backend): a match reaching
    disk is planned synchronous, and start_load_kv itself prefetches it into host and copies
    every block before it returns -- no load thread, nothing reported in ``recving``."""
    s = setup
    rig = Rig(s.store, s.ns, s.clock, cpu_inline=True)
    rig.sched = InProcessScheduler(s.store, s.ns, num_blocks=rig.sched.num_blocks,
                                   async_below_host=False)
    dst = [8, 9, 10, 11]
    assert rig.plan_load("r", s.tokens, dst) == (N * s.layout.block_size, False)
    rig.worker.bind_connector_metadata(rig.sched.build_connector_meta())
    rig.worker.start_load_kv()
    for src, d in zip(s.src, dst):  # every block in place before any wait_for_layer_load
        assert torch.equal(rig.block(d), s.rig.block(src))
    for lyr in range(s.layout.num_layers):
        rig.worker.wait_for_layer_load(lyr)
    rig.worker.clear_connector_metadata()
    rig.worker.wait_for_loads()
    assert rig.worker.get_block_ids_with_load_errors() == set()
    assert rig.worker.get_finished([]).recving == frozenset()
    assert s.store.tier("host").count_leading(s.keys) == N  # prefetched into host
    rig.worker.close()
