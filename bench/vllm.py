"""vLLM time to first token with kvstore's connector, on the CPU with a tiny random-weight Llama,
against vLLM without a connector and vLLM's own ``ExampleConnector`` -- all in one run.

    python -m bench.vllm [--quick] [--json] [--record]

One ``vllm.LLM`` (CPU backend, in this process, eager, block size 32) per variant, over the same
checkpoint. TTFT is the wall time of ``LLM.generate([prompt], max_tokens=1)``, the best of the
runs after one warm-up (the 2-core machines are shared: the minimum is the stable statistic); vLLM's own prefix cache is reset before every run, so a prefix can
only come from the connector (and every run checks ``num_cached_tokens`` says it did).

Cases (a prompt of ``N`` tokens: a shared prefix plus a short suffix that stays computed):

* ``recompute``      -- vLLM without a connector, a new prompt every run: the baseline;
* ``vLLM prefix-cache hit`` -- vLLM without a connector, the same prompt again, its prefix
                        cache kept: the floor of any hit (only the suffix computes, nothing
                        is copied);
* ``no reuse``       -- our connector, a new prompt every run (every block saved, nothing to
                        load): its overhead against ``recompute`` (target <= 3 %);
* ``host hit``       -- our connector, the same prompt again, its blocks in our host tier;
* ``disk hit``       -- the same with host emptied before each run (loaded from disk);
* ``daemon no reuse`` / ``daemon host hit`` -- our connector over a ``kvstore serve``
                        sidecar (``kv_connector_extra_config.daemon``; pages through its
                        shared-memory host slab), new prompts / the same prompt again;
* ``ExampleConnector hit`` -- vLLM's ExampleConnector (one safetensors file per layer and
                        prompt), the same prompt again: the peer. Target: host hit >= 3x its
                        speed;
* ``default layout: ...`` -- vLLM's default process layout (EngineCore and the worker in
                        processes of their own): recompute, vLLM's prefix-cache hit, and over the
                        daemon no reuse and a host hit. Run first, from a fresh process
                        (:mod:`bench.vllm_split`). Targets: host hit <= 1.3x the prefix-cache
                        hit, >= 20x faster than recompute; no reuse <= 3 % over recompute.
                        On the 2-core machine vLLM without a connector recomputes about 2x
                        slower in this layout than in one process (its model forward: ~630 ms
                        against ~350-420 ms with our connector, timed around vLLM's model
                        runner): the no-reuse row there compares against that, as the target
                        asks; the one-process no-reuse row is the tighter check.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # stdout is for --json lines

from bench.common import (  # noqa: E402
    Measurement,
    add_standard_args,
    command_line,
    emit_json,
    measurement,
    print_table,
    record,
)
from bench.vllm_engines import (  # noqa: E402
    BLOCK_SIZE,
    close_llm,
    daemon_ttfts,
    ttft_s,
    engine_id,
    example_transfer_config,
    generate,
    kvstore_transfer_config,
    make_llm,
    write_tiny_llama,
)

BENCH = "vllm"


def _prompt(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(3, 500) for _ in range(n)]


def run(quick: bool) -> list[Measurement]:
    n_tokens = 1024 if quick else 4096
    runs = 5 if quick else 15
    tmp = Path(tempfile.mkdtemp(prefix="kvstore-bench-vllm-"))
    num_layers, hidden = 4, 256  # 4 attention heads of 64, 2 KV heads (write_tiny_llama)
    model = write_tiny_llama(tmp / "model", num_layers=num_layers, hidden=hidden)
    rng = random.Random(0)
    fresh = {i: _prompt(rng, n_tokens) for i in range(6 * (runs + 1))}  # new prompts
    same = _prompt(rng, n_tokens)  # the reused prompt
    hit = (n_tokens - 1) // BLOCK_SIZE * BLOCK_SIZE
    max_len = n_tokens + 64
    ttft: dict[str, float] = {}

    def stage(msg: str) -> None:
        print(f"bench.vllm: {msg}", file=sys.stderr, flush=True)

    # first, in a fresh process: vLLM's CPU worker binds the OpenMP threads of a process that
    # ran an engine in it (the stages below), and they took cores from the later engines
    # (recompute there measured 2x slower)
    stage("vLLM's default process layout (scheduler and worker in two processes, run in a "
          "fresh process): recompute, prefix cache; over the daemon: no reuse, host hit")
    from bench.vllm_split import run_split

    ttft.update(run_split(model, tmp, n_tokens, runs, [fresh[3 * (runs + 1) + i]
                                                      for i in range(2 * (runs + 1))], same))

    stage("recompute (no connector)")
    llm = make_llm(model, max_model_len=max_len)
    try:
        ttft["recompute"] = ttft_s(llm, lambda i: fresh[i], runs, want_cached=0)
        ttft["prefix cache"] = ttft_s(llm, lambda i: same, runs, want_cached=hit, reset=False)
    finally:
        close_llm(llm)

    stage("kvstore: no reuse, host hit, disk hit")
    cfg = {"tiers": [{"kind": "host", "capacity": "1GiB"},
                     {"kind": "disk", "capacity": "1GiB", "path": str(tmp / "disk"),
                      "durability": "none"}],
           "store": {"write_policy": "write_through"}}
    llm = make_llm(model, kvstore_transfer_config(cfg), max_model_len=max_len)
    try:
        from connector.vllm import engine_store

        store = engine_store(engine_id(llm))
        k = runs + 1
        ttft["no reuse"] = ttft_s(llm, lambda i: fresh[k + i], runs, want_cached=0,
                                   before=store.drain)
        generate(llm, [same], max_tokens=1)
        store.drain()
        ttft["host hit"] = ttft_s(llm, lambda i: same, runs, want_cached=hit)

        def empty_host() -> None:
            store.drain()
            store.evict(store.tier("host").used_pages, tier="host")

        ttft["disk hit"] = ttft_s(llm, lambda i: same, runs, want_cached=hit, before=empty_host)
    finally:
        close_llm(llm)

    stage("kvstore over the daemon: no reuse, host hit")
    k = 2 * (runs + 1)
    ttft["daemon no reuse"], ttft["daemon host hit"] = daemon_ttfts(
        model, tmp / "daemon", max_len=max_len, runs=runs, fresh=lambda i: fresh[k + i],
        same=same, hit=hit)

    stage("ExampleConnector hit")
    llm = make_llm(model, example_transfer_config(str(tmp / "example")), max_model_len=max_len)
    try:
        generate(llm, [same], max_tokens=1)
        ttft["ExampleConnector hit"] = ttft_s(llm, lambda i: same, runs, want_cached=hit)
    finally:
        close_llm(llm)

    case = f"tiny-llama/{n_tokens}-tokens"
    ms = {k: v * 1e3 for k, v in ttft.items()}
    # (variant, its TTFT, the baseline's key); every ratio is baseline / value (a time)
    recompute, example, floor = "recompute", "ExampleConnector hit", "prefix cache"
    rows = [
        ("vLLM prefix-cache hit (floor)", "prefix cache", recompute),
        ("kvstore host hit vs the floor", "host hit", floor),
        ("kvstore no reuse", "no reuse", recompute),
        ("kvstore host hit", "host hit", example),
        ("kvstore disk hit", "disk hit", example),
        ("kvstore host hit vs recompute", "host hit", recompute),
        ("kvstore daemon no reuse", "daemon no reuse", recompute),
        ("kvstore daemon host hit", "daemon host hit", example),
        ("ExampleConnector hit", "ExampleConnector hit", recompute),
        # vLLM's default process layout, the daemon mode (issue 34's acceptance)
        ("default layout: vLLM prefix-cache hit (floor)", "split prefix cache", "split recompute"),
        ("default layout: kvstore daemon host hit vs the floor", "split daemon host hit",
         "split prefix cache"),
        ("default layout: kvstore daemon host hit vs recompute", "split daemon host hit",
         "split recompute"),
        ("default layout: kvstore daemon no reuse", "split daemon no reuse", "split recompute"),
    ]
    names = {recompute: "vLLM without a connector", example: "vLLM ExampleConnector hit",
             floor: "vLLM prefix-cache hit",
             "split recompute": "vLLM without a connector, default layout",
             "split prefix cache": "vLLM prefix-cache hit, default layout"}
    return [measurement(BENCH, case, "recompute (no connector)", "ttft", ms[recompute], "ms"),
            measurement(BENCH, case, "default layout: recompute (no connector)", "ttft",
                        ms["split recompute"], "ms")] + [
        measurement(BENCH, case, variant, "ttft", ms[key], "ms", baseline=names[base],
                    baseline_value=ms[base], higher_is_better=False)
        for variant, key, base in rows
    ]


def main(argv: list[str] | None = None) -> None:
    args = add_standard_args(argparse.ArgumentParser(prog="python -m bench.vllm")).parse_args(argv)
    load_before = os.getloadavg()[0]
    lines = run(args.quick)
    # the machines are shared: what else ran is part of the result
    notes = {"loadavg_1min_before": load_before, "loadavg_1min_after": os.getloadavg()[0]}
    if args.json:
        emit_json(lines)
    else:
        by = {m.variant: m for m in lines}
        host, over = by["kvstore host hit"], by["kvstore no reuse"]
        floor = by["vLLM prefix-cache hit (floor)"]
        print_table(
            ("case", "variant", "TTFT ms", "baseline", "baseline ms", "ratio"),
            [(m.case, m.variant, m.value, m.baseline, m.baseline_value, m.ratio) for m in lines],
            title="bench.vllm: vLLM TTFT (CPU, tiny Llama), ratio > 1 = faster than the baseline",
            headline=f"headline: host hit {host.ratio:.2f}x ExampleConnector's hit (target >= 3); "
            f"no-reuse overhead {(1 / over.ratio - 1) * 100:+.1f} % (target <= 3 %); "
            f"a hit's floor (vLLM's own prefix cache) {floor.value:.1f} ms, ours "
            f"{host.value:.1f} ms; default layout over the daemon: host hit "
            f"{1 / by['default layout: kvstore daemon host hit vs the floor'].ratio:.2f}x the floor "
            f"(target <= 1.3), "
            f"{by['default layout: kvstore daemon host hit vs recompute'].ratio:.1f}x faster than "
            f"recompute (target >= 20), no-reuse overhead "
            f"{(1 / by['default layout: kvstore daemon no reuse'].ratio - 1) * 100:+.1f} % "
            "(target <= 3 %)"
            if host.ratio and over.ratio else "headline: n/a",
        )
    if args.record:
        print(f"recorded {record(BENCH, lines, command_line(), extra=notes)}")


if __name__ == "__main__":
    main()
