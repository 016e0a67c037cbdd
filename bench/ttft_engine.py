"""Engine-level cases of ``bench.ttft``: TTFT of :class:`runtime.engine.Engine` with the prompt's
prefix in the hbm pool, in the host tier, on disk, in Redis, or nowhere, plus the overlap
ablation and the no-reuse overhead of the store. Called by ``bench/ttft.py``'s ``main``.

TTFT is the wall time of ``engine.generate([prompt], SamplingParams(max_tokens=1))`` (greedy),
synchronised on the engine's CUDA stream before and after (not on the device: the background
saves of earlier prompts run on, as on a server); the median of ``runs`` timed runs (3 on the
GPU, 5 on the CPU) after one untimed warm-up run. Every engine gets ``max_num_batched_tokens >= n``, so a
prompt's prefill is one step (no chunking: chunked prefill would make recompute slower, and every
hit look better). A prefix hit reuses ``(n - 1) // 16`` full blocks: the engine always recomputes
at least the last token.

Every run checks its :class:`~runtime.request.RequestOutput` — ``num_tokens_reused`` per tier
(``hbm``; with a connector ``host`` and, for pages loaded through host from below, ``disk`` or
``redis``) is exactly what the case intends, no load failed, ``computed + reused == n`` — and,
for disk and Redis, that the store prefetched exactly the prefix's pages into host; before each
run it checks which tiers hold the prefix. A mismatch raises :class:`BenchError`: a bench that
silently measures the wrong thing is a bug.

Setups per prompt length ``n`` (one model, the one the model-level part built; hbm pools of
``2 * (n // 16) + 64`` blocks, host tiers as big, so no run evicts its own prefix):

* **bare engine** — an hbm pool with no store (its :class:`~kvstore.pool.LocalOwner`)
  and no connector: ``engine cold`` (a new random prompt every run) and ``engine hbm hit`` (one
  prompt, run once to fill the pool, then timed).
* **hbm + host** — ``TieredStore([hbm, host], write_back)`` and two engines over that pool, each
  with an in-process connector (:class:`~connector.inprocess.InProcessScheduler`/``Worker``):
  layer-wise loads (``layerwise=True``) and load-then-compute (``layerwise=False``, the overlap
  ablation's blocking baseline). The prompt runs once (its full blocks are saved to host,
  ``engine.drain()`` waits for the puts); before each run ``store.evict`` empties the hbm tier
  (write-back finds the pages in host already), so the prefix comes from host only.
  ``load only``: the connector's own transfer (:func:`connector.transfer.make_transfer` over the
  same pool and host slab) moving the same pages host -> engine blocks, all layers, timed alone
  (``load_context`` / ``load_layer`` per layer / ``finish_load``); ``load only, layers 1..``:
  the same without layer 0 -- the copies a hit makes, whose engine writes layer 0's K/V from the
  tokens (``Engine(first_layer_from_tokens=True)``, the default; ``runtime/engine.py``). The
  overlap target is judged against all layers (moving the cached pages); the ratio against the
  hit's own copies is printed beside it. ``PCIe floor`` (GPU only):
  one contiguous pinned host->GPU copy of the same bytes (the prefix's ``(n - 1) // 16`` pages),
  in the same run; floor = bytes / measured bandwidth.
* **hbm + host + disk** — a disk tier (:func:`kvstore.build_tier`) in a temporary directory, the
  workers' ``prefetch_policy="wait_complete"``. Before each run ``store.evict`` empties hbm and
  host (write-back puts the pages on disk the first time), so the prefix is only on disk: the
  load waits for the prefetch disk -> host, then copies host -> engine blocks.
* **hbm + host + redis** — the same with a redis tier (:func:`kvstore.build_tier`) on a private
  redis-server the bench starts on a free loopback port (PATH, or ``.redis/redis-server``) and
  always stops; without a binary the redis lines are skipped with a note.

No-reuse overhead: new random prompts of ``n`` tokens, never repeated, alternately through the
hbm + host engine (layer-wise; every full block is saved to host, nothing is ever found) and the
bare engine (no store at all), after one warm-up prompt each. As on a real server, saves run in
the background and are **not** waited for before the next prompt: a finished request's blocks
are freed when its saves are done (the engine's delayed free), and the next prompt's TTFT runs
alongside the previous prompt's puts. After the sequence the bench drains the engine and checks
that every full block of every prompt was stored in host (none dropped). Ratio: median TTFT
without the store / median with it (target >= 0.98); the totals of both sequences are printed as
a note. Saves go straight into host slots the store reserves (``prepare_store``), so a prompt
saved while the previous one is still being published needs no staging of its own.

Start (:func:`measure_startup`, run first in the process, before anything else has compiled
a kernel): an hbm pool and an ``Engine`` built with ``capture_graphs_at_start=True`` (timed:
``engine start``, which captures the step graphs and warms the eager path of the steps too
long for them -- ``StartupReport.warm_s``; the model is built before and not counted), then
one new prompt of
``startup_length`` tokens (``first request after start``, computed) and the same prompt again
(``first hbm hit after start``), against the steady medians of that engine afterwards (``engine
cold``, ``engine hbm hit``) -- target: the first hit <= 1.5 x a steady one. The other cases'
engines leave capture to their warm-up run (``capture_graphs_at_start=False``): they measure
steady state, and each new pool would capture every shape again.

Timed on the GPU for 4K, 16K and 32K tokens (disk at 4K and 16K; Redis at 4K), on the CPU for
256 and 1K tokens (all cases). Everything a length allocates is freed before the next one.
"""

from __future__ import annotations

import gc
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from bench.common import Measurement, measurement, median_time
from bench.redis_server import find_redis_server, redis_server
from connector.base import KVCacheSpec
from connector.inprocess import InProcessScheduler, InProcessWorker, PrefetchPolicy
from connector.transfer import make_transfer
from kvstore import Tier, build_tier
from kvstore.api import LocalStagingSlab
from kvstore.keys import Namespace
from kvstore.layout import KVLayout
from kvstore.metrics import Metrics
from kvstore.ops import copy_spans
from kvstore.pool import HBMTier
from kvstore.store import TieredStore
from runtime.config import ModelConfig
from runtime.engine import Engine
from runtime.model import LlamaForPagedLM
from runtime.request import RequestOutput
from runtime.sampling import SamplingParams

BENCH = "ttft"
BLOCK = 16
GREEDY = SamplingParams(max_tokens=1)  # temperature 0: greedy

# Targets (BENCHMARKS.md, "bench.ttft" rows).
TARGET_SPEEDUP_32K = 12.0  # host hit vs recompute, GPU, 32K tokens
TARGET_FLOOR = 1 / 1.25  # host hit <= 1.25 x (PCIe floor + suffix compute)
TARGET_OVERLAP = 1 / 1.1  # layer-wise host hit <= 1.1 x max(load, compute)
TARGET_NO_REUSE = 0.98  # <= 2 % overhead with the store attached and nothing found
TARGET_DAEMON = 0.9  # the daemon's host-hit speedup >= 0.9 x the in-process connector's
TARGET_FIRST_HIT = 1 / 1.5  # the first hbm hit after start <= 1.5 x a steady hbm hit


class BenchError(RuntimeError):
    """A run did not measure what it claims to (the prefix came from another tier, a load
    failed, a save went missing)."""


@dataclass(frozen=True)
class Plan:
    """What to run: prompt lengths, timed runs per case, no-reuse prompts per variant, the
    lengths that get the disk and Redis cases, and whether the PCIe floor is measured."""

    lengths: tuple[int, ...]
    runs: int
    no_reuse_prompts: int
    disk_lengths: frozenset[int]
    redis_lengths: frozenset[int]
    gpu: bool
    daemon_lengths: frozenset[int] = frozenset()
    startup_length: int = 256

    @classmethod
    def for_device(cls, gpu: bool) -> Plan:
        if gpu:
            return cls((4096, 16384, 32768), 3, 4, frozenset({4096, 16384}),
                       frozenset({4096}), True, frozenset({4096, 32768}), 1024)
        # CPU: each run takes milliseconds, so more of them make the medians robust on a
        # noisy 2-core machine at little cost (the engine part stays under ~15 s).
        return cls((256, 1024), 5, 8, frozenset({256, 1024}), frozenset({256, 1024}), False,
                   frozenset({256, 1024}))


@dataclass
class EngineResults:
    """Measurement lines, notes for the table's footer (and the record), headline lines."""

    lines: list[Measurement] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    headline: list[str] = field(default_factory=list)


# ===================================================================== helpers


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _free_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        empty_host = getattr(torch._C, "_host_emptyCache", None)  # pinned-memory cache
        if empty_host is not None:
            empty_host()


class _Prompts:
    """Random prompts; every call gives a new one (never repeated within a run)."""

    def __init__(self, vocab_size: int, seed: int = 2) -> None:
        self.vocab_size = vocab_size
        self.gen = torch.Generator().manual_seed(seed)

    def new(self, n: int) -> list[int]:
        return torch.randint(0, self.vocab_size, (n,), generator=self.gen).tolist()


def _sync_stream(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()


def _timed_generate(engine: Engine, prompt: list[int], device: torch.device
                    ) -> tuple[float, RequestOutput]:
    """Seconds until ``generate`` returned the first token, synchronised on the engine's
    stream before and after. Not on the whole device: saves the engine left running in the
    background (on its save stream) are not waited for, before or after, as a server does not
    wait for them before it answers the next prompt."""
    _sync_stream(device)
    t0 = time.perf_counter()
    (out,) = engine.generate([prompt], GREEDY)
    _sync_stream(device)
    return time.perf_counter() - t0, out


def _expect(out: RequestOutput, reused: dict[str, int], what: str) -> None:
    """Raise BenchError unless the request reused exactly ``reused`` tokens per tier, had no
    failed load, and computed the rest of its prompt."""
    m = out.metrics
    n = len(out.prompt_token_ids)
    if out.finish_reason == "error":
        raise BenchError(f"{what}: the request failed: {out.error}")
    if (m.num_tokens_reused != reused or m.num_tokens_load_failed
            or m.num_tokens_computed != n - sum(reused.values())):
        raise BenchError(
            f"{what}: expected reuse {reused}, got {m.num_tokens_reused} (computed "
            f"{m.num_tokens_computed} of {n}, load failed {m.num_tokens_load_failed}, "
            f"preemptions {m.num_preemptions})")


def _check_placement(store: TieredStore, keys: Sequence[bytes], want: dict[str, int],
                     what: str) -> None:
    """Raise BenchError unless each named tier holds exactly ``want[tier]`` of ``keys``."""
    have = {t.name: sum(t.contains(list(keys))) for t in store.tiers if t.name in want}
    if have != want:
        raise BenchError(f"{what}: the prefix's {len(keys)} pages are in {have}, want {want}")


def _evict(store: TieredStore, tier: str) -> None:
    """Evict every evictable page of ``tier`` (write-back copies it to the next tier down
    where that tier lacks it)."""
    store.evict(store.tier(tier).capacity_pages, tier=tier)


def _engine_kwargs(n: int) -> dict[str, Any]:
    # steady-state cases: capture in the warm-up run (see the module docstring)
    return {"max_num_batched_tokens": max(n, 512), "max_num_seqs": 8,
            "capture_graphs_at_start": False}


def _pool_blocks(n: int) -> int:
    return 2 * (n // BLOCK) + 64


def _bare_engine(model: LlamaForPagedLM, layout: KVLayout, ns: Namespace, n: int,
                 device: torch.device) -> Engine:
    pool = HBMTier("hbm", layout, _pool_blocks(n), Metrics(), device=device)
    return Engine(model, pool, ns, **_engine_kwargs(n))  # LocalOwner, no connector


def _host_tier(layout: KVLayout, n: int, metrics: Metrics) -> Tier:
    """A host tier (pinned when CUDA is present) sized for an ``n``-token prompt."""
    return build_tier({"kind": "host", "capacity": _pool_blocks(n) * layout.page_bytes},
                      layout, metrics)


def host_store(layout: KVLayout, n: int, device: torch.device
               ) -> tuple[HBMTier, LocalStagingSlab, TieredStore]:
    """An hbm pool and a host tier (pinned when CUDA is present), each sized for an ``n``-token
    prompt, in a write-back store: what the host-hit cases run over."""
    metrics = Metrics()
    pool = HBMTier("hbm", layout, _pool_blocks(n), metrics, device=device)
    store = TieredStore(layout, [pool, _host_tier(layout, n, metrics)], write_policy="write_back")
    return pool, store.staging_tier("host"), store


def _connected_engine(model: LlamaForPagedLM, pool: HBMTier, store: TieredStore, ns: Namespace,
                      n: int, *, layerwise: bool, prefetch_policy: PrefetchPolicy = "timeout"
                      ) -> tuple[Engine, InProcessWorker]:
    """An engine over ``pool`` with an in-process connector over ``store`` (host tier "host")."""
    worker = InProcessWorker(store, host_tier="host", prefetch_policy=prefetch_policy,
                             layerwise=layerwise)
    csched = InProcessScheduler(store, ns, num_blocks=pool.num_blocks, host_tier="host")
    engine = Engine(model, pool, ns, connector=(csched, worker), **_engine_kwargs(n))
    engine.store = store
    return engine, worker


def _timed_case(engine: Engine, prompt: Callable[[], list[int]], prepare: Callable[[], None],
                reused: dict[str, int], what: str, device: torch.device, runs: int,
                check: Callable[[], None] | None = None) -> float:
    """Median TTFT of ``runs`` runs after one warm-up run; ``prepare`` before each (untimed),
    ``check`` after each (untimed); every run's reuse is verified."""
    times = []
    for i in range(runs + 1):
        prepare()
        t, out = _timed_generate(engine, prompt(), device)
        _expect(out, reused, f"{what} (run {i})")
        if check is not None:
            check()
        if i:
            times.append(t)
    return statistics.median(times)


class _Progress:
    def __init__(self, total: int, enabled: bool) -> None:
        self.bar = tqdm(total=total, desc="bench.ttft engine", leave=False, disable=not enabled)

    def step(self, what: str) -> None:
        self.bar.set_postfix_str(what)

    def done(self) -> None:
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()


# ===================================================================== cases


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
    t = median_time(lambda: dst.copy_(src, non_blocking=True), device, max(runs, 5))
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
    pool = HBMTier("hbm", layout, _pool_blocks(n), metrics, device=device)
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


# ===================================================================== start


def measure_startup(model: LlamaForPagedLM, cfg: ModelConfig, name: str, device: torch.device,
                    plan: Plan) -> EngineResults:
    """The start of an engine over ``model`` and its first two requests against its steady
    state (see the module docstring). Run it before anything else in the process."""
    res = EngineResults()
    n = plan.startup_length
    reuse = (n - 1) // BLOCK * BLOCK
    layout = cfg.kv_layout(BLOCK)
    ns = Namespace(f"bench/ttft/{name}/{cfg.dtype}/startup", layout)
    prompts = _Prompts(cfg.vocab_size, seed=3)
    graphs = model.step_graphs
    _free_memory(device)
    t0 = time.perf_counter()
    pool = HBMTier("hbm", layout, _pool_blocks(n), Metrics(), device=device)
    engine = Engine(model, pool, ns, **{**_engine_kwargs(n), "capture_graphs_at_start": True})
    _sync(device)
    start_s = time.perf_counter() - t0
    try:
        late = len(graphs.late_shapes) if graphs is not None else 0
        p = prompts.new(n)
        first_cold, out = _timed_generate(engine, p, device)
        _expect(out, {"hbm": 0}, f"first request after start, {n} tokens")
        first_hit, out = _timed_generate(engine, p, device)
        _expect(out, {"hbm": reuse}, f"first hbm hit after start, {n} tokens")
        late = (len(graphs.late_shapes) if graphs is not None else 0) - late
        hit = _timed_case(engine, lambda: p, lambda: None, {"hbm": reuse},
                          f"steady hbm hit, {n} tokens", device, plan.runs)
        cold = _timed_case(engine, lambda: prompts.new(n), lambda: None, {"hbm": 0},
                           f"steady cold, {n} tokens", device, plan.runs)
        up = engine.startup
    finally:
        engine.close()
        del engine, pool
        _free_memory(device)
    case = f"{name}/{n}-tokens"
    res.lines = [
        measurement(BENCH, case, "engine start (graph capture)", "time", start_s, "s"),
        measurement(BENCH, case, "first request after start", "ttft", first_cold * 1e3, "ms",
                    baseline="engine cold (steady)", baseline_value=cold * 1e3,
                    higher_is_better=False),
        measurement(BENCH, case, "first hbm hit after start", "ttft", first_hit * 1e3, "ms",
                    baseline="engine hbm hit (steady, same prompt)", baseline_value=hit * 1e3,
                    higher_is_better=False),
    ]
    mode = graphs.mode if graphs is not None else "off"
    res.notes.append(
        f"engine start at {n} tokens (step graphs {mode}): {start_s:.2f} s, of which "
        f"{up.capture_s:.2f} s preparing {up.num_shapes} step shapes ({up.num_captured} "
        f"captured as CUDA graphs) and {up.warm_s:.2f} s warming {up.num_warm_steps} long "
        f"steps eagerly (steps too long for the graphs: their first launches, JIT compiles "
        f"included, paid at start, not by the first request); {late} shapes first met by the "
        f"first two requests")
    ratio = first_hit / hit
    res.headline.append(
        f"first hbm hit after start at {n} tokens: {ratio:.2f}x a steady hit (target <= "
        f"{1 / TARGET_FIRST_HIT:g}x: {_verdict(hit / first_hit >= TARGET_FIRST_HIT)}); engine "
        f"start {start_s:.1f} s with {up.num_captured} graph captures")
    return res


# ===================================================================== driver


def measure(model: LlamaForPagedLM, cfg: ModelConfig, name: str, device: torch.device,
            plan: Plan, *, model_cold_ms: dict[int, float] | None = None,
            disk_dir: str | None = None, progress: bool = True) -> EngineResults:
    """Run every engine-level case of ``plan`` with ``model`` (config ``cfg``, preset ``name``)
    on ``device``. ``model_cold_ms``: the model-level cold prefill per length, the baseline of
    the ``engine cold`` lines where present. ``disk_dir``: parent of the disk tier's temporary
    directory (default: the system's temporary directory)."""
    res = EngineResults()
    layout = cfg.kv_layout(BLOCK)
    ns = Namespace(f"bench/ttft/{name}/{cfg.dtype}", layout)
    prompts = _Prompts(cfg.vocab_size)
    redis_exe = find_redis_server()
    if redis_exe is None and plan.redis_lengths:
        res.notes.append("redis-server not found (PATH or .redis/redis-server): redis hit skipped")
    steps = sum(6 + (n in plan.disk_lengths) + (n in plan.redis_lengths and redis_exe is not None)
                + (n in plan.daemon_lengths) for n in plan.lengths)
    bar = _Progress(steps, progress)
    results: dict[int, dict[str, float]] = {}
    try:
        for n in plan.lengths:
            r: dict[str, float] = {}
            bare = _bare_engine(model, layout, ns, n, device)
            try:
                r.update(_cold_and_hbm(bare, prompts, n, device, plan.runs, bar))
                r.update(_host_cases(model, layout, ns, bare, prompts, n, device, plan, bar))
            finally:
                bare.close()
                del bare
                _free_memory(device)
            if n in plan.disk_lengths:
                bar.step(f"{n}: disk hit")
                tmp = tempfile.mkdtemp(prefix="kvbench-ttft-disk-", dir=disk_dir)
                try:
                    def disk(m: Metrics, cap: int, tmp: str = tmp) -> Tier:
                        return build_tier({"kind": "disk", "capacity": cap * layout.page_bytes,
                                           "path": Path(tmp) / "tier"}, layout, m)

                    r["disk"] = _lower_tier_case("disk", model, layout, ns, prompts, n, device,
                                                 plan.runs, disk, res.notes)
                finally:
                    shutil.rmtree(tmp, ignore_errors=True)
                    _free_memory(device)
                bar.done()
            if n in plan.redis_lengths and redis_exe is not None:
                bar.step(f"{n}: redis hit")
                try:
                    with redis_server(redis_exe) as url:
                        def red(m: Metrics, cap: int, url: str = url) -> Tier:
                            return build_tier(
                                {"kind": "redis", "capacity": cap * layout.page_bytes, "url": url,
                                 "timeout_s": 60.0,
                                 "key_prefix": f"kvbench-ttft-{uuid.uuid4().hex[:8]}"},
                                layout, m)

                        r["redis"] = _lower_tier_case("redis", model, layout, ns, prompts, n,
                                                      device, plan.runs, red, res.notes)
                finally:
                    _free_memory(device)
                bar.done()
            if n in plan.daemon_lengths:
                bar.step(f"{n}: daemon host hit")
                try:
                    got = _daemon_case(model, layout, ns, prompts, n, device, plan.runs,
                                       res.notes)
                finally:
                    _free_memory(device)
                if got is not None:
                    r["daemon"] = got
                bar.done()
            results[n] = r
    finally:
        bar.close()
    res.lines = _lines(results, name, plan, model_cold_ms or {})
    res.notes += _no_reuse_notes(results, plan.no_reuse_prompts)
    res.headline = _headline(results, plan)
    return res


def _lines(results: dict[int, dict[str, float]], name: str, plan: Plan,
           model_cold_ms: dict[int, float]) -> list[Measurement]:
    lines: list[Measurement] = []
    for n, r in results.items():
        case = f"{name}/{n}-tokens"
        ms = {k: v * 1e3 for k, v in r.items() if k != "floor_bw"}

        def ttft(variant: str, value: float, baseline: str | None = None,
                 base: float | None = None, metric: str = "ttft", case: str = case) -> None:
            lines.append(measurement(BENCH, case, variant, metric, value, "ms", baseline=baseline,
                                     baseline_value=base, higher_is_better=False))

        cold = ms["cold"]
        bound = max(ms["load"], ms["hbm"])
        ttft("engine cold", cold, "cold prefill (model forward)", model_cold_ms.get(n))
        ttft("engine hbm hit", ms["hbm"], "engine cold (recompute)", cold)
        ttft("host hit", ms["host"], "engine cold (recompute)", cold)
        if "floor" in ms:
            ttft("host hit (vs PCIe floor)", ms["host"], "PCIe floor + engine hbm hit",
                 ms["floor"] + ms["hbm"])
        ttft("host hit, layer-wise", ms["host"], "max(load only, engine hbm hit)", bound)
        ttft("host hit, load-then-compute", ms["host_ltc"], "max(load only, engine hbm hit)",
             bound)
        ttft("host hit, layer-wise (vs its copies)", ms["host"],
             "max(load only layers 1.., engine hbm hit)", max(ms["load_hit"], ms["hbm"]))
        if "floor" in ms:
            ttft("load only", ms["load"], "PCIe floor", ms["floor"], metric="time")
            ttft("PCIe floor", ms["floor"], metric="time")
            lines.append(measurement(BENCH, case, "PCIe H2D pinned copy", "bandwidth",
                                     r["floor_bw"] / 1e9, "GB/s"))
        else:
            ttft("load only", ms["load"], metric="time")
        ttft("load only, layers 1..", ms["load_hit"], "load only", ms["load"], metric="time")
        for kind in ("disk", "redis"):
            if kind in ms:
                ttft(f"{kind} hit", ms[kind], "engine cold (recompute)", cold)
        if "daemon" in ms:  # ratio: the daemon's speedup over recompute / the in-process one's
            ttft("daemon host hit", ms["daemon"], "host hit (in-process connector)", ms["host"])
        ttft("no reuse, with store", ms["noreuse_with"], "no store (same runtime)",
             ms["noreuse_without"])
        ttft("no reuse, without store", ms["noreuse_without"])
    return lines


def _no_reuse_notes(results: dict[int, dict[str, float]], count: int) -> list[str]:
    return [
        f"no reuse at {n} tokens: total {r['noreuse_with_total'] * 1e3:.1f} ms with the store, "
        f"{r['noreuse_without_total'] * 1e3:.1f} ms without ({count} unique prompts each, "
        "interleaved; saves not waited for between prompts)"
        for n, r in results.items()
    ]


def _verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def _headline(results: dict[int, dict[str, float]], plan: Plan) -> list[str]:
    if not results:
        return []
    out: list[str] = []
    nmax = max(results)
    r = results[nmax]
    speedup = r["cold"] / r["host"]
    if plan.gpu and nmax == 32768:
        out.append(f"host hit at {nmax} tokens: {speedup:.1f}x faster than recompute "
                   f"(target >= {TARGET_SPEEDUP_32K:g}: {_verdict(speedup >= TARGET_SPEEDUP_32K)})")
    else:
        out.append(f"host hit at {nmax} tokens: {speedup:.1f}x faster than recompute "
                   f"(the >= {TARGET_SPEEDUP_32K:g}x target is for the GPU at 32K tokens)")
    if "floor" in r:
        fr = (r["floor"] + r["hbm"]) / r["host"]
        out.append(f"host hit at {nmax} tokens vs PCIe floor + compute: ratio {fr:.3f} "
                   f"(target >= {TARGET_FLOOR:.2f}: {_verdict(fr >= TARGET_FLOOR)})")
    lw = {n: max(x["load"], x["hbm"]) / x["host"] for n, x in results.items()}
    ltc = {n: max(x["load"], x["hbm"]) / x["host_ltc"] for n, x in results.items()}
    worst = min(lw, key=lw.__getitem__)
    own = {n: max(x["load_hit"], x["hbm"]) / x["host"] for n, x in results.items()}
    out.append(f"overlap: layer-wise host hit vs max(load, compute), worst {lw[worst]:.3f} at "
               f"{worst} tokens (target >= {TARGET_OVERLAP:.3f}: "
               f"{_verdict(lw[worst] >= TARGET_OVERLAP)}); load-then-compute "
               f"{ltc[worst]:.3f} there; against the copies the hit makes (layers 1.., its "
               f"engine writes layer 0 from the tokens) {own[worst]:.3f}")
    dm = {n: x["host"] / x["daemon"] for n, x in results.items() if "daemon" in x}
    if dm:
        n = max(dm)
        out.append(f"daemon host hit at {n} tokens: {dm[n]:.3f} x the in-process connector's "
                   f"speedup (target >= {TARGET_DAEMON}: {_verdict(dm[n] >= TARGET_DAEMON)})")
    nr = {n: x["noreuse_without"] / x["noreuse_with"] for n, x in results.items()}
    worst = min(nr, key=nr.__getitem__)
    out.append(f"no reuse: without store / with store, worst {nr[worst]:.3f} at {worst} tokens "
               f"(target >= {TARGET_NO_REUSE}: {_verdict(nr[worst] >= TARGET_NO_REUSE)})")
    return out


__all__ = ["BenchError", "EngineResults", "Plan", "measure", "measure_startup"]
