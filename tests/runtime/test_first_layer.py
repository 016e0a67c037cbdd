"""Layer 0 from the tokens: a load copies layers 1.. of its pages, the engine writes layer 0's
K/V of the loaded blocks itself (``LlamaForPagedLM.write_first_layer_kv``). The written K/V are
the ones a forward writes; the copy never touches layer 0 (it would race the write); greedy
outputs are the same with it on and off; bad input to the model's method changes nothing."""

from __future__ import annotations

import random

import pytest
import torch

from connector import InProcessScheduler, InProcessWorker
from connector.base import ConnectorMetadata, KVCacheSpec, LoadSpec
from kvstore.errors import InvalidArgument
from kvstore.keys import Namespace
from kvstore.metrics import Metrics
from kvstore.store import TieredStore
from kvstore.tiers.hbm import HBMTier
from kvstore.tiers.host import HostTier
from runtime import LlamaForPagedLM, SeqInput, allocate_kv_pool, build_batch, get_model_config
from runtime.engine import Engine
from runtime.sampling import SamplingParams

BS = 16

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def model() -> LlamaForPagedLM:
    return LlamaForPagedLM.from_random(get_model_config("tiny"), seed=11)


def _device(model: LlamaForPagedLM) -> torch.device:
    return next(model.parameters()).device


def _tokens(n: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 512) for _ in range(n)]


def test_written_kv_are_the_forwards(model: LlamaForPagedLM) -> None:
    """Blocks 2..4 of a prompt written from their tokens hold the layer-0 K/V a forward over the
    whole prompt wrote for them; no other layer, block or K/V slot changes."""
    dev = _device(model)
    pool = allocate_kv_pool(model.config, 16, BS, dev)
    ids = _tokens(5 * BS)
    table = [9, 3, 12, 0, 7]
    batch = build_batch([SeqInput(ids, table, 0, "last")], model.config, block_size=BS,
                        num_blocks=16, device=dev)
    model(batch, pool)
    want = pool[[12, 0, 7], 0].clone()
    fresh = [5, 14, 1]
    before = pool.clone()
    model.write_first_layer_kv(pool, ids[2 * BS:], 2 * BS, fresh)
    torch.testing.assert_close(pool[fresh, 0], want, rtol=1e-5, atol=1e-6)
    changed = (pool != before).flatten(1).any(dim=1).nonzero().flatten().tolist()
    assert changed == sorted(fresh)
    assert torch.equal(pool[fresh, 1:], before[fresh, 1:])  # layers 1.. untouched


def test_chunks_write_the_same(model: LlamaForPagedLM, monkeypatch: pytest.MonkeyPatch) -> None:
    """A long load is written in passes of FIRST_LAYER_CHUNK tokens: the same K/V."""
    dev = _device(model)
    ids = _tokens(6 * BS, seed=1)
    blocks = [4, 2, 9, 11, 0, 6]
    whole = allocate_kv_pool(model.config, 12, BS, dev)
    model.write_first_layer_kv(whole, ids, BS, blocks)
    monkeypatch.setattr(LlamaForPagedLM, "FIRST_LAYER_CHUNK", 2 * BS + 5)  # 2 blocks a pass
    parts = allocate_kv_pool(model.config, 12, BS, dev)
    model.write_first_layer_kv(parts, ids, BS, blocks)
    torch.testing.assert_close(parts, whole, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("case", ["count", "position", "unaligned", "past_max", "dup_block",
                                  "block_range", "token_range", "pool"])
def test_bad_input_changes_nothing(model: LlamaForPagedLM, case: str) -> None:
    dev = _device(model)
    pool = allocate_kv_pool(model.config, 8, BS, dev)
    ids, pos, blocks = _tokens(2 * BS), 0, [1, 2]
    target = pool
    if case == "count":
        ids = ids[:-1]
    elif case == "position":
        pos = -BS
    elif case == "unaligned":
        pos = 3
    elif case == "past_max":
        pos = model.config.max_position_embeddings - BS
    elif case == "dup_block":
        blocks = [1, 1]
    elif case == "block_range":
        blocks = [1, 8]
    elif case == "token_range":
        ids[5] = model.config.vocab_size
    else:
        target = allocate_kv_pool(model.config, 8, BS, dev).float()[:, :1]
    before = target.clone()
    with pytest.raises(InvalidArgument):
        model.write_first_layer_kv(target, ids, pos, blocks)
    assert torch.equal(target, before)


def _engine(model: LlamaForPagedLM, *, first_layer: bool) -> tuple[Engine, HostTier,
                                                                    list[int]]:
    """An engine over [hbm, host] with the in-process connector; the layers its loads copy
    are recorded (``layers``)."""
    layout = model.config.kv_layout(BS)
    m = Metrics()
    pool = HBMTier.build("hbm", layout, 64, m, device=_device(model))
    host = HostTier.build("host", layout, 64, m)
    store = TieredStore(layout, [pool, host], write_policy="write_back")  # type: ignore[list-item]
    ns = Namespace("test/tiny/11", layout)
    worker = InProcessWorker(store)
    engine = Engine(model, pool, ns, connector=(InProcessScheduler(store, ns, num_blocks=64),
                                                worker), first_layer_from_tokens=first_layer)
    engine.store = store
    layers: list[int] = []
    xfer = worker._xfer
    assert xfer is not None
    real = xfer.load_layer

    def spy(ctx: object, layer: int) -> None:
        layers.append(layer)
        real(ctx, layer)

    xfer.load_layer = spy  # type: ignore[method-assign]
    return engine, host, layers


def _page(host: HostTier, key: bytes, model: LlamaForPagedLM) -> torch.Tensor:
    slot = host.slot_of(key)
    assert slot is not None
    layout = host.layout
    return host.slab_tensor[slot].view(model.config.torch_dtype).view(layout.page_shape)


@pytest.mark.parametrize("first_layer", [True, False])
def test_host_hit_copies_layers_one_on(model: LlamaForPagedLM, first_layer: bool) -> None:
    """A host hit with the first layer from the tokens: the copies skip layer 0, the loaded
    blocks' layers 1.. are the host pages' bytes and their layer 0 the forward's K/V; off,
    every layer is copied and layer 0 is the page's bytes too. Outputs are the same."""
    engine, host, layers = _engine(model, first_layer=first_layer)
    store = engine.store
    assert store is not None
    conn = engine.connector
    assert conn is not None
    assert conn.scheduler.skip_first_layer is first_layer  # type: ignore[attr-defined]
    p = _tokens(6 * BS + 3, seed=5)
    greedy = SamplingParams(max_tokens=6)
    (cold,) = engine.generate([p], greedy)
    engine.drain()
    store.evict(engine.pool.num_blocks, tier="hbm")
    layers.clear()
    (hit,) = engine.generate([p], greedy)
    assert hit.metrics.num_tokens_reused["host"] == 6 * BS
    assert hit.output_token_ids == cold.output_token_ids
    L = model.config.num_layers
    assert sorted(set(layers)) == (list(range(1, L)) if first_layer else list(range(L)))
    keys = engine.namespace.chain(p[: 6 * BS]).keys
    for key in keys:
        block = engine.pool.block_of(key)
        assert block is not None
        page = _page(host, key, model)
        got = engine.pool.pool[block].cpu()
        assert torch.equal(got[1:], page[1:])
        if first_layer:
            torch.testing.assert_close(got[0], page[0], rtol=1e-5, atol=1e-6)
        else:
            assert torch.equal(got[0], page[0])
    engine.close()
    store.close()


def test_worker_leaves_layer_zero_of_a_skipping_load(model: LlamaForPagedLM) -> None:
    """The worker itself: a LoadSpec with skip_first_layer writes layers 1.. of its blocks and
    leaves layer 0 as it was (the engine's write is not raced)."""
    layout = model.config.kv_layout(BS)
    m = Metrics()
    host = HostTier.build("host", layout, 8, m)
    pool = HBMTier.build("hbm", layout, 8, m, device="cpu")
    store = TieredStore(layout, [pool, host], write_policy="write_back")  # type: ignore[list-item]
    ns = Namespace("test/tiny/11", layout)
    metas = ns.chain(_tokens(2 * BS, seed=9)).metas()
    pages = torch.randn((2, *layout.page_shape), dtype=torch.float32)
    store.put(metas, pages.view(torch.uint8).view(2, -1).numpy(), tier="host")
    cache = torch.full((8, *layout.page_shape), 7.0)
    worker = InProcessWorker(store)
    worker.register_kv_caches(KVCacheSpec.page_first(cache))
    keys = tuple(m.key for m in metas)
    worker.bind_connector_metadata(ConnectorMetadata(
        (LoadSpec("r", ns.id, (3, 5), keys, None, False, True),), ()))
    worker.start_load_kv()
    for lyr in range(layout.num_layers):
        worker.wait_for_layer_load(lyr)
    worker.wait_for_loads()
    worker.clear_connector_metadata()
    assert not worker.get_block_ids_with_load_errors()
    assert torch.equal(cache[[3, 5], 1:], pages[:, 1:])
    assert bool((cache[[3, 5], 0] == 7.0).all())
    worker.close()
    store.close()


def test_engine_refuses_a_non_bool_switch(model: LlamaForPagedLM) -> None:
    layout = model.config.kv_layout(BS)
    pool = HBMTier.build("hbm", layout, 8, Metrics(), device=_device(model))
    with pytest.raises(InvalidArgument, match="first_layer_from_tokens"):
        Engine(model, pool, Namespace("t", layout), first_layer_from_tokens="no")  # type: ignore[arg-type]
