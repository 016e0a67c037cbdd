"""The daemon's host-tier slab as a POSIX shared-memory segment (``/dev/shm/<name>``, mode
0600): the daemon creates it, every client on the node maps it, and pages move between a
client's KV cache and the slab with no copy through the daemon.

Mappings are made with ``mmap(2)`` through ctypes so that a client can *replace* its mapping in
place (``MAP_FIXED``) when the daemon restarts with a new segment: every numpy array and torch
tensor over the old mapping (the connector's transfer holds one) then sees the new segment at
the same address. The caller must make sure no copy runs across the switch (the client remaps
only while it holds no handle).
"""

from __future__ import annotations

import ctypes
import os
import re
import secrets
from pathlib import Path

import numpy as np

from kvstore.errors import InvalidArgument, TierUnavailable

SHM_DIR = Path("/dev/shm")
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,200}$")
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                       ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_PROT_RW = 0x1 | 0x2
_MAP_SHARED, _MAP_FIXED = 0x01, 0x10
_MAP_FAILED = ctypes.c_void_p(-1).value


def check_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise InvalidArgument(f"shared-memory name {name!r:.80} is not a plain file name")
    return name


def new_name(prefix: str = "kvstore") -> str:
    """A fresh segment name that carries the creating process id (see :func:`remove_stale`)."""
    return f"{prefix}-{os.getpid()}-{secrets.token_hex(4)}"


def remove_stale(prefix: str = "kvstore") -> list[str]:
    """Unlink segments ``<prefix>-<pid>-*`` of this user whose process is gone (a daemon killed
    with SIGKILL leaves its segment behind). Returns the names removed."""
    gone = []
    for path in SHM_DIR.glob(f"{prefix}-*-*"):
        try:
            pid = int(path.name.split("-")[-2])
            if path.stat().st_uid != os.getuid():
                continue
            os.kill(pid, 0)
        except ProcessLookupError:
            path.unlink(missing_ok=True)
            gone.append(path.name)
        except (ValueError, OSError):
            continue
    return gone


class SharedSlab:
    """A mapping of one segment. ``array`` is the whole segment as uint8; it stays valid until
    :meth:`close` (and across :meth:`remap`)."""

    def __init__(self, name: str, nbytes: int, addr: int, owner: bool) -> None:
        self.name, self.nbytes, self._addr, self.owner = name, nbytes, addr, owner
        buf = (ctypes.c_uint8 * nbytes).from_address(addr)
        self.array: np.ndarray = np.frombuffer(memoryview(buf).cast("B"), dtype=np.uint8)
        self._closed = False

    @property
    def address(self) -> int:
        return self._addr

    @classmethod
    def create(cls, name: str, nbytes: int) -> SharedSlab:
        """Create a new segment of ``nbytes`` (0600; fails if the name exists) and map it.

        Its memory is allocated now (``posix_fallocate``), not at each page's first write: a
        ``/dev/shm`` too small for it fails here with TierUnavailable, where a sparse segment
        would kill with SIGBUS whichever process -- a client copying a page in -- first wrote
        past the space left; and no save pays the allocation of the pages it writes."""
        check_name(name)
        fd = os.open(SHM_DIR / name, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.fchmod(fd, 0o600)  # whatever the umask
            os.ftruncate(fd, nbytes)
            try:
                os.posix_fallocate(fd, 0, nbytes)
            except OSError as exc:
                raise TierUnavailable(
                    f"cannot allocate {nbytes} bytes of shared memory in {SHM_DIR}: "
                    f"{exc.strerror}",
                    hint="make the host tier smaller, or /dev/shm larger "
                         "(mount -o remount,size=... /dev/shm; docker run --shm-size)") from None
            return cls(name, nbytes, _map(fd, nbytes, None), owner=True)
        except BaseException:
            os.unlink(SHM_DIR / name)
            raise
        finally:
            os.close(fd)

    @classmethod
    def attach(cls, name: str, nbytes: int) -> SharedSlab:
        """Map an existing segment (a client, after the daemon's handshake)."""
        fd = _open(name, nbytes)
        try:
            return cls(name, nbytes, _map(fd, nbytes, None), owner=False)
        finally:
            os.close(fd)

    def remap(self, name: str) -> None:
        """Map segment ``name`` (of the same size) at this mapping's address, replacing it."""
        fd = _open(name, self.nbytes)
        try:
            _map(fd, self.nbytes, self._addr)
        finally:
            os.close(fd)
        self.name = name

    def unlink(self) -> None:
        (SHM_DIR / self.name).unlink(missing_ok=True)

    def close(self) -> None:
        """Unmap (every array over it becomes invalid: close only when nothing uses it)."""
        if not self._closed:
            self._closed = True
            _libc.munmap(self._addr, self.nbytes)


def _open(name: str, nbytes: int) -> int:
    check_name(name)
    try:
        fd = os.open(SHM_DIR / name, os.O_RDWR)
    except OSError as exc:
        raise TierUnavailable(f"cannot open shared memory {name!r}: {exc.strerror}",
                              hint="the daemon and its clients must run on one node as one user") from None
    size = os.fstat(fd).st_size
    if size != nbytes:
        os.close(fd)
        raise TierUnavailable(f"shared memory {name!r} holds {size} bytes, the daemon said {nbytes}")
    return fd


def _map(fd: int, nbytes: int, at: int | None) -> int:
    flags = _MAP_SHARED | (_MAP_FIXED if at is not None else 0)
    addr = _libc.mmap(at, nbytes, _PROT_RW, flags, fd, 0)
    if addr in (None, _MAP_FAILED):
        err = ctypes.get_errno()
        raise TierUnavailable(f"mmap of {nbytes} bytes of shared memory failed: {os.strerror(err)}")
    return int(addr)


__all__ = ["SharedSlab", "check_name", "new_name", "remove_stale"]
