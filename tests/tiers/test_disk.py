"""The disk tier against real files and a real LMDB: round trips, warm restart, SIGKILL at random
moments, damaged records and index, a full filesystem, concurrency, and the refusals.

``KVSTORE_CRASH_CYCLES`` raises the number of kill cycles (default 50) for a longer run;
``KVSTORE_TEST_FULLFS=rlimit`` forces the file-size-limit variant of the full-disk test.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from kvstore import ConfigError, KVLayout, Metrics, Namespace
from kvstore.errors import StoreClosed
from kvstore.record import header_bytes, stored_meta
from kvstore.tiers import disk_io
from kvstore.tiers.disk import DiskTier, aligned_empty
from tests.tiers.disk_child import (
    CRASH_CAPACITY,
    CRASH_LAYOUT,
    block_metas,
    expected_page,
    full_fs_scenario,
    in_buffer,
    namespace,
)

REPO = Path(__file__).resolve().parents[2]
LAYOUTS = {
    # 16 KiB pages: a multiple of 4096, so aligned buffers go straight to disk.
    "16k": KVLayout(num_layers=2, num_kv_heads=2, head_dim=64, block_size=16, dtype="float16"),
    # 4224-byte pages: 4096 bytes in place plus a 128-byte tail through scratch.
    "odd": KVLayout(num_layers=33, num_kv_heads=2, head_dim=4, block_size=4, dtype="float16"),
    # 256-byte pages: smaller than one O_DIRECT block.
    "tiny": KVLayout(num_layers=2, num_kv_heads=2, head_dim=4, block_size=4, dtype="float16"),
}
L16 = LAYOUTS["16k"]


@pytest.fixture
def disk_dir(tmp_path: Path) -> Path:
    return tmp_path / "disk"


@pytest.fixture
def open_tier(disk_dir: Path) -> Iterator:
    opened: list[DiskTier] = []

    def make(layout: KVLayout = L16, capacity: int = 32, **kw) -> DiskTier:
        kw.setdefault("path", disk_dir)
        kw.setdefault("check_index", False)
        tier = DiskTier.build("disk", layout, capacity, kw.pop("metrics", None), **kw)
        opened.append(tier)
        return tier

    yield make
    for t in opened:
        t.close()


def pages_for(metas, page_bytes: int, aligned: bool = True) -> list[np.ndarray]:
    return [in_buffer(expected_page(m.key, page_bytes), aligned) for m in metas]


def read_back(tier: DiskTier, keys: list[bytes], aligned: bool = True) -> tuple[list[bool], int]:
    """Read ``keys``; return the found flags and how many hits held other bytes than written."""
    pb = tier.layout.page_bytes
    outs = [in_buffer(np.zeros(pb, np.uint8), aligned) for _ in keys]
    found = tier.read(namespace(tier.layout).id, keys, outs)
    wrong = sum(
        1 for k, f, o in zip(keys, found, outs) if f and not np.array_equal(o, expected_page(k, pb))
    )
    return found, wrong


# ----------------------------------------------------------------- round trips


@pytest.mark.parametrize("name", sorted(LAYOUTS))
@pytest.mark.parametrize("o_direct", ["auto", False])
@pytest.mark.parametrize("aligned", [True, False])
def test_round_trip_random_pages(open_tier, name: str, o_direct, aligned: bool) -> None:
    layout = LAYOUTS[name]
    tier = open_tier(layout, 40, o_direct=o_direct, max_io_bytes=3 * 8192 * 2)
    metas = block_metas(layout, range(40))
    rng = random.Random(1)
    order = list(range(40))
    rng.shuffle(order)
    for start in range(0, 40, 7):
        batch = [metas[i] for i in order[start : start + 7]]
        pages = pages_for(batch, layout.page_bytes, aligned)
        assert tier.write(batch, pages) == [True] * len(batch)
    rng.shuffle(order)
    for start in range(0, 40, 9):
        keys = [metas[i].key for i in order[start : start + 9]]
        found, wrong = read_back(tier, keys, aligned)
        assert found == [True] * len(keys) and wrong == 0
    assert tier.meta(metas[3].key) == stored_meta(metas[3], False)
    assert tier.used_pages == 40 and tier.free_pages == 0
    s = tier.stats()
    assert (s.writes, s.hits, s.corrupt, s.errors) == (40, 40, 0, 0)
    bounced = tier.metrics.value("kvstore_disk_bounce_pages_total", tier="disk", op="read")
    if not aligned and tier.o_direct and layout.page_bytes >= disk_io.ALIGN:
        assert bounced == 40
    elif aligned:
        assert bounced == 0


def test_overwrite_delete_and_reuse(open_tier) -> None:
    tier = open_tier(L16, 4)
    metas = block_metas(L16, range(6))
    pb = L16.page_bytes
    assert tier.write(metas[:4], pages_for(metas[:4], pb)) == [True] * 4
    assert tier.write(metas[4:5], pages_for(metas[4:5], pb)) == [False]  # full: back-pressure
    assert tier.stats().errors == 0
    # Rewriting a key needs a free slot: the old one is freed only after the new commit.
    assert tier.delete([metas[0].key, metas[1].key]) == 2
    assert tier.write(metas[2:3], [in_buffer(expected_page(metas[2].key, pb), False)]) == [True]
    assert tier.write(metas[4:6], pages_for(metas[4:6], pb)) == [True, True]
    found, wrong = read_back(tier, [m.key for m in metas])
    assert found == [False, False, True, True, True, True] and wrong == 0


# ----------------------------------------------------------------- warm restart


def test_warm_restart(disk_dir: Path) -> None:
    metas = block_metas(L16, range(12))
    pb = L16.page_bytes
    with DiskTier.build("disk", L16, 16, path=disk_dir) as tier:
        assert all(tier.write(metas, pages_for(metas, pb)))
        tier.delete([metas[11].key])
        read_back(tier, [metas[2].key])  # most recently used
        time.sleep(0.01)
        read_back(tier, [metas[0].key])
    with DiskTier.build("disk", L16, 16, path=disk_dir) as tier:
        assert tier.used_pages == 11
        order = list(tier.keys())
        assert order[-2:] == [metas[2].key, metas[0].key]  # least recently used first
        keys = [m.key for m in metas]
        found, wrong = read_back(tier, keys)
        assert found == [True] * 11 + [False] and wrong == 0
        assert tier.meta(metas[5].key) == stored_meta(metas[5], False)
        # Free slots are known again: the tier fills to capacity, not beyond.
        more = block_metas(L16, range(100, 106))
        assert tier.write(more, pages_for(more, pb)) == [True] * 5 + [False]


def test_warm_restart_through_the_store(disk_dir: Path) -> None:
    """Pages a store wrote to its disk tier are lookup hits after the process restarts."""
    from kvstore import TieredStore

    ns = namespace(L16)
    chain = ns.chain(list(range(L16.block_size * 6)))
    pages = np.stack([expected_page(k, L16.page_bytes) for k in chain.keys])
    with DiskTier.build("disk", L16, 8, path=disk_dir) as tier:
        store = TieredStore(L16, [tier], ["lru"])
        assert store.put(chain.metas(), pages).stored == 6
    with DiskTier.build("disk", L16, 8, path=disk_dir) as tier:
        store = TieredStore(L16, [tier], ["lru"])
        assert store.lookup(chain.keys).num_blocks == 6
        out = np.zeros_like(pages)
        assert store.get(ns.id, chain.keys, out).found == (True,) * 6
        assert np.array_equal(out, pages)


def test_reopen_smaller_drops_pages_past_the_end(disk_dir: Path) -> None:
    metas = block_metas(L16, range(10))
    with DiskTier.build("disk", L16, 10, path=disk_dir) as tier:
        assert all(tier.write(metas, pages_for(metas, L16.page_bytes)))
    with DiskTier.build("disk", L16, 6, path=disk_dir) as tier:
        assert tier.used_pages == 6
        found, wrong = read_back(tier, [m.key for m in metas])
        assert sum(found) == 6 and wrong == 0
    with DiskTier.build("disk", L16, 10, path=disk_dir) as tier:
        assert tier.used_pages == 6 and tier.free_pages == 4


def test_last_access_is_not_a_transaction_per_read(open_tier, monkeypatch) -> None:
    from kvstore.tiers import disk_index

    tier = open_tier(L16, 8)
    metas = block_metas(L16, range(4))
    tier.write(metas, pages_for(metas, L16.page_bytes))
    commits = []
    real = disk_index.DiskIndex.commit
    monkeypatch.setattr(
        disk_index.DiskIndex, "commit", lambda s, *a: (commits.append(a), real(s, *a))
    )
    for _ in range(50):
        read_back(tier, [m.key for m in metas])
    assert commits == []
    tier.close()
    assert len(commits) == 1 and len(commits[0][0]) == 4  # one flush carries every atime


# ----------------------------------------------------------------- SIGKILL during writes


def _crash_cycles() -> int:
    return int(os.environ.get("KVSTORE_CRASH_CYCLES", "50"))


def test_sigkill_at_random_moments(tmp_path: Path) -> None:
    """A worker streams writes and evictions and is SIGKILLed at a random moment, again and again
    on one directory. After every kill the reopened index must name only pages that read back
    exactly as written, keep every acknowledged write, and hold no torn record."""
    directory = tmp_path / "crash"
    directory.mkdir()
    server = subprocess.Popen(
        [sys.executable, "-m", "tests.tiers.disk_child", "serve", str(directory)],
        cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1,
    )
    assert server.stdin is not None and server.stdout is not None
    rng = random.Random(1234)
    pb = CRASH_LAYOUT.page_bytes
    ns = namespace(CRASH_LAYOUT)
    acked: dict[str, bool] = {}
    log_pos = 0
    total_pages = 0
    try:
        for cycle in range(_crash_cycles()):
            server.stdin.write(f"run {rng.randrange(1 << 30)}\n")
            line = server.stdout.readline().split()
            ready = line == ["ready"]  # the worker may say it before the server says its pid
            if ready:
                line = server.stdout.readline().split()
            assert line[0] == "pid", line
            pid = int(line[1])
            if rng.random() < 0.1:
                time.sleep(rng.uniform(0, 0.02))  # sometimes while the tier is still opening
            else:
                if not ready:
                    line = server.stdout.readline().split()
                    assert line == ["ready"], line
                time.sleep(rng.uniform(0.0, 0.15))
            os.kill(pid, signal.SIGKILL)
            while not (line := server.stdout.readline()).startswith("dead"):
                assert line.strip() in ("ready",), line
            # Replay the worker's log: "+key" once write() returned True, "-key" before delete().
            with open(directory / "acked.log", "rb") as f:
                f.seek(log_pos)
                data = f.read()
            complete = data[: data.rfind(b"\n") + 1]
            log_pos += len(complete)
            for entry in complete.decode().split():
                acked[entry[1:]] = entry[0] == "+"
            check = cycle % 5 == 0  # the defensive index check, every fifth reopen
            with DiskTier.build(
                "crash", CRASH_LAYOUT, CRASH_CAPACITY, path=directory, check_index=check
            ) as tier:
                keys = list(tier.keys())
                outs = [aligned_empty(pb) for _ in keys]
                found = tier.read(ns.id, keys, outs)
                assert found == [True] * len(keys), f"cycle {cycle}: an index entry failed to read"
                for k, o in zip(keys, outs):
                    assert np.array_equal(o, expected_page(k, pb)), f"cycle {cycle}: wrong bytes"
                assert tier.stats().corrupt == 0
                must = {k for k, ok in acked.items() if ok}
                assert must <= {k.hex() for k in keys}, f"cycle {cycle}: lost acknowledged writes"
                total_pages += len(keys)
        assert not (directory / "wrong.log").exists()
        assert total_pages > 0
    finally:
        server.stdin.close()
        server.wait(timeout=10)


# ----------------------------------------------------------------- damaged records


def test_damaged_records_are_detected(open_tier, disk_dir: Path) -> None:
    """>= 1000 mutations of record bytes (bit flips, zeroed ranges, truncation, swapped slots,
    swapped headers, swapped payloads): every read is a miss or exactly the bytes written."""
    layout = L16
    pb = layout.page_bytes
    tier = open_tier(layout, 24, durability="none")
    metas = block_metas(layout, range(24))
    assert all(tier.write(metas, pages_for(metas, pb)))
    by_key = {m.key: m for m in metas}
    slab = disk_dir / "slots.dat"
    S, H, hb = tier.slot_bytes, tier.slot_bytes - disk_io.round_up(pb), header_bytes(layout)
    rng = random.Random(7)
    fd = os.open(slab, os.O_RDWR)

    def record(raw: bytes) -> bytes:  # the bytes of a slot that verification covers
        return raw[:hb] + raw[H : H + pb]

    def any_offset(slot: int) -> int:
        r = rng.randrange(hb + pb)
        return slot * S + (r if r < hb else H + r - hb)

    wrong = detected = undetected = mutations = 0
    kinds = ["flip", "zero", "truncate", "swap_slots", "swap_headers", "swap_payloads", "garbage"]
    try:
        while mutations < 1000:
            kind = kinds[rng.randrange(len(kinds))]
            keys = list(tier.keys())
            a, b = rng.sample(keys, 2)
            sa, sb = tier.slot_of(a), tier.slot_of(b)
            before = {k: os.pread(fd, S, tier.slot_of(k) * S) for k in (a, b)}
            if kind == "flip":
                off = any_offset(sa)
                os.pwrite(fd, bytes([os.pread(fd, 1, off)[0] ^ (1 << rng.randrange(8))]), off)
            elif kind in ("zero", "garbage"):
                off = any_offset(sa)
                n = min(rng.randint(1, 256), (sa + 1) * S - off)  # within slot a
                os.pwrite(fd, bytes(n) if kind == "zero" else rng.randbytes(n), off)
            elif kind == "truncate":
                os.ftruncate(fd, any_offset(sa))
            elif kind == "swap_slots":
                os.pwrite(fd, before[b], sa * S)
                os.pwrite(fd, before[a], sb * S)
            elif kind == "swap_headers":
                os.pwrite(fd, before[b][:H], sa * S)
                os.pwrite(fd, before[a][:H], sb * S)
            elif kind == "swap_payloads":
                os.pwrite(fd, before[b][H:], sa * S + H)
                os.pwrite(fd, before[a][H:], sb * S + H)
            if kind == "truncate":
                size = os.fstat(fd).st_size
                damaged = {k for k in keys if (tier.slot_of(k) + 1) * S > size}
            else:
                damaged = {
                    k for k, raw in before.items()
                    if record(os.pread(fd, S, tier.slot_of(k) * S)) != record(raw)
                }
            mutations += bool(damaged)
            found, bad = read_back(tier, keys)
            wrong += bad
            for k, f in zip(keys, found):
                if k in damaged:
                    detected += not f
                    undetected += f
                elif not f:
                    undetected += 1000  # an intact record must still read
            lost = [k for k, f in zip(keys, found) if not f]
            if kind == "truncate":
                os.ftruncate(fd, tier.capacity_pages * S)
            assert tier.used_pages == len(keys) - len(lost)
            restore = [by_key[k] for k in lost]
            assert all(tier.write(restore, pages_for(restore, pb)))
    finally:
        os.close(fd)
    assert wrong == 0
    assert undetected == 0 and detected >= mutations >= 1000
    corrupt = tier.stats().corrupt
    assert corrupt == detected
    reasons = {
        s.labels["reason"]
        for m in tier.metrics.corrupt.collect()
        for s in m.samples
        if s.name.endswith("_total")
    }
    assert {"truncated", "header_checksum", "payload_checksum", "key"} <= reasons


def test_wrong_namespace_is_a_miss_not_a_drop(open_tier) -> None:
    tier = open_tier(L16, 4)
    metas = block_metas(L16, range(2))
    tier.write(metas, pages_for(metas, L16.page_bytes))
    other = Namespace("disk-test", L16, "someone-else")
    out = [aligned_empty(L16.page_bytes) for _ in metas]
    assert tier.read(other.id, [m.key for m in metas], out) == [False, False]
    assert tier.used_pages == 2


# ----------------------------------------------------------------- damaged index


@pytest.mark.parametrize("damage", ["garbage", "zero_meta_pages", "truncate", "scribble"])
def test_damaged_index_never_stops_the_tier(disk_dir: Path, damage: str, caplog) -> None:
    metas = block_metas(L16, range(20))
    pb = L16.page_bytes
    with DiskTier.build("disk", L16, 32, path=disk_dir) as tier:
        assert all(tier.write(metas, pages_for(metas, pb)))
    data = disk_dir / "index" / "data.mdb"
    size = data.stat().st_size
    rng = random.Random(3)
    with open(data, "r+b") as f:
        if damage == "garbage":
            f.write(rng.randbytes(size))
        elif damage == "zero_meta_pages":
            f.write(bytes(8192))
        elif damage == "truncate":
            f.truncate(100)
        else:
            for _ in range(64):
                f.seek(rng.randrange(8192, size - 8))
                f.write(rng.randbytes(8))
    caplog.set_level(logging.WARNING, logger="kvstore.tiers.disk")
    with DiskTier.build("disk", L16, 32, path=disk_dir) as tier:
        if damage != "scribble":
            assert tier.used_pages == 0
            said = [r.getMessage() for r in caplog.records]
            assert any("damaged" in m and "moved" in m for m in said)
            assert list(disk_dir.glob("index.corrupt-*"))
        found, wrong = read_back(tier, [m.key for m in metas])
        assert wrong == 0
        more = block_metas(L16, range(100, 104))
        tier.delete(list(tier.keys())[:4])
        assert tier.write(more, pages_for(more, pb)) == [True] * 4
        found, wrong = read_back(tier, [m.key for m in more])
        assert found == [True] * 4 and wrong == 0


# ----------------------------------------------------------------- full filesystem, I/O errors


def _mount_tmpfs(where: Path, size: str) -> bool:
    where.mkdir()
    try:
        proc = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "kvstore-test", str(where)],
            capture_output=True, timeout=20, check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return proc.returncode == 0


def test_full_filesystem_refuses_then_resumes(tmp_path: Path) -> None:
    """A size-limited tmpfs mount where we may mount one (big enough for the tier to open,
    then filled by another file), else a file-size limit on a child."""
    mnt = tmp_path / "small"
    limit = 3 << 20
    use_mount = os.environ.get("KVSTORE_TEST_FULLFS") != "rlimit" and _mount_tmpfs(mnt, "16m")
    if use_mount:
        try:
            result = full_fs_scenario(mnt / "disk", leave_free=limit)
        finally:
            subprocess.run(["umount", str(mnt)], check=False, timeout=20)
    else:
        child = ["-m", "tests.tiers.disk_child", "fullfs", str(tmp_path / "disk"), str(limit)]
        proc = subprocess.run(
            [sys.executable, *child],
            cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
        )
        assert proc.returncode == 0, proc.stderr
        result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["exception"] is None
    assert result["refused"] > 0 and result["errors_after_fill"] >= 1, result
    assert result["streak"] == 3 and result["errors_counted"] == 1, result
    assert result["logged_during_streak"] == 0  # once per condition, not once per write
    assert result["read_after_fill"] == result["num_stored"] > 8
    assert result["deleted"] == 8
    assert result["resumed"] == [True] * 4
    assert result["read_after_resume"] == result["num_kept"]
    assert result["wrong"] == 0
    refusals = [m for m in result["messages"] if "refuses writes" in m]
    assert refusals and any(w in refusals[0] for w in ("filesystem is full", "file-size limit"))
    assert "succeed again" in result["messages"][-1]


def test_io_error_refuses_writes_and_reads_keep_working(open_tier, monkeypatch, caplog) -> None:
    import errno as errno_

    tier = open_tier(L16, 16)
    metas = block_metas(L16, range(8))
    pb = L16.page_bytes
    assert all(tier.write(metas[:4], pages_for(metas[:4], pb)))

    def eio(*_a, **_k):
        raise OSError(errno_.EIO, os.strerror(errno_.EIO))

    monkeypatch.setattr(disk_io, "pwritev_all", eio)
    caplog.set_level(logging.ERROR, logger="kvstore.tiers.disk")
    assert tier.write(metas[4:6], pages_for(metas[4:6], pb)) == [False, False]
    assert tier.write(metas[6:8], pages_for(metas[6:8], pb)) == [False, False]
    assert tier.stats().errors == 2 and tier.stats().writes_refused == 4
    assert len([r for r in caplog.records if "refuses writes" in r.getMessage()]) == 1
    assert tier.used_pages == 4 and tier.contains([metas[4].key]) == [False]
    found, wrong = read_back(tier, [m.key for m in metas[:4]])
    assert found == [True] * 4 and wrong == 0
    monkeypatch.undo()
    assert tier.write(metas[4:8], pages_for(metas[4:8], pb)) == [True] * 4
    assert tier.used_pages == 8
    # A read error is a miss and an error, not a corrupt page: nothing is dropped.
    monkeypatch.setattr(disk_io, "preadv_all", eio)
    found, _ = read_back(tier, [m.key for m in metas])
    assert found == [False] * 8 and tier.used_pages == 8
    s = tier.stats()
    assert s.errors == 2 + 1 and s.corrupt == 0
    monkeypatch.undo()
    found, wrong = read_back(tier, [m.key for m in metas])
    assert found == [True] * 8 and wrong == 0


# ----------------------------------------------------------------- concurrency


def test_concurrent_readers_writers_and_deleters(open_tier, disk_dir: Path) -> None:
    tier = open_tier(L16, 20, io_threads=3)
    pb = L16.page_bytes
    metas = block_metas(L16, range(30))
    errors: list[str] = []
    stop = threading.Event()

    def writer(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for _ in range(80):
                batch = rng.sample(metas, rng.randint(1, 6))
                tier.write(batch, pages_for(batch, pb, aligned=rng.random() < 0.5))
                tier.delete([m.key for m in rng.sample(metas, rng.randint(0, 5))])
        except Exception as exc:  # noqa: BLE001
            errors.append(repr(exc))

    def reader(seed: int) -> None:
        rng = random.Random(seed)
        try:
            while not stop.is_set():
                keys = [m.key for m in rng.sample(metas, 8)]
                _, wrong = read_back(tier, keys, aligned=rng.random() < 0.5)
                if wrong:
                    errors.append(f"{wrong} wrong pages")
        except Exception as exc:  # noqa: BLE001
            errors.append(repr(exc))

    writers = [threading.Thread(target=writer, args=(i,)) for i in range(3)]
    readers = [threading.Thread(target=reader, args=(10 + i,)) for i in range(3)]
    for t in writers + readers:
        t.start()
    for t in writers:
        t.join()
    stop.set()
    for t in readers:
        t.join()
    assert errors == []
    s = tier.stats()
    assert s.corrupt == 0 and s.errors == 0 and tier.used_pages <= 20
    keys = list(tier.keys())
    tier.close()
    with DiskTier.build("disk", L16, 20, path=disk_dir) as again:
        assert sorted(again.keys()) == sorted(keys)
        found, wrong = read_back(again, keys)
        assert all(found) and wrong == 0


# ----------------------------------------------------------------- refusals and options


def test_directory_opened_twice_in_one_process(open_tier, disk_dir: Path) -> None:
    open_tier(L16, 4)
    with pytest.raises(ConfigError, match="already open.*this process"):
        DiskTier.build("again", L16, 4, path=disk_dir)


def test_directory_opened_by_another_process(disk_dir: Path) -> None:
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.tiers.disk_child", "hold", str(disk_dir)],
        cwd=REPO, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        with pytest.raises(ConfigError, match=f"already open.*process {child.pid}"):
            DiskTier.build("disk", CRASH_LAYOUT, 4, path=disk_dir)
    finally:
        child.kill()
        child.wait()
    with DiskTier.build("disk", CRASH_LAYOUT, 4, path=disk_dir) as tier:  # free once it is gone
        assert tier.used_pages == 0


def test_network_filesystem_refused_unless_allowed(open_tier, monkeypatch) -> None:
    monkeypatch.setattr(disk_io, "filesystem_type", lambda _p: "nfs4")
    with pytest.raises(ConfigError, match="network filesystem.*nfs4") as info:
        open_tier(L16, 4)
    assert "allow_network_fs" in str(info.value)
    tier = open_tier(L16, 4, allow_network_fs=True)
    assert tier.filesystem == "nfs4"


def test_o_direct_fallback_is_logged(open_tier, monkeypatch, caplog) -> None:
    monkeypatch.setattr(disk_io, "probe_o_direct", lambda _d: "Invalid argument (errno 22)")
    with pytest.raises(ConfigError, match="refuses O_DIRECT"):
        open_tier(L16, 4, o_direct=True)
    caplog.set_level(logging.WARNING, logger="kvstore.tiers.disk")
    tier = open_tier(L16, 4, o_direct="auto")
    assert not tier.o_direct
    assert any("buffered I/O" in r.getMessage() for r in caplog.records)
    metas = block_metas(L16, range(3))
    assert all(tier.write(metas, pages_for(metas, L16.page_bytes, aligned=False)))
    found, wrong = read_back(tier, [m.key for m in metas], aligned=False)
    assert all(found) and wrong == 0


def test_another_layout_in_the_directory_is_refused(disk_dir: Path) -> None:
    with DiskTier.build("disk", L16, 4, path=disk_dir):
        pass
    with pytest.raises(ConfigError, match="another geometry"):
        DiskTier.build("disk", LAYOUTS["odd"], 4, path=disk_dir)


def test_unusable_directory_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="cannot use directory"):
        DiskTier.build("disk", L16, 4, path=tmp_path / "file" / "sub")


def test_closed_tier_refuses_work(disk_dir: Path) -> None:
    metas = block_metas(L16, range(2))
    tier = DiskTier.build("disk", L16, 4, Metrics(), path=disk_dir)
    tier.write(metas, pages_for(metas, L16.page_bytes))
    tier.close()
    tier.close()
    with pytest.raises(StoreClosed, match="tier 'disk' is closed"):
        tier.read(namespace(L16).id, [metas[0].key], [aligned_empty(L16.page_bytes)])
    with pytest.raises(StoreClosed, match="tier 'disk' is closed"):
        tier.write(metas, pages_for(metas, L16.page_bytes))


def test_unused_directory_cleans_up(tmp_path: Path) -> None:
    """A failed open releases the directory lock (and nothing stays half-open)."""
    d = tmp_path / "disk"
    with DiskTier.build("disk", L16, 4, path=d):
        pass
    with pytest.raises(ConfigError):
        DiskTier.build("disk", LAYOUTS["odd"], 4, path=d)
    with DiskTier.build("disk", L16, 4, path=d) as tier:
        assert tier.used_pages == 0
    shutil.rmtree(d)
