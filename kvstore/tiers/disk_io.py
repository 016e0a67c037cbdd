"""File mechanics of the disk tier: private directories and files, space reservation and
errno descriptions. No tier logic lives here. The I/O itself -- O_DIRECT, vectored transfers
that survive short ones, filesystem checks -- is :mod:`kvstore.direct_io` (public: a benchmark
of a disk uses it too), re-exported here for the tier's modules.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import stat
from pathlib import Path
from typing import Any

import numpy as np

#: Alignment of slot offsets, of O_DIRECT buffer addresses and of their lengths.
from kvstore.buffers import ALIGN, aligned_empty
from kvstore.direct_io import (
    IOV_MAX,
    NETWORK_FILESYSTEMS,
    O_DIRECT,
    filesystem_type,
    is_network_filesystem,
    preadv_all,
    probe_o_direct,
    pwritev_all,
)

log = logging.getLogger("kvstore.tiers.disk")


#: Mode of every directory the disk tier creates: only the daemon's user may open it. The
#: directory is inside the records' trust boundary (DESIGN.md, Security): nobody else may read
#: its pages or plant records there. Set explicitly, whatever the process umask.
DIR_MODE = 0o700
#: Mode of every file the disk tier creates (slab, lock file, the LMDB index and its lock).
FILE_MODE = 0o600


def private_dir(path: Path) -> None:
    """Make ``path`` a directory only its owner can open: create it, and each missing parent,
    with mode :data:`DIR_MODE` whatever the umask; tighten an existing ``path`` (one an older
    version made 0755) with :func:`tighten`. A parent that exists already is not ours and is
    left as it is. Raises OSError when ``path`` cannot be made, or is not a directory."""
    path = Path(path)
    missing: list[Path] = []
    p = path
    while not os.path.lexists(p) and p != p.parent:
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        try:
            os.mkdir(d, DIR_MODE)
        except FileExistsError:  # made meanwhile by someone else: not ours (``path``: below)
            continue
        os.chmod(d, DIR_MODE)  # the umask may have taken bits off
    if not path.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(path))
    tighten(path, DIR_MODE)


def open_private(path: Path, flags: int) -> int:
    """``os.open(path, flags | O_CREAT | O_CLOEXEC)`` of a file only its owner can open: created
    with mode :data:`FILE_MODE` whatever the umask, and an existing one (an older version made
    0644) tightened with :func:`tighten`. Raises OSError when it cannot be opened."""
    fd = os.open(path, flags | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), FILE_MODE)
    try:
        tighten(fd, FILE_MODE, path)
    except OSError:
        os.close(fd)
        raise
    return fd


def tighten(target: Path | int, mode: int, name: Path | None = None) -> None:
    """Set the mode of ``target`` (a path, or an open descriptor of file ``name``) to ``mode``
    when it has other bits. Where that is not ours to do (another user's file: EPERM) it logs
    a warning and leaves it: the tier still works, and its reads still verify every record's
    MAC, but its directory is then not private."""
    if stat.S_IMODE(os.stat(target).st_mode) == mode:
        return
    try:
        os.chmod(target, mode)
    except PermissionError:
        log.warning(
            "disk tier: %s has other permission bits than %o and is not ours to change: other "
            "users may read its pages; give the daemon's user a directory of its own",
            name if name is not None else target, mode,
        )


def round_up(n: int, align: int = ALIGN) -> int:
    return -(-n // align) * align


def is_aligned(buf: np.ndarray, align: int = ALIGN) -> bool:
    return buf.ctypes.data % align == 0


#: errnos of a failed allocation that mean "there is no room for it" (not "unsupported").
SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
_WHAT_ERRNO_MEANS = {
    errno.ENOSPC: "the filesystem is full",
    errno.EDQUOT: "the disk quota is spent",
    errno.EFBIG: "the file-size limit is reached",
    errno.EIO: "an I/O error",
}


def describe(exc: OSError) -> str:
    """``exc`` for a log line or an error message, led by what it means for the tier."""
    what = _WHAT_ERRNO_MEANS.get(exc.errno or 0)
    text = f"{exc.strerror or exc} (errno {exc.errno})"
    return f"{what}: {text}" if what else text


def preallocate(fd: int, nbytes: int) -> str | None:
    """Give the file ``nbytes`` of allocated blocks (so later writes cannot run out of space).
    Returns None, or, where the filesystem cannot preallocate, a message saying so (the file is
    then made ``nbytes`` long and sparse). Raises OSError (ENOSPC, EDQUOT, EFBIG, EIO...) when
    the blocks cannot be had: the file is then as it was, with no block of the failed call kept
    (ext4 keeps what a failed ``fallocate`` got; those blocks would hide in the file)."""
    old_size = os.fstat(fd).st_size
    holes = _holes(fd, old_size)
    try:
        os.posix_fallocate(fd, 0, nbytes)
        return None
    except OSError as exc:
        _give_back(fd, old_size, holes)
        if exc.errno in SPACE_ERRNOS or exc.errno == errno.EIO:
            raise
        first = f"cannot preallocate {nbytes} bytes: {exc.strerror}"
    try:
        if old_size < nbytes:
            os.ftruncate(fd, nbytes)
    except OSError as exc:
        return f"{first}; cannot extend the file either ({exc.strerror}): it grows as pages arrive"
    return f"{first}; the file is sparse and writes fail once the filesystem fills"


_FALLOC_FL_KEEP_SIZE = 1
_FALLOC_FL_PUNCH_HOLE = 2
_libc: Any = None


def _fallocate(fd: int, mode: int, offset: int, length: int) -> int:
    """Linux ``fallocate(2)``; 0 or the errno (ENOSYS where libc has none)."""
    global _libc
    try:
        if _libc is None:
            _libc = ctypes.CDLL(None, use_errno=True)
            _libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
        if _libc.fallocate(fd, mode, offset, length) == 0:
            return 0
        return ctypes.get_errno() or errno.EIO
    except (OSError, AttributeError):
        return errno.ENOSYS


def _holes(fd: int, size: int) -> list[tuple[int, int]]:
    """The unallocated ranges ``(offset, length)`` of the file's first ``size`` bytes."""
    holes: list[tuple[int, int]] = []
    pos = 0
    try:
        while pos < size:
            hole = os.lseek(fd, pos, os.SEEK_HOLE)
            if hole >= size:
                break
            try:
                data = os.lseek(fd, hole, os.SEEK_DATA)
            except OSError as exc:
                if exc.errno != errno.ENXIO:  # ENXIO: no data after the hole
                    raise
                data = size
            holes.append((hole, min(data, size) - hole))
            pos = data
    except (OSError, AttributeError):
        return []  # no SEEK_HOLE here: nothing to tell holes from data with
    return holes


def _give_back(fd: int, size: int, holes: list[tuple[int, int]]) -> None:
    """Undo a failed allocation: cut the file back to ``size`` (which also frees blocks kept past
    the end) and punch again the ``holes`` it had."""
    try:
        os.ftruncate(fd, size)
    except OSError:
        pass
    for offset, length in holes:
        _fallocate(fd, _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE, offset, length)


def reserve_beyond_eof(fd: int, nbytes: int) -> bool:
    """Best effort: have ``nbytes`` of blocks allocated past the end of the file without changing
    its size (``fallocate(FALLOC_FL_KEEP_SIZE)``), so a program that later appends there (LMDB)
    finds space even on a full filesystem. False where unsupported or where the filesystem has
    not the room; then nothing is taken (a failed call's blocks are given back)."""
    st = os.fstat(fd)
    missing = st.st_size + nbytes - st.st_blocks * 512
    if missing <= 0:
        return True
    if missing > free_bytes(fd):
        return False
    if _fallocate(fd, _FALLOC_FL_KEEP_SIZE, st.st_size, nbytes) == 0:
        return True
    _give_back(fd, st.st_size, [])
    return False


def free_bytes(where: int | Path) -> int:
    """Bytes an unprivileged writer may still allocate on the filesystem of ``where`` (a
    descriptor or a path); the blocks ext4 keeps for root are not counted as ours to take."""
    st = os.fstatvfs(where) if isinstance(where, int) else os.statvfs(where)
    return st.f_bavail * st.f_frsize


def allocated_bytes(path: Path) -> int:
    """Bytes of blocks the file at ``path`` holds (0 if there is none)."""
    try:
        return os.stat(path).st_blocks * 512
    except FileNotFoundError:
        return 0


__all__ = [
    "ALIGN",
    "DIR_MODE",
    "FILE_MODE",
    "IOV_MAX",
    "NETWORK_FILESYSTEMS",
    "O_DIRECT",
    "SPACE_ERRNOS",
    "aligned_empty",
    "allocated_bytes",
    "describe",
    "filesystem_type",
    "free_bytes",
    "is_aligned",
    "is_network_filesystem",
    "open_private",
    "preadv_all",
    "preallocate",
    "probe_o_direct",
    "private_dir",
    "pwritev_all",
    "reserve_beyond_eof",
    "round_up",
    "tighten",
]
