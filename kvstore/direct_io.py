"""Direct file I/O, as the disk tier does it and as a caller measuring a disk needs it too:
O_DIRECT (and probing a directory for it), vectored reads and writes that survive short
transfers, and what filesystem holds a path.

O_DIRECT transfers must be aligned in three ways: the file offset, every buffer's address and
every buffer's length. :data:`kvstore.buffers.ALIGN` (4096) satisfies every Linux block device we
target (logical blocks of 512 or 4096 bytes); :func:`kvstore.buffers.aligned_empty` allocates
such buffers.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvstore.buffers import ALIGN, aligned_empty

#: Most buffers one preadv/pwritev takes.
IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024
#: The open flag that bypasses the page cache; 0 where the platform has none.
O_DIRECT: int = getattr(os, "O_DIRECT", 0)

#: Filesystems on which flock and LMDB's shared-memory locking are unreliable (LMDB's docs: "do
#: not use LMDB databases on remote filesystems"), or whose O_DIRECT/mmap semantics differ.
NETWORK_FILESYSTEMS = frozenset(
    {
        "nfs", "nfs4", "cifs", "smb3", "smbfs", "ncpfs", "afs", "coda", "9p", "ceph",
        "glusterfs", "lustre", "gpfs", "beegfs", "ocfs2", "gfs2", "davfs",
        "fuse.sshfs", "fuse.s3fs", "fuse.gcsfuse", "fuse.rclone", "fuse.glusterfs",
        "fuse.cephfs", "fuse.ceph-fuse", "fuse.juicefs", "fuse.goofys", "fuse.davfs",
    }
)  # fmt: skip


def _advance(iovs: Sequence[Any], done: int) -> list[memoryview]:
    """``iovs`` without their first ``done`` bytes."""
    rest: list[memoryview] = []
    for buf in iovs:
        view = memoryview(buf).cast("B")
        if done >= view.nbytes:
            done -= view.nbytes
            continue
        rest.append(view[done:])
        done = 0
    return rest


def pwritev_all(fd: int, iovs: Sequence[Any], offset: int) -> None:
    """Write every byte of ``iovs`` at ``offset`` or raise OSError. A short write is continued;
    one that makes no progress is reported as ENOSPC (what a regular file means by it)."""
    total = sum(memoryview(b).nbytes for b in iovs)
    done = 0
    while done < total:
        chunk = iovs if done == 0 else _advance(iovs, done)
        for i in range(0, len(chunk), IOV_MAX):
            try:
                n = os.pwritev(fd, chunk[i : i + IOV_MAX], offset + done)
            except OSError as exc:
                if exc.errno == errno.EINVAL and done % ALIGN:
                    n = 0  # O_DIRECT cannot resume a short write at an unaligned offset
                else:
                    raise
            if n == 0:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC) + " (short write)")
            done += n
            if n < sum(memoryview(b).nbytes for b in chunk[i : i + IOV_MAX]):
                break


def preadv_all(fd: int, iovs: Sequence[Any], offset: int) -> int:
    """Read into ``iovs`` from ``offset`` until they are full or the file ends; return the bytes
    read (less than their total only at end of file)."""
    total = sum(memoryview(b).nbytes for b in iovs)
    done = 0
    while done < total:
        chunk = iovs if done == 0 else _advance(iovs, done)
        progressed = 0
        for i in range(0, len(chunk), IOV_MAX):
            part = chunk[i : i + IOV_MAX]
            n = os.preadv(fd, part, offset + done)
            done += n
            progressed += n
            if n < sum(memoryview(b).nbytes for b in part):
                break
        if progressed == 0:
            break
    return done


def probe_o_direct(directory: Path) -> str | None:
    """None when files in ``directory`` accept aligned O_DIRECT reads and writes, else why not."""
    if not O_DIRECT:
        return "this platform has no O_DIRECT"
    probe = directory / f".odirect-probe-{os.getpid()}"
    buf = aligned_empty(ALIGN)
    buf[:] = 0
    try:
        fd = os.open(probe, os.O_RDWR | os.O_CREAT | os.O_TRUNC | O_DIRECT, 0o600)
        try:
            os.pwritev(fd, [buf.data], 0)
            os.preadv(fd, [buf.data], 0)
        finally:
            os.close(fd)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            return None  # the open took O_DIRECT; only the space to prove it with is missing
        return f"{exc.strerror} (errno {exc.errno})"
    finally:
        try:
            probe.unlink()
        except OSError:
            pass
    return None


def filesystem_type(path: Path) -> str:
    """The type of the filesystem holding ``path`` (``ext4``, ``xfs``, ``tmpfs``, ``nfs4``...)
    from ``/proc/self/mountinfo``, matched by device number; ``unknown`` where that fails."""
    try:
        st_dev = os.stat(path).st_dev
        real = os.path.realpath(path)
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return "unknown"
    dev = f"{os.major(st_dev)}:{os.minor(st_dev)}"
    by_dev: list[tuple[int, str]] = []
    by_prefix: list[tuple[int, str]] = []
    for line in lines:
        left, sep, right = line.partition(" - ")
        fields = left.split()
        if not sep or len(fields) < 5 or not right:
            continue
        mount_point = fields[4].replace("\\040", " ")
        fstype = right.split()[0]
        if real == mount_point or real.startswith(mount_point.rstrip("/") + "/"):
            entry = (len(mount_point), fstype)
            by_prefix.append(entry)
            if fields[2] == dev:
                by_dev.append(entry)
    best = by_dev or by_prefix
    return max(best)[1] if best else "unknown"


def is_network_filesystem(fstype: str) -> bool:
    return fstype in NETWORK_FILESYSTEMS or fstype.split(".")[0] in NETWORK_FILESYSTEMS


__all__ = [
    "IOV_MAX",
    "NETWORK_FILESYSTEMS",
    "O_DIRECT",
    "filesystem_type",
    "is_network_filesystem",
    "preadv_all",
    "probe_o_direct",
    "pwritev_all",
]
