"""GPU machine only (-m gpu): the hbm pool on CUDA — batched gather/scatter through pinned staging,
and pages the engine writes on the device reach host buffers and the store's lower tiers."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kvstore import KVLayout, Metrics, Namespace, TieredStore
from kvstore.tiers.hbm import HBMTier
from kvstore.tiers.host import HostTier

pytestmark = pytest.mark.gpu

LAYOUT = KVLayout(4, 8, 128, 16, "bfloat16")  # 256 KiB pages
NS = Namespace("gpu", LAYOUT)


@pytest.fixture(autouse=True)
def _needs_cuda() -> None:
    if not torch.cuda.is_available():
        pytest.fail("-m gpu tests need a CUDA GPU")


def test_pool_defaults_to_the_gpu() -> None:
    pool = HBMTier.build("hbm", LAYOUT, 4, Metrics())
    assert pool.pool.is_cuda and pool.pool.shape == (4, *LAYOUT.page_shape)
    assert pool.pool_bytes.shape == (4, LAYOUT.page_bytes)


def test_engine_writes_on_device_and_tier_reads_to_host() -> None:
    pool = HBMTier.build("hbm", LAYOUT, 16, Metrics())
    chain = NS.chain(list(range(16 * 6)))
    blocks = pool.allocate(3)
    assert blocks is not None
    kv = torch.randn(3, *LAYOUT.page_shape, dtype=torch.bfloat16, device=pool.device)
    pool.pool[blocks] = kv
    torch.cuda.synchronize()
    pool.commit(blocks, chain.metas(0, 3))
    want = kv.cpu().view(torch.uint8).reshape(3, -1).numpy()
    out = np.zeros((3, LAYOUT.page_bytes), np.uint8)
    assert pool.read(NS.id, chain.keys[2::-1], list(out)) == [True] * 3  # blocks out of order
    assert np.array_equal(out, want[::-1])


def test_tier_writes_scatter_into_free_blocks() -> None:
    pool = HBMTier.build("hbm", LAYOUT, 16, Metrics())
    held = pool.allocate(5)
    assert held is not None
    pool.release(held[::2])  # free blocks are now not contiguous
    chain = NS.chain(list(range(16 * 4)))
    pages = np.random.default_rng(0).integers(0, 256, (4, LAYOUT.page_bytes), dtype=np.uint8)
    assert pool.write(chain.metas(), list(pages)) == [True] * 4
    blocks = [pool.block_of(k) for k in chain.keys]
    assert torch.equal(pool.pool_bytes[blocks].cpu(), torch.from_numpy(pages))
    out = np.zeros_like(pages)
    assert pool.read(NS.id, chain.keys, list(out)) == [True] * 4
    assert np.array_equal(out, pages)


def test_store_reads_and_writes_back_cuda_pages() -> None:
    m = Metrics()
    hbm = HBMTier.build("hbm", LAYOUT, 4, m)
    host = HostTier.build("host", LAYOUT, 8, m)
    with TieredStore(LAYOUT, [hbm, host], write_policy="write_back") as store:
        chain = NS.chain(list(range(16 * 4)))
        pages = torch.randn(4, *LAYOUT.page_shape, dtype=torch.bfloat16)
        assert store.put(chain.metas(), pages).stored == 4
        assert store.evict(4, tier="hbm") == 4 and host.contains(chain.keys) == [True] * 4
        out = torch.zeros_like(pages)
        assert store.get(NS.id, chain.keys, out).tiers == ("host",) * 4  # promoted back up
        store.drain()  # promotion runs on the store's mover thread
        assert torch.equal(out, pages) and hbm.contains(chain.keys) == [True] * 4
        out.zero_()
        assert store.get(NS.id, chain.keys, out).tiers == ("hbm",) * 4
        assert torch.equal(out, pages)
