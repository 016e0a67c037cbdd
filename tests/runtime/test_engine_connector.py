"""Engine + in-process KV connector: prefixes evicted from the hbm pool are loaded back from the
host tier instead of recomputed. Greedy outputs are identical to a no-cache reference whether the
prefix comes from hbm, host, both, or nowhere; failed loads are recomputed; blocks are freed only
once the connector's transfers are done."""

from __future__ import annotations

import random

import pytest
import torch

from connector import InProcessScheduler, InProcessWorker
from kvstore.keys import Namespace
from kvstore.metrics import Metrics
from kvstore.store import TieredStore
from kvstore.tiers.base import Tier
from kvstore.tiers.hbm import HBMTier
from kvstore.tiers.host import HostTier
from runtime import LlamaForPagedLM, get_model_config
from runtime.engine import Engine
from runtime.request import RequestOutput
from runtime.sampling import SamplingParams

BS = 16
GREEDY = SamplingParams(max_tokens=8)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def model() -> LlamaForPagedLM:
    return LlamaForPagedLM.from_random(get_model_config("tiny"), seed=7)


def make_engine(model: LlamaForPagedLM, num_blocks: int = 64, host_pages: int = 64, *,
                connector: bool = True, write_policy: str = "write_back",
                cpu_inline: bool = False, **kw: object) -> Engine:
    layout = model.config.kv_layout(BS)
    m = Metrics()
    pool = HBMTier.build("hbm", layout, num_blocks, m, device=device_of(model))
    host = HostTier.build("host", layout, host_pages, m)  # pinned where CUDA is present
    store = TieredStore(layout, [pool, host], write_policy=write_policy)  # type: ignore[arg-type]
    ns = Namespace("test/tiny/7", layout)
    conn = (InProcessScheduler(store, ns, num_blocks=num_blocks),
            InProcessWorker(store, cpu_inline=cpu_inline)) if connector else None
    engine = Engine(model, pool, ns, connector=conn, **kw)  # type: ignore[arg-type]
    engine.store = store
    return engine


def make_disk_engine(model: LlamaForPagedLM, tmp_path) -> Engine:  # type: ignore[no-untyped-def]
    """An engine whose store is [hbm 32, host 16, disk 32 in ``tmp_path``] (write-back), with an
    in-process connector: pages evicted from host go to disk and load back through host."""
    from kvstore.tiers.disk import DiskTier

    layout = model.config.kv_layout(BS)
    m = Metrics()
    pool = HBMTier.build("hbm", layout, 32, m, device=device_of(model))
    host = HostTier.build("host", layout, 16, m)
    disk = DiskTier.build("disk", layout, 32, m, path=tmp_path / "disk", o_direct=False, durability="none")
    store = TieredStore(layout, [pool, host, disk], write_policy="write_back")  # type: ignore[arg-type]
    ns = Namespace("test/tiny/7", layout)
    engine = Engine(model, pool, ns, connector=(InProcessScheduler(store, ns, num_blocks=32),
                                                InProcessWorker(store)))
    engine.store = store
    return engine


def device_of(model: LlamaForPagedLM) -> torch.device:
    """The pool goes where the model is (tests/gpu reruns this module's tests on CUDA)."""
    return next(model.parameters()).device


def prompt(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(3, 512) for _ in range(n)]


def reference(model: LlamaForPagedLM, prompts: list[list[int]]) -> list[list[int]]:
    """Each prompt alone, no cache at all (no prefix caching, no connector)."""
    out = []
    for p in prompts:
        engine = make_engine(model, 64, connector=False, enable_prefix_caching=False)
        out.append(engine.generate([p], GREEDY)[0].output_token_ids)
    return out


def tokens(outs: list[RequestOutput]) -> list[list[int]]:
    return [o.output_token_ids for o in outs]


def clear_hbm(engine: Engine) -> None:
    """Evict every cached block from the hbm pool (write-back copies them to host)."""
    engine.drain()
    assert engine.store is not None
    # write-through copies of the last commits may still run on the store's mover: a block
    # being copied down is not evictable until its copy is done
    engine.store.drain()
    engine.store.evict(engine.pool.num_blocks, tier="hbm")
    assert engine.pool.num_free == engine.pool.num_blocks


def assert_clean(engine: Engine) -> None:
    engine.drain()
    pool = engine.pool
    pool.check_integrity()
    assert not engine.has_unfinished()
    assert engine.num_pending_frees == 0
    assert pool.num_free + pool.num_evictable == pool.num_blocks
    assert all(pool.refcount(b) == 0 for b in range(pool.num_blocks))


def close(engine: Engine) -> None:
    engine.close()
    assert engine.store is not None
    engine.store.close()


@pytest.mark.parametrize("chunk_size", [None, 16])
def test_prefix_from_hbm_host_and_none_identical(model: LlamaForPagedLM,
                                                 chunk_size: int | None) -> None:
    p = prompt(random.Random(1), 53)  # 3 full blocks + 5
    (ref,) = reference(model, [p])
    engine = make_engine(model, chunk_size=chunk_size)
    (cold,) = engine.generate([p], GREEDY)  # computed
    (hot,) = engine.generate([p], GREEDY)  # hbm hit
    assert cold.output_token_ids == hot.output_token_ids == ref
    assert hot.metrics.num_tokens_reused == {"hbm": 48, "host": 0}
    # the connector saved the full blocks to host (write-back: request_save, not eviction)
    engine.drain()
    host = engine.store.tier("host")  # type: ignore[union-attr]
    keys = engine.namespace.chain(p).keys
    assert all(host.contains(keys[:3]))
    clear_hbm(engine)
    (warm,) = engine.generate([p], GREEDY)  # host hit: loaded, not recomputed
    assert warm.output_token_ids == ref
    assert warm.metrics.num_tokens_reused == {"hbm": 0, "host": 48}
    assert warm.metrics.num_tokens_computed == 5
    assert warm.metrics.num_tokens_load_failed == 0
    assert engine.scheduler.num_tokens_loaded == 48
    # the loaded blocks were committed to hbm: the next run hits hbm
    (again,) = engine.generate([p], GREEDY)
    assert again.output_token_ids == ref
    assert again.metrics.num_tokens_reused == {"hbm": 48, "host": 0}
    assert_clean(engine)
    close(engine)


def test_partial_and_mixed_hits(model: LlamaForPagedLM) -> None:
    rng = random.Random(2)
    a = prompt(rng, 60)  # 3 full blocks + 12
    b = a[:32] + prompt(rng, 20)  # shares 2 blocks with a
    c = a[:16] + prompt(rng, 9)  # shares 1 block with a
    ref = reference(model, [a, b, c])
    engine = make_engine(model)
    assert tokens(engine.generate([a], GREEDY)) == [ref[0]]
    clear_hbm(engine)
    (ob,) = engine.generate([b], GREEDY)  # partial host hit
    assert ob.output_token_ids == ref[1]
    assert ob.metrics.num_tokens_reused == {"hbm": 0, "host": 32}
    assert ob.metrics.num_tokens_computed == 20
    clear_hbm(engine)
    (oc,) = engine.generate([c], GREEDY)  # loads a's block 0 and commits it to hbm
    assert oc.output_token_ids == ref[2]
    assert oc.metrics.num_tokens_reused == {"hbm": 0, "host": 16}
    (oa,) = engine.generate([a], GREEDY)  # block 0 from hbm, blocks 1-2 from host
    assert oa.output_token_ids == ref[0]
    assert oa.metrics.num_tokens_reused == {"hbm": 16, "host": 32}
    assert oa.metrics.num_tokens_computed == 12
    assert_clean(engine)
    close(engine)


def test_concurrent_requests_sharing_a_host_prefix(model: LlamaForPagedLM) -> None:
    rng = random.Random(3)
    shared = prompt(rng, 48)
    prompts = [shared + prompt(rng, 5 + i) for i in range(4)]
    ref = reference(model, prompts)
    engine = make_engine(model)
    engine.generate([shared + prompt(rng, 7)], GREEDY)  # warm the prefix
    clear_hbm(engine)
    outs = engine.generate(prompts, GREEDY)  # all 4 admitted together, all load from host
    assert tokens(outs) == ref
    for o in outs:
        assert o.metrics.num_tokens_reused == {"hbm": 0, "host": 48}
    assert_clean(engine)
    close(engine)


def test_tiny_pool_evicts_to_host_between_requests(model: LlamaForPagedLM) -> None:
    rng = random.Random(4)
    a, b = prompt(rng, 53), prompt(rng, 53)  # 4 blocks each (with the 8 output tokens)
    ref = reference(model, [a, b])
    engine = make_engine(model, num_blocks=5)
    got = []
    for p in (a, b, a, b):
        got.append(engine.generate([p], GREEDY)[0])
    assert tokens(got) == [ref[0], ref[1], ref[0], ref[1]]
    assert got[2].metrics.num_tokens_reused["host"] > 0
    assert got[3].metrics.num_tokens_reused["host"] > 0
    assert sum(o.metrics.num_tokens_reused["host"] for o in got) == engine.scheduler.num_tokens_loaded
    assert_clean(engine)
    close(engine)


def test_write_through_store_skips_request_save(model: LlamaForPagedLM) -> None:
    p = prompt(random.Random(5), 40)
    (ref,) = reference(model, [p])
    engine = make_engine(model, write_policy="write_through")
    assert engine.connector is not None and not engine.connector.save
    assert tokens(engine.generate([p], GREEDY)) == [ref]
    clear_hbm(engine)
    (o,) = engine.generate([p], GREEDY)
    assert o.output_token_ids == ref
    assert o.metrics.num_tokens_reused == {"hbm": 0, "host": 32}
    assert engine.connector.worker.stats().blocks_saved == 0  # type: ignore[attr-defined]
    assert_clean(engine)
    close(engine)


@pytest.mark.parametrize("first_bad", [0, 1])
def test_host_page_deleted_after_admission_is_recomputed(model: LlamaForPagedLM,
                                                          first_bad: int) -> None:
    rng = random.Random(6)
    p = prompt(rng, 53)
    others = [p[:48] + prompt(rng, 6) for _ in range(2)]  # concurrent, same prefix
    ref = reference(model, [p, *others])
    engine = make_engine(model)
    engine.generate([p], GREEDY)
    clear_hbm(engine)
    assert engine.connector is not None and engine.store is not None
    csched = engine.connector.scheduler
    host = engine.store.tier("host")
    bad_keys = engine.namespace.chain(p).keys[first_bad:first_bad + 1]
    original = csched.update_state_after_alloc
    fired: list[str] = []

    def hook(rid: str, block_ids: list[int], n: int) -> None:
        original(rid, block_ids, n)
        if n and not fired:  # right after admission, before the load runs
            fired.append(rid)
            assert host.delete(bad_keys) == 1

    csched.update_state_after_alloc = hook  # type: ignore[method-assign,assignment]
    outs = engine.generate([p, *others], GREEDY)
    assert fired
    assert tokens(outs) == ref
    failed = (3 - first_bad) * BS
    first = outs[0].metrics
    assert first.num_tokens_load_failed == failed
    assert first.num_tokens_reused == {"hbm": 0, "host": 48 - failed}
    assert first.num_tokens_computed == 5 + failed
    assert engine.scheduler.num_tokens_load_failed == failed
    assert engine.connector.worker.stats().load_failures.get("miss", 0) >= 3 - first_bad  # type: ignore[attr-defined]
    for o in outs:  # computed + reused == prompt for every request
        m = o.metrics
        assert m.num_tokens_computed + sum(m.num_tokens_reused.values()) == len(o.prompt_token_ids)
    assert_clean(engine)
    close(engine)


def test_delayed_free_waits_for_saves(model: LlamaForPagedLM) -> None:
    p = prompt(random.Random(7), 40)
    engine = make_engine(model)
    rid = engine.add_request(p, SamplingParams(max_tokens=1))
    outs: list[RequestOutput] = []
    while not outs:
        outs = engine.step()
    # the prompt's 2 full blocks were saved during its only step; the request finished in it,
    # so its blocks are held until the connector reports the saves stored
    assert outs[0].request_id == rid
    engine.drain()
    assert engine.num_pending_frees == 0
    host = engine.store.tier("host")  # type: ignore[union-attr]
    assert all(host.contains(engine.namespace.chain(p).keys[:2]))
    assert_clean(engine)
    close(engine)


def test_from_config_builds_the_connector() -> None:
    layout = get_model_config("tiny").kv_layout(BS)
    host = HostTier.build("host", layout, 32, Metrics())
    engine = Engine.from_config("tiny", seed=7, num_blocks=16, lower_tiers=[host])
    assert engine.connector is not None
    bare = Engine.from_config("tiny", seed=7, num_blocks=16)
    assert bare.connector is None
    p = prompt(random.Random(8), 37)
    (ref,) = bare.generate([p], GREEDY)
    assert tokens(engine.generate([p], GREEDY)) == [ref.output_token_ids]
    clear_hbm(engine)
    (o,) = engine.generate([p], GREEDY)
    assert o.output_token_ids == ref.output_token_ids
    assert o.metrics.num_tokens_reused["host"] == 32
    assert_clean(engine)
    close(engine)


def test_prefix_from_disk_loads_through_host(model: LlamaForPagedLM, tmp_path) -> None:  # type: ignore[no-untyped-def]
    engine = make_disk_engine(model, tmp_path)
    store, ns = engine.store, engine.namespace
    assert store is not None
    host, disk = store.tier("host"), store.tier("disk")
    p = prompt(random.Random(9), 53)
    (ref,) = reference(model, [p])
    assert tokens(engine.generate([p], GREEDY)) == [ref]
    clear_hbm(engine)
    store.evict(host.capacity_pages, tier="host")  # write-back: host -> disk
    keys = ns.chain(p).keys[:3]
    assert not any(host.contains(keys)) and all(disk.contains(keys))
    (o,) = engine.generate([p], GREEDY)  # an asynchronous load, waited for in the same step
    assert o.output_token_ids == ref
    assert o.metrics.num_tokens_reused == {"hbm": 0, "host": 0, "disk": 48}  # through host
    assert_clean(engine)
    engine.close()
    store.close()


def test_preemption_with_connector(model: LlamaForPagedLM) -> None:
    rng = random.Random(10)
    shared = prompt(rng, 32)
    prompts = [shared + prompt(rng, 8 + 3 * i) for i in range(6)]
    ref = reference(model, prompts)
    engine = make_engine(model, num_blocks=10, max_num_batched_tokens=48, chunk_size=16)
    engine.generate([shared + [5]], GREEDY)
    clear_hbm(engine)
    outs = engine.generate(prompts, GREEDY)
    assert tokens(outs) == ref
    assert engine.scheduler.num_preemptions > 0
    assert sum(o.metrics.num_tokens_reused["host"] for o in outs) > 0
    assert_clean(engine)
    outs = engine.generate(prompts, GREEDY)  # again, from whatever tier holds them now
    assert tokens(outs) == ref
    assert_clean(engine)
    close(engine)


def test_loads_queued_on_the_engine_thread(model: LlamaForPagedLM,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU path queues a host load's copies on the engine thread (start_load_kv) and leaves
    only the wait to the load thread; the same control flow over the CPU transfer (inline: it
    queues on the caller too) gives the same results, including a page deleted between lookup
    and load."""
    import functools
    import sys

    monkeypatch.setattr(sys.modules[__name__], "make_engine",
                        functools.partial(make_engine, cpu_inline=True))
    test_prefix_from_hbm_host_and_none_identical(model, None)
    test_partial_and_mixed_hits(model)
    test_host_page_deleted_after_admission_is_recomputed(model, 1)


def _engine_over(model: LlamaForPagedLM, lower: Tier) -> tuple[Engine, TieredStore, HostTier]:
    """hbm (32 blocks) over host (16 pages) over ``lower``, write-back, with the connector."""
    layout = model.config.kv_layout(BS)
    pool = HBMTier.build("hbm", layout, 32, lower.metrics, device=device_of(model))
    host = HostTier.build("host", layout, 16, lower.metrics)
    store = TieredStore(layout, [pool, host, lower], write_policy="write_back")  # type: ignore[arg-type]
    ns = Namespace("test/tiny/7", layout)
    engine = Engine(model, pool, ns, connector=(InProcessScheduler(store, ns, num_blocks=32),
                                                InProcessWorker(store, prefetch_policy="wait_complete")))
    engine.store = store
    return engine, store, host


def _only_below_host(engine: Engine, store: TieredStore, host: HostTier, lower: Tier,
                     keys: list[bytes]) -> None:
    clear_hbm(engine)
    store.evict(host.capacity_pages, tier="host")  # write-back: host -> the lower tier
    assert not any(host.contains(keys)) and all(lower.contains(keys))


def test_prefix_from_redis_loads_through_host(model: LlamaForPagedLM, redis_server) -> None:  # type: ignore[no-untyped-def]
    from kvstore.tiers.redis import RedisTier

    layout = model.config.kv_layout(BS)
    redis = RedisTier.build("redis", layout, 64, Metrics(), url=redis_server.url)
    engine, store, host = _engine_over(model, redis)
    rng = random.Random(11)
    p = prompt(rng, 53)
    q = p[:32] + prompt(rng, 9)  # shares 2 of p's 3 full blocks
    ref = reference(model, [p, q])
    assert tokens(engine.generate([p], GREEDY)) == [ref[0]]
    _only_below_host(engine, store, host, redis, engine.namespace.chain(p).keys[:3])
    outs = engine.generate([p, q], GREEDY)  # concurrent, sharing a prefix served from Redis
    assert tokens(outs) == ref
    assert outs[0].metrics.num_tokens_reused["redis"] == 48
    assert sum(o.metrics.num_tokens_load_failed for o in outs) == 0
    assert_clean(engine)
    engine.close()
    store.close()


def test_disk_page_corrupted_after_lookup_is_recomputed(model: LlamaForPagedLM, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A disk record whose bytes change between the lookup and the load fails its checksum on
    the prefetch: that block and the ones after it are recomputed (counted), output unchanged."""
    from kvstore.tiers.disk import DiskTier

    layout = model.config.kv_layout(BS)
    disk = DiskTier.build("disk", layout, 32, Metrics(), path=tmp_path / "disk", o_direct=False,
                    durability="none", check_index=False)
    engine, store, host = _engine_over(model, disk)
    p = prompt(random.Random(12), 53)
    (ref,) = reference(model, [p])
    assert tokens(engine.generate([p], GREEDY)) == [ref]
    keys = engine.namespace.chain(p).keys[:3]
    _only_below_host(engine, store, host, disk, keys)
    assert engine.connector is not None
    csched = engine.connector.scheduler
    original = csched.update_state_after_alloc

    def corrupt_after_lookup(rid: str, block_ids: list[int], n: int) -> None:
        original(rid, block_ids, n)
        slot = disk.slot_of(keys[1])
        assert slot is not None
        with open(tmp_path / "disk" / "slots.dat", "r+b") as f:  # flip one payload byte
            off = slot * disk.slot_bytes + disk._slab.hdr_region + 100
            f.seek(off)
            byte = f.read(1)
            f.seek(off)
            f.write(bytes([byte[0] ^ 0xFF]))

    csched.update_state_after_alloc = corrupt_after_lookup  # type: ignore[method-assign,assignment]
    (o,) = engine.generate([p], GREEDY)
    assert o.output_token_ids == ref
    assert o.metrics.num_tokens_reused["disk"] == 16  # block 0 loaded; 1 and 2 recomputed
    assert o.metrics.num_tokens_load_failed == 32
    assert disk.stats().corrupt == 1
    assert engine.connector.worker.stats().load_failures == {"miss": 2}  # type: ignore[attr-defined]
    assert_clean(engine)
    engine.close()
    store.close()


def test_a_stalled_redis_never_holds_up_scheduling(model: LlamaForPagedLM, redis_server) -> None:  # type: ignore[no-untyped-def]
    """The scheduler side answers "not known yet" while a lookup of Redis is in flight: a
    request whose prefix is only in a stalled (SIGSTOP) Redis waits, one whose prefix is in host
    is admitted in the same step; once the lookup gives up, the first is computed -- both with
    the reference's tokens."""
    from kvstore.tiers.redis import RedisTier

    layout = model.config.kv_layout(BS)
    redis = RedisTier.build("redis", layout, 64, Metrics(), url=redis_server.url, timeout_s=0.5,
                      connect_timeout_s=0.5)
    engine, store, host = _engine_over(model, redis)
    rng = random.Random(12)
    far, near = prompt(rng, 53), prompt(rng, 40)
    ref = reference(model, [far, near])
    assert tokens(engine.generate([far], GREEDY)) == [ref[0]]
    _only_below_host(engine, store, host, redis, engine.namespace.chain(far).keys[:3])
    assert tokens(engine.generate([near], GREEDY)) == [ref[1]]
    clear_hbm(engine)  # near's blocks: back in host only
    redis_server.pause()
    try:
        a = engine.add_request(far, GREEDY)
        b = engine.add_request(near, GREEDY)
        engine.step()
        sched = engine.scheduler
        assert [r.request_id for r in sched.waiting] == [a]  # its lookup is still in flight
        assert [r.request_id for r in sched.running] == [b]  # admitted, loading from host
        outs = {}
        while engine.has_unfinished():
            outs.update({o.request_id: o for o in engine.step()})
    finally:
        redis_server.resume()
    assert [outs[a].output_token_ids, outs[b].output_token_ids] == ref
    assert outs[b].metrics.num_tokens_reused["host"] == 32
    assert engine.connector.scheduler.pending_answers >= 1  # type: ignore[union-attr]
    assert_clean(engine)
    engine.close()
    store.close()


def test_a_settled_load_commits_its_blocks_while_the_copies_run(
        model: LlamaForPagedLM, monkeypatch: pytest.MonkeyPatch) -> None:
    """Host loads queued on the engine thread (the GPU path) know their outcome at queue time:
    the step commits its blocks before it waits for the copies, and a page gone since the lookup
    still rolls its request back (its blocks are not committed)."""
    rng = random.Random(5)
    p = prompt(rng, 53)
    (ref,) = reference(model, [p])
    engine = make_engine(model, cpu_inline=True)
    engine.generate([p], GREEDY)
    clear_hbm(engine)
    keys = engine.namespace.chain(p).keys
    worker = engine.connector.worker  # type: ignore[union-attr]
    seen: list[list[bool]] = []
    wait = worker.wait_for_loads

    def recording_wait() -> None:
        seen.append([engine.pool.block_of(k) is not None for k in keys[:3]])
        wait()

    monkeypatch.setattr(worker, "wait_for_loads", recording_wait)
    (warm,) = engine.generate([p], GREEDY)
    assert warm.output_token_ids == ref and warm.metrics.num_tokens_reused["host"] == 48
    assert seen[0] == [True, True, True]  # committed before the wait for the copies
    assert_clean(engine)
    close(engine)


def test_settled_load_errors_are_the_reported_ones(model: LlamaForPagedLM,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """What the worker says is settled before the copies equals what it reports after them,
    for a load whose later pages were deleted between the lookup and the load."""
    p = prompt(random.Random(6), 53)
    (ref,) = reference(model, [p])
    engine = make_engine(model, cpu_inline=True)
    engine.generate([p], GREEDY)
    clear_hbm(engine)
    worker = engine.connector.worker  # type: ignore[union-attr]
    assert worker.settled_load_errors() is None  # nothing bound
    keys = engine.namespace.chain(p).keys
    settled: list[set[int] | None] = []
    reported: list[set[int]] = []
    start, errs = worker.start_load_kv, worker.get_block_ids_with_load_errors

    def start_after_delete() -> None:
        engine.store.delete([keys[1], keys[2]])  # type: ignore[union-attr]
        start()
        settled.append(worker.settled_load_errors())

    monkeypatch.setattr(worker, "start_load_kv", start_after_delete)
    monkeypatch.setattr(worker, "get_block_ids_with_load_errors",
                        lambda: (reported.append(errs()), reported[-1])[1])
    (warm,) = engine.generate([p], GREEDY)
    assert warm.output_token_ids == ref
    assert warm.metrics.num_tokens_load_failed == 32
    assert settled[0] is not None and len(settled[0]) == 2 and settled[0] == reported[0]
    assert_clean(engine)
    close(engine)
