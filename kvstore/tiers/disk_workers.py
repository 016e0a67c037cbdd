"""The disk tier's I/O workers, and how a batch's runs of adjacent slots are spread over them.

Who hashes a put's records and verifies a get's is ``hash_in_workers``: each worker the run it
moves (True), or the calling thread, run after run while the workers move the others (False);
the module docstring of :mod:`kvstore.tiers.disk` says when each pays.

Neither :meth:`IOWorkers.write` nor :meth:`IOWorkers.read` returns (or raises) while one of its
runs is still queued or moving: no slot may be released or unpinned under a transfer.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

import numpy as np

from kvstore.errors import TierUnavailable
from kvstore.keys import BlockMeta
from kvstore.tiers import disk_io
from kvstore.tiers.disk_index import IndexEntry
from kvstore.tiers.disk_slab import Slab


class IOWorkers:
    """A pool of ``threads`` I/O workers of the disk tier named ``tier``."""

    def __init__(self, tier: str, threads: int) -> None:
        self.tier = tier
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix=f"kvstore-disk-{tier}")

    def submit(self, fn: Any, *args: Any) -> Future[Any]:
        try:
            return self._pool.submit(fn, *args)
        except RuntimeError:  # the pool was shut down: close() raced this call
            raise TierUnavailable(f"disk tier {self.tier!r} is closed") from None

    def shutdown(self, *, wait: bool) -> None:
        self._pool.shutdown(wait=wait)

    def write(
        self,
        slab: Slab,
        metas: Sequence[BlockMeta],
        pages: Sequence[np.ndarray],
        slots: list[int],
        todo: list[int],
        *,
        hash_in_workers: bool,
    ) -> tuple[dict[int, int], str | None]:
        """Write the records of ``todo`` (indices sorted by slot) into their ``slots``, run by
        run. Returns the checksums of the items written, and what failed (an OSError's
        description), or None. Raises what is not an OSError."""
        checksums: dict[int, int] = {}
        failure: str | None = None
        jobs: list[tuple[list[int], Future[list[int]]]] = []
        try:
            for run in slab.runs(todo, slots):
                items = [(metas[i], pages[i]) for i in run]
                if hash_in_workers:  # the hashing of a batch spreads over the cores
                    job = self.submit(slab.encode_and_write, slots[run[0]], items)
                else:  # the caller hashes the next run while the workers write this one
                    hdr, sums = slab.encode_run(items)
                    job = self.submit(slab.write_encoded, slots[run[0]], hdr, pages, run, sums)
                jobs.append((run, job))
        finally:
            # No slot may be released while a write into it is still queued.
            wait([job for _, job in jobs])
        for run, job in jobs:
            exc = job.exception()
            if exc is None:
                checksums.update(zip(run, job.result()))
            elif isinstance(exc, OSError):
                failure = disk_io.describe(exc)
            else:
                raise exc
        return checksums, failure

    def read(
        self,
        slab: Slab,
        namespace_id: bytes,
        keys: Sequence[bytes],
        outs: Sequence[np.ndarray],
        plan: list[tuple[int, IndexEntry]],
        *,
        hash_in_workers: bool,
    ) -> tuple[list[int], list[tuple[bytes, int, str]], str | None]:
        """Read and verify the items of ``plan`` (``(index, its entry)``; sorted here by slot)
        into ``outs``, run by run. Returns the items verified, the ``(key, slot, reason)`` of
        those that failed verification, and what failed to read (an OSError's description),
        or None."""
        hits: list[int] = []
        bad: list[tuple[bytes, int, str]] = []
        failure: str | None = None
        jobs: list[tuple[list[int], list[tuple[bytes, int, np.ndarray]], Future[Any]]] = []
        try:
            plan.sort(key=lambda p: p[1].slot)
            slot_of = {i: e.slot for i, e in plan}
            by_index = dict(plan)
            for run in slab.runs([i for i, _ in plan], slot_of):
                items = [(keys[i], by_index[i].checksum, outs[i]) for i in run]
                if hash_in_workers:  # each verifies the run it read, while it is fresh
                    job = self.submit(slab.read_verified, slot_of[run[0]], namespace_id, items)
                else:  # the caller verifies run after run as they arrive
                    job = self.submit(slab.read_run, slot_of[run[0]], [o for _, _, o in items])
                jobs.append((run, items, job))
            for run, items, job in jobs:
                try:
                    results = job.result()
                except OSError as exc:
                    failure = disk_io.describe(exc)
                    continue
                if not hash_in_workers:
                    hdr, got = results
                    results = slab.verify_run(hdr, got, namespace_id, items)
                for i, reason in zip(run, results):
                    if reason is None:
                        hits.append(i)
                    else:
                        bad.append((keys[i], by_index[i].slot, reason))
        finally:
            wait([job for _, _, job in jobs])  # no slot is unpinned while it is being read
        return hits, bad, failure
