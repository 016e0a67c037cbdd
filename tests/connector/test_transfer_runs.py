"""The pieces a whole-page save and a load by DMA are planned from: runs of adjacent (block, slot)
pairs, and the whole-page view of a page-first cache (none for per-layer caches)."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given
from hypothesis import strategies as st

from connector.base import KVCacheSpec
from kvstore.transfer_cuda import _whole_pages
from kvstore.ops import index_runs
from kvstore import KVLayout

LAYOUT = KVLayout(num_layers=4, num_kv_heads=2, head_dim=64, block_size=16, dtype="bfloat16")

pairs = st.lists(st.tuples(st.integers(0, 40), st.integers(0, 40)), max_size=60)


def runs_of(ps: list[tuple[int, int]], limit: int | None = None
            ) -> list[tuple[int, int, int]] | None:
    return index_runs(np.array([b for b, _ in ps], np.int64),
                      np.array([s for _, s in ps], np.int64), limit)


@given(pairs)
def test_runs_cover_the_pairs_in_order(ps: list[tuple[int, int]]) -> None:
    runs = runs_of(ps)
    assert runs is not None
    assert [(b + i, s + i) for b, s, n in runs for i in range(n)] == ps
    for (b, s, n), (b2, s2, _) in zip(runs, runs[1:]):  # maximal: no run continues the last
        assert n >= 1 and not (b2 == b + n and s2 == s + n)


@given(pairs, st.integers(0, 8))
def test_index_runs_are_the_runs_up_to_a_limit(ps: list[tuple[int, int]], limit: int) -> None:
    """A load by DMA takes the runs, or None (the scatter kernel) beyond ``limit`` of them."""
    want = runs_of(ps)
    assert want is not None
    assert runs_of(ps, limit) == (want if len(want) <= limit else None)


def test_whole_pages_of_a_page_first_cache() -> None:
    pool = torch.arange(6 * LAYOUT.page_bytes // 2, dtype=torch.int16).view(torch.bfloat16)
    pool = pool.view(6, *LAYOUT.page_shape)
    layers = KVCacheSpec.page_first(pool).layer_views(LAYOUT)
    pages = _whole_pages(layers, LAYOUT.page_bytes)
    assert pages is not None and pages.shape == (6, LAYOUT.page_bytes)
    assert torch.equal(pages, pool.view(6, -1).view(torch.uint8))


def test_per_layer_caches_have_no_whole_pages() -> None:
    S = LAYOUT.page_bytes // LAYOUT.num_layers
    layers = [torch.zeros((6, S), dtype=torch.uint8) for _ in range(LAYOUT.num_layers)]
    assert _whole_pages(layers, LAYOUT.page_bytes) is None
