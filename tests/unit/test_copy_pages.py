"""The transfer engine's whole-page copy, the one path a save's pages and the HBM tier's reads and
writes take: every pair lands, by runs (the copy engine on a GPU) or by the gather/scatter kernel
(its reference on the CPU), and nothing else in the destination changes."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstore import transfer_cuda
from kvstore.transfer_cuda import copy_pages

ROWS = 48


def _pages(rows: int, page_bytes: int, seed: int) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(seed).integers(0, 256, (rows, page_bytes), np.uint8))


@st.composite
def pairs(draw: st.DrawFn) -> tuple[list[int], list[int]]:
    dst = draw(st.lists(st.integers(0, ROWS - 1), unique=True, max_size=ROWS))  # a row once
    src = draw(st.lists(st.integers(0, ROWS - 1), min_size=len(dst), max_size=len(dst)))
    return dst, src


def _check(dst_rows: list[int], src_rows: list[int], page_bytes: int) -> None:
    dst, src = _pages(ROWS, page_bytes, 1), _pages(ROWS, page_bytes, 2)
    want = dst.clone()
    for d, s in zip(dst_rows, src_rows):
        want[d] = src[s]
    copy_pages(dst, src, torch.tensor(dst_rows, dtype=torch.int64),
               torch.tensor(src_rows, dtype=torch.int64))
    assert torch.equal(dst, want)


@settings(max_examples=60, deadline=None)
@given(pairs())
def test_every_pair_lands_by_runs(p: tuple[list[int], list[int]]) -> None:
    _check(*p, page_bytes=64)


@settings(max_examples=60, deadline=None)
@given(pairs())
def test_every_pair_lands_by_the_kernel(p: tuple[list[int], list[int]]) -> None:
    dma_runs = transfer_cuda._DMA_RUNS
    transfer_cuda._DMA_RUNS = 0  # any run count above 0 with small pages takes the kernel
    try:
        _check(*p, page_bytes=64)
    finally:
        transfer_cuda._DMA_RUNS = dma_runs


def test_many_short_runs_take_the_kernel_and_long_runs_the_copy_engine(
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = transfer_cuda.copy_rows

    def counting(*a: Any, **kw: Any) -> bool:
        calls.append(len(a[2]))
        return real(*a, **kw)

    monkeypatch.setattr(transfer_cuda, "copy_rows", counting)
    scattered = list(range(0, 2 * 40, 2))  # 40 pairs, no two adjacent: 40 runs of one page
    dst, src = _pages(100, 64, 3), _pages(100, 64, 4)
    idx = torch.tensor(scattered, dtype=torch.int64)
    copy_pages(dst, src, idx, idx)
    assert calls == []  # 40 runs: within _DMA_RUNS, by runs
    many = list(range(0, 2 * 90, 2))[:90]
    dst, src = _pages(200, 64, 3), _pages(200, 64, 4)
    idx = torch.tensor(many, dtype=torch.int64)
    copy_pages(dst, src, idx, idx)
    assert calls == [90]  # 90 runs of 64 bytes: one kernel
    assert torch.equal(dst[idx], src[idx])
    whole = torch.arange(100, dtype=torch.int64)
    copy_pages(dst, src, whole, whole)
    assert calls == [90]  # one run
    assert torch.equal(dst[:100], src[:100])
