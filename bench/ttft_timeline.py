"""Where a layer-wise host hit's time goes, phase by phase: when each step of the engine thread
starts and ends after ``generate`` is called, and (on a GPU) when the load's copies and the
forward end on the device, against ``load only`` and the engine's hbm hit in the same run.

    python -m bench.ttft_timeline [--lengths 4096,32768] [--runs 15]

The engine's, scheduler's, connector's and store's methods on the hit path are wrapped with
``perf_counter`` stamps (a microsecond or two each): unlike a ``torch.profiler`` trace with
Python frames, which slowed the 4K hit's forward launch 50-fold, the timeline stays the hit's
own. Medians over ``--runs`` hits (prefix only in host, as ``bench.ttft`` measures them).
The GPU marks are CUDA events recorded on the load stream after layers 0, 1, L/2, L-2 and L-1,
and on the engine's stream when the forward returns.

What it showed on the H200 (4K, Llama-3-8B, 21 hits a run). At 84e0331: ``generate``
returned at 12.32 ms against a load only of 10.39 (ratio 0.843); the first copy started 1.34 ms
after the call, the token was on the host 0.59 ms after the last copy landed and ``generate``
returned 0.32 ms after that. At 3127ac9 (two runs): 11.37 and 11.74 ms against 10.07 and 10.26
(0.886, 0.874; the target of 1.1x needs 0.909). The first copy starts at 0.69-1.01 ms:
``add_request`` 0.08-0.11, ``schedule`` 0.33-0.49 (hashing ~0.06, the leased lookup 0.08-0.12),
pinning 0.07-0.11 and ``load_context`` 0.13-0.18 (which ``load only`` pays too). The copies run
10.05 ms (the PCIe floor); the forward ends 0.44-0.45 ms after the last one (the last layer and
the 1 GB ``lm_head``: reads of the weights), the token is on the host 0.09-0.14 ms later and
``generate`` returns 0.08-0.10 ms after that (it was 0.32: a request that the token ends gives
its blocks back while the GPU runs, ``Scheduler.release_ending``). Earlier, the scatter kernel's
loads ran 0.7 ms longer beside the forward than alone (now DMA: ``kvstore/transfer_cuda.py``).
At 4135920: 11.62 ms against 10.24 (0.881) at 4K, and 83.79 against 78.74 (0.940) at 32K.

At 933de1b (2026-12-03, another H200 host): ``bench.ttft`` gave 11.96 ms against 10.47 (0.876)
at 4K, 0.954 at 16K, 0.964 at 32K; this timeline 11.79 against 10.33. A CUDA-only
``torch.profiler`` trace of one 4K hit put the device's tail after the last copy at 0.43 ms, all
reads of weights at the bandwidth floor: layer 31 0.137 (attention 0.021, o_proj 0.013, gate/up
0.060, down 0.030), the logits row's gather 0.004, ``lm_head`` 0.246 (1 GB, 4.3 TB/s), the float
cast 0.004 and the argmax 0.028. The host has the token 13-22 us after the argmax ends (the
event wait spins; polling ``query`` gains nothing); from there to ``generate``'s return is
160-275 us of Python with no single culprit: a ``sys.setprofile`` trace of it shows some 40
calls of 1-12 us each on that host (waiting on the finished load's event, 25; ``update`` with
``_finish``, 45; ``to_output``, 40; the step's frame torn down, 12). Before the first copy, 0.67
ms is the engine's own (0.86 ms, less ``load_context``, which ``load only`` pays too). So the 4K
target of 1.1x (1.02-1.05 ms over ``load only``) needs 0.3-0.45 ms less Python on the hit path,
about a third of it: spread over some thirty calls of 5-100 us each, a native admission path
(hash chain, host index lookup, lease and pin in one call) rather than more micro-cuts.

At eff89a7 the loads copy layers 1.. only and the engine writes layer 0's K/V from the tokens
beside them (``Engine(first_layer_from_tokens=True)``): ``bench.ttft`` gave 11.10 ms against a
load only of 10.58 (0.953) at 4K, 0.977 at 16K, 0.992 at 32K; four runs of that round on the
day's hosts ranged 0.876-0.953 at 4K, so the Python above still decides the 4K margin.

Not a recorded bench: it prints, for whoever tunes the hit path (``bench.ttft_profile`` takes
the no-reuse and hit cases apart by totals)."""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch

from bench import ttft_engine as te
from bench.common import bench_model_config
from kvstore.keys import Namespace
from runtime import LlamaForPagedLM


class _Stamps:
    """(label, start, end) in seconds after ``t0`` for every call of the wrapped methods."""

    def __init__(self) -> None:
        self.t0 = 0.0
        self.marks: list[tuple[str, float, float]] = []

    def wrap(self, obj: Any, attr: str, label: str) -> None:
        fn: Callable[..., Any] = getattr(obj, attr)

        @functools.wraps(fn)
        def stamped(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.marks.append((label, start - self.t0, time.perf_counter() - self.t0))

        setattr(obj, attr, stamped)


def _gpu_marks(engine: Any, num_layers: int, marks: list[tuple[str, torch.cuda.Event]]) -> None:
    """Record timing events after some layers' copies and after the forward."""
    xfer = engine.connector.worker._xfer
    load_layer, load_context, forward = xfer.load_layer, xfer.load_context, engine._forward
    watched = {0, 1, num_layers // 2, num_layers - 2, num_layers - 1}

    def event(what: str, stream: Any = None) -> None:
        ev = torch.cuda.Event(enable_timing=True)
        ev.record(stream)
        marks.append((what, ev))

    def on_load_context(gate: Any, blocks: Any, slots: Any) -> Any:
        ctx = load_context(gate, blocks, slots)
        event("copies start", xfer._load_stream)
        return ctx

    def on_load_layer(ctx: Any, layer: int) -> None:
        load_layer(ctx, layer)
        if layer in watched:
            event(f"copy of layer {layer} ends", xfer._load_stream)

    def on_forward(chunks: Any, hooks: Any) -> Any:
        out = forward(chunks, hooks)
        event("forward ends")
        return out

    xfer.load_context, xfer.load_layer, engine._forward = on_load_context, on_load_layer, on_forward


def run(n: int, model: LlamaForPagedLM, device: torch.device, runs: int) -> None:
    cfg = model.config
    layout = cfg.kv_layout(te.BLOCK)
    ns = Namespace("bench/ttft/timeline", layout)
    prompts = te._Prompts(cfg.vocab_size)
    nblk = (n - 1) // te.BLOCK
    bare = te._bare_engine(model, layout, ns, n, device)
    pool, _, store = te.host_store(layout, n, device)
    engine, worker = te._connected_engine(model, pool, store, ns, n, layerwise=True)
    try:
        prompt = prompts.new(n)
        keys = ns.chain(prompt).keys[:nblk]
        te._timed_generate(engine, prompt, device)
        engine.drain()

        def only_in_host() -> None:
            engine.drain()
            te._evict(store, "hbm")
            te._sync(device)

        stamps = _Stamps()
        assert engine.connector is not None
        sched, conn = engine.scheduler, engine.connector
        for obj, attr, label in (
                (engine, "add_request", "add_request"), (sched, "schedule", "schedule"),
                (conn.scheduler, "get_num_new_matched_tokens", "  connector match"),
                (store, "lookup", "    store.lookup"),
                (conn.scheduler, "update_state_after_alloc", "  update_state_after_alloc"),
                (conn.scheduler, "build_connector_meta", "build_connector_meta"),
                (worker, "bind_connector_metadata", "bind_connector_metadata"),
                (worker, "start_load_kv", "start_load_kv"),
                (store, "prepare_load", "  store.prepare_load"),
                (engine, "_forward", "forward (queued)"),
                (sched, "prepare_commits", "prepare_commits"), (engine, "_commit", "commit"),
                (engine, "_sample", "sample"), (engine, "_wait_loads", "wait for load threads"),
                (store, "complete_load", "(load thread) store.complete_load"),
                (sched, "update", "scheduler.update"), (engine, "_reap", "reap"),
                (sched, "take_finished", "take_finished"), (engine, "step", "step"),
                (sched, "_ensure_keys", "  hash block keys"),
                (pool, "acquire_prefix", "  hbm acquire_prefix"),
                (pool, "allocate", "  hbm allocate"),
                (store.tier(worker._host_name), "count_leading", "  host count_leading"),
                (worker._xfer, "load_context", "  load_context"),
                (worker._xfer, "finish_load", "(load thread) finish_load"),
                (worker, "settled_load_errors", "settled_load_errors"),
                (worker, "clear_connector_metadata", "clear_connector_metadata"),
                (engine._readout, "argmax", "  readout.argmax"),
                (sched, "_finish", "  finish"), (pool, "release", "  hbm release")):
            stamps.wrap(obj, attr, label)
        gpu_events: list[tuple[str, torch.cuda.Event]] = []
        if device.type == "cuda":
            _gpu_marks(engine, layout.num_layers, gpu_events)
        spans: dict[str, list[tuple[float, float]]] = defaultdict(list)
        gpu_at: dict[str, list[float]] = defaultdict(list)
        returned: list[float] = []
        for i in range(runs + 1):  # the first is a warm-up
            only_in_host()
            stamps.marks.clear()
            gpu_events.clear()
            start = torch.cuda.Event(enable_timing=True) if device.type == "cuda" else None
            if start is not None:
                start.record()
            stamps.t0 = time.perf_counter()
            (out,) = engine.generate([prompt], te.GREEDY)
            back = time.perf_counter() - stamps.t0
            te._expect(out, {"hbm": 0, "host": nblk * te.BLOCK}, f"host hit, {n} tokens")
            if not i:
                continue
            returned.append(back)
            for label, s, e in stamps.marks:
                spans[label].append((s, e))
            if start is not None:
                torch.cuda.synchronize()
                for what, ev in gpu_events:
                    gpu_at[what].append(start.elapsed_time(ev) / 1e3)
        only_in_host()
        load = te._load_only(pool, store, ns.id, keys, device, runs)
        hbm_prompt = prompts.new(n)
        te._timed_generate(bare, hbm_prompt, device)
        hbm = statistics.median(te._timed_generate(bare, hbm_prompt, device)[0]
                                for _ in range(runs))
    finally:
        engine.close()
        store.close()
        bare.close()
        te._free_memory(device)
    hit = statistics.median(returned)
    ms = 1e3
    print(f"\n== {n} tokens ({nblk} blocks from host), medians of {runs} hits, {device.type}")
    print(f"  generate returned at {hit * ms:.3f} ms; load only {load * ms:.3f} ms; engine hbm hit "
          f"{hbm * ms:.3f} ms; max(load, hbm) / hit = {max(load, hbm) / hit:.3f}")
    print(f"  {'engine thread':36s} {'start':>8s} {'end':>8s} {'took':>7s}  (ms after generate)")
    for label, v in sorted(spans.items(), key=lambda kv: statistics.median(s for s, _ in kv[1])):
        s = statistics.median(a for a, _ in v)
        e = statistics.median(b for _, b in v)
        took = statistics.median(b - a for a, b in v)
        print(f"  {label:36s} {s * ms:8.3f} {e * ms:8.3f} {took * ms:7.3f}"
              + (f"  x{len(v) // runs}" if len(v) > runs else ""))
    for what, at in gpu_at.items():
        print(f"  GPU: {what:31s} {statistics.median(at) * ms:8.3f}")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.ttft_timeline")
    p.add_argument("--lengths", default=None, help="comma-separated prompt lengths")
    p.add_argument("--runs", type=int, default=15)
    args = p.parse_args(argv)
    gpu = torch.cuda.is_available()
    device = torch.device("cuda" if gpu else "cpu")
    lengths = ([int(x) for x in args.lengths.split(",")] if args.lengths
               else ([4096, 32768] if gpu else [1024, 4096]))
    cfg = bench_model_config("llama3-8b" if gpu else "tiny", gpu=gpu, positions=max(lengths) + 16)
    model = LlamaForPagedLM.from_random(cfg, 0, device=device)
    for n in lengths:
        run(n, model, device, args.runs)


if __name__ == "__main__":
    main()
