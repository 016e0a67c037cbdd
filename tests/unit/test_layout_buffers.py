"""KVLayout and the page-buffer boundary: shapes, dtypes, devices are checked with clear errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kvstore import InvalidArgument, KVLayout
from kvstore.buffers import page_views


def test_page_geometry() -> None:
    lay = KVLayout(32, 8, 128, 16, "bfloat16")
    assert lay.page_shape == (32, 2, 16, 8, 128)
    assert lay.page_bytes == 2 * 2**20
    assert KVLayout(32, 8, 128, 16, torch.bfloat16) == lay  # torch dtypes accepted
    assert lay.torch_dtype is torch.bfloat16


def test_fingerprint_covers_every_field() -> None:
    base = KVLayout(4, 2, 8, 16, "float16")
    variants = [
        KVLayout(5, 2, 8, 16, "float16"), KVLayout(4, 4, 8, 16, "float16"),
        KVLayout(4, 2, 16, 16, "float16"), KVLayout(4, 2, 8, 8, "float16"),
        KVLayout(4, 2, 8, 16, "bfloat16"),
    ]
    assert len({base.fingerprint, *(v.fingerprint for v in variants)}) == 6


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"num_layers": 0}, "num_layers"),
        ({"head_dim": -1}, "head_dim"),
        ({"block_size": 1.5}, "block_size"),
        ({"dtype": "complex64"}, "dtype"),
        ({"num_kv_heads": True}, "num_kv_heads"),
    ],
)
def test_bad_layout(kwargs: dict, match: str) -> None:
    args = {"num_layers": 2, "num_kv_heads": 2, "head_dim": 4, "block_size": 4, "dtype": "float16"}
    args.update(kwargs)
    with pytest.raises(InvalidArgument, match=match):
        KVLayout(**args)


def test_views_are_zero_copy(layout: KVLayout) -> None:
    batch = torch.zeros(3, *layout.page_shape, dtype=torch.float16)
    views = page_views(batch, layout, 3, writable=True)
    views[1][:] = 255
    assert batch[1].view(torch.uint8).eq(255).all() and batch[0].eq(0).all()
    singles = [torch.ones(layout.page_shape, dtype=torch.float16) for _ in range(2)]
    assert len(page_views(singles, layout, 2, writable=False)) == 2
    raw = np.zeros((2, layout.page_bytes), dtype=np.uint8)
    assert page_views(raw, layout, 2, writable=True)[0].base is not None
    typed = np.zeros((2, *layout.page_shape), dtype=np.float16)
    assert page_views(typed, layout, 2, writable=True)[0].nbytes == layout.page_bytes


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda L: torch.zeros(2, *L.page_shape, dtype=torch.float32), "dtype"),
        (lambda L: torch.zeros(2, 3, *L.page_shape[1:], dtype=torch.float16), "shape"),
        (lambda L: torch.zeros(2, *L.page_shape, dtype=torch.float16).transpose(1, 2), "shape|contiguous"),
        (lambda L: torch.zeros(3, *L.page_shape, dtype=torch.float16), "batch of 3"),
        (lambda L: np.zeros((2, L.page_bytes + 1), dtype=np.uint8), "dtype|shape"),
        (lambda L: np.zeros((2, *L.page_shape), dtype=np.float32), "dtype"),
        (lambda L: [b"x" * L.page_bytes] * 2, "tensor or numpy"),
        (lambda L: "pages", "sequence"),
        (lambda L: [torch.zeros(L.page_shape, dtype=torch.float16)], "2 keys but 1"),
    ],
)
def test_bad_pages(layout: KVLayout, make, match: str) -> None:
    with pytest.raises(InvalidArgument, match=match):
        page_views(make(layout), layout, 2, writable=False)


def test_read_only_buffer_rejected_for_reads(layout: KVLayout) -> None:
    arr = np.zeros((1, layout.page_bytes), dtype=np.uint8)
    arr.flags.writeable = False
    with pytest.raises(InvalidArgument, match="read-only"):
        page_views(arr, layout, 1, writable=True)
