"""Lookups while an eviction's write-back hangs on a stalled Redis.

    python -m bench.stall [--quick] [--json] [--record]

A store of hbm (an engine pool, here on the CPU) over host over Redis, write-back, both upper
tiers full. One thread evicts from hbm: its victims go down to host, whose victims go down to
Redis -- which is stopped (SIGSTOP), so that write-back hangs until the tier's ``timeout_s``.
Meanwhile the main thread does what an engine's scheduler does on every step: a leased lookup of
a 2K-block prompt held in host (the local tiers; the scheduler never waits on a remote tier, it
answers "not known yet" instead) and releases it.

Reported: lookup p50 and p99 during the stall, against the same lookups with nothing in flight,
measured in the same run (ratio: baseline / stalled; 1.0 = the stall costs lookups nothing). For
contrast, one lookup that asks Redis too during the stall (what a scheduler that waited would pay).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import threading
import time

import numpy as np
import redis as redis_py

from bench.common import add_standard_args, command_line, emit_json, measurement, print_measurements, record
from bench.redis_server import find_redis_server, redis_server
from kvstore import KVLayout, Metrics, Namespace, TieredStore, build_tier
from kvstore.pool import HBMTier

LAYOUT = KVLayout(1, 1, 8, 16, "uint8")  # small pages: the index, not the bytes, is measured


def _lookups(store: TieredStore, keys: list[bytes], until: threading.Event | float) -> list[float]:
    """Leased local lookups (and releases) of ``keys`` until the event is set or the time."""
    times: list[float] = []
    while not (until.is_set() if isinstance(until, threading.Event) else time.monotonic() > until):
        t0 = time.perf_counter()
        hit = store.lookup(keys, lease=True, local_only=True)
        times.append(time.perf_counter() - t0)
        if hit.lease is not None:
            store.release(hit.lease)
    return times


def _pct(samples: list[float], q: float) -> float:
    return float(np.percentile(np.array(samples), q)) * 1e3


def main(argv: list[str] | None = None) -> None:
    args = add_standard_args(argparse.ArgumentParser(prog="python -m bench.stall")).parse_args(argv)
    exe = find_redis_server()
    if exe is None:
        raise SystemExit("bench.stall needs redis-server (PATH or .redis/)")
    pool_pages, prompt_blocks = (512, 256) if args.quick else (4096, 2048)
    timeout_s = 1.0 if args.quick else 3.0
    ns = Namespace("bench-stall", LAYOUT)
    with redis_server(exe) as url:
        m = Metrics()
        hbm = HBMTier.build("hbm", LAYOUT, pool_pages, m, device="cpu")
        host = build_tier({"kind": "host", "capacity": pool_pages * LAYOUT.page_bytes,
                           "pin_memory": False}, LAYOUT, m)
        # a breaker that never opens: every call to the stalled server waits its timeout_s
        red = build_tier({"kind": "redis", "capacity": (1 << 20) * LAYOUT.page_bytes, "url": url,
                          "timeout_s": timeout_s, "connect_timeout_s": timeout_s,
                          "breaker_failures": 1_000_000}, LAYOUT, m)
        store = TieredStore(LAYOUT, [hbm, host, red], ["lineage", "lru", "lru"],
                            write_policy="write_back")
        rng = np.random.default_rng(0)
        prompt = ns.chain(rng.integers(0, 50_000, prompt_blocks * 16).tolist())
        fill = ns.chain(rng.integers(0, 50_000, pool_pages * 16).tolist())
        page = lambda n: np.zeros((n, LAYOUT.page_bytes), np.uint8)  # noqa: E731
        store.put(prompt.metas(), page(prompt_blocks), tier="host")
        store.put(fill.metas(0, pool_pages - prompt_blocks), page(pool_pages - prompt_blocks),
                  tier="host")
        store.put(fill.metas(0, pool_pages), page(pool_pages), tier="hbm")  # hbm full too
        keys = list(prompt.keys)
        baseline = _lookups(store, keys, time.monotonic() + (1.0 if args.quick else 3.0))

        pid = redis_py.Redis.from_url(url).info("server")["process_id"]
        os.kill(pid, signal.SIGSTOP)
        done = threading.Event()

        def evict() -> None:
            try:
                store.evict(pool_pages // 2, tier="hbm")
            finally:
                done.set()

        evictor = threading.Thread(target=evict)
        t_stall = time.perf_counter()
        evictor.start()
        time.sleep(0.05)  # the evictor is in its write-back now
        stalled = _lookups(store, keys, done)
        t_full0 = time.perf_counter()
        store.lookup(keys[:1] + [b"\x00" * 16], local_only=False)  # asks Redis for the 2nd key
        t_full = time.perf_counter() - t_full0
        evictor.join()
        stall_s = time.perf_counter() - t_stall
        os.kill(pid, signal.SIGCONT)
        store.close()
    case = f"{prompt_blocks}-block-prompt"
    lines = [
        measurement("stall", case, "local lookup p50 during a stalled write-back", "latency",
                    _pct(stalled, 50), "ms", baseline="same lookup, nothing in flight",
                    baseline_value=_pct(baseline, 50), higher_is_better=False),
        measurement("stall", case, "local lookup p99 during a stalled write-back", "latency",
                    _pct(stalled, 99), "ms", baseline="same lookup, nothing in flight",
                    baseline_value=_pct(baseline, 99), higher_is_better=False),
        measurement("stall", case, "lookup that asks the stalled Redis", "latency", t_full * 1e3,
                    "ms"),
        measurement("stall", case, "write-back stall (eviction of half the pool)", "time",
                    stall_s * 1e3, "ms"),
    ]
    if args.json:
        emit_json(lines)
    else:
        print_measurements(lines, "ms",
                           title=f"bench.stall ({len(stalled)} lookups during the stall, "
                                 f"{len(baseline)} without; median {statistics.median(stalled) * 1e3:.3f} ms)",
                           headline=f"headline: lookup p99 during the stall {lines[1].value:.3f} ms, "
                                    f"{lines[1].ratio:.2f}x of without")
    if args.record:
        print(f"recorded {record('stall', lines, command_line())}")


if __name__ == "__main__":
    main()
