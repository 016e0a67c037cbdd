"""The engine-level cases of ``bench.ttft`` (each described in :mod:`bench.ttft_engine`'s
docstring): cold and hbm hit on the bare engine; the host hits, layer-wise and load-then-compute,
with the load-only and PCIe-floor references and the no-reuse overhead; the disk and Redis hits;
the daemon's host hit. Each returns its medians in seconds, keyed by what it measured.
"""

from __future__ import annotations

import statistics
import tempfile
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from bench.common import median_time
from bench.ttft_engine_setup import (
    BLOCK,
    BenchError,
    Plan,
    _check_placement,
    _connected_engine,
    _engine_kwargs,
    _evict,
    _expect,
    _host_tier,
    _pool_blocks,
    _Progress,
    _Prompts,
    _timed_case,
    _timed_generate,
    host_store,
)
from connector.base import KVCacheSpec
from connector.inprocess import InProcessWorker
from kvstore.transfer import make_transfer
from kvstore import Tier
from kvstore.api import LocalStagingSlab
from kvstore.keys import Namespace
from kvstore.layout import KVLayout
from kvstore.metrics import Metrics
from kvstore.ops import copy_spans
from kvstore.pool import HBMTier
from kvstore.store import TieredStore
from runtime.engine import Engine
from runtime.model import LlamaForPagedLM


def _load_only(pool: HBMTier, store: TieredStore, namespace_id: bytes, keys: Sequence[bytes],
               device: torch.device, runs: int, first_layer: int = 0) -> float:
    """Seconds to move ``keys``' host pages into free engine blocks with the connector's own
    transfer (every layer from ``first_layer`` on), without the model."""
    # the pages' slots, pinned as a load pins them (prepared, untimed, as the connector does)
    handle = store.prepare_load(namespace_id, keys, tier="host")
    try:
        if handle.num_blocks != len(keys):
            raise BenchError("load only: a prefix page is missing from host")
        return _copy_in(pool, store.staging_tier("host"), list(handle.slots), device, runs,
                        first_layer)
    finally:
        store.complete_load(handle)


def _copy_in(pool: HBMTier, host: LocalStagingSlab, slots: list[int], device: torch.device,
             runs: int, first_layer: int) -> float:
    """Median seconds of the connector's transfer of host ``slots`` into free pool blocks."""
    layout = pool.layout
    L = layout.num_layers
    layers = KVCacheSpec.page_first(pool.pool).layer_views(layout)  # as the worker's
    blocks = pool.allocate(len(slots))
    if blocks is None:
        raise BenchError("load only: no free engine blocks to load into")
    saver = ThreadPoolExecutor(1)
    xfer = make_transfer(layers, host.slab_tensor, L, layout.page_bytes, copy_spans, saver)
    try:
        def load() -> None:
            ctx = xfer.load_context(xfer.gate(), blocks, slots)
            for lyr in range(first_layer, L):
                xfer.load_layer(ctx, lyr)
            xfer.finish_load(ctx)

        t = median_time(load, device, runs)
        slab = host.slab_tensor
        skip = first_layer * layout.page_bytes // L  # page-first: a layer is a run of bytes
        for i in (0, len(blocks) - 1):  # the bytes did land where a load puts them
            got = pool.pool_bytes[blocks[i]].cpu()
            if not torch.equal(got[skip:], slab[slots[i]][skip:]):
                raise BenchError(f"load only: block {blocks[i]} differs from its host page")
    finally:
        xfer.close()
        saver.shutdown(wait=True)
        pool.release(blocks)
    return t


def _pcie_floor(host: LocalStagingSlab, num_pages: int, device: torch.device, runs: int
                ) -> tuple[float, float]:
    """(seconds, bytes/s) of one contiguous pinned host->GPU copy of ``num_pages`` pages (the
    host tier's pinned slab is the source)."""
    src = host.slab_tensor[:num_pages]
    if not src.is_pinned():
        raise BenchError("PCIe floor: the host slab is not pinned")
    dst = torch.empty(src.shape, dtype=src.dtype, device=device)
    # the lambda runs before the del below (pyflakes cannot tell)
    t = median_time(lambda: dst.copy_(src, non_blocking=True), device, max(runs, 5))  # noqa: F821
    del dst
    return t, src.numel() / t


def _cold_and_hbm(bare: Engine, prompts: _Prompts, n: int, device: torch.device, runs: int,
                  progress: _Progress) -> dict[str, float]:
    reuse = (n - 1) // BLOCK * BLOCK
    r: dict[str, float] = {}
    progress.step(f"{n}: engine cold")
    r["cold"] = _timed_case(bare, lambda: prompts.new(n), lambda: None, {"hbm": 0},
                            f"engine cold, {n} tokens", device, runs)
    progress.done()
    progress.step(f"{n}: engine hbm hit")
    p = prompts.new(n)
    _, out = _timed_generate(bare, p, device)  # fills the pool
    _expect(out, {"hbm": 0}, f"engine hbm hit, {n} tokens (fill)")
    r["hbm"] = _timed_case(bare, lambda: p, lambda: None, {"hbm": reuse},
                           f"engine hbm hit, {n} tokens", device, runs)
    progress.done()
    return r


def _host_cases(model: LlamaForPagedLM, layout: KVLayout, ns: Namespace, bare: Engine,
                prompts: _Prompts, n: int, device: torch.device, plan: Plan,
                progress: _Progress) -> dict[str, float]:
    """host hit (layer-wise and load-then-compute), load only, PCIe floor, no-reuse."""
    nblk = (n - 1) // BLOCK
    reuse = nblk * BLOCK
    pool, host, store = host_store(layout, n, device)
    engines: list[Engine] = []
    r: dict[str, float] = {}
    try:
        lw, lw_worker = _connected_engine(model, pool, store, ns, n, layerwise=True)
        engines.append(lw)
        ltc, _ = _connected_engine(model, pool, store, ns, n, layerwise=False)
        engines.append(ltc)
        p = prompts.new(n)
        keys = ns.chain(p).keys[:nblk]
        _, out = _timed_generate(lw, p, device)  # computed; its full blocks are saved to host
        _expect(out, {"hbm": 0, "host": 0}, f"host hit, {n} tokens (fill)")
        lw.drain()
        _check_placement(store, keys, {"hbm": nblk, "host": nblk}, f"host hit, {n} tokens (fill)")

        def only_in_host() -> None:
            for e in engines:
                e.drain()
            _evict(store, "hbm")
            _check_placement(store, keys, {"hbm": 0, "host": nblk}, f"host hit, {n} tokens")

        for key, eng, label in (("host", lw, "layer-wise"), ("host_ltc", ltc, "load-then-compute")):
            progress.step(f"{n}: host hit, {label}")
            r[key] = _timed_case(eng, lambda: p, only_in_host, {"hbm": 0, "host": reuse},
                                 f"host hit ({label}), {n} tokens", device, plan.runs)
            progress.done()

        progress.step(f"{n}: load only")
        only_in_host()
        r["load"] = _load_only(pool, store, ns.id, keys, device, plan.runs)
        # what the hit copies: its engine writes layer 0 from the tokens
        r["load_hit"] = _load_only(pool, store, ns.id, keys, device, plan.runs, first_layer=1)
        if plan.gpu:
            r["floor"], r["floor_bw"] = _pcie_floor(host, nblk, device, plan.runs)
        progress.done()

        progress.step(f"{n}: no reuse")
        r.update(_no_reuse(lw, lw_worker, bare, prompts, n, device, plan.no_reuse_prompts))
        progress.done()
    finally:
        for e in engines:
            e.close()
        store.close()
    return r


def _no_reuse(with_store: Engine, worker: InProcessWorker, without: Engine, prompts: _Prompts,
              n: int, device: torch.device, count: int) -> dict[str, float]:
    """Unique prompts alternately through both engines; saves are not waited for between
    prompts (see the module docstring). Returns medians and totals (seconds)."""
    before = worker.stats()
    variants = {"with": (with_store, {"hbm": 0, "host": 0}), "without": (without, {"hbm": 0})}
    times: dict[str, list[float]] = {"with": [], "without": []}
    order = ["with", "without"]
    for i in range(count + 1):  # round 0 is the warm-up
        for name in order if i % 2 == 0 else order[::-1]:
            eng, reused = variants[name]
            t, out = _timed_generate(eng, prompts.new(n), device)
            _expect(out, reused, f"no reuse ({name} store), {n} tokens")
            if i:
                times[name].append(t)
    with_store.drain(timeout_s=120.0)
    after = worker.stats()
    saved = after.blocks_saved - before.blocks_saved
    want = (count + 1) * (n // BLOCK)
    if saved != want or after.saves_abandoned != before.saves_abandoned:
        raise BenchError(f"no reuse, {n} tokens: {saved} blocks saved to host, want {want} "
                         f"({after.saves_abandoned - before.saves_abandoned} saves abandoned)")
    return {
        "noreuse_with": statistics.median(times["with"]),
        "noreuse_without": statistics.median(times["without"]),
        "noreuse_with_total": sum(times["with"]),
        "noreuse_without_total": sum(times["without"]),
    }


def _lower_tier_case(kind: str, model: LlamaForPagedLM, layout: KVLayout, ns: Namespace,
                     prompts: _Prompts, n: int, device: torch.device, runs: int,
                     lower_factory: Callable[[Metrics, int], Tier], notes: list[str]) -> float:
    """TTFT with the prefix only in the tier ``lower_factory`` builds, below [hbm, host]."""
    nblk = (n - 1) // BLOCK
    reuse = nblk * BLOCK
    metrics = Metrics()
    pool = HBMTier.build("hbm", layout, _pool_blocks(n), metrics, device=device)
    lower = lower_factory(metrics, n // BLOCK + 64)
    tiers: list[Tier] = [pool, _host_tier(layout, n, metrics), lower]
    store = TieredStore(layout, tiers, write_policy="write_back")
    engine: Engine | None = None
    try:
        engine, _ = _connected_engine(model, pool, store, ns, n, layerwise=True,
                                      prefetch_policy="wait_complete")
        eng = engine
        if kind == "disk":
            notes.append(f"disk tier at {n} tokens: "
                         f"{'O_DIRECT' if getattr(lower, 'o_direct', False) else 'buffered I/O'} "
                         f"on {getattr(lower, 'filesystem', '?')}")
        p = prompts.new(n)
        keys = ns.chain(p).keys[:nblk]
        _, out = _timed_generate(eng, p, device)
        _expect(out, {"hbm": 0, "host": 0}, f"{kind} hit, {n} tokens (fill)")
        where = {"hbm": 0, "host": 0, lower.name: nblk}

        def only_below() -> None:
            eng.drain(timeout_s=120.0)
            _evict(store, "hbm")  # write-back: to host (already there)
            _evict(store, "host")  # write-back: to the lower tier (the first time)
            _check_placement(store, keys, where, f"{kind} hit, {n} tokens")

        prefetched = [0.0]

        def count_before() -> None:
            only_below()
            prefetched[0] = metrics.value("kvstore_copies_total", reason="prefetch", tier="host")

        def count_after() -> None:
            got = metrics.value("kvstore_copies_total", reason="prefetch", tier="host")
            if got - prefetched[0] != nblk:
                raise BenchError(f"{kind} hit, {n} tokens: {got - prefetched[0]:.0f} pages "
                                 f"prefetched into host, want {nblk}")

        return _timed_case(eng, lambda: p, count_before, {"hbm": 0, "host": 0, lower.name: reuse},
                           f"{kind} hit, {n} tokens", device, runs, check=count_after)
    finally:
        if engine is not None:
            engine.close()
        store.close()


def _daemon_case(model: LlamaForPagedLM, layout: KVLayout, ns: Namespace, prompts: _Prompts,
                 n: int, device: torch.device, runs: int, notes: list[str]) -> float | None:
    """TTFT with the prefix only in the host tier of a ``kvstore serve`` (its shared-memory
    slab; registered for DMA on a GPU), through the daemon-client connector; None (with a note)
    when no daemon can run here."""
    from server.daemon.process import DaemonProcess, layout_env

    nblk = (n - 1) // BLOCK
    host_bytes = (nblk + 64) * layout.page_bytes
    env = {**layout_env(layout),
           "KVSTORE_TIERS": f'[{{"kind": "host", "capacity": "{host_bytes}B"}}]'}
    with tempfile.TemporaryDirectory(prefix="kvbench-ttft-daemon-") as tmp:
        try:
            daemon = DaemonProcess(Path(tmp), env).start()
        except Exception as exc:  # noqa: BLE001 - e.g. no grpc, or /dev/shm too small
            notes.append(f"daemon host hit at {n} tokens skipped: {exc}")
            return None
        engine: Engine | None = None
        try:
            engine = Engine._over_store(model, ns.model_id, device, num_blocks=_pool_blocks(n),
                                        block_size=BLOCK, daemon=daemon.target,
                                        **_engine_kwargs(n))
            eng = engine
            p = prompts.new(n)
            keys = ns.chain(p).keys[:nblk]
            _, out = _timed_generate(eng, p, device)
            _expect(out, {"hbm": 0, "host": 0}, f"daemon host hit, {n} tokens (fill)")

            def only_in_daemon() -> None:
                eng.drain(timeout_s=120.0)
                _evict(eng.store, "hbm")
                found = eng.daemon.lookup(keys).num_blocks
                if found != nblk or any(eng.store.tier("hbm").contains(list(keys))):
                    raise BenchError(f"daemon host hit, {n} tokens: the daemon holds {found} of "
                                     f"the prefix's {nblk} pages, or hbm still holds some")

            return _timed_case(eng, lambda: p, only_in_daemon, {"hbm": 0, "host": nblk * BLOCK},
                               f"daemon host hit, {n} tokens", device, runs)
        finally:
            if engine is not None:
                engine.close()
            code = daemon.stop()
            if code != 0:
                notes.append(f"kvstore serve exited {code} after the {n}-token case: "
                             f"{daemon.tail()}")
