"""Saves go straight into the host slots the store reserves: into one run of adjacent slots on a
fresh slab, into slots scattered over an aged one, and, when the host tier has no room for every page (the rest pinned),
the pages that fit are stored and the save counts as abandoned. On the CPU in CI; the same tests
run on CUDA with ``-m gpu``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from connector import InProcessScheduler, InProcessWorker, KVCacheSpec
from kvstore import KVLayout, Metrics, Namespace, TieredStore
from kvstore.tiers.host import HostTier

LAYOUT = KVLayout(num_layers=4, num_kv_heads=2, head_dim=64, block_size=16, dtype="bfloat16")
NS = Namespace("save-slots", LAYOUT)
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def pool_on(device: str, num_blocks: int = 32) -> torch.Tensor:
    if device == "cuda" and not torch.cuda.is_available():
        pytest.fail("-m gpu tests need a CUDA GPU")
    g = torch.Generator(device=device).manual_seed(3)
    return torch.randn((num_blocks, *LAYOUT.page_shape), generator=g, device=device).bfloat16()


def block(pool: torch.Tensor, b: int) -> np.ndarray:
    return pool[b].reshape(-1).view(torch.uint8).cpu().numpy()


def save(store: TieredStore, pool: torch.Tensor, tokens: list[int], blocks: list[int]) -> InProcessWorker:
    sched = InProcessScheduler(store, NS, num_blocks=pool.shape[0])
    worker = InProcessWorker(store)
    worker.register_kv_caches(KVCacheSpec.page_first(pool))
    sched.request_save("r", blocks, NS.chain(tokens).metas()[: len(blocks)])
    worker.bind_connector_metadata(sched.build_connector_meta())
    worker.start_load_kv()
    for layer in range(LAYOUT.num_layers):
        worker.save_kv_layer(layer)
    worker.wait_for_save()
    worker.clear_connector_metadata()
    worker.close()  # waits for the saves to be published
    return worker


def tokens_for(blocks: int, start: int = 1) -> list[int]:
    return list(range(start, start + 16 * blocks + 1))


def assert_stored(store: TieredStore, pool: torch.Tensor, tokens: list[int],
                  blocks: list[int]) -> None:
    """The first ``len(blocks)`` pages of ``tokens`` read back as those engine blocks."""
    keys = NS.chain(tokens).keys[: len(blocks)]
    out = np.empty((len(blocks), LAYOUT.page_bytes), np.uint8)
    assert all(store.get(NS.id, keys, out).found)
    for got, b in zip(out, blocks):
        assert np.array_equal(got, block(pool, b))


@pytest.mark.parametrize("device", DEVICES)
def test_save_into_scattered_slots(device: str) -> None:
    host = HostTier.build("host", LAYOUT, 24, Metrics())
    store = TieredStore(LAYOUT, [host])
    filler = NS.chain(tokens_for(22, start=5000))
    store.put(filler.metas(), np.zeros((22, LAYOUT.page_bytes), np.uint8))
    store.delete(list(filler.keys[::2]))  # every other slot free: 11 runs of one, plus 2 at the end
    pool = pool_on(device)
    blocks = [3, 9, 0, 17, 30, 21, 8, 11, 2, 6, 14, 19]
    tokens = tokens_for(len(blocks))
    worker = save(store, pool, tokens, blocks)
    assert worker.stats().blocks_saved == len(blocks)
    assert_stored(store, pool, tokens, blocks)
    store.check_integrity()
    store.close()


@pytest.mark.parametrize("device", DEVICES)
def test_a_save_without_room_stores_what_fits(device: str) -> None:
    host = HostTier.build("host", LAYOUT, 4, Metrics())
    store = TieredStore(LAYOUT, [host])
    held = NS.chain(tokens_for(4, start=7000))
    store.put(held.metas(), np.zeros((4, LAYOUT.page_bytes), np.uint8))
    pin = store.lookup(held.keys[:2], lease=True).lease  # two pages stay: room for two
    pool = pool_on(device)
    tokens = tokens_for(4)
    worker = save(store, pool, tokens, [5, 6, 7, 8])
    stats = worker.stats()
    assert (stats.blocks_saved, stats.saves_abandoned) == (2, 1)
    keys = NS.chain(tokens).keys[:4]
    assert host.contains(keys) == [True, True, False, False]
    assert host.contains(held.keys[:2]) == [True, True]
    assert_stored(store, pool, tokens, [5, 6])
    store.release(pin)  # type: ignore[arg-type]
    store.check_integrity()
    store.close()


@pytest.mark.parametrize("device", DEVICES)
def test_many_short_runs_of_small_pages(device: str) -> None:
    """More runs than a save gives the copy engine one DMA each (on CUDA: the kernel path),
    every page landing in its own slot."""
    host = HostTier.build("host", LAYOUT, 300, Metrics())
    store = TieredStore(LAYOUT, [host])
    filler = NS.chain(tokens_for(300, start=9000))
    store.put(filler.metas(), np.zeros((300, LAYOUT.page_bytes), np.uint8))
    store.delete(list(filler.keys[::2]))  # 150 free slots, none adjacent
    pool = pool_on(device, num_blocks=160)
    blocks = list(range(159, 9, -1))  # descending: no block run lines up with a slot run
    tokens = tokens_for(len(blocks))
    worker = save(store, pool, tokens, blocks)
    assert worker.stats().blocks_saved == len(blocks)
    assert_stored(store, pool, tokens, blocks)
    store.check_integrity()
    store.close()
