"""The in-process connector, end to end on CPU: layer-wise saves and loads between an engine-shaped
KV cache and a TieredStore, overlap, failed loads, leases, bad input, delayed free."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator

import pytest
import torch

from connector import (
    ConnectorMetadata,
    InProcessScheduler,
    InProcessWorker,
    KVCacheSpec,
    LoadSpec,
)
from kvstore import InvalidArgument, KVLayout, Namespace, TieredStore
from kvstore.ops import Spans, copy_spans
from kvstore.tiers.host import HostTier

NUM_BLOCKS = 16
N = 4  # blocks per test sequence


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Rig:
    """A store, the two connector sides and an engine-shaped page-first pool."""

    def __init__(self, store: TieredStore, ns: Namespace, clock: FakeClock,
                 copy_fn: Callable[[Spans], None] = copy_spans, per_layer: bool = False,
                 cpu_inline: bool = False) -> None:
        self.store, self.ns, self.layout = store, ns, store.layout
        self.sched = InProcessScheduler(store, ns, num_blocks=NUM_BLOCKS)
        self.worker = InProcessWorker(store, clock=clock, copy_fn=copy_fn, load_timeout_s=5.0,
                                      cpu_inline=cpu_inline)
        self.pool = torch.zeros((NUM_BLOCKS, *self.layout.page_shape), dtype=torch.float16)
        if per_layer:
            self.caches = [torch.zeros((NUM_BLOCKS, *self.layout.page_shape[1:]), dtype=torch.float16)
                           for _ in range(self.layout.num_layers)]
            self.worker.register_kv_caches(KVCacheSpec.per_layer(self.caches))
        else:
            self.worker.register_kv_caches(KVCacheSpec.page_first(self.pool))

    def block(self, b: int) -> torch.Tensor:
        """Block b as one page [L, 2, B, H, D], as int16 bits (exact comparison, NaNs too)."""
        if hasattr(self, "caches"):
            return torch.stack([c[b] for c in self.caches]).view(torch.int16)
        return self.pool[b].view(torch.int16)

    def fill(self, block_ids: list[int], seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        for b in block_ids:
            bits = torch.randint(-(2**15), 2**15, self.layout.page_shape, dtype=torch.int16, generator=g)
            if hasattr(self, "caches"):
                for lyr, c in enumerate(self.caches):
                    c[b].view(torch.int16).copy_(bits[lyr])
            else:
                self.pool[b].view(torch.int16).copy_(bits)

    def save(self, rid: str, tokens: list[int], block_ids: list[int]) -> None:
        metas = self.ns.chain(tokens).metas(0, len(block_ids))
        self.sched.request_save(rid, block_ids, metas)
        self.worker.bind_connector_metadata(self.sched.build_connector_meta())
        for lyr in range(self.layout.num_layers):
            self.worker.save_kv_layer(lyr)
        self.worker.wait_for_save()
        self.worker.clear_connector_metadata()

    def wait_sent(self, rid: str, timeout_s: float = 5.0) -> None:
        """request_finished -> delayed free -> reported once the saves are stored."""
        assert self.sched.request_finished(rid) is True
        ids = [rid]
        deadline = time.monotonic() + timeout_s
        while rid not in self.worker.get_finished(ids).sending:
            ids = []
            assert time.monotonic() < deadline, "save never reported finished"
            time.sleep(0.005)

    def plan_load(self, rid: str, tokens: list[int], block_ids: list[int]) -> tuple[int, bool]:
        m = self.sched.get_num_new_matched_tokens(rid, tokens, 0)
        n = min(m.num_tokens, len(block_ids) * self.layout.block_size)
        self.sched.update_state_after_alloc(rid, block_ids[: n // self.layout.block_size], n)
        return m.num_tokens, m.load_async

    def run_load_step(self) -> None:
        self.worker.bind_connector_metadata(self.sched.build_connector_meta())
        self.worker.start_load_kv()
        for lyr in range(self.layout.num_layers):
            self.worker.wait_for_layer_load(lyr)
        self.worker.clear_connector_metadata()

    def close(self) -> None:
        self.worker.close()
        self.sched.close()
        self.store.close()


def tokens_for(n_blocks: int, block_size: int, seed: int = 1) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 30000, (n_blocks * block_size + 1,), generator=g).tolist()


@pytest.fixture
def host_store(layout: KVLayout, clock: FakeClock) -> Iterator[TieredStore]:
    store = TieredStore(layout, [HostTier.build("host", layout, 32, pin_memory=False)], clock=clock)
    yield store


def test_round_trip_layerwise_exact(host_store: TieredStore, ns: Namespace, clock: FakeClock) -> None:
    for per_layer in (False, True):
        rig = Rig(host_store, ns, clock, per_layer=per_layer)
        tokens = tokens_for(N, rig.layout.block_size, seed=int(per_layer))
        src = [3, 7, 1, 9]
        rig.fill(src, seed=5)
        rig.save("w", tokens, src)
        rig.wait_sent("w")
        assert host_store.tier("host").count_leading(ns.chain(tokens).keys) == N

        fresh = Rig(host_store, ns, clock, per_layer=per_layer)
        dst = [10, 2, 14, 5]
        assert fresh.plan_load("r", tokens, dst) == (N * rig.layout.block_size, False)
        fresh.run_load_step()
        assert fresh.worker.get_block_ids_with_load_errors() == set()
        for s, d in zip(src, dst):
            assert torch.equal(fresh.block(d), rig.block(s))
        untouched = [b for b in range(NUM_BLOCKS) if b not in dst]
        assert all(not fresh.block(b).any() for b in untouched)
        assert fresh.worker.stats().blocks_loaded == N
        assert host_store.stats().active_leases == 0
        host_store.check_integrity()
        # blocks already stored are not saved again
        rig.sched.request_save("again", src, ns.chain(tokens).metas(0, N))
        assert rig.sched.build_connector_meta().saves == ()
        rig.worker.close()
        fresh.worker.close()
        host_store.delete(ns.chain(tokens).keys)


def test_layer_zero_ready_before_last_layer(host_store: TieredStore, ns: Namespace,
                                           clock: FakeClock) -> None:
    rig = Rig(host_store, ns, clock)
    tokens = tokens_for(N, rig.layout.block_size)
    rig.fill([0, 1, 2, 3])
    rig.save("w", tokens, [0, 1, 2, 3])
    rig.wait_sent("w")

    calls = 0

    def slow_copy(spans: Spans) -> None:  # layer 0 fast, every later layer 0.15 s
        nonlocal calls
        calls += 1
        if calls > 1:
            time.sleep(0.15)
        copy_spans(spans)

    loader = Rig(host_store, ns, clock, copy_fn=slow_copy)
    dst = [4, 5, 6, 7]
    loader.plan_load("r", tokens, dst)
    loader.worker.bind_connector_metadata(loader.sched.build_connector_meta())
    t0 = time.monotonic()
    loader.worker.start_load_kv()
    loader.worker.wait_for_layer_load(0)
    t_layer0 = time.monotonic() - t0
    last = rig.layout.num_layers - 1
    assert t_layer0 < 0.12
    for s, d in zip([0, 1, 2, 3], dst):  # layer 0 is in place, the last layer not yet
        assert torch.equal(loader.pool[d, 0].view(torch.int16), rig.pool[s, 0].view(torch.int16))
        assert not loader.pool[d, last].view(torch.int16).any()
    loader.worker.wait_for_layer_load(last)
    assert time.monotonic() - t0 >= 0.3
    for s, d in zip([0, 1, 2, 3], dst):
        assert torch.equal(loader.block(d), rig.block(s))
    loader.worker.clear_connector_metadata()
    assert loader.worker.get_block_ids_with_load_errors() == set()
    loader.close()


@pytest.mark.parametrize("per_layer", [False, True])
@pytest.mark.parametrize("dst", [[4, 5, 6, 7], [7, 5, 4, 6]])
def test_cpu_inline_copies_run_on_the_engine_thread(host_store: TieredStore, ns: Namespace,
                                                    clock: FakeClock, dst: list[int],
                                                    per_layer: bool) -> None:
    """With ``cpu_inline`` a host load runs whole in start_load_kv, on the caller's thread --
    pinned, copied, completed -- (saves keep the save thread); the bytes round-trip exactly.
    Blocks and slots in one run copy as one torch copy per layer (the copy function is not
    called); scattered ones page by page through the copy function."""
    threads: list[int] = []

    def recording_copy(spans: Spans) -> None:
        threads.append(threading.get_ident())
        copy_spans(spans)

    rig = Rig(host_store, ns, clock, copy_fn=recording_copy, cpu_inline=True, per_layer=per_layer)
    tokens = tokens_for(N, rig.layout.block_size)
    rig.fill([0, 1, 2, 3], seed=3)
    rig.save("w", tokens, [0, 1, 2, 3])
    assert len(threads) == rig.layout.num_layers and threading.get_ident() not in threads
    rig.wait_sent("w")
    threads.clear()
    rig.plan_load("r", tokens, dst)
    rig.worker.bind_connector_metadata(rig.sched.build_connector_meta())
    rig.worker.start_load_kv()
    one_run = dst == sorted(dst)
    # before any wait
    assert threads == ([] if one_run else [threading.get_ident()] * rig.layout.num_layers)
    assert rig.worker.stats().blocks_loaded == N  # completed (unpinned) there too
    assert host_store.stats().active_leases == 0
    for s, d in zip([0, 1, 2, 3], dst):
        assert torch.equal(rig.block(d), rig.block(s))
    for lyr in range(rig.layout.num_layers):
        rig.worker.wait_for_layer_load(lyr)
    rig.worker.clear_connector_metadata()
    rig.worker.wait_for_loads()
    assert rig.worker.get_block_ids_with_load_errors() == set()
    assert rig.worker.stats().blocks_loaded == N
    rig.close()


def test_a_load_of_pages_the_lookup_found_in_host_does_not_ask_host_again(
        host_store: TieredStore, ns: Namespace, clock: FakeClock,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The lease keeps pages the lookup found in host there: the load pins them without a
    count of the leading run first (over the daemon that is a round trip on the engine
    thread); the bytes round-trip exactly."""
    rig = Rig(host_store, ns, clock, cpu_inline=True)
    tokens = tokens_for(N, rig.layout.block_size)
    rig.fill([0, 1, 2, 3], seed=5)
    rig.save("w", tokens, [0, 1, 2, 3])
    rig.wait_sent("w")
    asked: list[int] = []
    host = host_store.tier("host")
    count = host.count_leading
    monkeypatch.setattr(host, "count_leading", lambda keys: asked.append(len(keys)) or count(keys))
    rig.plan_load("r", tokens, [4, 5, 6, 7])
    meta = rig.sched.build_connector_meta()
    assert [spec.in_host for spec in meta.loads] == [N]
    rig.worker.bind_connector_metadata(meta)
    rig.worker.start_load_kv()
    assert asked == [] and rig.worker.stats().blocks_loaded == N
    for s_, d in zip([0, 1, 2, 3], [4, 5, 6, 7]):
        assert torch.equal(rig.block(d), rig.block(s_))
    rig.worker.clear_connector_metadata()
    rig.close()


def test_page_deleted_from_host_between_lookup_and_load(host_store: TieredStore, ns: Namespace,
                                                        clock: FakeClock) -> None:
    rig = Rig(host_store, ns, clock)
    tokens = tokens_for(N, rig.layout.block_size)
    src = [0, 1, 2, 3]
    rig.fill(src)
    rig.save("w", tokens, src)
    rig.wait_sent("w")

    loader = Rig(host_store, ns, clock)
    dst = [8, 9, 10, 11]
    loader.plan_load("r", tokens, dst)
    host_store.tier("host").delete([ns.chain(tokens).keys[2]])  # gone after the lookup
    loader.run_load_step()
    assert loader.worker.get_block_ids_with_load_errors() == {10, 11}
    assert loader.worker.get_block_ids_with_load_errors() == set()  # reported once
    for s, d in zip(src[:2], dst[:2]):
        assert torch.equal(loader.block(d), rig.block(s))
    assert not loader.block(10).any() and not loader.block(11).any()  # nothing written
    st = loader.worker.stats()
    assert st.blocks_loaded == 2 and st.load_failures == {"miss": 2}
    assert host_store.stats().active_leases == 0
    loader.close()


def disk_store(layout: KVLayout, clock: FakeClock, path: os.PathLike[str]) -> TieredStore:
    """Host over disk, write-through: every saved page is on disk too."""
    from kvstore.tiers.disk import DiskTier

    disk = DiskTier.build("disk", layout, 32, path=path, o_direct=False, durability="none",
                    check_index=False)
    return TieredStore(layout, [HostTier.build("host", layout, 32, pin_memory=False), disk],
                       write_policy="write_through", clock=clock)


def saved_on_disk(store: TieredStore, ns: Namespace, clock: FakeClock) -> tuple[Rig, list[int]]:
    """A rig over ``store`` that saved blocks 0-3 (their tokens returned)."""
    rig = Rig(store, ns, clock)
    tokens = tokens_for(N, store.layout.block_size)
    rig.fill([0, 1, 2, 3])
    rig.save("w", tokens, [0, 1, 2, 3])
    rig.wait_sent("w")
    return rig, tokens


@pytest.mark.parametrize("corrupt", [False, True])
def test_lower_tier_pages_load_async_and_corrupt_page_fails(
    layout: KVLayout, ns: Namespace, clock: FakeClock, tmp_path: os.PathLike[str], corrupt: bool
) -> None:
    store = disk_store(layout, clock, tmp_path / "disk")
    disk = store.tier("disk")
    rig, tokens = saved_on_disk(store, ns, clock)
    keys = ns.chain(tokens).keys
    src = [0, 1, 2, 3]
    assert disk.count_leading(keys) == N
    store.tier("host").delete(keys[2:])  # blocks 2, 3 now only on disk

    loader = Rig(store, ns, clock)
    dst = [12, 13, 14, 15]
    assert loader.plan_load("r", tokens, dst) == (N * layout.block_size, True)
    if corrupt:  # flip a payload byte of block 2's record after the lookup
        slot = disk.slot_of(keys[2])
        assert slot is not None
        with open(tmp_path / "disk" / "slots.dat", "r+b") as f:
            off = slot * disk.slot_bytes + disk._slab.hdr_region + 7
            f.seek(off)
            byte = f.read(1)
            f.seek(off)
            f.write(bytes([byte[0] ^ 0xFF]))
    loader.worker.bind_connector_metadata(loader.sched.build_connector_meta())
    loader.worker.start_load_kv()
    loader.worker.wait_for_layer_load(layout.num_layers - 1)  # async loads are not waited for
    loader.worker.clear_connector_metadata()
    deadline = time.monotonic() + 5
    while "r" not in loader.worker.get_finished([]).recving:
        assert time.monotonic() < deadline
        time.sleep(0.005)
    errors = loader.worker.get_block_ids_with_load_errors()
    good = 2 if corrupt else N
    assert errors == set(dst[good:])
    for s, d in zip(src[:good], dst[:good]):
        assert torch.equal(loader.block(d), rig.block(s))
    for d in dst[good:]:
        assert not loader.block(d).any()
    if corrupt:
        assert loader.worker.stats().load_failures == {"miss": 2}
        assert disk.stats().corrupt == 1
    assert loader.sched.request_finished("r") is True  # async load: delayed free
    assert "r" in loader.worker.get_finished(["r"]).sending
    loader.close()
    rig.worker.close()


def test_expired_lease_fails_the_load(host_store: TieredStore, ns: Namespace,
                                      clock: FakeClock) -> None:
    rig = Rig(host_store, ns, clock)
    tokens = tokens_for(N, rig.layout.block_size)
    rig.fill([0, 1, 2, 3])
    rig.save("w", tokens, [0, 1, 2, 3])
    rig.wait_sent("w")
    loader = Rig(host_store, ns, clock)
    dst = [4, 5, 6, 7]
    loader.plan_load("r", tokens, dst)
    clock.now += host_store.lease_ttl_s + 1
    loader.run_load_step()
    assert loader.worker.get_block_ids_with_load_errors() == set(dst)
    assert loader.worker.stats().load_failures == {"lease_expired": N}
    assert all(not loader.block(d).any() for d in dst)
    assert host_store.stats().active_leases == 0
    loader.close()


def test_bad_inputs_raise_and_change_nothing(host_store: TieredStore, ns: Namespace,
                                             clock: FakeClock, layout: KVLayout) -> None:
    rig = Rig(host_store, ns, clock)
    w = InProcessWorker(host_store, clock=clock)
    per = layout.page_shape[1:]
    bad_specs = [
        KVCacheSpec.per_layer([torch.zeros((8, *per), dtype=torch.float16)] * 3),  # 3 of 4 layers
        KVCacheSpec.page_first(torch.zeros((8, *layout.page_shape), dtype=torch.float32)),
        KVCacheSpec.page_first(torch.zeros((8, 4, 2, 4, 2, 4), dtype=torch.float16)),  # head_dim
        KVCacheSpec.per_layer([torch.zeros((8, *per), dtype=torch.float16)] * 3
                              + [torch.zeros((9, *per), dtype=torch.float16)]),
        KVCacheSpec.page_first(torch.zeros((*layout.page_shape, 8), dtype=torch.float16)
                               .permute(5, 0, 1, 2, 3, 4)),  # not contiguous
        KVCacheSpec("pages", (torch.zeros(1),)),  # type: ignore[arg-type]
    ]
    for spec in bad_specs:
        with pytest.raises(InvalidArgument):
            w.register_kv_caches(spec)
    with pytest.raises(InvalidArgument, match="no KV caches registered"):
        w.bind_connector_metadata(ConnectorMetadata())

    tokens = tokens_for(N, layout.block_size)
    with pytest.raises(InvalidArgument, match="no pending match"):
        rig.sched.update_state_after_alloc("nobody", [0], layout.block_size)
    rig.fill([0, 1, 2, 3])
    rig.save("w", tokens, [0, 1, 2, 3])
    rig.wait_sent("w")
    m = rig.sched.get_num_new_matched_tokens("r", tokens, 0)
    assert m.num_tokens == N * layout.block_size
    with pytest.raises(InvalidArgument, match="not in"):
        rig.sched.update_state_after_alloc("r", [0, 1, 2, NUM_BLOCKS], m.num_tokens)
    with pytest.raises(InvalidArgument, match="need 4 blocks"):
        rig.sched.update_state_after_alloc("r", [0, 1], m.num_tokens)
    with pytest.raises(InvalidArgument, match="multiple of"):
        rig.sched.get_num_new_matched_tokens("r2", tokens, 3)
    assert rig.sched.build_connector_meta().loads == ()  # nothing planned by the failures
    rig.sched.update_state_after_alloc("r", [4, 5, 6, 7], m.num_tokens)  # the match survived
    meta = rig.sched.build_connector_meta()
    assert len(meta.loads) == 1
    with pytest.raises(InvalidArgument, match="request_save takes|blocks but"):
        rig.sched.request_save("w2", [0, 1], ns.chain(tokens).metas(0, 1))

    # worker: a plan naming blocks outside the registered cache binds nothing
    small = InProcessWorker(host_store, clock=clock)
    small.register_kv_caches(KVCacheSpec.page_first(
        torch.zeros((4, *layout.page_shape), dtype=torch.float16)))
    with pytest.raises(InvalidArgument, match=r"not in \[0, 4\)"):
        small.bind_connector_metadata(meta)
    with pytest.raises(InvalidArgument, match="no plan bound"):
        small.start_load_kv()
    with pytest.raises(InvalidArgument, match="not in"):
        rig.worker.save_kv_layer(layout.num_layers)
    bogus = LoadSpec("x", ns.id, (0,), (b"\0" * 16,), None, False)
    small.bind_connector_metadata(ConnectorMetadata(loads=(bogus,)))  # in range: binds
    small.clear_connector_metadata()
    rig.worker.bind_connector_metadata(meta)
    rig.worker.start_load_kv()
    rig.worker.wait_for_layer_load(layout.num_layers - 1)
    rig.worker.clear_connector_metadata()
    assert rig.worker.get_block_ids_with_load_errors() == set()
    assert torch.equal(rig.block(4), rig.block(0))
    assert rig.sched.request_finished("unknown") is False
    small.close()
    w.close()
    rig.close()


def test_finished_with_saves_in_flight_is_freed_after_the_save(
    host_store: TieredStore, ns: Namespace, clock: FakeClock
) -> None:
    gate = threading.Event()
    calls = 0

    def gated_copy(spans: Spans) -> None:  # the last layer's copy waits for the gate
        nonlocal calls
        calls += 1
        if calls == 4:
            assert gate.wait(5)
        copy_spans(spans)

    rig = Rig(host_store, ns, clock, copy_fn=gated_copy)
    tokens = tokens_for(N, rig.layout.block_size)
    keys = ns.chain(tokens).keys
    rig.fill([0, 1, 2, 3])
    rig.sched.request_save("w", [0, 1, 2, 3], ns.chain(tokens).metas())
    rig.worker.bind_connector_metadata(rig.sched.build_connector_meta())
    for lyr in range(rig.layout.num_layers):
        rig.worker.save_kv_layer(lyr)
    rig.worker.clear_connector_metadata()
    assert rig.sched.request_finished("w") is True  # saves in flight: delay the free
    assert rig.worker.get_finished(["w"]).sending == frozenset()
    time.sleep(0.05)
    assert rig.worker.get_finished([]).sending == frozenset()
    assert host_store.tier("host").count_leading(keys) == 0
    gate.set()
    rig.worker.wait_for_save()
    deadline = time.monotonic() + 5
    while "w" not in rig.worker.get_finished([]).sending:
        assert time.monotonic() < deadline
        time.sleep(0.005)
    assert host_store.tier("host").count_leading(keys) == N  # stored before it was reported
    assert rig.worker.get_finished([]).sending == frozenset()  # reported once
    # a request without transfers is freed at once
    assert rig.sched.request_finished("idle") is False
    # a save requested but never handed to the worker is dropped and delays nothing
    rig.sched.request_save("late", [4], ns.chain(tokens_for(N, rig.layout.block_size) + [9] * 4)
                           .metas()[-1:])
    assert rig.sched.request_finished("late") is False
    assert rig.sched.build_connector_meta().saves == ()
    rig.close()


def test_incomplete_save_is_abandoned(host_store: TieredStore, ns: Namespace,
                                      clock: FakeClock) -> None:
    rig = Rig(host_store, ns, clock)
    tokens = tokens_for(N, rig.layout.block_size)
    rig.fill([0, 1, 2, 3])
    rig.sched.request_save("w", [0, 1, 2, 3], ns.chain(tokens).metas())
    rig.worker.bind_connector_metadata(rig.sched.build_connector_meta())
    rig.worker.save_kv_layer(0)
    with pytest.raises(InvalidArgument, match="already saved"):
        rig.worker.save_kv_layer(0)
    rig.worker.wait_for_save()
    rig.worker.clear_connector_metadata()
    assert rig.worker.stats().saves_abandoned == 1
    assert host_store.tier("host").count_leading(ns.chain(tokens).keys) == 0
    assert rig.sched.request_finished("w") is True
    assert "w" in rig.worker.get_finished(["w"]).sending
    rig.close()


def test_a_step_that_ends_before_its_save_hooks_reserves_nothing(
        host_store: TieredStore, ns: Namespace, clock: FakeClock) -> None:
    """Host slots are reserved by the first save hook, not at bind (the engine binds before
    it queues the forward): a step whose forward never ran leaves every slot free, counts the
    save abandoned, and does not hold its request's blocks."""
    rig = Rig(host_store, ns, clock)
    host = host_store.staging_tier("host")

    def free_slots() -> int:  # every slot a writer could reserve now
        got = host.reserve(1 << 30)
        host.unreserve(got)
        return len(got)

    tokens = tokens_for(N, rig.layout.block_size)
    rig.fill([0, 1, 2, 3])
    free_before = free_slots()
    rig.sched.request_save("w", [0, 1, 2, 3], ns.chain(tokens).metas())
    rig.worker.bind_connector_metadata(rig.sched.build_connector_meta())
    assert free_slots() == free_before  # nothing reserved yet
    rig.worker.clear_connector_metadata()
    assert rig.worker.stats().saves_abandoned == 1
    assert free_slots() == free_before
    assert rig.sched.request_finished("w") is True
    assert "w" in rig.worker.get_finished(["w"]).sending
    host_store.check_integrity()
    rig.close()


def test_prefetch_timeout_and_page_deleted_during_copy_fail(
    host_store: TieredStore, layout: KVLayout, ns: Namespace, clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch, tmp_path: os.PathLike[str],
) -> None:
    from concurrent.futures import Future

    # timeout: blocks 2, 3 must come from disk, and the prefetch never completes
    tiered = disk_store(layout, clock, tmp_path / "disk")
    saver, tokens = saved_on_disk(tiered, ns, clock)
    keys = ns.chain(tokens).keys
    tiered.tier("host").delete(keys[2:])
    loader = Rig(tiered, ns, clock)
    loader.worker.load_timeout_s = 0.05
    loader.plan_load("r", tokens, [4, 5, 6, 7])
    monkeypatch.setattr(tiered, "prefetch", lambda *a, **k: Future())
    loader.run_load_step()
    loader.worker.wait_for_loads()  # from below host: asynchronous
    assert loader.worker.get_block_ids_with_load_errors() == {6, 7}
    assert loader.worker.stats().load_failures == {"timeout": 2}
    monkeypatch.undo()
    loader.worker.close()
    loader.sched.close()
    saver.close()  # and the store

    rig = Rig(host_store, ns, clock)
    rig.fill([0, 1, 2, 3])

    # block 0's page is deleted while its layers are being copied: the load pinned its slot,
    # so the copy still reads that page's bytes, and the slot is freed once the load completes
    rig.save("w2", tokens, [0, 1, 2, 3])
    rig.wait_sent("w2")
    host = host_store.tier("host")

    def deleting_copy(spans: Spans) -> None:
        host.delete([keys[0]])
        copy_spans(spans)

    loader = Rig(host_store, ns, clock, copy_fn=deleting_copy)
    loader.plan_load("r", tokens, [4, 5, 6, 7])
    free_before = host.free_pages
    loader.run_load_step()
    assert loader.worker.get_block_ids_with_load_errors() == set()
    for s, d in zip([0, 1, 2, 3], [4, 5, 6, 7]):
        assert torch.equal(loader.block(d), rig.block(s))
    assert host.free_pages == free_before + 1  # the unlinked slot, once unpinned
    assert host_store.stats().active_leases == 0
    loader.close()


def test_unexpected_errors_fail_the_transfer_not_the_engine(
    host_store: TieredStore, ns: Namespace, clock: FakeClock, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "kvstore.connector")
    rig = Rig(host_store, ns, clock)
    tokens = tokens_for(N, rig.layout.block_size)
    rig.fill([0, 1, 2, 3])
    monkeypatch.setattr(host_store, "complete_store", lambda *a, **k: 1 / 0)
    rig.save("w", tokens, [0, 1, 2, 3])
    rig.wait_sent("w")  # still reported, so the engine frees the blocks
    assert rig.worker.stats().saves_abandoned == 1
    monkeypatch.undo()
    rig.save("w2", tokens, [0, 1, 2, 3])
    rig.wait_sent("w2")

    def broken_copy(spans: Spans) -> None:
        raise RuntimeError("copy failed")

    loader = Rig(host_store, ns, clock, copy_fn=broken_copy)
    loader.plan_load("r", tokens, [4, 5, 6, 7])
    loader.run_load_step()
    assert loader.worker.get_block_ids_with_load_errors() == {4, 5, 6, 7}
    assert loader.worker.stats().load_failures == {"error": 4}
    assert host_store.stats().active_leases == 0
    loader.close()
    # each failure says why, once: never swallowed without a word
    logged = [r.getMessage() for r in caplog.records if r.name == "kvstore.connector"]
    assert logged == [
        "kvstore save of 4 block(s) failed (reason error): ZeroDivisionError: division by zero; "
        "they are not stored (a later miss)",
        "kvstore load of 4 block(s) failed (reason error): RuntimeError: copy failed; they are "
        "recomputed"]


def test_the_scheduler_labels_its_namespace_with_the_store(host_store: TieredStore) -> None:
    ns = Namespace("some/model", host_store.layout, "t1")
    InProcessScheduler(host_store, ns, num_blocks=NUM_BLOCKS)
    assert host_store.namespace_labels.snapshot() == {ns.id: "some/model · tenant t1"}


def test_a_partial_hit_is_answered_at_once_by_a_store_without_remote_tiers(
        host_store: TieredStore, ns: Namespace, clock: FakeClock) -> None:
    """Only a store with a shared (network) tier defers a partial hit to a background lookup
    (answering "not known yet"); one without answers in the same call. (The connector read the
    in-process store's ``has_remote_tiers`` method, not its value: every partial hit took a
    background lookup and an engine step's delay.)"""
    rig = Rig(host_store, ns, clock)
    tokens = tokens_for(N, rig.layout.block_size, seed=11)
    rig.fill([0, 1])
    rig.save("w", tokens, [0, 1])  # the first 2 of N blocks
    rig.wait_sent("w")
    m = rig.sched.get_num_new_matched_tokens("r", tokens, 0)
    assert m.num_tokens == 2 * rig.layout.block_size
    assert rig.sched.pending_answers == 0
