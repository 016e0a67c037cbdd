"""GPU machine only (-m gpu): the host tier's slab is page-locked and DMA-able."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kvstore import KVLayout, Metrics, Namespace
from kvstore.tiers.host import HostTier

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _needs_cuda() -> None:
    if not torch.cuda.is_available():
        pytest.fail("-m gpu tests need a CUDA GPU")


def test_slab_is_pinned_by_default_and_round_trips_through_the_gpu() -> None:
    layout = KVLayout(4, 8, 128, 16, "bfloat16")
    tier = HostTier.build("host", layout, 8, Metrics())  # pin_memory='auto' -> pinned with CUDA
    assert tier.pinned and tier.slab_tensor.is_pinned()
    ns = Namespace("gpu", layout)
    chain = ns.chain(list(range(16 * 4)))
    pages = torch.randn(4, *layout.page_shape, dtype=torch.bfloat16)
    tier.write(chain.metas(), list(pages.view(torch.uint8).reshape(4, -1).numpy()))
    slots = [tier.slot_of(k) for k in chain.keys]
    slab = tier.slab_tensor
    on_gpu = slab[slots].to("cuda", non_blocking=True)  # DMA from pinned memory
    torch.cuda.synchronize()
    back = on_gpu.view(torch.bfloat16).reshape(4, *layout.page_shape).cpu()
    assert torch.equal(back, pages)
    out = np.zeros((4, layout.page_bytes), np.uint8)
    assert tier.read(ns.id, chain.keys, list(out)) == [True] * 4


def test_unpinned_when_asked() -> None:
    layout = KVLayout(1, 1, 8, 16, "float16")
    assert not HostTier.build("h", layout, 2, Metrics(), pin_memory=False).slab_tensor.is_pinned()
