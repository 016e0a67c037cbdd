"""Host tier: put/get of pages against a memcpy of the same bytes and against LMCache's local
CPU backend, in the same run.

Pages of 2 MiB (Llama-3-8B: 32 layers, 8 KV heads of 128, 16-token blocks, bf16) and of
256 KiB (the same with 4 layers), in batches of 16 and of 64:

* ``kvstore`` — ``HostTier.write`` / ``read`` of a batch: slot bookkeeping, then one copy per
  run of adjacent slots by whichever copy (``kvstore.ops.copy_choice()``: the native
  streaming-store kernel or ``np.copyto``) measured faster on this machine at start-up;
* ``LMCache LocalCPUBackend`` (``bench.lmcache_peer``) — its own allocator, a ``tensor.copy_``
  per page in and out (one torch thread), its put task and blocking get; left out, with the reason printed, where
  LMCache is not installed;
* ``store, event log on`` — the same puts and gets through a ``TieredStore`` over a host tier,
  with its event log (every page stored or removed, appended under the store lock), against
  the same store with the log off (``event_log_events`` 0): what the log costs (two stores of
  each, made in both orders, each timed as the best of its two: where a slab lands moves a
  store's copies by a few %, more than the log costs);
* the baseline — one ``np.copyto`` of each batch between the same source (destination) pages
  and memory of the same kind and size as the tier's slab: an anonymous mapping advised
  ``MADV_HUGEPAGE``, each batch at its own offset (a buffer reused batch after batch would stay
  in the cache). Transparent huge pages roughly double a copy's speed on this kind of
  machine, so the baseline must copy into the same kind of memory as the tier, or the ratio
  measures the allocator, not the tier.

Every contender runs warm (its memory faulted in by a first pass); rounds interleave them in a
rotating order, and each keeps its best round.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from tqdm import tqdm

from bench import lmcache_peer
from kvstore import KVLayout, Namespace, TieredStore, build_tier
from kvstore.config import StoreConfig
from kvstore.buffers import hugepage_buffer
from kvstore.ops import copy_choice

SIZES = (("2MiB", 32), ("256KiB", 4))
BATCHES = (16, 64)
BASELINE = "memcpy of the same bytes (np.copyto, huge-page memory)"
#: the store over the tier, with its event log (the default) and without (``event_log_events`` 0)
LOG_ON, LOG_OFF = "store, event log on", "store, event log off"


def measure(args: Any) -> list[dict]:
    quick = bool(getattr(args, "quick", False))
    no_peer = lmcache_peer.unavailable("host")
    if no_peer:
        print(f"bench.tiers host: no LMCache peer: {no_peer}", file=sys.stderr)
    print(f"bench.tiers host: copy_choice() = {copy_choice()}", file=sys.stderr)
    lines: list[dict] = []
    progress = tqdm(total=len(SIZES) * len(BATCHES), desc="bench.tiers host", leave=False,
                    disable=quick, file=sys.stderr)
    for size, layers in SIZES:
        for batch in BATCHES:
            layout = KVLayout(layers, 8, 128, 16, "bfloat16")
            lines += _measure(layout, f"{size}x{batch}", batch, quick=quick, peer=not no_peer)
            progress.update()
    progress.close()
    return lines


def _measure(layout: KVLayout, label: str, batch: int, *, quick: bool, peer: bool) -> list[dict]:
    page = layout.page_bytes
    n_pages = max(batch, ((32 << 20) if quick else (256 << 20)) // page // batch * batch)
    rounds = 3 if quick else 9
    ns = Namespace("bench", layout)
    chain = ns.chain(np.arange(n_pages * layout.block_size))
    metas = chain.metas()
    rng = np.random.default_rng(0)
    src = rng.integers(0, 256, (n_pages, page), dtype=np.uint8)
    dst = np.empty_like(src)
    huge = hugepage_buffer(n_pages * page).reshape(n_pages, page)  # as big as the tier's slab
    tier = build_tier({"kind": "host", "capacity": n_pages * page}, layout)
    src_views, dst_views = list(src), list(dst)
    spans = range(0, n_pages, batch)
    puts: dict[str, Callable[[], None]] = {}
    gets: dict[str, Callable[[], None]] = {}

    put_all, get_all = _batched(tier.delete, tier.write, tier.read, ns, chain, metas, src_views,
                                dst_views, spans, batch)

    def copy_in() -> None:
        for i in spans:
            np.copyto(huge[i : i + batch], src[i : i + batch])

    def copy_out() -> None:
        for i in spans:
            np.copyto(dst[i : i + batch], huge[i : i + batch])

    puts.update(kvstore=put_all, baseline=copy_in)
    gets.update(kvstore=get_all, baseline=copy_out)
    # the same pages through a store over the tier, its event log on (the default) and off:
    # two of each, made in both orders -- where a store's slab lands moves its copies by a
    # few %, more than the log costs, and the first-made of a pair is the one favoured -- each
    # timed as the best of its two
    stores = {}
    for i, order in enumerate(((LOG_ON, LOG_OFF), (LOG_OFF, LOG_ON))):
        for name in order:
            events = StoreConfig().event_log_events if name == LOG_ON else 0
            tier = build_tier({"kind": "host", "capacity": n_pages * page}, layout)
            stores[f"{name} #{i}"] = TieredStore(layout, [tier], event_log_events=events)
    for name, store in stores.items():
        puts[name], gets[name] = _batched(store.delete, store.put, store.get, ns, chain, metas,
                                          src_views, dst_views, spans, batch)
    lmc = None
    if peer:
        import torch

        # One copy stream, like the tier and the baseline: torch's OpenMP copy threads wait at
        # a barrier for a descheduled peer on a busy 2-core machine (milliseconds a page).
        torch.set_num_threads(1)
        shape = (layout.num_layers, 2, layout.block_size, layout.num_kv_heads, layout.head_dim)
        lmc = lmcache_peer.CpuBackend(shape, torch.bfloat16, n_pages * page)
        as_t = [torch.from_numpy(p).view(torch.bfloat16).view(shape) for p in src_views]
        out_t = [torch.from_numpy(p).view(torch.bfloat16).view(shape) for p in dst_views]
        ids = list(range(n_pages))

        def lmc_put() -> None:
            for i in spans:
                lmc.remove(ids[i : i + batch])
                lmc.put(ids[i : i + batch], as_t[i : i + batch])

        def lmc_get() -> None:
            for i in spans:
                lmc.get(ids[i : i + batch], out_t[i : i + batch])

        puts[lmcache_peer.HOST_VARIANT] = lmc_put
        gets[lmcache_peer.HOST_VARIANT] = lmc_get
    try:
        for name in puts:  # warm: slabs and pools faulted in; then check what comes back
            puts[name]()
            if name != "baseline":
                dst[:] = 0
                gets[name]()
                assert np.array_equal(dst, src), f"{name} returned other bytes"
        t_put = _best_interleaved(puts, rounds)
        t_get = _best_interleaved(gets, rounds)
    finally:
        if lmc is not None:
            lmc.close()
        for store in stores.values():
            store.close()
    for times in (t_put, t_get):
        for name in (LOG_ON, LOG_OFF):
            times[name] = min(times.pop(f"{name} #{i}") for i in range(2))
    gb = n_pages * page / 1e9
    lines: list[dict] = []
    for direction, times in (("put", t_put), ("get", t_get)):
        case = f"host/{direction} {label}"
        base = gb / times["baseline"]
        for name in times:
            if name not in ("baseline", LOG_ON, LOG_OFF):
                lines.append({"case": case, "variant": name, "value": gb / times[name],
                              "baseline": BASELINE, "baseline_value": base})
        lines.append({"case": case, "variant": LOG_ON, "value": gb / times[LOG_ON],
                      "baseline": LOG_OFF, "baseline_value": gb / times[LOG_OFF]})
        if lmcache_peer.HOST_VARIANT in times:
            peer_line = lmcache_peer.peer_line(
                "tiers", case, gb / times["kvstore"], gb / times[lmcache_peer.HOST_VARIANT]
            )
            lines.append(peer_line)
    return lines



def _batched(delete: Callable[..., Any], write: Callable[..., Any], read: Callable[..., Any],
             ns: Namespace, chain: Any, metas: list[Any], src_views: list[np.ndarray],
             dst_views: list[np.ndarray], spans: range, batch: int
             ) -> tuple[Callable[[], None], Callable[[], None]]:
    """put and get of every page, a batch at a time, through a tier's or a store's calls (a
    put deletes its batch first: every round writes)."""

    def put() -> None:
        for i in spans:
            delete(chain.keys[i : i + batch])
            write(metas[i : i + batch], src_views[i : i + batch])

    def get() -> None:
        for i in spans:
            read(ns.id, chain.keys[i : i + batch], dst_views[i : i + batch])

    return put, get


def _best_interleaved(fns: dict[str, Callable[[], None]], rounds: int) -> dict[str, float]:
    best = dict.fromkeys(fns, float("inf"))
    names = list(fns)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            t0 = time.perf_counter()
            fns[name]()
            best[name] = min(best[name], time.perf_counter() - t0)
    return best
