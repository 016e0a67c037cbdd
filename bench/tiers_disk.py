"""Disk tier throughput against the medium itself, measured in the same run and directory.

For the same bytes (``num_pages`` pages of the Llama-3-8B layout: 32 layers, 8 KV heads of 128,
16-token blocks, bf16 = 2 MiB a page), in batches of ``batch`` pages:

* **baseline** — raw O_DIRECT I/O on a plain, preallocated file in the same directory: each
  batch is one sequential ``pwritev`` (``preadv``) of the batch's pages at the next offset; the
  writes end with one ``fdatasync``. That is what one sequential stream gets from the device.
* **kvstore** — ``DiskTier.write`` / ``DiskTier.read`` of the same pages under their keys, from
  4096-aligned buffers, default options: every write batch is fdatasync'ed and its index commit
  synced before ``write`` returns; every read verifies header and payload checksums and the
  record MAC (keyed BLAKE3 under a deployment secret).
* **kvstore, MAC off** — the same tier with the MAC switched off (``bench.mac.NoMac``): its
  line "MAC on vs off" gives the MAC's cost as the ratio on/off.
* **kvstore-unaligned** (only with ``args.unaligned``) — the same through buffers 64 bytes off
  alignment, so every page is copied through a bounce buffer: the price of handing the tier
  unaligned memory. Left out by default: the store hands the tier aligned buffers, and the
  target (>= 0.9 of the device) is about that path.

The baseline and the tiers alternate batch by batch (which goes first rotates too), so all
see the same moment of a shared machine's disk. Each side's throughput is the median, over every
batch of every repetition, of the batch's bytes over its seconds: a virtual disk on a busy host
stalls now and then for tens of milliseconds, on either side, and a median of many paired
batches is what stays put from run to run. Every tier batch carries its own fdatasync and
synced index commit (the raw writes have one fdatasync at the end, counted in their last batch),
so no cost of the tier is left out of the median. The page cache plays no part.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.mac import VARIANT_OFF, VARIANT_ON, mac_cost_line, tier_macs
from kvstore.keys import Namespace
from kvstore.layout import KVLayout
from kvstore.tiers import disk_io
from kvstore.tiers.disk import DiskTier

BENCH = "tiers"
LLAMA3_8B = KVLayout(num_layers=32, num_kv_heads=8, head_dim=128, block_size=16, dtype="bfloat16")
_LOCAL_DIRS = ("/var/tmp", str(Path(__file__).resolve().parent.parent))


def default_dir(need_bytes: int) -> str:
    """A local, disk-backed directory with room: /var/tmp, else the checkout (never tmpfs)."""
    for d in _LOCAL_DIRS:
        fs = disk_io.filesystem_type(Path(d))
        if fs in ("tmpfs", "ramfs") or disk_io.is_network_filesystem(fs):
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
    raw = disk_io.aligned_empty(n * page_bytes + 4096)
    pages = raw[: n * page_bytes] if aligned else raw[64 : 64 + n * page_bytes]
    if fill:
        rng = np.random.default_rng(0)
        pages[:] = np.frombuffer(rng.bytes(pages.nbytes), dtype=np.uint8)
    return pages.reshape(n, page_bytes)


def measure(args: Any) -> list[dict[str, Any]]:
    """Measurement dicts (``machine`` is left for the caller to fill)."""
    quick = bool(getattr(args, "quick", False))
    layout = LLAMA3_8B
    page = layout.page_bytes
    num_pages, batch, reps = (192, 32, 3) if quick else (1024, 32, 6)
    total = num_pages * page
    base = Path(getattr(args, "dir", None) or default_dir(total * 3))  # raw + 2 tiers
    work = Path(tempfile.mkdtemp(prefix="kvstore-bench-disk-", dir=base))
    try:
        unaligned = bool(getattr(args, "unaligned", False))
        return _measure(work, layout, num_pages, batch, reps, unaligned)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _measure(
    work: Path, layout: KVLayout, num_pages: int, batch: int, reps: int, unaligned: bool
) -> list[dict[str, Any]]:
    page = layout.page_bytes
    total = num_pages * page
    if disk_io.probe_o_direct(work) is not None:
        raise SystemExit(f"bench.tiers disk: {work} refuses O_DIRECT; pass --dir on a local disk")
    ns = Namespace("bench/llama-3-8b", layout)
    chain = ns.chain(np.arange(num_pages * layout.block_size) % 128000)
    metas, keys = chain.metas(), chain.keys
    names = ("raw_w", "raw_r", "put", "get", "put_u", "get_u", "put_off", "get_off")
    results: dict[str, list[float]] = {k: [] for k in names}
    raw_src = list(_pages(num_pages, page, aligned=True, fill=True))
    raw_dst = list(_pages(num_pages, page, aligned=True, fill=False))
    for aligned, suffix in ((True, ""), (False, "_u"))[: 2 if unaligned else 1]:
        if aligned:
            src, dst = raw_src, list(_pages(num_pages, page, aligned=True, fill=False))
        else:
            src = list(_pages(num_pages, page, aligned=False, fill=True))
            dst = list(_pages(num_pages, page, aligned=False, fill=False))
        # The MAC's cost is measured on the aligned path only: MAC on and off, side by side.
        macs = tier_macs() if aligned else {VARIANT_ON: tier_macs()[VARIANT_ON]}
        for rep in range(reps):
            raw_path = work / "raw.dat"
            fd = os.open(raw_path, os.O_RDWR | os.O_CREAT | disk_io.O_DIRECT, 0o644)
            tiers: dict[str, DiskTier] = {}
            try:
                os.posix_fallocate(fd, 0, total)  # the tier's slab is preallocated too
                for n, (variant, mac) in enumerate(macs.items()):
                    path = work / f"tier-{rep}{suffix}-{n}"
                    tiers[variant] = DiskTier("disk", layout, num_pages, path=path, mac=mac)
                for direction, raw_key, raw_pages, pages in (
                    ("put", "raw_w", raw_src, src), ("get", "raw_r", raw_dst, dst)
                ):
                    raw, mine = _paired(fd, tiers, ns.id, metas, keys, raw_pages, pages, batch)
                    results[raw_key] += raw
                    results[direction + suffix] += mine[VARIANT_ON]
                    if VARIANT_OFF in mine:
                        results[direction + "_off"] += mine[VARIANT_OFF]
                if any(not np.array_equal(a, b) for a, b in zip(src, dst)):
                    raise RuntimeError("disk tier returned other bytes than were written")
            finally:
                os.close(fd)
                raw_path.unlink()
                for tier in tiers.values():
                    tier.close()
                    shutil.rmtree(tier.path, ignore_errors=True)
    med = {k: statistics.median(v) / 1e9 for k, v in results.items() if v}
    lines = []
    for direction, raw_key, base_name in (
        ("put", "raw_w", "raw O_DIRECT sequential write"),
        ("get", "raw_r", "raw O_DIRECT sequential read"),
    ):
        for variant, key in (
            (VARIANT_ON, direction), (VARIANT_OFF, direction + "_off"),
            ("kvstore-unaligned", direction + "_u"),
        ):
            if key not in med:
                continue
            lines.append(
                {
                    "bench": BENCH,
                    "case": f"disk/{direction}",
                    "variant": variant,
                    "metric": "throughput",
                    "value": med[key],
                    "unit": "GB/s",
                    "baseline": base_name,
                    "baseline_value": med[raw_key],
                    "ratio": med[key] / med[raw_key],
                }
            )
        if direction + "_off" in med:
            on, off = med[direction], med[direction + "_off"]
            lines.append(mac_cost_line(BENCH, f"disk/{direction}", on, off))
    return lines


def _paired(
    fd: int,
    tiers: dict[str, DiskTier],
    ns_id: bytes,
    metas: list[Any],
    keys: list[bytes],
    raw_pages: list[np.ndarray],
    tier_pages: list[np.ndarray],
    batch: int,
) -> tuple[list[float], dict[str, list[float]]]:
    """Bytes per second of each batch, raw file and each tier, alternating batch by batch (the
    order rotates). The pages are sources (a write) when the tiers hold nothing yet, else
    destinations (a read). The raw side always uses aligned buffers: it stands for the
    device."""
    first = next(iter(tiers.values()))
    page = first.layout.page_bytes
    write = first.used_pages == 0
    raw: list[float] = []
    mine: dict[str, list[float]] = {name: [] for name in tiers}
    sides = ["raw", *tiers]
    for n, i in enumerate(range(0, len(raw_pages), batch)):
        nbytes = len(raw_pages[i : i + batch]) * page
        last = i + batch >= len(raw_pages)
        for side in sides[n % len(sides) :] + sides[: n % len(sides)]:
            t0 = time.perf_counter()
            if side == "raw":
                part = raw_pages[i : i + batch]
                if write:
                    disk_io.pwritev_all(fd, part, i * page)
                    if last:
                        os.fdatasync(fd)
                else:
                    got = disk_io.preadv_all(fd, part, i * page)
                    assert got == len(part) * page
                raw.append(nbytes / (time.perf_counter() - t0))
            else:
                part = tier_pages[i : i + batch]
                tier = tiers[side]
                if write:
                    ok = tier.write(metas[i : i + batch], part)
                else:
                    ok = tier.read(ns_id, keys[i : i + batch], part)
                mine[side].append(nbytes / (time.perf_counter() - t0))
                if not all(ok):
                    raise RuntimeError(f"disk tier {'refused' if write else 'missed'} pages")
    return raw, mine


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
