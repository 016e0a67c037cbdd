"""``bench.tiers`` for the Redis tier: put/get GB/s of pages against raw redis-py and against
LMCache's native Redis client, same server, same run.

What is measured, in one run, on one server, with pages of 2 MiB (Llama-3-8B layout: 32 layers,
8 KV heads, head_dim 128, 16-token blocks, bf16) and of 256 KiB (the same with 4 layers), in
batches of 16 and of 64 pages:

* ``kvstore`` — ``RedisTier.write`` / ``RedisTier.read`` (records with verified headers, checksums
  and the record MAC — AES-256-GMAC under a deployment secret — computed on put and checked on
  get, pages read into the caller's buffers; pages under 1 MiB put over one connection in sends
  of 4 MiB, larger ones over ``write_lanes`` connections, page by page);
* ``kvstore, MAC off`` (2 MiB x 16 only) — the same tier with the MAC switched off
  (``bench.mac.NoMac``), under its own key prefix; the line "MAC on vs off" gives its cost;
* ``kvstore, MAC on the calling thread`` (2 MiB x 16, only where the tier hashes on its MAC
  pool by default: from 4 cores) — the MAC on with ``mac_threads=0``;
* LMCache's C++ RESP client (``bench.lmcache_peer``, 8 workers: its default) — ``SET``/``GET``
  of the same page bytes, a batch per call; the line "kvstore vs LMCache" is our throughput
  over its. Left out, with the reason printed, where LMCache is not installed;
* the baseline — raw redis-py (with hiredis) ``SET`` / ``GET`` of the same page bytes, the way a
  user would write it, in both usual styles: a pipeline per batch of the same size, and a plain
  loop of single commands. The baseline value is the *faster* of the two in this run (each is
  also printed as its own line, without a ratio).

Rounds interleave the contenders (one pass over all batches each, in a rotating order), so a
noisy neighbour slows all of them alike; each figure is total page bytes over total time across
rounds. Gets use the same server-side data for every contender: everything is written once
before timing. Without ``url`` a private redis-server (``--save "" --appendonly no``) is started
on a free loopback port and stopped afterwards; with ``url`` the bench writes under a random key
prefix there and deletes its keys afterwards.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from collections.abc import Callable, Generator
from contextlib import contextmanager
from typing import Any

import numpy as np

BENCH = "tiers"


#: (size name, layers) of the two page sizes (8 KV heads of 128, 16-token blocks, bf16).
SIZES = (("2MiB", 32), ("256KiB", 4))
BATCHES = (16, 64)
LMCACHE_WORKERS = 8


def measure(args: Any) -> list[dict[str, Any]]:
    """Measurement dicts (BENCHMARKS.md convention, without ``machine``)."""
    quick = bool(getattr(args, "quick", False))
    url = getattr(args, "url", None)
    from bench import lmcache_peer

    no_peer = lmcache_peer.unavailable()
    if no_peer:
        print(f"bench.tiers redis: no LMCache peer: {no_peer}", file=sys.stderr)
    lines: list[dict[str, Any]] = []
    with _server(url) as server_url:
        for size, layers in SIZES:
            for batch in BATCHES:
                first = (size, batch) == (SIZES[0][0], BATCHES[0])
                lines += _measure(server_url, layers, f"{size}x{batch}", batch, quick=quick,
                                  variants=first, peer=no_peer is None)
    return lines


def _measure(
    url: str, layers: int, label: str, batch: int, *, quick: bool, variants: bool, peer: bool
) -> list[dict[str, Any]]:
    import redis

    from bench import lmcache_peer
    from bench.mac import (
        BENCH_SECRET,
        VARIANT_CALLER,
        VARIANT_OFF,
        VARIANT_ON,
        mac_cost_line,
        tier_macs,
    )
    from kvstore import Tier, build_tier
    from kvstore.keys import Namespace
    from kvstore.layout import KVLayout
    from kvstore.record import RecordMac, default_mac_threads

    layout = KVLayout(layers, 8, 128, 16, "bfloat16")
    total = (32 << 20) if quick else (128 << 20)
    rounds = 3 if quick else 6
    n = max(batch, total // layout.page_bytes // batch * batch)
    n_batches = n // batch
    prefix = f"kvbench-{uuid.uuid4().hex[:8]}"
    ns = Namespace("bench/llama-3-8b", layout)
    chain = ns.chain(np.arange(n * layout.block_size, dtype=np.int64) % 128_000)
    metas = chain.metas()
    pages = _bf16_pages(n, layout.page_bytes)
    outs = np.empty_like(pages)
    page_list = list(pages)
    out_list = list(outs)
    raw_names = [f"{prefix}-raw:{i}".encode() for i in range(n)]
    batches = [range(b * batch, (b + 1) * batch) for b in range(n_batches)]

    def redis_tier(key_prefix: str, mac: RecordMac, **settings: Any) -> Tier:
        return build_tier({"kind": "redis", "capacity": n * layout.page_bytes, "url": url,
                           "key_prefix": key_prefix, "timeout_s": 30.0, **settings},
                          layout, mac=mac)

    macs = tier_macs() if variants else {VARIANT_ON: tier_macs()[VARIANT_ON]}
    tiers = {variant: redis_tier(f"{prefix}-{i}", mac)
             for i, (variant, mac) in enumerate(macs.items())}
    if variants and default_mac_threads():
        tiers[VARIANT_CALLER] = redis_tier(f"{prefix}-c", RecordMac(BENCH_SECRET), mac_threads=0)
    client = redis.Redis.from_url(url, socket_timeout=30)
    lmc = lmcache_peer.redis_client(url, LMCACHE_WORKERS) if peer else None
    lmc_names = lmcache_peer.keys(prefix, n)
    lmc_outs = np.empty_like(pages)
    lmc_out_list = list(lmc_outs)
    try:

        def ours_put(tier: Tier) -> Callable[[], None]:
            def put() -> None:
                for r in batches:
                    ok = tier.write(metas[r.start : r.stop], page_list[r.start : r.stop])
                    assert all(ok), "kvstore put refused pages"
            return put

        def ours_get(tier: Tier) -> Callable[[], None]:
            def get() -> None:
                for r in batches:
                    ok = tier.read(ns.id, chain.keys[r.start : r.stop], out_list[r.start : r.stop])
                    assert all(ok), "kvstore get missed pages"
            return get

        def raw_put_pipe() -> None:
            for r in batches:
                pipe = client.pipeline(transaction=False)
                for i in r:
                    pipe.set(raw_names[i], memoryview(pages[i]))
                pipe.execute()

        def raw_put_loop() -> None:
            for i in range(n):
                client.set(raw_names[i], memoryview(pages[i]))

        def raw_get_pipe() -> None:
            for r in batches:
                pipe = client.pipeline(transaction=False)
                for i in r:
                    pipe.get(raw_names[i])
                got = pipe.execute()
                assert all(v is not None for v in got)

        def raw_get_loop() -> None:
            for i in range(n):
                assert client.get(raw_names[i]) is not None

        def lmc_put() -> None:
            assert lmc is not None
            for r in batches:
                lmc.set(lmc_names[r.start : r.stop], page_list[r.start : r.stop])

        def lmc_get() -> None:
            assert lmc is not None
            for r in batches:
                lmc.get(lmc_names[r.start : r.stop], lmc_out_list[r.start : r.stop])

        puts = {v: ours_put(t) for v, t in tiers.items()}
        puts.update(pipeline=raw_put_pipe, loop=raw_put_loop)
        gets = {v: ours_get(t) for v, t in tiers.items()}
        gets.update(pipeline=raw_get_pipe, loop=raw_get_loop)
        if lmc is not None:
            puts[lmcache_peer.REDIS_VARIANT] = lmc_put
            gets[lmcache_peer.REDIS_VARIANT] = lmc_get
        for fn in (*puts.values(), *gets.values()):  # warm up: connections, allocator, keys
            fn()
        assert np.array_equal(outs, pages), "kvstore returned other bytes than it stored"
        if lmc is not None:
            assert np.array_equal(lmc_outs, pages), "LMCache returned other bytes than it stored"
        put_s = _interleaved(puts, rounds)
        get_s = _interleaved(gets, rounds)
    finally:
        for tier in tiers.values():
            _cleanup(client, tier, chain.keys, raw_names)
            tier.close()
        if lmc is not None:
            lmc.delete(lmc_names)
            lmc.close()
        client.close()

    nbytes = rounds * n * layout.page_bytes
    lines = []
    for direction, times, cmd in (("put", put_s, "SET"), ("get", get_s, "GET")):
        case = f"redis/{direction} {label}"
        gbs = {k: nbytes / t / 1e9 for k, t in times.items()}
        base = max(gbs["pipeline"], gbs["loop"])
        for variant in (*tiers, lmcache_peer.REDIS_VARIANT):
            if variant in gbs:
                lines.append(_line(case, variant, gbs[variant], f"raw redis-py {cmd}", base))
        lines.append(_line(case, f"raw redis-py {cmd} pipeline ({batch}/batch)", gbs["pipeline"]))
        lines.append(_line(case, f"raw redis-py {cmd} loop", gbs["loop"]))
        if VARIANT_OFF in gbs:
            lines.append(mac_cost_line(BENCH, case, gbs[VARIANT_ON], gbs[VARIANT_OFF]))
        if VARIANT_CALLER in gbs:
            lines.append(mac_cost_line(BENCH, case, gbs[VARIANT_CALLER], gbs[VARIANT_OFF],
                                       "MAC on the calling thread vs off"))
        if lmcache_peer.REDIS_VARIANT in gbs:
            lines.append(lmcache_peer.peer_line(BENCH, case, gbs[VARIANT_ON],
                                                gbs[lmcache_peer.REDIS_VARIANT]))
    return lines


def _interleaved(fns: dict[str, Callable[[], None]], rounds: int) -> dict[str, float]:
    total = dict.fromkeys(fns, 0.0)
    names = list(fns)
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            t0 = time.perf_counter()
            fns[name]()
            total[name] += time.perf_counter() - t0
    return total


def _line(
    case: str, variant: str, value: float, baseline: str | None = None, base: float | None = None
) -> dict[str, Any]:
    return {
        "bench": BENCH,
        "case": case,
        "variant": variant,
        "metric": "throughput",
        "value": value,
        "unit": "GB/s",
        "baseline": baseline,
        "baseline_value": base,
        "ratio": value / base if base else None,
    }


def _bf16_pages(n: int, page_bytes: int) -> np.ndarray:
    """KV-like bytes: normal values with per-channel scales, rounded to bfloat16."""
    rng = np.random.default_rng(0)
    vals = rng.standard_normal(n * page_bytes // 2, dtype=np.float32)
    vals *= np.exp(rng.standard_normal(1024, dtype=np.float32) * 0.5).repeat(
        len(vals) // 1024 + 1
    )[: len(vals)]
    bf16 = (vals.view(np.uint32) >> 16).astype(np.uint16)
    return bf16.view(np.uint8).reshape(n, page_bytes)


def _cleanup(client: Any, tier: Any, keys: list[bytes], raw_names: list[bytes]) -> None:
    try:
        tier.delete(keys)
        for i in range(0, len(raw_names), 256):
            client.delete(*raw_names[i : i + 256])
    except Exception as exc:  # noqa: BLE001 - a failed cleanup must not hide the results
        print(f"bench.tiers_redis: cleanup failed: {exc}", file=sys.stderr)


@contextmanager
def _server(url: str | None) -> Generator[str, None, None]:
    if url:
        yield url
        return
    from bench.redis_server import find_redis_server, redis_server

    exe = find_redis_server()
    if exe is None:
        raise SystemExit("bench.tiers redis: redis-server is not installed; pass a URL instead")
    with redis_server(exe) as server_url:
        yield server_url


def main(argv: list[str] | None = None) -> None:
    from bench.common import add_standard_args, emit_json, measurement, print_table

    parser = add_standard_args(argparse.ArgumentParser(prog="python -m bench.tiers_redis"))
    parser.add_argument("--url", default=None, help="use this redis server instead of starting one")
    args = parser.parse_args(argv)
    lines = [
        measurement(BENCH, d["case"], d["variant"], d["metric"], d["value"], d["unit"],
                    baseline=d["baseline"], baseline_value=d["baseline_value"])
        for d in measure(args)
    ]
    if args.json:
        emit_json(lines)
        return
    heads = [m for m in lines if m.ratio is not None]
    print_table(
        ("case", "variant", "GB/s", "baseline", "baseline GB/s", "ratio"),
        [(m.case, m.variant, m.value, m.baseline, m.baseline_value, m.ratio) for m in lines],
        title="redis tier vs raw redis-py (same server, same pages, same run)",
        headline="  ".join(f"{m.case}: {m.ratio:.2f}x raw redis-py" for m in heads),
    )


if __name__ == "__main__":
    main()
