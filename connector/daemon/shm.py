"""Shared memory between the daemon and its clients: anonymous ``memfd`` segments handed over
as file descriptors (``SCM_RIGHTS`` on a Unix socket, :mod:`.shm_handoff`), never by a name.

Two kinds of segment:

* **the slab** -- the host tier's pages. The daemon maps it read-write, then seals it
  (``F_SEAL_FUTURE_WRITE``, and against growing, shrinking and further seals): from then on no
  process can map it writable, ``write(2)`` to it, punch a hole in it or resize it, whatever
  descriptor it holds (one reopened through ``/proc`` included). Clients map it read-only and
  load from it; only the daemon's own mapping writes it. That is what keeps one client from
  changing what another loads.
* **a session's staging area** -- where that session's saves land: the client maps it
  read-write, the daemon copies each completed save from it into the slab. Sealed against
  shrinking (a client that truncated it would fault the daemon's copy) and growing; no other
  client ever gets its descriptor.

Neither has a name in any file system: a segment lives while a process maps it or holds its
descriptor, so a daemon killed with SIGKILL leaves nothing behind.

Mappings are made with ``mmap(2)`` through ctypes so that a client can *replace* its mapping in
place (``MAP_FIXED``) when the daemon restarts with new segments: every numpy array and torch
tensor over the old mapping (the connector's transfer holds one) then sees the new segment at
the same address. The caller must make sure no copy runs across the switch (the client remaps
only while it holds no handle).
"""

from __future__ import annotations

import ctypes
import fcntl
import os

import numpy as np

from kvstore.errors import InvalidArgument, TierUnavailable

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                       ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_PROT_READ, _PROT_WRITE = 0x1, 0x2
_MAP_SHARED, _MAP_FIXED, _MAP_POPULATE = 0x01, 0x10, 0x8000
_MAP_FAILED = ctypes.c_void_p(-1).value
#: Linux 5.1; Python's fcntl module names it only from 3.13
F_SEAL_FUTURE_WRITE = getattr(fcntl, "F_SEAL_FUTURE_WRITE", 0x0010)
_SEAL_SIZE = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW


class SharedSlab:
    """A mapping of one segment. ``array`` is the whole segment as uint8 (read-only where the
    mapping is); it stays valid until :meth:`close` (and across :meth:`remap`). ``fd``: the
    segment's descriptor where this process keeps it (the daemon, to hand it on), else -1."""

    def __init__(self, name: str, nbytes: int, addr: int, *, writable: bool, fd: int = -1) -> None:
        self.name, self.nbytes, self._addr, self.writable, self.fd = name, nbytes, addr, writable, fd
        buf = (ctypes.c_uint8 * nbytes).from_address(addr)
        self.array: np.ndarray = np.frombuffer(memoryview(buf).cast("B"), dtype=np.uint8)
        if not writable:
            self.array.flags.writeable = False  # a write would fault: say so in numpy first
        self._closed = False

    @property
    def address(self) -> int:
        return self._addr

    @classmethod
    def create(cls, name: str, nbytes: int, *, allocate: bool = True) -> SharedSlab:
        """A new segment of ``nbytes``, mapped read-write, its descriptor kept (``fd``).

        ``allocate``: take all of its memory now (``posix_fallocate``), not at each page's
        first write: memory too short fails here with TierUnavailable, where a sparse segment
        would kill with SIGBUS whichever process first wrote past what is left; and no save
        pays the allocation of the pages it writes. A staging area is left sparse: it costs
        only what its session writes."""
        if nbytes <= 0:
            raise InvalidArgument(f"a shared-memory segment of {nbytes} bytes")
        fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(fd, nbytes)
            if allocate:
                try:
                    os.posix_fallocate(fd, 0, nbytes)
                except OSError as exc:
                    raise TierUnavailable(
                        f"cannot allocate {nbytes} bytes of shared memory: {exc.strerror}",
                        hint="make the host tier smaller, or give the daemon more memory "
                             "(its memory limit counts the slab)") from None
            # an allocated segment is also mapped in full now: the daemon's copies into it
            # take no page faults later (a sparse one would allocate it all)
            addr = _map(fd, nbytes, None, writable=True, populate=allocate)
            return cls(name, nbytes, addr, writable=True, fd=fd)
        except BaseException:
            os.close(fd)
            raise

    def seal(self, *, read_only: bool) -> None:
        """Seal the segment against resizing and further seals; ``read_only``: also against
        any writable mapping or write made from now on (this mapping keeps writing)."""
        seals = _SEAL_SIZE | fcntl.F_SEAL_SEAL | (F_SEAL_FUTURE_WRITE if read_only else 0)
        try:
            fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, seals)
        except OSError as exc:
            raise TierUnavailable(f"cannot seal shared memory {self.name!r}: {exc.strerror}",
                                  hint="the daemon needs Linux >= 5.1 (memfd write seals)") from None

    @classmethod
    def attach(cls, fd: int, nbytes: int, *, writable: bool, name: str = "") -> SharedSlab:
        """Map the segment behind a received descriptor (which the caller still closes)."""
        _check_size(fd, nbytes, name)
        return cls(name, nbytes, _map(fd, nbytes, None, writable=writable), writable=writable)

    def remap(self, fd: int, name: str = "") -> None:
        """Map the segment behind ``fd`` (of the same size) at this mapping's address."""
        _check_size(fd, self.nbytes, name)
        _map(fd, self.nbytes, self._addr, writable=self.writable)
        self.name = name

    def close(self) -> None:
        """Unmap (every array over it becomes invalid: close only when nothing uses it) and
        close the kept descriptor."""
        if not self._closed:
            self._closed = True
            _libc.munmap(self._addr, self.nbytes)
            if self.fd >= 0:
                os.close(self.fd)
                self.fd = -1


def _check_size(fd: int, nbytes: int, name: str) -> None:
    size = os.fstat(fd).st_size
    if size != nbytes:
        raise TierUnavailable(f"shared memory {name!r} holds {size} bytes, the daemon said {nbytes}")


def _map(fd: int, nbytes: int, at: int | None, *, writable: bool, populate: bool = False) -> int:
    flags = _MAP_SHARED | (_MAP_FIXED if at is not None else 0) | (_MAP_POPULATE if populate else 0)
    prot = _PROT_READ | (_PROT_WRITE if writable else 0)
    addr = _libc.mmap(at, nbytes, prot, flags, fd, 0)
    if addr in (None, _MAP_FAILED):
        err = ctypes.get_errno()
        raise TierUnavailable(f"mmap of {nbytes} bytes of shared memory failed: {os.strerror(err)}")
    return int(addr)


__all__ = ["F_SEAL_FUTURE_WRITE", "SharedSlab"]
