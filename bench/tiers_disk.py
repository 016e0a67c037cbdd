"""Disk tier throughput against the medium itself, measured in the same run and directory.

For the same bytes (``num_pages`` pages of the Llama-3-8B layout: 32 layers, 8 KV heads of 128,
16-token blocks, bf16 = 2 MiB a page), in batches of ``batch`` pages:

* **baseline** — raw O_DIRECT I/O on a plain, preallocated file in the same directory: each
  batch is one sequential ``pwritev`` (``preadv``) of the batch's pages at the next offset; the
  writes end with one ``fdatasync``. That is what one sequential stream gets from the device.
* **kvstore** — ``DiskTier.write`` / ``DiskTier.read`` of the same pages under their keys, from
  4096-aligned buffers, default options: every write batch is fdatasync'ed and its index commit
  synced before ``write`` returns; every read verifies header and payload checksums.
* **kvstore-unaligned** (only with ``args.unaligned``) — the same through buffers 64 bytes off
  alignment, so every page is copied through a bounce buffer: the price of handing the tier
  unaligned memory. Left out by default: the store hands the tier aligned buffers, and the
  target (>= 0.9 of the device) is about that path.

The baseline and the tier alternate batch by batch (which goes first alternates too), so both
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
    base = Path(getattr(args, "dir", None) or default_dir(total * 2))
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
    names = ("raw_w", "raw_r", "put", "get", "put_u", "get_u")
    results: dict[str, list[float]] = {k: [] for k in names}
    raw_src = list(_pages(num_pages, page, aligned=True, fill=True))
    raw_dst = list(_pages(num_pages, page, aligned=True, fill=False))
    for aligned, suffix in ((True, ""), (False, "_u"))[: 2 if unaligned else 1]:
        if aligned:
            src, dst = raw_src, list(_pages(num_pages, page, aligned=True, fill=False))
        else:
            src = list(_pages(num_pages, page, aligned=False, fill=True))
            dst = list(_pages(num_pages, page, aligned=False, fill=False))
        for rep in range(reps):
            raw_path, tier_path = work / "raw.dat", work / f"tier-{rep}{suffix}"
            fd = os.open(raw_path, os.O_RDWR | os.O_CREAT | disk_io.O_DIRECT, 0o644)
            try:
                os.posix_fallocate(fd, 0, total)  # the tier's slab is preallocated too
                with DiskTier("disk", layout, num_pages, path=tier_path) as tier:
                    raw, mine = _paired(fd, tier, ns.id, metas, keys, raw_src, src, batch)
                    results["raw_w"] += raw
                    results["put" + suffix] += mine
                    raw, mine = _paired(fd, tier, ns.id, metas, keys, raw_dst, dst, batch)
                    results["raw_r"] += raw
                    results["get" + suffix] += mine
                    if any(not np.array_equal(a, b) for a, b in zip(src, dst)):
                        raise RuntimeError("disk tier returned other bytes than were written")
            finally:
                os.close(fd)
                raw_path.unlink()
                shutil.rmtree(tier_path, ignore_errors=True)
    med = {k: statistics.median(v) / 1e9 for k, v in results.items() if v}
    lines = []
    for direction, raw_key, base_name in (
        ("put", "raw_w", "raw O_DIRECT sequential write"),
        ("get", "raw_r", "raw O_DIRECT sequential read"),
    ):
        for variant, key in (("kvstore", direction), ("kvstore-unaligned", direction + "_u")):
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
    return lines


def _paired(
    fd: int,
    tier: DiskTier,
    ns_id: bytes,
    metas: list[Any],
    keys: list[bytes],
    raw_pages: list[np.ndarray],
    tier_pages: list[np.ndarray],
    batch: int,
) -> tuple[list[float], list[float]]:
    """Bytes per second of each batch, raw file and tier, alternating batch by batch. The pages
    are sources (a write) when the tier holds nothing yet, else destinations (a read). The raw
    side always uses aligned buffers: it stands for the device."""
    page = tier.layout.page_bytes
    write = tier.used_pages == 0
    raw: list[float] = []
    mine: list[float] = []
    for n, i in enumerate(range(0, len(raw_pages), batch)):
        nbytes = len(raw_pages[i : i + batch]) * page
        last = i + batch >= len(raw_pages)
        for side in ("raw", "tier") if n % 2 == 0 else ("tier", "raw"):
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
                if write:
                    ok = tier.write(metas[i : i + batch], part)
                else:
                    ok = tier.read(ns_id, keys[i : i + batch], part)
                mine.append(nbytes / (time.perf_counter() - t0))
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
