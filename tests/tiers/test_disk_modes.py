"""Everything the disk tier puts on disk is private to the daemon's user: directories 0700,
files 0600 (the slab, the LMDB index and its lock file, the directory lock), whatever the
process umask -- the directory is inside the records' trust boundary (DESIGN: Security). Real
files, real LMDB; the modes are read back with ``os.stat``."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from kvstore.keys import Namespace
from kvstore.layout import KVLayout
from kvstore.record import RecordMac
from kvstore.tiers.disk import DiskTier

pytestmark = pytest.mark.timeout(120)

LAYOUT = KVLayout(2, 1, 64, 16, "float16")  # 8 KiB pages
SECRET = b"a-deployment-secret-of-32-bytes!"


@pytest.fixture
def umask(request: pytest.FixtureRequest) -> Iterator[int]:
    old = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(old)


def _tier(path: Path, check_index: bool = True) -> DiskTier:
    return DiskTier.build("disk", LAYOUT, 8, path=path, durability="batch", check_index=check_index,
                    mac=RecordMac(SECRET))


def _write_some(t: DiskTier, salt: str) -> None:
    ns = Namespace("m", LAYOUT, salt)
    ch = ns.chain(np.arange(2 * LAYOUT.block_size))
    pages = np.random.default_rng(0).integers(0, 256, (2, LAYOUT.page_bytes), dtype=np.uint8)
    assert t.write(ch.metas(), list(pages)) == [True, True]
    outs = np.zeros_like(pages)
    assert t.read(ns.id, ch.keys, list(outs)) == [True, True]


def _modes(root: Path) -> dict[str, int]:
    """Mode bits of ``root`` and of everything under it, by path relative to ``root``."""
    out = {".": stat.S_IMODE(os.stat(root).st_mode)}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath, name)
            out[str(p.relative_to(root))] = stat.S_IMODE(os.lstat(p).st_mode)
    return out


def _assert_private(root: Path) -> None:
    modes = _modes(root)
    bad = {}
    for rel, mode in modes.items():
        want = 0o700 if (root / rel).is_dir() else 0o600
        if mode != want:
            bad[rel] = f"{mode:o} (want {want:o})"
    assert not bad, bad


@pytest.mark.parametrize("umask", [0o022, 0o000, 0o277], indirect=True,
                         ids=lambda m: f"umask-{m:03o}")
def test_the_disk_tier_creates_only_private_files_and_directories(
    tmp_path: Path, umask: int
) -> None:
    path = tmp_path / "missing" / "parents" / "disk"
    t = _tier(path)
    _write_some(t, "a")
    t.close()
    t = _tier(path)  # a warm restart: the index check in a child, the existing files
    _write_some(t, "b")
    t.close()
    modes = _modes(path)
    # what is there: the lock, the slab, the index and LMDB's own lock file
    assert {"LOCK", "slots.dat", "index", "index/data.mdb", "index/lock.mdb"} <= set(modes)
    _assert_private(path)
    # the parents it had to create are its own too
    assert stat.S_IMODE(os.stat(tmp_path / "missing").st_mode) == 0o700
    assert stat.S_IMODE(os.stat(tmp_path / "missing" / "parents").st_mode) == 0o700


@pytest.mark.parametrize("umask", [0o022], indirect=True)
def test_a_directory_left_world_readable_is_made_private_at_open(
    tmp_path: Path, umask: int
) -> None:
    """A directory written by an older version (0755 / 0644) is tightened when a tier opens it;
    its pages stay readable."""
    path = tmp_path / "disk"
    t = _tier(path)
    _write_some(t, "a")
    t.close()
    for rel in _modes(path):
        p = path / rel
        p.chmod(0o755 if p.is_dir() else 0o644)
    t = _tier(path)
    try:
        assert t.used_pages == 2
        _assert_private(path)
    finally:
        t.close()
    _assert_private(path)


@pytest.mark.parametrize("umask", [0o022], indirect=True)
def test_a_damaged_index_is_replaced_by_a_private_one(tmp_path: Path, umask: int) -> None:
    """The index moved aside after damage, and the empty one created in its place, are private
    too."""
    path = tmp_path / "disk"
    t = _tier(path)
    _write_some(t, "a")
    t.close()
    data = path / "index" / "data.mdb"
    with open(data, "r+b") as f:
        f.write(b"\xff" * 8192)  # both meta pages: LMDB refuses the file
    t = _tier(path)
    try:
        assert t.used_pages == 0
        assert any(p.name.startswith("index.corrupt-") for p in path.iterdir())
        _write_some(t, "b")
    finally:
        t.close()
    _assert_private(path)
