"""The disk tier against real faults of its filesystem and its index: a capacity that does not
fit, an absurd capacity, one changed byte in the stored geometry, damage that only a commit
shows, and a full filesystem at open.

Filesystems are small real ones that each test mounts in its own temporary directory and
unmounts after (a tmpfs, or an ext4 image on a loop device: ext4 keeps what a failed
``fallocate`` got, tmpfs gives it back), so no test fills a shared filesystem.
"""

from __future__ import annotations

import errno
import logging
import os
import random
import re
import shutil
import struct
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import lmdb
import numpy as np
import pytest

from kvstore import ConfigError, KVLayout
from kvstore.errors import KVStoreError
from kvstore.tiers import disk_io
from kvstore.tiers.disk import DiskTier
from tests.tiers.disk_child import block_metas, expected_page, in_buffer, namespace

L16 = KVLayout(num_layers=2, num_kv_heads=2, head_dim=64, block_size=16, dtype="float16")
PB = L16.page_bytes


@contextmanager
def small_filesystem(tmp_path: Path, kind: str, size_mib: int) -> Iterator[Path]:
    """Mount a ``size_mib`` MiB tmpfs or ext4 (loop) filesystem under ``tmp_path``."""
    mnt = tmp_path / f"{kind}-mnt"
    mnt.mkdir()
    if kind == "tmpfs":
        cmd = ["mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "kvstore-test", str(mnt)]
    else:
        image = tmp_path / "ext4.img"
        with open(image, "wb") as f:
            f.truncate(size_mib << 20)
        mkfs = subprocess.run(
            ["mkfs.ext4", "-q", "-F", str(image)], capture_output=True, text=True, check=False
        )
        if mkfs.returncode != 0:
            pytest.skip(f"cannot make an ext4 image here: {mkfs.stderr.strip()}")
        cmd = ["mount", "-o", "loop", str(image), str(mnt)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a small {kind} filesystem (needs root): {proc.stderr.strip()}")
    try:
        yield mnt
    finally:
        # Lazily when busy: a tier that a failing test left open must not keep it mounted.
        if subprocess.run(["umount", str(mnt)], capture_output=True, check=False).returncode:
            subprocess.run(["umount", "-l", str(mnt)], check=False, timeout=30)


def free_bytes(path: Path) -> int:
    """Free bytes of the filesystem, counting the blocks ext4 keeps for root (we are root)."""
    st = os.statvfs(path)
    return st.f_bfree * st.f_frsize


def fill(mnt: Path) -> Path:
    """Write a file until the filesystem refuses another byte; return it."""
    filler = mnt / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        for chunk in (1 << 20, 4096, 512, 1):
            try:
                while True:
                    os.write(fd, bytes(chunk))
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
    finally:
        os.close(fd)
    return filler


def write_pages(tier: DiskTier, ids: range) -> list[bytes]:
    metas = block_metas(L16, ids)
    pages = [in_buffer(expected_page(m.key, PB), True) for m in metas]
    assert tier.write(metas, pages) == [True] * len(metas)
    return [m.key for m in metas]


def read_ok(tier: DiskTier, keys: list[bytes]) -> list[bool]:
    """Found flags of ``keys``; asserts that every hit holds exactly the bytes written."""
    outs = [in_buffer(np.zeros(PB, np.uint8), True) for _ in keys]
    found = tier.read(namespace(L16).id, keys, outs)
    for k, f, o in zip(keys, found, outs):
        assert not f or bytes(o) == bytes(expected_page(k, PB))
    return found


# ----------------------------------------------------------------- 4: capacity vs free space


@pytest.mark.parametrize("kind", ["ext4", "tmpfs"])
def test_mistyped_capacity_is_refused_before_anything_is_reserved(tmp_path: Path, kind) -> None:
    with small_filesystem(tmp_path, kind, 32) as mnt:
        before = free_bytes(mnt)
        with pytest.raises(ConfigError, match="capacity_pages=1073741824") as info:
            DiskTier.build("disk", L16, 2**30, path=mnt / "disk")
        assert "lower the disk tier's capacity" in info.value.hint
        # Nothing was reserved, visibly or not (a directory and a lock file take a few blocks).
        assert free_bytes(mnt) >= before - (64 << 10)
        with DiskTier.build("disk", L16, 16, path=mnt / "disk") as tier:
            keys = write_pages(tier, range(8))
            assert read_ok(tier, keys) == [True] * 8
        with DiskTier.build("disk", L16, 16, path=mnt / "disk") as tier:
            assert tier.used_pages == 8
        assert free_bytes(mnt) > before // 2


def test_capacity_just_over_free_space_is_refused_and_the_hint_fits(tmp_path: Path) -> None:
    with small_filesystem(tmp_path, "ext4", 32) as mnt:
        before = free_bytes(mnt)
        slot = 16384 + 4096  # one page of L16 and its header region
        over = before // slot + 1
        with pytest.raises(ConfigError, match=f"capacity_pages={over}") as info:
            DiskTier.build("disk", L16, over, path=mnt / "disk")
        assert free_bytes(mnt) >= before - (64 << 10)
        fits = int(re.search(r"at most (\d+)", info.value.hint).group(1))
        assert 0 < fits < over
        with DiskTier.build("disk", L16, fits, path=mnt / "disk") as tier:
            assert (mnt / "disk" / "slots.dat").stat().st_blocks * 512 >= fits * tier.slot_bytes
            keys = write_pages(tier, range(fits - 4, fits))
            assert read_ok(tier, keys) == [True] * 4


def test_failed_preallocation_gives_back_what_it_got(tmp_path: Path) -> None:
    with small_filesystem(tmp_path, "ext4", 32) as mnt:
        before = free_bytes(mnt)
        fd = os.open(mnt / "slab", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            os.pwrite(fd, b"x" * 4096, 0)  # one block of data in a sparse 1 MiB file
            os.ftruncate(fd, 1 << 20)
            with pytest.raises(OSError) as info:
                disk_io.preallocate(fd, 4 * before)
            assert info.value.errno == errno.ENOSPC
            st = os.fstat(fd)
            # The data block, and at most an extent block of the filesystem's own.
            assert st.st_size == 1 << 20 and 4096 <= st.st_blocks * 512 <= 8192
            assert os.pread(fd, 4096, 0) == b"x" * 4096
        finally:
            os.close(fd)
        assert free_bytes(mnt) >= before - (64 << 10)


def test_failed_reservation_beyond_eof_gives_back_what_it_got(tmp_path: Path) -> None:
    with small_filesystem(tmp_path, "ext4", 32) as mnt:
        before = free_bytes(mnt)
        fd = os.open(mnt / "data.mdb", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            os.pwrite(fd, b"x" * 8192, 0)
            assert disk_io.reserve_beyond_eof(fd, 4 * before) is False
            assert os.fstat(fd).st_size == 8192
            assert disk_io.reserve_beyond_eof(fd, 1 << 20) is True
            assert os.fstat(fd).st_blocks * 512 >= 8192 + (1 << 20)
        finally:
            os.close(fd)
        assert free_bytes(mnt) >= before - (1 << 20) - (64 << 10)


# ----------------------------------------------------------------- 5: absurd capacity


def test_absurd_capacity_is_refused_and_the_index_survives(tmp_path: Path) -> None:
    with small_filesystem(tmp_path, "tmpfs", 16) as mnt:
        d = mnt / "disk"
        with DiskTier.build("disk", L16, 32, path=d) as tier:
            keys = write_pages(tier, range(10))
        with pytest.raises(ConfigError, match="capacity_pages=1099511627776"):
            DiskTier.build("disk", L16, 2**40, path=d)
        assert not list(d.glob("index.corrupt-*"))
        with DiskTier.build("disk", L16, 32, path=d) as tier:
            assert tier.used_pages == 10
            assert read_ok(tier, keys) == [True] * 10


# ----------------------------------------------------------------- 6: damage in the index


def _index_file(d: Path) -> Path:
    return d / "index" / "data.mdb"


def _stored_geometry(d: Path) -> bytes:
    env = lmdb.open(str(d / "index"), readonly=True, lock=False, max_dbs=4)
    try:
        meta = env.open_db(b"meta", create=False)
        with env.begin() as txn:
            return bytes(txn.get(b"geometry", db=meta))
    finally:
        env.close()


def _flip_everywhere(path: Path, needle: bytes, pos: int, new: int) -> None:
    """Set byte ``pos`` of every copy of ``needle`` in the file to ``new`` (LMDB's
    copy-on-write leaves older copies in free pages; change them all alike)."""
    raw = bytearray(path.read_bytes())
    hits = [m.start() for m in re.finditer(re.escape(needle), raw)]
    assert hits
    for at in hits:
        raw[at + pos] = new
    path.write_bytes(bytes(raw))


def _geometry_damage_cases() -> list[str]:
    rng = random.Random(16)
    return ["digit"] + [f"byte{rng.randrange(1000)}" for _ in range(5)]


@pytest.mark.parametrize("case", _geometry_damage_cases())
def test_changed_geometry_byte_is_damage_not_another_layout(tmp_path: Path, case, caplog) -> None:
    d = tmp_path / "disk"
    with DiskTier.build("disk", L16, 32, path=d) as tier:
        write_pages(tier, range(10))
    stored = _stored_geometry(d)
    if case == "digit":  # still well-formed JSON: a page size that is not ours
        pos = stored.index(b'"page_bytes"') + stored[stored.index(b'"page_bytes"') :].index(b"1")
        new = ord("2")
    else:
        pos = int(case[4:]) % len(stored)
        new = stored[pos] ^ 0x10
    _flip_everywhere(_index_file(d), stored, pos, new)
    caplog.set_level(logging.WARNING, logger="kvstore.tiers.disk")
    with DiskTier.build("disk", L16, 32, path=d) as tier:
        assert tier.used_pages == 0
        assert list(d.glob("index.corrupt-*"))
        assert any("damaged" in r.getMessage() for r in caplog.records)
        keys = write_pages(tier, range(20, 24))
    with DiskTier.build("disk", L16, 32, path=d) as tier:
        assert sorted(tier.keys()) == sorted(keys)


def _mark_free_list_as_subdatabase(path: Path) -> None:
    """Set F_SUBDATA on the first record of LMDB's free-page list: damage that every read and
    the old start-up probe pass, while every commit fails with MDB_INCOMPATIBLE.

    A meta page (pages 0 and 1; the newer one has the larger txnid) holds after its 16-byte page
    header: magic u32, version u32, address u64, mapsize u64, then two MDB_db records of 48
    bytes (free list, main): pad u32 (the page size), flags u16, depth u16, branch, leaf and
    overflow page counts, entries, root (u64 each); then last page u64 and txnid u64. A leaf
    page holds u16 node offsets from byte 16; a node starts with lo u16, hi u16, flags u16."""
    raw = bytearray(path.read_bytes())
    metas = []
    for base in (0, 4096):
        psize = struct.unpack_from("<I", raw, base + 40)[0]
        root = struct.unpack_from("<Q", raw, base + 40 + 40)[0]
        txnid = struct.unpack_from("<Q", raw, base + 16 + 24 + 96 + 8)[0]
        metas.append((txnid, psize, root))
    _, psize, root = max(metas)
    assert root != 2**64 - 1, "the free list is empty"
    page = root * psize
    assert struct.unpack_from("<H", raw, page + 10)[0] & 0x02, "the free list's root is a leaf"
    node = page + struct.unpack_from("<H", raw, page + 16)[0]
    flags = struct.unpack_from("<H", raw, node + 4)[0]
    struct.pack_into("<H", raw, node + 4, flags | 0x02)
    path.write_bytes(bytes(raw))


def _tier_with_a_free_list(d: Path) -> list[bytes]:
    with DiskTier.build("disk", L16, 32, path=d) as tier:
        keys = write_pages(tier, range(12))
        tier.delete(keys[:4])
        write_pages(tier, range(4, 8))  # replaced: more freed pages
    return keys[4:]


def test_start_up_probe_commits_to_every_database(tmp_path: Path, caplog) -> None:
    d = tmp_path / "disk"
    _tier_with_a_free_list(d)
    _mark_free_list_as_subdatabase(_index_file(d))
    caplog.set_level(logging.WARNING, logger="kvstore.tiers.disk")
    with DiskTier.build("disk", L16, 32, path=d) as tier:  # check_index defaults to True
        assert tier.used_pages == 0
        assert list(d.glob("index.corrupt-*"))
        keys = write_pages(tier, range(40, 44))
    with DiskTier.build("disk", L16, 32, path=d) as tier:
        assert sorted(tier.keys()) == sorted(keys)


def test_commit_error_that_is_not_a_full_disk_replaces_the_index(tmp_path: Path, caplog) -> None:
    d = tmp_path / "disk"
    old = _tier_with_a_free_list(d)
    _mark_free_list_as_subdatabase(_index_file(d))
    caplog.set_level(logging.WARNING, logger="kvstore.tiers.disk")
    with DiskTier.build("disk", L16, 32, path=d, check_index=False) as tier:
        assert tier.used_pages == 8  # reads cannot see this damage
        new = write_pages(tier, range(50, 54))  # its commit can
        said = [r.getMessage() for r in caplog.records]
        assert any("damaged" in m and "moved" in m for m in said), said
        assert not any("space frees" in m for m in said), said
        assert list(d.glob("index.corrupt-*"))
        assert sorted(tier.keys()) == sorted(new)
        assert read_ok(tier, old) == [False] * 8
        assert read_ok(tier, new) == [True] * 4
        assert tier.delete(new[:2]) == 2
        more = write_pages(tier, range(60, 70))
    with DiskTier.build("disk", L16, 32, path=d, check_index=False) as tier:
        assert sorted(tier.keys()) == sorted(new[2:] + more)  # deletes were saved
        assert read_ok(tier, new[2:] + more) == [True] * 12


# ----------------------------------------------------------------- 7: a full filesystem at open


def test_opening_on_a_full_filesystem_is_a_clear_error_and_leaks_nothing(tmp_path: Path) -> None:
    with small_filesystem(tmp_path, "tmpfs", 8) as mnt:
        filler = fill(mnt)
        with pytest.raises(KVStoreError, match="full") as info:
            DiskTier.build("disk", L16, 16, path=mnt / "disk")
        assert "free" in info.value.hint
        filler.unlink()
        with DiskTier.build("disk", L16, 16, path=mnt / "disk") as tier:  # the same process
            keys = write_pages(tier, range(4))
            assert read_ok(tier, keys) == [True] * 4


@pytest.mark.parametrize("kind", ["tmpfs", "ext4"])
def test_a_tier_reopens_warm_on_its_full_filesystem(tmp_path: Path, kind) -> None:
    """Its slab and index reservation were allocated when it first opened: a full filesystem
    later does not stop it, nor its deletes, nor writes into the slots they free."""
    with small_filesystem(tmp_path, kind, 16) as mnt:
        d = mnt / "disk"
        with DiskTier.build("disk", L16, 64, path=d) as tier:
            keys = write_pages(tier, range(40))
        fill(mnt)
        with DiskTier.build("disk", L16, 64, path=d) as tier:
            assert tier.used_pages == 40
            assert read_ok(tier, keys) == [True] * 40
            assert tier.delete(keys[:10]) == 10
            more = write_pages(tier, range(100, 130))
        with DiskTier.build("disk", L16, 64, path=d) as tier:
            assert sorted(tier.keys()) == sorted(keys[10:] + more)
        shutil.rmtree(d)
