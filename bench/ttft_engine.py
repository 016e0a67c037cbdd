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
  ``load only``: the connector's own transfer (:func:`kvstore.transfer.make_transfer` over the
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

import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import torch

from bench.common import Measurement, measurement
from bench.redis_server import find_redis_server, redis_server
from bench.ttft_engine_cases import _cold_and_hbm, _daemon_case, _host_cases, _lower_tier_case
from bench.ttft_engine_report import (
    BENCH,
    TARGET_FIRST_HIT,
    _headline,
    _lines,
    _no_reuse_notes,
    _verdict,
)
from bench.ttft_engine_setup import (
    BLOCK,
    BenchError,
    Plan,
    _bare_engine,
    _engine_kwargs,
    _expect,
    _free_memory,
    _pool_blocks,
    _Progress,
    _Prompts,
    _sync,
    _timed_case,
    _timed_generate,
)
# not used here: bench.ttft_timeline and bench.ttft_profile reach them as ttft_engine.<name>
from bench.ttft_engine_cases import _load_only  # noqa: F401
from bench.ttft_engine_setup import GREEDY, _check_placement, _connected_engine  # noqa: F401
from bench.ttft_engine_setup import _evict, host_store  # noqa: F401
from kvstore import Tier, build_tier
from kvstore.keys import Namespace
from kvstore.metrics import Metrics
from kvstore.pool import HBMTier
from runtime.config import ModelConfig
from runtime.engine import Engine
from runtime.model import LlamaForPagedLM


@dataclass
class EngineResults:
    """Measurement lines, notes for the table's footer (and the record), headline lines."""

    lines: list[Measurement] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    headline: list[str] = field(default_factory=list)


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
    pool = HBMTier.build("hbm", layout, _pool_blocks(n), Metrics(), device=device)
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


__all__ = ["BenchError", "EngineResults", "Plan", "measure", "measure_startup"]
