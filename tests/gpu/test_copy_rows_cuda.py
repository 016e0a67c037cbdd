"""GPU machine only (-m gpu): the gather/scatter kernel (csrc/copy_rows.cu) against its torch
reference, in every direction the connector uses -- pinned host slab -> GPU cache rows (loads),
GPU cache rows -> pinned staging (saves), GPU -> GPU -- over the strided per-layer views of
page-first tensors, with scattered, repeated-source and reversed indices."""

from __future__ import annotations

import pytest
import torch

from kvstore.ops import copy_rows, copy_rows_reference

pytestmark = pytest.mark.gpu

L, S = 4, 4096  # layers, bytes of one layer of one page


@pytest.fixture(autouse=True)
def _needs_cuda() -> None:
    if not torch.cuda.is_available():
        pytest.fail("-m gpu tests need a CUDA GPU")


def _rand(n: int, device: str, pinned: bool = False) -> torch.Tensor:
    t = torch.randint(0, 256, (n, L * S), dtype=torch.uint8)
    t = t.pin_memory() if pinned else t
    return t.to(device) if device == "cuda" else t


def _idx(ids: list[int]) -> torch.Tensor:
    return torch.tensor(ids, dtype=torch.int64).pin_memory()


@pytest.mark.parametrize("blocks", [None, 1, 3, 1000])
@pytest.mark.parametrize("direction", ["h2d", "d2h", "d2d"])
def test_kernel_matches_reference(direction: str, blocks: int | None) -> None:
    src_dev, dst_dev = {"h2d": ("cpu", "cuda"), "d2h": ("cuda", "cpu"),
                        "d2d": ("cuda", "cuda")}[direction]
    src = _rand(64, src_dev, pinned=True)
    dst_a = _rand(48, dst_dev, pinned=True)
    dst_b = dst_a.clone().pin_memory() if dst_dev == "cpu" else dst_a.clone()
    g = torch.Generator().manual_seed(3)
    dst_ids = torch.randperm(48, generator=g)[:40].tolist()
    src_ids = torch.randint(0, 64, (40,), generator=g).tolist()  # repeats allowed on the source
    di, si = _idx(dst_ids), _idx(src_ids)  # alive until the kernels ran (the contract)
    for layer in range(L):
        sv = src.view(-1, L, S)[:, layer]
        assert copy_rows(dst_a.view(-1, L, S)[:, layer], sv, di, si, max_blocks=blocks)
        copy_rows_reference(dst_b.view(-1, L, S)[:, layer], sv, di, si)
    torch.cuda.synchronize()
    assert torch.equal(dst_a.cpu(), dst_b.cpu())
    # rows not named in dst_ids are untouched
    untouched = sorted(set(range(48)) - set(dst_ids))
    before = dst_b.cpu()[untouched]
    assert torch.equal(dst_a.cpu()[untouched], before)


def test_unaligned_rows_fall_back_to_the_reference() -> None:
    src = torch.randint(0, 256, (8, 40), dtype=torch.uint8).pin_memory()  # 40 % 16 != 0
    dst = torch.zeros(8, 40, dtype=torch.uint8, device="cuda")
    di, si = _idx([0, 1, 2]), _idx([7, 6, 5])
    ran_kernel = copy_rows(dst, src, di, si)
    torch.cuda.synchronize()
    assert not ran_kernel
    assert torch.equal(dst[:3].cpu(), src[[7, 6, 5]])


def test_ordering_with_the_consumer_stream() -> None:
    """A copy on a side stream, an event, then the default stream reads: never stale bytes."""
    src = _rand(256, "cpu", pinned=True)
    dst = torch.zeros(256, L * S, dtype=torch.uint8, device="cuda")
    side = torch.cuda.Stream()
    ids = list(range(256))
    ev = torch.cuda.Event()
    di, si = _idx(ids), _idx(ids[::-1])
    with torch.cuda.stream(side):
        copy_rows(dst, src, di, si)
        ev.record(side)
    torch.cuda.current_stream().wait_event(ev)
    got = dst.sum(dim=1, dtype=torch.int64).cpu()
    want = src.flip(0).sum(dim=1, dtype=torch.int64)
    assert torch.equal(got, want)
