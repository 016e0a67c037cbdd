"""Host tier: put/get of 2 MiB pages (Llama-3-8B shape) against a memcpy of the same bytes.

The baseline is one ``np.copyto`` of the whole batch between two contiguous, already-touched
buffers — the most a single copy stream can do on this machine. The tier copies page by page
into its slab slots, plus its index and metrics work. Both sides run warm (slab pages faulted
in by a first pass) and take the best of several rounds.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from tqdm import tqdm

from kvstore import KVLayout, Metrics, Namespace
from kvstore.tiers.host import HostTier

LAYOUT = KVLayout(32, 8, 128, 16, "bfloat16")


def _best(fn, rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def measure(args: Any) -> list[dict]:
    n_pages = 32 if args.quick else 256
    batch = 32
    rounds = 3 if args.quick else 7
    ns = Namespace("bench", LAYOUT)
    chain = ns.chain(np.arange(n_pages * LAYOUT.block_size))
    metas = chain.metas()
    rng = np.random.default_rng(0)
    src = rng.integers(0, 256, (n_pages, LAYOUT.page_bytes), dtype=np.uint8)
    dst = np.empty_like(src)
    tier = HostTier("host", LAYOUT, n_pages, Metrics())
    nbytes = src.nbytes
    src_views, dst_views = list(src), list(dst)

    def put_all() -> None:
        for i in range(0, n_pages, batch):
            tier.delete(chain.keys[i : i + batch])
            tier.write(metas[i : i + batch], src_views[i : i + batch])

    def get_all() -> None:
        for i in range(0, n_pages, batch):
            tier.read(ns.id, chain.keys[i : i + batch], dst_views[i : i + batch])

    put_all()  # fault the slab in
    get_all()
    assert np.array_equal(dst, src)
    progress = tqdm(total=4, desc="bench.tiers host", leave=False, disable=args.quick)
    t_put = _best(put_all, rounds)
    progress.update()
    t_get = _best(get_all, rounds)
    progress.update()
    t_copy_in = _best(lambda: np.copyto(dst, src), rounds)
    progress.update()
    t_copy_out = _best(lambda: np.copyto(src, dst), rounds)
    progress.close()
    gb = nbytes / 1e9
    return [
        {"case": "host/put", "value": gb / t_put, "baseline": "memcpy of the same bytes",
         "baseline_value": gb / t_copy_in},
        {"case": "host/get", "value": gb / t_get, "baseline": "memcpy of the same bytes",
         "baseline_value": gb / t_copy_out},
    ]
