"""Child processes and shared helpers of ``tests/tiers/test_disk.py``.

Run as ``python -m tests.tiers.disk_child MODE ...`` from the repository root:

* ``serve DIR`` — a fork server for the crash test. It imports everything once, then for each
  ``run SEED`` line on stdin forks a worker that opens a DiskTier on DIR and streams writes,
  evictions and reads until it is killed; it prints ``pid N``, the worker prints ``ready`` once
  the tier is open, and the server prints ``dead N STATUS`` when the worker is gone. Forking from
  an idle, single-threaded server costs milliseconds; starting Python costs half a second.
* ``hold DIR`` — open a DiskTier on DIR, print ``ready`` and sleep (to be killed).
* ``ack DIR N`` — open a DiskTier on DIR with a group commit that never comes in time (60 s),
  write N pages in batches of 4, print ``acked`` and the hex keys ``write`` acknowledged, and
  sleep (to be SIGKILLed before any group commit ran).
* ``fullfs DIR LIMIT_BYTES`` — run :func:`full_fs_scenario` under ``RLIMIT_FSIZE`` (SIGXFSZ
  ignored, so writes past the limit fail with EFBIG) and print its result as JSON.

Every worker writes pages whose bytes are a function of their key (:func:`expected_page`), so
whoever reads a page back can tell whether it holds exactly what was written.
"""

from __future__ import annotations

import json
import logging
import os
import random
import resource
import signal
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from kvstore import KVLayout, Metrics, Namespace
from kvstore.keys import BlockMeta
from kvstore.tiers.disk import DiskTier, aligned_empty

#: 4 layers, 2 KV heads of 64, 16-token blocks, fp16: 32 KiB pages.
CRASH_LAYOUT = KVLayout(num_layers=4, num_kv_heads=2, head_dim=64, block_size=16, dtype="float16")
CRASH_CAPACITY = 48
CRASH_POOL = 160
#: 16 layers, 2 KV heads of 64, 16-token blocks, fp16: 128 KiB pages.
FULL_LAYOUT = KVLayout(num_layers=16, num_kv_heads=2, head_dim=64, block_size=16, dtype="float16")
FULL_CAPACITY = 64


def namespace(layout: KVLayout) -> Namespace:
    return Namespace("disk-test", layout, "tenant")


def block_metas(layout: KVLayout, ids: range | list[int]) -> list[BlockMeta]:
    """One single-block prefix per id: independent keys whose tokens encode the id."""
    ns = namespace(layout)
    return [ns.chain([i] + [7] * (layout.block_size - 1)).meta(0) for i in ids]


def expected_page(key: bytes, page_bytes: int) -> np.ndarray:
    """The bytes every test writes under ``key``."""
    rng = np.random.default_rng(int.from_bytes(key[:8], "little"))
    return np.frombuffer(rng.bytes(page_bytes), dtype=np.uint8)


def in_buffer(page: np.ndarray, aligned: bool) -> np.ndarray:
    """``page`` copied into a 4096-aligned buffer, or into one 64 bytes off alignment."""
    raw = aligned_empty(page.nbytes + 4096)
    buf = raw[: page.nbytes] if aligned else raw[64 : 64 + page.nbytes]
    buf[:] = page
    return buf


# ----------------------------------------------------------------- crash test worker


def crash_worker(directory: Path, seed: int) -> None:
    """Stream writes, evictions, deletes and reads until killed. Each acknowledged write is
    logged as ``+key`` after ``write`` returned True; each delete as ``-key`` before it is
    issued. A read that returns other bytes is logged in ``wrong.log``."""
    layout, page_bytes = CRASH_LAYOUT, CRASH_LAYOUT.page_bytes
    metas = block_metas(layout, range(CRASH_POOL))
    ns = namespace(layout)
    rng = random.Random(seed)
    tier = DiskTier.build(
        "crash", layout, CRASH_CAPACITY, path=directory, io_threads=2,
        check_index=False, durability=rng.choice(("group", "group", "batch", "none")),
    )
    _say("ready")
    log_fd = os.open(directory / "acked.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    out = aligned_empty(8 * page_bytes).reshape(8, page_bytes)
    while True:
        batch = [metas[i] for i in rng.sample(range(CRASH_POOL), rng.randint(1, 8))]
        need = len(batch) - tier.free_pages
        if need > 0 or rng.random() < 0.1:
            stored = list(tier.keys())
            victims = rng.sample(stored, min(len(stored), max(need, 0) + rng.randint(0, 3)))
            os.write(log_fd, b"".join(b"-%s\n" % v.hex().encode() for v in victims))
            tier.delete(victims)
        pages = [in_buffer(expected_page(m.key, page_bytes), rng.random() < 0.7) for m in batch]
        ok = tier.write(batch, pages)
        os.write(log_fd, b"".join(b"+%s\n" % m.key.hex().encode() for m, f in zip(batch, ok) if f))
        if rng.random() < 0.3:
            keys = [m.key for m in batch]
            found = tier.read(ns.id, keys, list(out[: len(keys)]))
            for k, f, buf in zip(keys, found, out):
                if f and not np.array_equal(buf, expected_page(k, page_bytes)):
                    with open(directory / "wrong.log", "a") as w:
                        w.write(k.hex() + "\n")


def serve(directory: Path) -> None:
    for line in sys.stdin:
        cmd, _, arg = line.strip().partition(" ")
        if cmd != "run":
            return
        pid = os.fork()
        if pid == 0:
            try:
                crash_worker(directory, int(arg))
            except BaseException as exc:  # noqa: BLE001 - report, never return into the server
                print(f"error {type(exc).__name__}: {exc}", flush=True)
            finally:
                os._exit(1)
        _say(f"pid {pid}")
        _, status = os.waitpid(pid, 0)
        _say(f"dead {pid} {status}")


def _say(line: str) -> None:
    """One line in one write: the server and its worker share stdout (print may split it)."""
    sys.stdout.flush()
    os.write(1, (line + "\n").encode())


def hold(directory: Path) -> None:
    DiskTier.build("hold", CRASH_LAYOUT, 4, path=directory, check_index=False)
    print("ready", flush=True)
    time.sleep(120)


def ack_then_wait(directory: Path, n: int) -> None:
    layout = CRASH_LAYOUT
    tier = DiskTier.build("ack", layout, CRASH_CAPACITY, path=directory, check_index=False,
                    durability="group", sync_interval_ms=60_000)
    metas = block_metas(layout, range(n))
    acked: list[str] = []
    for i in range(0, n, 4):
        batch = metas[i : i + 4]
        pages = [in_buffer(expected_page(m.key, layout.page_bytes), True) for m in batch]
        acked += [m.key.hex() for m, ok in zip(batch, tier.write(batch, pages)) if ok]
    _say("acked " + " ".join(acked) + (" unsynced" if tier.unsynced else " synced"))
    time.sleep(120)


# ----------------------------------------------------------------- full filesystem


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def full_fs_scenario(directory: Path, leave_free: int | None = None) -> dict[str, Any]:
    """Fill a disk tier whose directory cannot hold its capacity; then evict and write again.
    The tier's slab is sparse (a capacity that cannot be preallocated is refused at open);
    with ``leave_free``, once it is open another file takes all but that many bytes of the
    filesystem. Returns what happened, for the test to judge."""
    layout, page_bytes = FULL_LAYOUT, FULL_LAYOUT.page_bytes
    handler = _Records()
    logger = logging.getLogger("kvstore.tiers.disk")
    logger.addHandler(handler)
    metrics = Metrics()
    ns = namespace(layout)
    metas = block_metas(layout, range(2 * FULL_CAPACITY))
    result: dict[str, Any] = {"refused": 0, "stored": [], "wrong": 0, "exception": None}
    stored: list[bytes] = []
    fresh = iter(metas)

    def put(n: int) -> list[bool]:
        batch = [next(fresh) for _ in range(n)]
        ok = tier.write(batch, [expected_page(m.key, page_bytes) for m in batch])
        stored.extend(m.key for m, f in zip(batch, ok) if f)
        return ok

    try:
        with DiskTier.build(
            "full", layout, FULL_CAPACITY, metrics, path=directory, preallocate=False
        ) as tier:
            if leave_free is not None:
                _fill_all_but(directory.parent / "filler", leave_free)
            while len(stored) + 4 <= FULL_CAPACITY and not result["refused"]:
                result["refused"] += put(4).count(False)
            result["errors_after_fill"] = tier.stats().errors
            # A full disk keeps refusing, counting every refusal and logging it once. (A write
            # may still fit where a refused run had allocated blocks before space ran out.)
            streak = 0
            for _ in range(20):
                logged = len(handler.messages)
                errors = tier.stats().errors
                if put(2) == [False, False]:
                    streak += 1
                    result["errors_counted"] = tier.stats().errors - errors
                    if streak > 1:
                        result["logged_during_streak"] = len(handler.messages) - logged
                    if streak == 3:
                        break
                else:
                    streak = 0
            result["streak"] = streak
            result["read_after_fill"] = _read_check(tier, ns, stored, result)
            result["num_stored"] = len(stored)
            result["deleted"] = tier.delete(stored[:8])
            del stored[:8]
            result["resumed"] = put(4)
            result["read_after_resume"] = _read_check(tier, ns, stored, result)
            result["num_kept"] = len(stored)
            result["errors"] = tier.stats().errors
    except Exception as exc:  # noqa: BLE001 - the test asserts there was none
        result["exception"] = f"{type(exc).__name__}: {exc}"
    finally:
        logger.removeHandler(handler)
    result["messages"] = handler.messages
    return result


def _fill_all_but(filler: Path, leave_free: int) -> None:
    """Grow ``filler`` until its filesystem has at most ``leave_free`` bytes free."""
    with open(filler, "wb") as f:
        while True:
            st = os.statvfs(filler)
            extra = st.f_bavail * st.f_frsize - leave_free
            if extra <= 0:
                return
            f.write(bytes(min(extra, 1 << 20)))
            f.flush()


def _read_check(tier: DiskTier, ns: Namespace, keys: list[bytes], result: dict[str, Any]) -> int:
    page_bytes = tier.layout.page_bytes
    out = aligned_empty(max(1, len(keys)) * page_bytes).reshape(-1, page_bytes)
    found = tier.read(ns.id, keys, list(out[: len(keys)]))
    for k, f, buf in zip(keys, found, out):
        if f and not np.array_equal(buf, expected_page(k, page_bytes)):
            result["wrong"] += 1
    return sum(found)


def fullfs_with_rlimit(directory: Path, limit_bytes: int) -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))
    print(json.dumps(full_fs_scenario(directory)), flush=True)


if __name__ == "__main__":
    mode, where = sys.argv[1], Path(sys.argv[2])
    if mode == "serve":
        serve(where)
    elif mode == "hold":
        hold(where)
    elif mode == "ack":
        ack_then_wait(where, int(sys.argv[3]))
    elif mode == "fullfs":
        fullfs_with_rlimit(where, int(sys.argv[3]))
    else:
        raise SystemExit(f"unknown mode {mode!r}")
