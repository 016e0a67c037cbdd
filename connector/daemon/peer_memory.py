"""Copies between the daemon and a client process's memory in one step (Linux
``process_vm_readv`` / ``process_vm_writev``), for saves and loads of pages in host memory.

Why: a client's save through the staging area costs two copies (the client's into its staging
rows, the daemon's into the slab) and a load one copy at the client's speed. When the daemon may
read and write the client's memory, a save is one copy (client memory -> slab) and a load one
copy (slab -> client memory), each split over the daemon's copy threads, and the engine thread
waits for neither.

Who may: the kernel allows it only where the daemon could ptrace the client -- the same user
(or CAP_SYS_PTRACE), a process that is not marked undumpable, and, under Yama's
``ptrace_scope = 1``, a client that named the daemon its tracer (:func:`allow_tracer`). The
daemon learns the client's pid from the kernel (``SO_PEERCRED`` of its lane connection), and
proves the path works before using it: the client names a buffer of random bytes and the daemon
must read them back (:func:`probe`). Anywhere that fails -- another user, another pid namespace,
a seccomp profile that forbids the calls -- the session keeps the staging path.

What a client can do with it: name addresses in its own memory only -- the daemon reads or
writes the process the kernel says is on the other end of the socket, never another. A client
that names memory it does not own, or changes its pages while they are read, spoils its own save
(as writing its staging rows would). A pid is only trusted while its process lives: the daemon
holds a pidfd and discards a copy if that process exited before the copy ended (its pid may
belong to another process by then).
"""

from __future__ import annotations

import ctypes
import errno
import os
import select
import socket
import struct
import threading
from collections.abc import Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from pathlib import Path

import numpy as np

#: the most iovecs one call takes on each side (Linux UIO_MAXIOV)
IOV_MAX = 1024
#: below this many bytes a copy runs on the calling thread alone
SPLIT_BYTES = 4 << 20
#: prctl(PR_SET_PTRACER): under Yama's ptrace_scope 1, let this pid read and write our memory
_PR_SET_PTRACER = 0x59616D61
_YAMA = Path("/proc/sys/kernel/yama/ptrace_scope")
_CRED = struct.Struct("3i")


class PeerMemoryError(OSError):
    """A copy from or to the peer's memory did not complete (the peer went away, named memory
    it does not own, or the kernel refused)."""


_libc: ctypes.CDLL | None = None


def _call(name: str) -> ctypes._CFuncPtr:  # type: ignore[name-defined]
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    fn = getattr(_libc, name)
    fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_void_p,
                   ctypes.c_ulong, ctypes.c_ulong]
    fn.restype = ctypes.c_ssize_t
    return fn


def peer_pid(sock: socket.socket) -> int:
    """The pid of the process at the other end of a Unix socket, as this process's pid
    namespace sees it (0 when it cannot see it)."""
    pid, _, _ = _CRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CRED.size))
    return int(pid)


def allow_tracer(pid: int) -> None:
    """Let process ``pid`` read and write this process's memory where Yama's ptrace_scope
    would otherwise forbid it (scope 1: only ancestors may). No-op elsewhere; never raises."""
    try:
        if _YAMA.read_text().strip() != "1" or pid <= 0:
            return
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PTRACER, ctypes.c_ulong(pid), 0, 0, 0)
    except (OSError, ValueError, AttributeError):
        pass


def segments(views: Sequence[np.ndarray]) -> np.ndarray:
    """``(n, 2)`` uint64 (address, length) of contiguous byte views."""
    out = np.empty((len(views), 2), np.uint64)
    for i, v in enumerate(views):
        out[i] = (v.__array_interface__["data"][0], v.nbytes)
    return out


def _pair(local: np.ndarray, remote: np.ndarray, cuts: np.ndarray) -> np.ndarray:
    """``(k, 3)`` uint64 (local address, remote address, length) pieces covering both segment
    lists (equal totals) on the union of their boundaries and ``cuts`` (byte offsets)."""
    lo = np.cumsum(local[:, 1], dtype=np.uint64)
    ro = np.cumsum(remote[:, 1], dtype=np.uint64)
    ends = np.union1d(np.union1d(lo, ro), cuts)
    ends = ends[(ends > 0) & (ends <= lo[-1])]
    starts = np.concatenate((np.zeros(1, np.uint64), ends[:-1]))
    li = np.searchsorted(lo, starts, side="right")
    ri = np.searchsorted(ro, starts, side="right")
    out = np.empty((len(ends), 3), np.uint64)
    out[:, 0] = local[li, 0] + (starts - (lo[li] - local[li, 1]))
    out[:, 1] = remote[ri, 0] + (starts - (ro[ri] - remote[ri, 1]))
    out[:, 2] = ends - starts
    return out


def _copy(pid: int, pieces: np.ndarray, write: bool) -> None:
    fn = _call("process_vm_writev" if write else "process_vm_readv")
    for i in range(0, len(pieces), IOV_MAX):
        chunk = pieces[i: i + IOV_MAX]
        liov = np.ascontiguousarray(chunk[:, [0, 2]])
        riov = np.ascontiguousarray(chunk[:, [1, 2]])
        want = int(chunk[:, 2].sum())
        got = fn(pid, liov.ctypes.data, len(chunk), riov.ctypes.data, len(chunk), 0)
        if got != want:
            err = ctypes.get_errno() if got < 0 else errno.EFAULT
            raise PeerMemoryError(err, f"{'wrote' if write else 'read'} {max(got, 0)} of "
                                       f"{want} bytes of process {pid}'s memory: "
                                       f"{os.strerror(err)}")


def transfer(pid: int, local: np.ndarray, remote: np.ndarray, *, write: bool,
             pool: Executor | None = None, threads: int = 1) -> None:
    """Copy between this process's ``local`` segments and process ``pid``'s ``remote`` ones
    (``(n, 2)`` address/length lists of equal total): read into ``local`` or, with ``write``,
    write from it. Large copies are split over ``threads`` jobs on ``pool``. Raises
    PeerMemoryError when any byte did not move."""
    total = int(local[:, 1].sum())
    if total != int(remote[:, 1].sum()):
        raise ValueError("the local and remote segments differ in length")
    if total == 0:
        return
    jobs = max(1, threads) if pool is not None and total >= SPLIT_BYTES else 1
    cuts = np.arange(1, jobs, dtype=np.uint64) * np.uint64(-(-total // jobs))
    pieces = _pair(local, remote, cuts)
    if jobs == 1:
        _copy(pid, pieces, write)
        return
    piece_job = np.searchsorted(cuts, np.cumsum(pieces[:, 2]) - pieces[:, 2], side="right")
    groups = [pieces[piece_job == j] for j in range(jobs)]
    assert pool is not None
    list(pool.map(lambda g: _copy(pid, g, write), [g for g in groups if len(g)]))


def probe(pid: int, address: int, expect: bytes) -> bool:
    """Whether ``len(expect)`` bytes at ``address`` in process ``pid`` read back as ``expect``
    (the path works, and ``pid`` is the process that wrote them)."""
    if pid <= 0 or not expect:
        return False
    buf = np.zeros(len(expect), np.uint8)
    try:
        transfer(pid, segments([buf]), np.array([[address, len(expect)]], np.uint64), write=False)
    except (PeerMemoryError, OverflowError):
        return False
    return buf.tobytes() == expect


class Peer:
    """A client process the daemon may copy to and from: its pid, a pidfd that tells whether
    that process still lives, and copy threads of its own (up to ``threads``, started on
    demand): a copy the client's memory stalls -- a mapping of a file on a hung FUSE server
    blocks the kernel's read -- holds only this client's threads, never the daemon's shared
    ones, and only this client's calls wait."""

    def __init__(self, pid: int, threads: int = 1) -> None:
        self.pid = pid
        self.threads = max(1, threads)
        self._fd = os.pidfd_open(pid)
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def alive(self) -> bool:
        """The process behind the pid has not exited (a pidfd turns readable when it does)."""
        try:
            return not select.select([self._fd], [], [], 0)[0]
        except (OSError, ValueError):
            return False

    def transfer(self, local: np.ndarray, remote: np.ndarray, *, write: bool) -> None:
        """:func:`transfer` with the peer on its own threads, checked afterwards to be the same
        live process."""
        pool = None
        if self.threads > 1:
            with self._lock:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="kvstore-peer")
                pool = self._pool
        transfer(self.pid, local, remote, write=write, pool=pool, threads=self.threads)
        if not self.alive():
            raise PeerMemoryError(errno.ESRCH, f"process {self.pid} exited during the copy")

    def close(self) -> None:
        """Drop the pidfd and the threads (a copy still running ends on its own)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
        try:
            os.close(self._fd)
        except OSError:
            pass


__all__ = ["IOV_MAX", "Peer", "PeerMemoryError", "allow_tracer", "peer_pid", "probe",
           "segments", "transfer"]
