"""Loads and saves go through the store's staging path: what the engine loads from host through
its connector is seen by the host tier's policy (a hot prefix survives a stream of cold prompts
under LRU), by its hit counters, and by the ``selective`` write policy."""

from __future__ import annotations

import random

import pytest

from connector import InProcessScheduler, InProcessWorker
from kvstore.keys import Namespace
from kvstore.metrics import Metrics
from kvstore.store import TieredStore
from kvstore.tiers.hbm import HBMTier
from kvstore.tiers.host import HostTier
from runtime import LlamaForPagedLM, get_model_config
from runtime.engine import Engine
from runtime.sampling import SamplingParams

BS = 16
GREEDY = SamplingParams(max_tokens=4)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def model() -> LlamaForPagedLM:
    return LlamaForPagedLM.from_random(get_model_config("tiny"), seed=11)


def engine_over(model: LlamaForPagedLM, lower: list[HostTier], policies: list[str],
                **store_kw: object) -> tuple[Engine, TieredStore]:
    layout = model.config.kv_layout(BS)
    pool = HBMTier.build("hbm", layout, 12, lower[0].metrics, device="cpu")
    store = TieredStore(layout, [pool, *lower], ["lineage", *policies], **store_kw)  # type: ignore[arg-type]
    ns = Namespace("test/staging", layout)
    conn = (InProcessScheduler(store, ns, num_blocks=12), InProcessWorker(store))
    engine = Engine(model, pool, ns, connector=conn)
    engine.store = store
    return engine, store


def run(engine: Engine, store: TieredStore, p: list[int], *, from_host: bool) -> int:
    """Generate ``p`` with nothing in hbm; returns the tokens it reused from host."""
    engine.drain()
    store.evict(engine.pool.num_blocks, tier="hbm")
    (out,) = engine.generate([p], GREEDY)
    engine.drain()
    reused = out.metrics.num_tokens_reused["host"]
    if from_host:
        assert out.metrics.num_tokens_load_failed == 0
    return reused


def prompt(rng: random.Random, blocks: int) -> list[int]:
    return [rng.randrange(3, 512) for _ in range(blocks * BS + 3)]


def test_hot_prefix_survives_cold_stream_under_lru(model: LlamaForPagedLM) -> None:
    rng = random.Random(1)
    layout = model.config.kv_layout(BS)
    host = HostTier.build("host", layout, 20, Metrics())
    engine, store = engine_over(model, [host], ["lru"])
    hot = prompt(rng, 4)
    hot_keys = engine.namespace.chain(hot).keys[:4]
    assert run(engine, store, hot, from_host=False) == 0  # computed, saved to host
    cold_pages = 0
    for _ in range(6):
        assert run(engine, store, hot, from_host=True) == 4 * BS  # loaded from host
        for _ in range(2):
            assert run(engine, store, prompt(rng, 4), from_host=False) == 0
            cold_pages += 4
    assert cold_pages >= 2 * host.capacity_pages  # the host tier turned over twice
    assert host.contains(hot_keys) == [True] * 4
    worker = engine.connector.worker  # type: ignore[union-attr]
    loaded = worker.stats().blocks_loaded  # type: ignore[attr-defined]
    assert loaded == 6 * 4
    assert host.stats().hits == loaded  # every connector load counted as a host hit
    assert host.stats().bytes_read == loaded * layout.page_bytes
    store.check_integrity()
    engine.close()
    store.close()


def test_selective_copies_down_after_n_connector_hits(model: LlamaForPagedLM) -> None:
    rng = random.Random(2)
    layout = model.config.kv_layout(BS)
    m = Metrics()
    host, below = HostTier.build("host", layout, 16, m), HostTier.build("below", layout, 16, m)
    engine, store = engine_over(model, [host, below], ["lru", "lru"],
                                write_policy="selective", selective_hits=3)
    p = prompt(rng, 3)
    keys = engine.namespace.chain(p).keys[:3]
    run(engine, store, p, from_host=False)
    for hit in range(1, 4):
        assert run(engine, store, p, from_host=True) == 3 * BS
        store.drain()  # selective copies run on the store's mover thread
        assert below.contains(keys) == [hit >= 3] * 3, f"after {hit} hits"
    store.check_integrity()
    engine.close()
    store.close()
