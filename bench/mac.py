"""The record MAC switched on and off, for the tier benches that measure its cost (``bench.tiers
--tier disk|redis``): the same tier, the same pages, in the same run, once with the MAC of a
deployment secret and once with :class:`NoMac`, which hashes nothing and writes a zero tag.
Their line's ratio is on/off (1.0: the MAC is free; the target is >= 0.9).

``python -m bench.mac [--quick]`` is the MAC's own microbench (:func:`micro`): GB/s of the
record MAC over 64 pages of 2 MiB on the calling thread, on the MAC pool
(:func:`kvstore.record.mac_jobs`) at several thread counts, and the MAC of records v2 (keyed
BLAKE3, on the calling thread) over the same bytes, which GMAC replaced.
"""

from __future__ import annotations

from typing import Any

from kvstore.record import TAG_BYTES, RecordMac

#: A stand-in deployment secret (the benches' records are deleted afterwards).
BENCH_SECRET = b"bench-only-secret-not-for-deployments"
VARIANT_ON = "kvstore"
VARIANT_OFF = "kvstore, MAC off"
#: The MAC on, hashed on the calling thread (no MAC pool): measured where the pool is on by
#: default, so the pool's gain shows in the same run.
VARIANT_CALLER = "kvstore, MAC on the calling thread"


class _NoHasher:
    __slots__ = ()

    def update(self, _piece: Any) -> None:
        pass


class NoMac(RecordMac):
    """The MAC switched off: nothing is hashed, every tag is zero (so every tag verifies).
    Benchmarks only; never a deployment's choice."""

    __slots__ = ()

    def begin(self, signed: Any) -> Any:
        return _NoHasher()

    def tag(self, hasher: Any) -> bytes:
        return bytes(TAG_BYTES)


def tier_macs() -> dict[str, RecordMac]:
    """Variant name -> the MAC its tier uses."""
    return {VARIANT_ON: RecordMac(BENCH_SECRET), VARIANT_OFF: NoMac()}


def mac_cost_line(
    bench: str, case: str, on: float, off: float, variant: str = "MAC on vs off"
) -> dict[str, Any]:
    """The line of the MAC's cost in ``case``: throughput with it on, against off."""
    return {
        "bench": bench,
        "case": case,
        "variant": variant,
        "metric": "throughput",
        "value": on,
        "unit": "GB/s",
        "baseline": VARIANT_OFF,
        "baseline_value": off,
        "ratio": on / off,
    }


# --------------------------------------------------------------------- microbench

MICRO = "mac"


def micro(quick: bool = False) -> list[dict[str, Any]]:
    """MAC GB/s over 64 pages of 2 MiB (the get path's check, :func:`kvstore.record.verify_payload`,
    on verified records): on the calling thread, on the MAC pool with 1, 2, 4, 8 threads and its
    default here (counts above the usable cores are left out), and keyed BLAKE3 (the MAC of
    records v2) per page on the calling thread.
    Rounds interleave the variants; each figure is total bytes over total time."""
    import time

    import blake3
    import numpy as np

    from kvstore.keys import Namespace
    from kvstore.layout import KVLayout
    from kvstore.record import (
        default_mac_threads,
        encode_header,
        mac_jobs,
        parse_header,
        usable_cores,
        verify_payload,
    )

    layout = KVLayout(32, 8, 128, 16, "bfloat16")  # 2 MiB pages
    n, rounds = 64, 3 if quick else 10
    mac = RecordMac(BENCH_SECRET)
    ns = Namespace("bench/mac", layout)
    metas = ns.chain(np.arange(n * layout.block_size, dtype=np.int64) % 128_000).metas()
    pages = np.random.default_rng(0).integers(0, 256, (n, layout.page_bytes), dtype=np.uint8)
    heads = [parse_header(encode_header(m, layout, p, mac), layout) for m, p in zip(metas, pages)]
    default = default_mac_threads()
    key = bytes(32)

    def single() -> None:
        for h, p in zip(heads, pages):
            verify_payload(h, p, mac)

    def blake3_v2() -> None:
        for p in pages:
            b = blake3.blake3(key=key)
            b.update(p)
            b.digest(16)

    def pool(threads: int) -> Any:
        def run() -> None:
            jobs = mac_jobs(n, threads)
            assert jobs is not None
            with jobs:
                for i in range(n):
                    jobs.start(i, verify_payload, heads[i], pages[i], mac)
            for _ in jobs.results():
                pass
        return run

    counts = sorted({t for t in (1, 2, 4, 8) if t <= usable_cores()} | ({default} - {0}))
    variants: dict[str, Any] = {"calling thread": single,
                                "keyed BLAKE3 (records v2), calling thread": blake3_v2}
    variants.update({f"MAC pool, threads={t}": pool(t) for t in counts})
    total = dict.fromkeys(variants, 0.0)
    names = list(variants)
    for fn in variants.values():  # warm up: the pool's threads, the pages in memory
        fn()
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            t0 = time.perf_counter()
            variants[name]()
            total[name] += time.perf_counter() - t0
    nbytes = rounds * n * layout.page_bytes
    base = nbytes / total["calling thread"] / 1e9
    lines = []
    for name in names:
        gbs = nbytes / total[name] / 1e9
        tail = " (the default here)" if name == f"MAC pool, threads={default}" else ""
        lines.append({
            "bench": MICRO, "case": f"mac/{n}x2MiB", "variant": name + tail,
            "metric": "throughput", "value": gbs, "unit": "GB/s",
            "baseline": None if name == "calling thread" else "calling thread",
            "baseline_value": None if name == "calling thread" else base,
            "ratio": None if name == "calling thread" else gbs / base,
        })
    return lines


def main(argv: list[str] | None = None) -> None:
    """``python -m bench.mac [--quick] [--json] [--record]``: the MAC microbench (:func:`micro`)."""
    import argparse

    import bench.common as common
    from kvstore.record import default_mac_threads, usable_cores

    parser = common.add_standard_args(argparse.ArgumentParser(prog="python -m bench.mac"))
    args = parser.parse_args(argv)
    lines = [common.measurement(MICRO, d["case"], d["variant"], d["metric"], d["value"],
                                d["unit"], baseline=d["baseline"],
                                baseline_value=d["baseline_value"])
             for d in micro(args.quick)]
    rows = [(m.case, m.variant, m.value, m.baseline, m.baseline_value, m.ratio) for m in lines]
    pool = default_mac_threads() or "none (the calling thread hashes)"
    if args.json:
        common.emit_json(lines)
    else:
        common.print_table(("case", "variant", "GB/s", "baseline", "baseline GB/s", "ratio"),
                           rows, title="record MAC (keyed BLAKE3) over 2 MiB pages",
                           headline=f"{usable_cores()} usable cores; MAC pool threads by default: {pool}")
    if args.record:
        print("recorded", common.record(MICRO, lines, common.command_line()))


if __name__ == "__main__":
    main()
