"""Where a prompt's TTFT goes with the store attached: the engine-level cases of ``bench.ttft``
taken apart, for finding the no-reuse overhead and the layer-wise overlap's gap.

    python -m bench.ttft_profile [--lengths 4096,16384] [--runs 7] [--trace-dir DIR]

Per length, interleaved (median of ``--runs``):

* ``bare`` — the engine with no store (the no-reuse baseline);
* ``no reuse`` — new prompts through the store's engine, the previous prompt's saves still in
  flight (as ``bench.ttft`` measures it);
* ``no reuse, drained`` — the same after ``engine.drain()`` and a device sync: what is left is
  on the prompt's own path (lookup, save reservations, hooks);
* ``no reuse, host empty`` — drained, and the host tier emptied first: the reservations need no
  eviction;
* ``host hit`` — layer-wise, the prefix only in host; ``hbm hit`` — the bare engine's.

With ``--trace-dir``, one run of each case is also recorded with ``torch.profiler`` (CPU with
Python frames, and CUDA) as ``<case>-<n>.json.gz`` (open in Perfetto), and a summary of each
trace is printed: wall time, the time until the first kernel of the forward, the GPU's busy
time, and the Python functions that took most of the engine thread.

Not a recorded bench: it prints, for whoever tunes the hit path."""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import torch

from bench import ttft_engine as te
from bench.common import bench_model_config
from bench.ttft import hf_and_ours
from kvstore.keys import Namespace


def _trace_summary(path: Path) -> str:
    """Wall, first-kernel offset, GPU busy time and the top Python frames of one trace."""
    with gzip.open(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    spans = [e for e in events if e.get("ph") == "X" and "dur" in e]
    if not spans:
        return f"{path.name}: empty trace"
    t0 = min(e["ts"] for e in spans)
    t1 = max(e["ts"] + e["dur"] for e in spans)
    kernels = sorted((e for e in spans if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")),
                     key=lambda e: e["ts"])
    busy, end = 0.0, 0.0
    for k in kernels:  # union of kernel intervals
        s, t = k["ts"], k["ts"] + k["dur"]
        if t > end:
            busy += t - max(s, end)
            end = t
    first = (kernels[0]["ts"] - t0) / 1e3 if kernels else float("nan")
    # the engine thread: the one that ran generate(); its own time per frame (self) and the
    # store's and connector's frames (inclusive) say where its CPU time went
    pyf = [e for e in spans if e.get("cat") == "python_function"]
    main_tid = next((e["tid"] for e in pyf if "engine.py" in e["name"]
                     and e["name"].endswith(": generate")), None)
    mine = sorted((e for e in pyf if e["tid"] == main_tid), key=lambda e: (e["ts"], -e["dur"]))
    own: dict[str, float] = defaultdict(float)
    incl: dict[str, float] = defaultdict(float)
    stack: list[dict] = []
    for e in mine:
        while stack and stack[-1]["ts"] + stack[-1]["dur"] <= e["ts"]:
            stack.pop()
        own[e["name"]] += e["dur"]
        if stack:
            own[stack[-1]["name"]] -= e["dur"]
        if any(m in e["name"] for m in ("kvstore/", "connector/", "scheduler.py", "batch.py")):
            incl[e["name"]] += e["dur"]
        stack.append(e)
    lines = [f"{path.name}: wall {(t1 - t0) / 1e3:.2f} ms, first kernel at {first:.2f} ms, "
             f"GPU busy {busy / 1e3:.2f} ms ({len(kernels)} kernels/copies)",
             "  engine thread, self time:"]
    lines += [f"    {us / 1e3:8.2f} ms  {name}"
              for name, us in sorted(own.items(), key=lambda kv: -kv[1])[:15]]
    lines.append("  engine thread, store/connector/scheduler frames (inclusive):")
    lines += [f"    {us / 1e3:8.2f} ms  {name}"
              for name, us in sorted(incl.items(), key=lambda kv: -kv[1])[:20]]
    return "\n".join(lines)


def _profiled(fn: Callable[[], object], path: Path) -> None:
    acts = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=acts, with_stack=True) as prof:
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    raw = path.with_suffix("")  # .json
    prof.export_chrome_trace(str(raw))
    with open(raw, "rb") as src, gzip.open(path, "wb", compresslevel=6) as dst:
        dst.write(src.read())
    os.unlink(raw)
    print(_trace_summary(path), flush=True)


def run(n: int, model: torch.nn.Module, cfg, device: torch.device, runs: int,
        trace_dir: Path | None) -> None:
    layout = cfg.kv_layout(te.BLOCK)
    ns = Namespace(f"bench/ttft/profile/{cfg.dtype}", layout)
    prompts = te._Prompts(cfg.vocab_size)
    nblk = (n - 1) // te.BLOCK
    bare = te._bare_engine(model, layout, ns, n, device)
    pool, host, store = te.host_store(layout, n, device)
    lw, _ = te._connected_engine(model, pool, store, ns, n, layerwise=True)
    hit_prompt = prompts.new(n)
    keys = ns.chain(hit_prompt).keys[:nblk]
    hbm_prompt = prompts.new(n)

    def drained() -> None:
        lw.drain(timeout_s=120.0)
        te._sync(device)

    def host_empty() -> None:
        drained()
        te._evict(store, "hbm")
        te._evict(store, "host")

    def only_in_host() -> None:
        drained()
        if sum(host.contains(list(keys))) < nblk:  # "host empty" dropped it: save it again
            te._timed_generate(lw, hit_prompt, device)
            drained()
        te._evict(store, "hbm")
        te._check_placement(store, keys, {"hbm": 0, "host": nblk}, "host hit")

    cases: dict[str, tuple[Callable[[], None], Callable[[], object]]] = {
        "bare": (lambda: None, lambda: te._timed_generate(bare, prompts.new(n), device)),
        "no reuse": (lambda: None, lambda: te._timed_generate(lw, prompts.new(n), device)),
        "no reuse, drained": (drained, lambda: te._timed_generate(lw, prompts.new(n), device)),
        "no reuse, host empty": (host_empty,
                                 lambda: te._timed_generate(lw, prompts.new(n), device)),
        "host hit": (only_in_host, lambda: te._timed_generate(lw, hit_prompt, device)),
        # the bare cases' prompts evict it from the bare pool: run it once more first
        "hbm hit": (lambda: te._timed_generate(bare, hbm_prompt, device) and None,
                    lambda: te._timed_generate(bare, hbm_prompt, device)),
    }
    try:
        for fill in (hit_prompt, hbm_prompt):  # warm-up, and the prefixes the hits need
            te._timed_generate(lw if fill is hit_prompt else bare, fill, device)
        te._timed_generate(bare, hit_prompt, device)  # bare engine warm too
        times: dict[str, list[float]] = {k: [] for k in cases}
        mixed = [k for k in cases if not k.endswith("hit")]  # interleaved, as bench.ttft does
        for i in range(runs):
            for name in (mixed if i % 2 == 0 else mixed[::-1]):
                prepare, go = cases[name]
                prepare()
                t, _out = go()  # type: ignore[misc]
                times[name].append(t)
        for name in ("host hit", "hbm hit"):  # each in a row, after one untimed run
            prepare, go = cases[name]
            for i in range(runs + 1):
                prepare()
                t, _out = go()  # type: ignore[misc]
                if i:
                    times[name].append(t)
        base = statistics.median(times["bare"])
        print(f"\n== {n} tokens, median of {runs}", flush=True)
        for name, ts in times.items():
            m = statistics.median(ts)
            print(f"  {name:24s} {m * 1e3:9.2f} ms  (bare/this {base / m:.3f}; "
                  f"min {min(ts) * 1e3:.2f}, max {max(ts) * 1e3:.2f})", flush=True)
        if trace_dir is not None:
            trace_dir.mkdir(parents=True, exist_ok=True)
            for name, (prepare, go) in cases.items():
                if name == "no reuse":  # the previous prompt's saves in flight, as timed
                    te._timed_generate(lw, prompts.new(n), device)
                prepare()
                slug = name.replace(", ", "-").replace(" ", "_")
                _profiled(go, trace_dir / f"{slug}-{n}.json.gz")
    finally:
        lw.close()
        store.close()
        bare.close()
        te._free_memory(device)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.ttft_profile")
    p.add_argument("--lengths", default=None, help="comma-separated prompt lengths")
    p.add_argument("--runs", type=int, default=7)
    p.add_argument("--trace-dir", type=Path, default=None)
    args = p.parse_args(argv)
    gpu = torch.cuda.is_available()
    device = torch.device("cuda" if gpu else "cpu")
    lengths = ([int(x) for x in args.lengths.split(",")] if args.lengths
               else ([4096, 16384] if gpu else [256, 1024]))
    cfg = bench_model_config("llama3-8b" if gpu else "small", gpu=gpu,
                             positions=max(lengths) + 16)
    hf, model = hf_and_ours(cfg, device, "sdpa")
    del hf
    te._free_memory(device)
    t0 = time.perf_counter()
    for n in lengths:
        run(n, model, cfg, device, args.runs, args.trace_dir)
    print(f"\nbench.ttft_profile took {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
