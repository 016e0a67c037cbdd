"""An engine's scheduling time per step while its block pool writes back (HBM eviction under load).

    python -m bench.writeback [--quick] [--json] [--record] [--device cuda]

The engine's side of HBM eviction, without a model. Each step the engine thread allocates the
blocks of ``per_step`` new pages from its pool, the "forward" writes them and takes
``forward_ms``, then the engine commits them and releases them (the request ended; the blocks
stay cached). The pool, the host tier below it and the disk tier below that (real files in a
temporary directory) are full before the measured steps start, so every allocation needs pool
blocks evicted, and under write-back (the default) each victim is copied down to host and host's
victims to disk: ``per_step`` pages of write-back per step, at every level.

Measured: the engine thread's own time per step -- allocate + commit + release, the forward
excluded -- p50 and p99. Baseline, in the same run: the same steps on a bare pool (no tier
below: eviction only unlinks, nothing is written back). Variants: the store with
``free_reserve`` 0 (the allocation evicts, and writes back, on the engine thread) and with its
default (the pool and host are cleaned ahead of need on the store's mover; the engine takes free
blocks), once with the interpreter's 5 ms thread switch interval (``store.switch_interval_ms``
0) and once with the store's default (the engine's thread waits at most that long for the GIL
behind the cleaner's bookkeeping). Ratio = baseline / variant (1.0: write-back costs the engine
thread nothing).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.common import add_standard_args, command_line, emit_json, measurement, print_measurements, record
from kvstore import KVLayout, Metrics, Namespace, TieredStore, build_tier
from kvstore.config import StoreConfig
from kvstore.pool import HBMTier, LocalOwner

#: 64 KiB pages: enough bytes that write-back costs, few enough that the bench fits CI's disk
LAYOUT = KVLayout(num_layers=4, num_kv_heads=4, head_dim=64, block_size=16, dtype="float16")
POOL_BLOCKS, HOST_PAGES, DISK_PAGES = 1024, 1024, 4096
DEFAULT_RESERVE = StoreConfig().free_reserve
DEFAULT_INTERVAL_MS = StoreConfig().switch_interval_ms
#: CPython's own thread switch interval (5 ms)
INTERPRETER_SWITCH_S = 0.005
#: (label, free_reserve, switch_interval_ms): inline eviction; cleaning ahead with the
#: interpreter's switch interval left alone (0); the defaults
VARIANTS = (("free_reserve 0", 0.0, DEFAULT_INTERVAL_MS),
            (f"free_reserve {DEFAULT_RESERVE}, switch interval 5 ms", DEFAULT_RESERVE, 0.0),
            (f"free_reserve {DEFAULT_RESERVE}", DEFAULT_RESERVE, DEFAULT_INTERVAL_MS))


def _pool(device: str, m: Metrics) -> HBMTier:
    return HBMTier.build("hbm", LAYOUT, POOL_BLOCKS, m, device=device)


def _store(device: str, reserve: float, interval_ms: float, tmp: Path
           ) -> tuple[HBMTier, TieredStore]:
    m = Metrics()
    pool = _pool(device, m)
    host = build_tier({"kind": "host", "capacity": HOST_PAGES * LAYOUT.page_bytes,
                       "pin_memory": device != "cpu"}, LAYOUT, m)
    disk = build_tier({"kind": "disk", "capacity": DISK_PAGES * LAYOUT.page_bytes,
                       "path": str(tmp)}, LAYOUT, m)
    return pool, TieredStore(LAYOUT, [pool, host, disk], write_policy="write_back",
                             free_reserve=reserve, switch_interval_ms=interval_ms, metrics=m)


class _Engine:
    """The scheduler's calls on its pool, one step at a time, over an endless prompt stream."""

    def __init__(self, pool: HBMTier, per_step: int, forward_s: float) -> None:
        self.pool, self.per_step, self.forward_s = pool, per_step, forward_s
        self.ns = Namespace("bench-writeback", LAYOUT)
        self.kv = torch.from_numpy(np.random.default_rng(0).integers(
            0, 256, (per_step, LAYOUT.page_bytes), np.uint8)).to(pool.pool_bytes.device)
        self.n = 0

    def step(self) -> float:
        """One step; returns the engine thread's own seconds in it (the forward excluded)."""
        chain = self.ns.chain(list(range(self.n, self.n + self.per_step * LAYOUT.block_size)))
        self.n += self.per_step * LAYOUT.block_size
        t0 = time.perf_counter()
        blocks = self.pool.allocate(self.per_step)
        t1 = time.perf_counter()
        if blocks is None:
            raise SystemExit("the pool refused an allocation: nothing held it, it should not")
        idx = torch.tensor(blocks, device=self.kv.device)
        self.pool.pool_bytes.index_copy_(0, idx, self.kv)  # the forward writes the K/V
        if self.forward_s:
            time.sleep(self.forward_s)
        t2 = time.perf_counter()
        self.pool.note_queued_writes()
        self.pool.commit(blocks, chain.metas())
        self.pool.release(blocks)
        return (t1 - t0) + (time.perf_counter() - t2)


def _run(pool: HBMTier, store: TieredStore | None, per_step: int, steps: int,
         forward_s: float) -> tuple[list[float], float]:
    """Fill every tier first (no forward time), then time ``steps`` steps. Returns the step
    times and the pages evicted inline (by the engine thread) in them."""
    eng = _Engine(pool, per_step, forward_s=0.0)
    total = POOL_BLOCKS + (HOST_PAGES + DISK_PAGES if store is not None else 0)
    for _ in range(total // per_step + 1):
        eng.step()
    if store is not None:
        store.drain()
    inline0 = _inline(store)
    eng.forward_s = forward_s
    times = [eng.step() for _ in range(steps)]
    return times, _inline(store) - inline0


def _inline(store: TieredStore | None) -> float:
    return 0.0 if store is None else store.metrics.value("kvstore_inline_evictions_total",
                                                         tier="hbm")


def _ms(times: list[float], q: float) -> float:
    return float(np.percentile(np.array(times), q)) * 1e3


def main(argv: list[str] | None = None) -> None:
    parser = add_standard_args(argparse.ArgumentParser(prog="python -m bench.writeback"))
    parser.add_argument("--device", default="cpu", help="the pool's device (cpu, cuda)")
    parser.add_argument("--dir", default=None, help="where the disk tier's files go (a temp dir)")
    args = parser.parse_args(argv)
    steps, forward_s = (60, 0.005) if args.quick else (400, 0.010)
    volumes = (8,) if args.quick else (8, 32)
    lines = []
    notes = []
    for per_step in volumes:
        case = f"{per_step} pages/step x {LAYOUT.page_bytes // 1024}KiB"
        bare = _pool(args.device, Metrics())
        bare.attach(LocalOwner(bare))
        base, _ = _run(bare, None, per_step, steps, forward_s)
        for label, reserve, interval_ms in VARIANTS:
            # the interval is the process's: each variant starts from the interpreter's own
            sys.setswitchinterval(INTERPRETER_SWITCH_S)
            with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
                pool, store = _store(args.device, reserve, interval_ms, Path(tmp))
                try:
                    times, inline = _run(pool, store, per_step, steps, forward_s)
                finally:
                    store.close()
            notes.append(f"{case}, {label}: {inline:.0f} pages evicted on the engine thread")
            for q in (50, 99):
                lines.append(measurement(
                    "writeback", case, f"write-back, {label}: engine time/step p{q}", "latency",
                    _ms(times, q), "ms", baseline="bare pool, nothing written back",
                    baseline_value=_ms(base, q), higher_is_better=False))
    if args.json:
        emit_json(lines)
    else:
        print_measurements(lines, "ms",
                           title=f"bench.writeback ({steps} steps of {forward_s * 1e3:.0f} ms forward, "
                                 f"pool {POOL_BLOCKS} blocks on {args.device})\n" + "\n".join(notes),
                           headline=_headline(lines))
    if args.record:
        print(f"recorded {record('writeback', lines, command_line())}")


def _headline(lines: list[Any]) -> str:
    last = [x for x in lines if x.variant.endswith("p99")][-len(VARIANTS):]
    return ("headline: engine time/step p99 at the largest write-back volume, "
            + ", ".join(f"{x.variant.split(':')[0]} {x.value:.3f} ms ({x.ratio:.2f}x of bare)"
                        for x in last))


if __name__ == "__main__":
    main()
