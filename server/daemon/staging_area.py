"""A session's staging area: the shared-memory rows its saves are written into, and the copy
that admits a completed save into the host tier's slab.

Why: clients map the slab read-only (:mod:`connector.daemon.shm`), so no client can change
what another loads. A save therefore lands in rows only its own session can write, and the
daemon copies it into the slab slots the store reserved, at ``complete_store``, before it
publishes them. A client that keeps writing its staging rows during that copy spoils only its
own save -- pages it could have stored wrong through the API anyway.

Cost: one host memcpy per saved page, in the daemon, off the client's thread (the connector
completes saves on its save thread). Large saves are split across ``copy_threads`` threads
(numpy releases the GIL for a plain copy).

The segment is sparse: it costs only the rows its session has written.

Thread-safety: every method may be called from many threads. :meth:`close` waits for copies
in progress, then unmaps; a copy after it raises LeaseError.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from connector.daemon.peer_memory import SPLIT_BYTES
from connector.daemon.shm import SharedSlab
from kvstore.errors import LeaseError
from kvstore.ops import index_runs



class StagingArea:
    def __init__(self, name: str, pages: int, page_bytes: int, pool: ThreadPoolExecutor | None) -> None:
        self.pages, self.page_bytes = pages, page_bytes
        self.segment = SharedSlab.create(name, pages * page_bytes, allocate=False)
        self.segment.seal(read_only=False)  # the client cannot shrink it under the daemon's copy
        self.rows = self.segment.array.reshape(pages, page_bytes)
        self._pool = pool
        self._threads = max(1, getattr(pool, "_max_workers", 1))
        self._free = list(range(pages - 1, -1, -1))  # pop() hands out ascending rows
        self._cond = threading.Condition()
        self._busy = 0
        self._closed = False

    @property
    def free_rows(self) -> int:
        with self._cond:
            return len(self._free)

    def take(self, n: int) -> list[int]:
        """Up to ``n`` free rows (fewer when the area is short; the caller refuses the rest)."""
        with self._cond:
            if self._closed:
                raise LeaseError("the session's staging area is closed")
            k = min(n, len(self._free))
            return [self._free.pop() for _ in range(k)]

    def give(self, rows: Sequence[int]) -> None:
        with self._cond:
            self._free.extend(reversed(rows))

    def copy_into(self, slab: np.ndarray, rows: Sequence[int], slots: Sequence[int]) -> None:
        """Copy staging ``rows[i]`` into ``slab[slots[i]]`` (``slab``: the daemon's writable
        ``(P, page_bytes)`` view)."""
        with self._cond:
            if self._closed:
                raise LeaseError("the session's staging area is closed")
            self._busy += 1
        try:
            runs = index_runs(np.asarray(rows, np.int64), np.asarray(slots, np.int64)) or []
            nbytes = len(rows) * self.page_bytes
            if self._pool is None or nbytes < SPLIT_BYTES:
                for r, s, n in runs:
                    np.copyto(slab[s: s + n], self.rows[r: r + n])
            else:  # one piece per thread (at least a page; the calling thread waits)
                piece = max(1, -(-nbytes // self._threads) // self.page_bytes)
                list(self._pool.map(lambda job: np.copyto(slab[job[1]: job[1] + job[2]],
                                                          self.rows[job[0]: job[0] + job[2]]),
                                    _split(runs, piece)))
        finally:
            with self._cond:
                self._busy -= 1
                self._cond.notify_all()

    def close(self) -> None:
        """Wait for copies in progress, then unmap (the client's own mapping lives on until it
        unmaps it: its memory is freed then)."""
        with self._cond:
            self._closed = True
            self._cond.wait_for(lambda: self._busy == 0)
        self.segment.close()


def _split(runs: list[tuple[int, int, int]], most: int) -> list[tuple[int, int, int]]:
    """``runs`` cut into pieces of at most ``most`` rows (so threads share a long run)."""
    return [(r + i, s + i, min(most, n - i)) for r, s, n in runs for i in range(0, n, most)]


__all__ = ["StagingArea"]
