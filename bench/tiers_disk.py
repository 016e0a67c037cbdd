"""Disk tier throughput against the medium itself and against LMCache's native fs adapter,
measured in the same run and directory.

For the same bytes — pages of 2 MiB (Llama-3-8B: 32 layers, 8 KV heads of 128, 16-token
blocks, bf16) and of 256 KiB (the same with 4 layers) — in batches of 16 and of 64 pages:

* **baseline** — raw O_DIRECT I/O on a plain, preallocated file in the same directory: each
  batch is one sequential ``pwritev`` (``preadv``) of the batch's pages at the next offset; the
  writes end with one ``fdatasync``. That is what one sequential stream gets from the device.
* **kvstore** — the disk tier's ``write`` / ``read`` of the same pages under their keys, from
  4096-aligned buffers, default options: ``durability="group"`` (a put returns once its record
  and index entry are written; a background group commit flushes both within 100 ms; the
  pass's last batch includes a ``sync()``, as the raw writes' last batch includes their
  ``fdatasync``); every put computes and every read verifies the header checksum and the record
  MAC (AES-256-GMAC under a deployment secret), a put the payload checksum too. Below 4 cores
  the calling thread does that hashing, run after run, while the I/O workers move the others
  (``hash_in_workers``).
* **kvstore, MAC off** (2 MiB pages, batches of 16 only) — the same tier with the MAC
  switched off (``bench.mac.NoMac``): its line "MAC on vs off" gives the MAC's cost.
* **LMCache** (``bench.lmcache_peer``) — LMCache's C++ fs client with O_DIRECT and as many
  workers as our tier has I/O threads, one file per page, in a directory beside ours; its line
  "kvstore vs LMCache" is our throughput over its. Skipped, with the reason printed, when
  LMCache is not installed.
* **kvstore-unaligned** (only with ``args.unaligned``) — buffers 64 bytes off alignment, so
  every page goes through a bounce buffer.

The contenders alternate batch by batch (which goes first rotates too), so all see the same
moment of a shared machine's disk; the group commit's flushes land during whichever side runs
next, so they weigh on every side alike. Each side's throughput is the median, over every batch
of every repetition, of the batch's bytes over its seconds: a virtual disk on a busy host
stalls now and then for tens of milliseconds, on either side, and a median of many paired
batches is what stays put from run to run. The page cache plays no part.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bench import lmcache_peer
from bench.mac import VARIANT_OFF, VARIANT_ON, mac_cost_line, tier_macs
from kvstore import Tier, build_tier, direct_io
from kvstore.buffers import aligned_empty
from kvstore.keys import Namespace
from kvstore.layout import KVLayout
from kvstore.record import RecordMac

BENCH = "tiers"
LLAMA3_8B = KVLayout(num_layers=32, num_kv_heads=8, head_dim=128, block_size=16, dtype="bfloat16")
VARIANT_U = "kvstore-unaligned"
_LOCAL_DIRS = ("/var/tmp", str(Path(__file__).resolve().parent.parent))


def default_dir(need_bytes: int) -> str:
    """A local, disk-backed directory with room: /var/tmp, else the checkout (never tmpfs)."""
    for d in _LOCAL_DIRS:
        fs = direct_io.filesystem_type(Path(d))
        if fs in ("tmpfs", "ramfs") or direct_io.is_network_filesystem(fs):
            continue
        try:
            st = os.statvfs(d)
        except OSError:
            continue
        if st.f_bavail * st.f_frsize > 2.5 * need_bytes and os.access(d, os.W_OK):
            return d
    raise SystemExit(f"bench.tiers disk: no local disk directory with {need_bytes >> 20} MiB free; "
                     "pass --dir")


def _pages(n: int, page_bytes: int, *, aligned: bool, fill: bool) -> np.ndarray:
    """``n`` pages in one buffer, 4096-aligned or deliberately off by 64 bytes."""
    raw = aligned_empty(n * page_bytes + 4096)
    pages = raw[: n * page_bytes] if aligned else raw[64 : 64 + n * page_bytes]
    if fill:
        rng = np.random.default_rng(0)
        pages[:] = np.frombuffer(rng.bytes(pages.nbytes), dtype=np.uint8)
    return pages.reshape(n, page_bytes)


#: (size name, layout) of the two page sizes, and the batch sizes.
SIZES = (("2MiB", LLAMA3_8B), ("256KiB", KVLayout(4, 8, 128, 16, "bfloat16")))
BATCHES = (16, 64)
IO_THREADS = 8


def measure(args: Any) -> list[dict[str, Any]]:
    """Measurement dicts (``machine`` is left for the caller to fill)."""
    quick = bool(getattr(args, "quick", False))
    total, reps = (48 << 20, 2) if quick else (512 << 20, 3)
    base = Path(getattr(args, "dir", None) or default_dir(total * 4))  # raw + 2 tiers + LMCache
    unaligned = bool(getattr(args, "unaligned", False))
    no_peer = lmcache_peer.unavailable()
    if no_peer:
        print(f"bench.tiers disk: no LMCache peer: {no_peer}", file=sys.stderr)
    lines: list[dict[str, Any]] = []
    for size, layout in SIZES:
        for batch in BATCHES:
            work = Path(tempfile.mkdtemp(prefix="kvstore-bench-disk-", dir=base))
            try:
                if direct_io.probe_o_direct(work) is not None:
                    raise SystemExit(
                        f"bench.tiers disk: {work} refuses O_DIRECT; pass --dir on a local disk"
                    )
                macs = size == "2MiB" and batch == BATCHES[0]
                lines += _measure(
                    work, layout, f"{size}x{batch}", total // layout.page_bytes, batch, reps,
                    unaligned=unaligned, mac_off=macs, peer=no_peer is None,
                )
            finally:
                shutil.rmtree(work, ignore_errors=True)
    return lines


def _measure(
    work: Path, layout: KVLayout, label: str, num_pages: int, batch: int, reps: int, *,
    unaligned: bool, mac_off: bool, peer: bool,
) -> list[dict[str, Any]]:
    page = layout.page_bytes
    ns = Namespace("bench/llama-3-8b", layout)
    chain = ns.chain(np.arange(num_pages * layout.block_size) % 128000)
    metas, keys = chain.metas(), chain.keys
    results: dict[str, list[float]] = {}
    src = list(_pages(num_pages, page, aligned=True, fill=True))
    outs = {"raw": list(_pages(num_pages, page, aligned=True, fill=False))}
    macs = tier_macs() if mac_off else {VARIANT_ON: tier_macs()[VARIANT_ON]}
    for variant in macs:
        outs[variant] = list(_pages(num_pages, page, aligned=True, fill=False))
    if peer:
        outs[lmcache_peer.FS_VARIANT] = list(_pages(num_pages, page, aligned=True, fill=False))
    if unaligned:
        src_u = list(_pages(num_pages, page, aligned=False, fill=True))
        outs[VARIANT_U] = list(_pages(num_pages, page, aligned=False, fill=False))
    names = lmcache_peer.keys(f"kvbench-{label}", num_pages)
    for rep in range(reps):
        raw_path = work / "raw.dat"
        fd = os.open(raw_path, os.O_RDWR | os.O_CREAT | direct_io.O_DIRECT, 0o644)
        tiers: dict[str, Tier] = {}
        lmc: lmcache_peer.NativeClient | None = None
        try:
            os.posix_fallocate(fd, 0, num_pages * page)  # the tier's slab is preallocated too
            sides: dict[str, Side] = {"raw": _raw_side(fd, page, src)}
            for n, (variant, mac) in enumerate(macs.items()):
                tiers[variant] = _disk_tier(layout, num_pages, work / f"tier-{rep}-{n}", mac)
                sides[variant] = _tier_side(tiers[variant], ns.id, metas, keys, src)
            if unaligned:
                tiers[VARIANT_U] = _disk_tier(layout, num_pages, work / f"tier-{rep}-u")
                sides[VARIANT_U] = _tier_side(tiers[VARIANT_U], ns.id, metas, keys, src_u)
            if peer:
                (work / f"lmc-{rep}").mkdir()
                lmc = lmcache_peer.fs_client(str(work / f"lmc-{rep}"), IO_THREADS)
                sides[lmcache_peer.FS_VARIANT] = _peer_side(lmc, names, src)
            for direction in ("put", "get"):
                got = _paired(sides, direction, num_pages, batch, page, outs)
                for side, rates in got.items():
                    results.setdefault(f"{direction}:{side}", []).extend(rates)
            for side, pages in outs.items():
                ref = src_u if side == VARIANT_U else src
                if any(not np.array_equal(a, b) for a, b in zip(ref, pages)):
                    raise RuntimeError(f"{side} returned other bytes than were written")
        finally:
            os.close(fd)
            raw_path.unlink()
            if lmc is not None:
                lmc.close()
                shutil.rmtree(work / f"lmc-{rep}", ignore_errors=True)
            for tier in tiers.values():
                tier.close()
            for path in work.glob(f"tier-{rep}-*"):
                shutil.rmtree(path, ignore_errors=True)
    med = {k: statistics.median(v) / 1e9 for k, v in results.items() if v}
    lines = []
    for direction, base_name in (
        ("put", "raw O_DIRECT sequential write"), ("get", "raw O_DIRECT sequential read"),
    ):
        case = f"disk/{direction} {label}"
        raw = med[f"{direction}:raw"]
        for side in (*macs, VARIANT_U, lmcache_peer.FS_VARIANT):
            if f"{direction}:{side}" in med:
                lines.append(_line(case, side, med[f"{direction}:{side}"], base_name, raw))
        ours = med[f"{direction}:{VARIANT_ON}"]
        if f"{direction}:{VARIANT_OFF}" in med:
            lines.append(mac_cost_line(BENCH, case, ours, med[f"{direction}:{VARIANT_OFF}"]))
        if f"{direction}:{lmcache_peer.FS_VARIANT}" in med:
            peer_v = med[f"{direction}:{lmcache_peer.FS_VARIANT}"]
            lines.append(lmcache_peer.peer_line(BENCH, case, ours, peer_v))
    return lines


def _line(case: str, variant: str, value: float, base_name: str, base: float) -> dict[str, Any]:
    return {
        "bench": BENCH, "case": case, "variant": variant, "metric": "throughput",
        "value": value, "unit": "GB/s", "baseline": base_name, "baseline_value": base,
        "ratio": value / base,
    }


#: A contender: ``side(direction, first, stop, outs, last)`` moves pages [first, stop).
Side = Callable[[str, int, int, list[np.ndarray], bool], None]


def _raw_side(fd: int, page: int, src: list[np.ndarray]) -> Side:
    def run(direction: str, i: int, j: int, outs: list[np.ndarray], last: bool) -> None:
        if direction == "put":
            direct_io.pwritev_all(fd, src[i:j], i * page)
            if last:
                os.fdatasync(fd)
        else:
            got = direct_io.preadv_all(fd, outs[i:j], i * page)
            assert got == (j - i) * page
    return run


def _disk_tier(layout: KVLayout, num_pages: int, path: Path, mac: RecordMac | None = None
               ) -> Tier:
    """A disk tier of ``num_pages`` pages in ``path``, built as a configuration's would be."""
    return build_tier({"kind": "disk", "capacity": num_pages * layout.page_bytes, "path": path,
                       "io_threads": IO_THREADS}, layout, mac=mac)


def _tier_side(
    tier: Tier, ns_id: bytes, metas: list[Any], keys: list[bytes], src: list[np.ndarray]
) -> Side:
    def run(direction: str, i: int, j: int, outs: list[np.ndarray], last: bool) -> None:
        if direction == "put":
            ok = tier.write(metas[i:j], src[i:j])
            if last:
                tier.sync()
        else:
            ok = tier.read(ns_id, keys[i:j], outs[i:j])
        if not all(ok):
            raise RuntimeError(f"disk tier {'refused' if direction == 'put' else 'missed'} pages")
    return run


def _peer_side(client: lmcache_peer.NativeClient, names: list[str], src: list[np.ndarray]) -> Side:
    def run(direction: str, i: int, j: int, outs: list[np.ndarray], last: bool) -> None:
        if direction == "put":
            client.set(names[i:j], src[i:j])
        else:
            client.get(names[i:j], outs[i:j])
    return run


def _paired(
    sides: dict[str, Side], direction: str, num_pages: int, batch: int, page: int,
    outs: dict[str, list[np.ndarray]],
) -> dict[str, list[float]]:
    """Bytes per second of each batch of each side, alternating batch by batch (the order
    rotates). Puts write each side's sources; gets land in each side's ``outs``."""
    rates: dict[str, list[float]] = {name: [] for name in sides}
    names = list(sides)
    for n, i in enumerate(range(0, num_pages, batch)):
        j = min(i + batch, num_pages)
        last = j >= num_pages
        for side in names[n % len(names) :] + names[: n % len(names)]:
            t0 = time.perf_counter()
            sides[side](direction, i, j, outs[side], last)
            rates[side].append((j - i) * page / (time.perf_counter() - t0))
    return rates


def main() -> None:  # pragma: no cover - convenience until bench.tiers dispatches here
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--dir", default=None, help="directory to benchmark in (a local disk)")
    parser.add_argument("--unaligned", action="store_true", help="also measure unaligned buffers")
    args = parser.parse_args()
    for line in measure(args):
        print(
            f"{line['case']:<10} {line['variant']:<18} {line['value']:6.3f} GB/s   "
            f"{line['baseline']}: {line['baseline_value']:6.3f} GB/s   ratio {line['ratio']:.3f}"
        )


if __name__ == "__main__":  # pragma: no cover
    main()
