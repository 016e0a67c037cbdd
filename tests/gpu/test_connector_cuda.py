"""GPU machine only (-m gpu): the in-process connector over CUDA KV caches, driven through its
API -- blocks saved from the GPU land in the host tier byte for byte, loads bring them back into
other blocks, for a page-first pool and for per-layer caches. (Saves into scattered host slots
and saves the host tier has no room for: tests/connector/test_save_slots.py, on CPU and CUDA.)"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from connector import InProcessScheduler, InProcessWorker, KVCacheSpec
from kvstore import transfer_cuda as transfer
from kvstore import KVLayout, Metrics, Namespace, TieredStore
from kvstore.tiers.host import HostTier

pytestmark = pytest.mark.gpu

LAYOUT = KVLayout(num_layers=4, num_kv_heads=2, head_dim=64, block_size=16, dtype="bfloat16")


@pytest.fixture(autouse=True)
def _needs_cuda() -> None:
    if not torch.cuda.is_available():
        pytest.fail("-m gpu tests need a CUDA GPU")


def _caches(kind: str) -> tuple[KVCacheSpec, list[torch.Tensor]]:
    """The spec and, per block id, a function of its bytes: a (num_blocks, page) uint8 view."""
    g = torch.Generator(device="cuda").manual_seed(1)
    if kind == "page_first":
        pool = torch.randn((32, *LAYOUT.page_shape), generator=g, device="cuda").bfloat16()
        return KVCacheSpec.page_first(pool), [pool]
    per = [torch.randn((32, *LAYOUT.page_shape[1:]), generator=g, device="cuda").bfloat16()
           for _ in range(LAYOUT.num_layers)]
    return KVCacheSpec.per_layer(per), per


def _block(tensors: list[torch.Tensor], b: int) -> torch.Tensor:
    if len(tensors) == 1:
        return tensors[0][b].reshape(-1).view(torch.uint8).cpu()
    return torch.cat([t[b].reshape(-1).view(torch.uint8) for t in tensors]).cpu()


def _step(sched: InProcessScheduler, worker: InProcessWorker, rid: str, tokens: list[int],
          blocks: list[int], save: list[int] | None, ns: Namespace) -> set[int]:
    m = sched.get_num_new_matched_tokens(rid, tokens, 0)
    if m.num_tokens:
        sched.update_state_after_alloc(rid, blocks[: m.num_tokens // 16], m.num_tokens)
    if save:
        sched.request_save(rid, save, ns.chain(tokens).metas()[: len(save)])
    worker.bind_connector_metadata(sched.build_connector_meta())
    worker.start_load_kv()
    for layer in range(LAYOUT.num_layers):
        worker.wait_for_layer_load(layer)
        worker.save_kv_layer(layer)
    worker.wait_for_loads()
    worker.wait_for_save()
    failed = worker.get_block_ids_with_load_errors()
    worker.clear_connector_metadata()
    sched.request_finished(rid)
    return failed


@pytest.mark.parametrize("kind", ["page_first", "per_layer"])
@pytest.mark.parametrize("layerwise", [True, False])
@pytest.mark.parametrize("path", ["dma", "kernel"])
def test_save_then_load_round_trips_on_cuda(kind: str, layerwise: bool, path: str,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Loads go by DMA where their pairs fall in few runs, else by the scatter kernel
    (kvstore/transfer_cuda.py): both land every byte in its block."""
    if path == "kernel":
        monkeypatch.setattr(transfer, "_DMA_LOAD_RUNS", 0)  # no load is few enough runs
    kernel_launches = []
    real_copy_rows = transfer.copy_rows

    def counted(*args: object, **kwargs: object) -> bool:
        kernel_launches.append(1)
        return real_copy_rows(*args, **kwargs)  # type: ignore[arg-type]

    host = HostTier.build("host", LAYOUT, 16, Metrics())
    assert host.pinned
    store = TieredStore(LAYOUT, [host])
    ns = Namespace("gpu-test", LAYOUT)
    spec, tensors = _caches(kind)
    sched = InProcessScheduler(store, ns, num_blocks=32)
    worker = InProcessWorker(store, layerwise=layerwise)
    worker.register_kv_caches(spec)
    tokens = list(range(1000, 1000 + 16 * 5 + 3))
    saved = [3, 9, 0, 17, 30]
    want = [_block(tensors, b) for b in saved]
    assert _step(sched, worker, "a", tokens, [], saved, ns) == set()
    worker.close()  # waits for the puts
    keys = ns.chain(tokens).keys[:5]
    out = np.empty((5, LAYOUT.page_bytes), np.uint8)
    assert all(store.get(ns.id, keys, out).found)
    for got, w in zip(out, want):
        assert torch.equal(torch.from_numpy(got), w)
    worker = InProcessWorker(store, layerwise=layerwise)
    worker.register_kv_caches(spec)
    dst = [31, 4, 5, 12, 20]
    monkeypatch.setattr(transfer, "copy_rows", counted)
    assert _step(sched, worker, "b", tokens, dst, None, ns) == set()
    assert len(kernel_launches) == (LAYOUT.num_layers if path == "kernel" else 0)
    torch.cuda.synchronize()
    for b, w in zip(dst, want):
        assert torch.equal(_block(tensors, b), w)
    assert worker.stats().blocks_loaded == 5
    worker.close()
    store.close()


def test_loads_reuse_their_index_buffers_and_copy_the_right_rows() -> None:
    """Each load's block and slot indices live in a pinned buffer reused by the next load
    (kvstore/transfer_cuda.py): loads of different lengths, one after another through one worker,
    each land exactly their own pages in their own blocks."""
    host = HostTier.build("host", LAYOUT, 16, Metrics())
    store = TieredStore(LAYOUT, [host])
    ns = Namespace("gpu-test", LAYOUT)
    spec, tensors = _caches("page_first")
    sched = InProcessScheduler(store, ns, num_blocks=32)
    worker = InProcessWorker(store)
    worker.register_kv_caches(spec)
    prompts = {n: list(range(100 * n, 100 * n + 16 * n + 1)) for n in (5, 2, 4)}
    sources = {5: [0, 1, 2, 3, 4], 2: [5, 6], 4: [7, 8, 9, 10]}
    for n, tokens in prompts.items():
        assert _step(sched, worker, f"save-{n}", tokens, [], sources[n], ns) == set()
    worker.wait_for_save()
    want = {n: [_block(tensors, b) for b in sources[n]] for n in prompts}
    targets = {5: [31, 30, 29, 28, 27], 2: [20, 22], 4: [11, 13, 15, 17]}
    for n, tokens in prompts.items():  # longest first: later loads reuse its buffer
        assert _step(sched, worker, f"load-{n}", tokens, targets[n], None, ns) == set()
        torch.cuda.synchronize()
        for b, w in zip(targets[n], want[n]):
            assert torch.equal(_block(tensors, b), w)
    # one buffer served every load
    assert len(worker._xfer._loads._buffers) == 1  # type: ignore[union-attr]
    assert worker.stats().blocks_loaded == 11
    worker.close()
    store.close()
