"""Disk tier: a preallocated slab file of fixed-size record slots, read and written with aligned
O_DIRECT vectored I/O from a bounded thread pool, indexed by LMDB.

Files in the tier's directory::

    LOCK       an exclusive flock while a tier has the directory open (text: the owner's pid)
    slots.dat  the slab: capacity_pages fixed-size record slots, preallocated (disk_slab.py)
    index/     the LMDB index, key -> slot, checksum, identity, last access (disk_index.py)

Every directory the tier creates (its own, missing parents, ``index/``) is mode 0700 and every
file (``LOCK``, ``slots.dat``, LMDB's ``data.mdb`` and ``lock.mdb``) 0600, whatever the
process umask; an existing directory or file of the tier with other bits (an older version made
them 0755 / 0644) is tightened when the tier opens it (``disk_io.private_dir``,
``open_private``).

The slot layout and the vectored I/O are in ``disk_slab.py``: a run of adjacent slots (at most
``max_io_bytes``) moves in one ``preadv``/``pwritev`` straight into (out of) the caller's
buffers when they are 4096-aligned (else through a counted bounce buffer). Runs go to a pool of
``io_threads`` workers. Checksums and MACs are computed beside the other runs' I/O: on a
machine with cores to spare each worker hashes the run it writes and verifies the run it read;
on a small one (``hash_in_workers``) the calling thread hashes run after run, handing each to
the workers, and verifies the runs in order as they arrive -- there, worker threads that each
take the GIL a few times per page cost more than they overlap. Where the filesystem refuses
O_DIRECT (``o_direct="auto"``) the tier logs a warning and uses buffered I/O, same layout.

Guarantees:

* **Ordering.** A write: allocate free slots (never one a committed index entry names) ->
  pwritev -> [fdatasync, ``durability="batch"`` only] -> commit the LMDB transaction -> publish
  in memory, so reads hit -> return. An index entry is committed only after its record's bytes
  are written. A delete (or a dropped corrupt page) leaves memory at once but its slot is
  reused only after the LMDB removal commits; a replaced page's old slot is freed by the
  commit that repoints its key.
* **Acknowledged.** A put is acknowledged when ``write`` returns True for it. By then its
  record is written to the slab (O_DIRECT: handed to the device; else in the page cache) and
  its index entry is committed to LMDB (written to the index file: at least the page cache).
* **Process crash** (SIGKILL, OOM), every ``durability``: no acknowledged put is lost. The
  page cache and the device survive the process, so every committed entry names a complete
  record. Writes that had not committed are forgotten; their slots are free at the next open
  (orphaned slots are simply slots no entry names).
* **Power loss / kernel crash**, by ``durability``:

  - ``"group"`` (the default): a background group commit (``disk_sync.py``) runs
    ``fdatasync(slab)`` then an LMDB sync at most ``sync_interval_ms`` after the first
    unsynced put. A put acknowledged before a group commit starts is power-safe when it ends:
    within ``sync_interval_ms`` plus one sync (a few ms) of its acknowledgement. ``close()``
    and ``sync()`` run one at once. Puts after the last completed group commit may be lost,
    and the LMDB pages they dirtied may reach the disk out of order: the index may then name
    records that never reached the medium (verification turns them into misses) or be
    damaged (moved aside at open: the cache comes back cold). Wrong bytes are never returned.
  - ``"batch"``: the slab is fdatasync'ed before each commit and LMDB syncs each commit
    (``metasync`` off: the last commit may be undone, which only forgets pages). A put is
    power-safe when it is acknowledged; it costs two device flushes per batch.
  - ``"none"``: nothing is flushed except by the kernel: the guarantees of ``"group"``
    without its bound; after a power loss the cache may come back cold or partial.
* **Verification.** Every read checks the header (magic, version, header checksum, layout,
  namespace, key, key chain), that it agrees with the index (checksum, size), the payload
  checksum and the record's MAC (keyed by the deployment secret, so whoever can write the
  directory but lacks the secret cannot plant a page). A failure is a miss; the entry is
  dropped and counted by reason.
* **Errors.** A write that meets ENOSPC, EFBIG, EDQUOT, EIO or an index commit failure is
  refused (False), logged once per condition and counted in ``kvstore_tier_errors_total``;
  reads keep working and writes resume when space frees (freed slots are reused lowest first).
  An index commit that fails for another reason is damage (``disk_index``): the index is moved
  aside, the tier forgets every page and goes on with an empty index (the write that found it
  is committed there).
* **Concurrency.** ``_lock`` guards the in-memory index, the free heap and reader pins; it is
  never held during I/O. ``_commit_lock`` serialises LMDB transactions with the in-memory
  changes they publish, so both see one order of events. A slot being read is pinned: a
  delete or replacement unlinks it at once but frees it after the last reader, so a read never
  returns another page's bytes. Last-access times change in memory and reach LMDB with the
  next commit, or from a background flush at most every ``ATIME_FLUSH_S``.
* **Safety.** One process and one tier per directory (flock, also within a process). Network
  filesystems are refused unless ``allow_network_fs``. A damaged index never stops the tier: it
  is moved aside and the tier starts empty (logged as an error). A capacity that does not fit
  the filesystem (``disk_space``) is refused before anything is reserved or the index is
  touched; a failed reservation gives back what it got. A filesystem too full to take the lock
  file's pid is a TierUnavailable, and no failed open keeps the directory locked.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import lmdb
import numpy as np

from kvstore.errors import TierUnavailable
from kvstore.keys import BlockMeta
from kvstore.layout import KVLayout
from kvstore.metrics import Metrics
from kvstore.record import RecordMac, default_mac_threads, stored_meta
from kvstore.tiers import disk_io
from kvstore.tiers.base import Tier
from kvstore.tiers.disk_config import DiskTierConfig, Durability
from kvstore.tiers.disk_failures import read_failures, write_failures
from kvstore.tiers.disk_index import DiskIndex, IndexEntry, IndexReplaced
from kvstore.tiers.disk_io import ALIGN, aligned_empty
from kvstore.tiers.disk_lock import lock_directory
from kvstore.tiers.disk_setup import open_directory, slab_open_error, use_o_direct
from kvstore.tiers.disk_slab import Slab
from kvstore.tiers.disk_slots import FreeSlots
from kvstore.tiers.disk_space import check_capacity
from kvstore.tiers.disk_sync import GroupCommitter
from kvstore.tiers.disk_workers import IOWorkers

log = logging.getLogger("kvstore.tiers.disk")

ATIME_FLUSH_S = 30.0


class DiskTier(Tier):
    kind = "disk"
    writes_records = True
    config_model = DiskTierConfig

    def __init__(
        self,
        config: DiskTierConfig,
        layout: KVLayout,
        metrics: Metrics | None = None,
        *,
        mac: RecordMac | None = None,
        store_token_ids: bool = False,
    ) -> None:
        """Opens the tier in ``config.path`` (the settings: :class:`DiskTierConfig`).
        ``config.durability`` says when a put becomes power-safe; every mode keeps every
        acknowledged put across a process crash (module docstring). ``config.hash_in_workers``
        None: the I/O workers hash and verify where the machine has cores to spare for it
        (``record.default_mac_threads``), else the calling thread does.

        Runtime arguments: ``mac``: the records' MAC, keyed by the deployment secret (None: the
        public key). ``store_token_ids``: keep each block's token ids in its record and index
        entry (``security.store_token_ids``); by default neither holds them
        (``record.stored_meta``)."""
        super().__init__(config, layout, metrics)
        name, capacity_pages = self.name, self.capacity_pages
        self.path = Path(config.path)
        self.durability: Durability = config.durability
        self.sync_interval_ms = config.sync_interval_ms
        self._committer: GroupCommitter | None = None
        self._max_io_bytes = int(config.max_io_bytes)
        hash_in_workers = config.hash_in_workers
        #: Whether the I/O workers hash and verify the runs they move (else the caller does).
        self.hash_in_workers = (default_mac_threads() > 0 if hash_in_workers is None
                                else hash_in_workers)
        self._mac = mac if mac is not None else RecordMac(None)
        self.store_token_ids = bool(store_token_ids)
        self._lock = threading.Lock()
        self._commit_lock = threading.Lock()
        self._entries: dict[bytes, IndexEntry] = {}
        self._slots = FreeSlots(capacity_pages)  # guarded by _lock, like _entries
        self._pending: list[tuple[bytes, int]] = []  # removed from memory, LMDB removal to commit
        self._dirty: set[bytes] = set()  # keys whose atime LMDB has not seen
        self._last_flush = time.monotonic()
        self._flush_queued = False
        self._write_failures = write_failures(name, self.path, self.metrics)
        self._read_failures = read_failures(name, self.path, self.metrics)
        self._closed = True
        self._lock_fd = -1
        self._slab: Slab | None = None
        self._index: DiskIndex | None = None
        self._workers: IOWorkers | None = None
        try:
            self._open(config.o_direct, config.preallocate, config.allow_network_fs,
                       config.check_index, config.io_threads)
        except BaseException:
            self._release()
            raise
        self._closed = False
        self._update_occupancy()

    # ----------------------------------------------------------------- open / close

    def _open(
        self, o_direct: Any, prealloc: bool, allow_nfs: bool, check: bool, threads: int
    ) -> None:
        path, layout = self.path, self.layout
        self.filesystem = open_directory(self.name, path, allow_nfs)
        self._lock_fd = lock_directory(path)
        self.o_direct = use_o_direct(self.name, path, self.filesystem, o_direct)
        self._slab = slab = Slab(
            path, layout, self.capacity_pages, o_direct=self.o_direct,
            max_io_bytes=self._max_io_bytes, metrics=self.metrics, tier_name=self.name,
            mac=self._mac,
        )
        self.slot_bytes = slab.slot_bytes
        check_capacity(
            self.name, path, self.capacity_pages, slot_bytes=slab.slot_bytes,
            block_size=layout.block_size, preallocate=prealloc, slab_file=slab.path,
            index_file=path / "index" / "data.mdb",
        )
        self._index = DiskIndex(
            path, slab.geometry, block_size=layout.block_size, capacity_pages=self.capacity_pages,
            sync=self.durability == "batch", check=check,
        )
        self._load(self._index.entries)
        self._index.entries = []
        try:
            problem = slab.open(prealloc)
        except OSError as exc:
            raise slab_open_error(self.name, self.capacity_pages, slab, exc) from None
        if problem:
            log.warning("disk tier %r: slab %s: %s", self.name, slab.path, problem)
        self._workers = IOWorkers(self.name, threads)
        if self.durability == "group":
            self._committer = GroupCommitter(
                self.name, slab.sync, self._sync_index, self.sync_interval_ms / 1000,
                self._sync_failed,
            )
        log.info(
            "disk tier %r: %s (%s, %s I/O): %d of %d slots hold pages", self.name, path,
            self.filesystem, "O_DIRECT" if self.o_direct else "buffered", len(self._entries),
            self.capacity_pages,
        )

    def _load(self, entries: list[IndexEntry]) -> None:
        """Rebuild the in-memory index and free heap from the index as opened. Entries past the
        capacity, of another layout or sharing a slot are dropped; every other slot is free."""
        fp, page = self.layout.fingerprint, self.layout.page_bytes
        taken: set[int] = set()
        drop: list[bytes] = []
        for e in entries:
            bad = e.slot >= self.capacity_pages or e.slot in taken
            if bad or e.layout_fingerprint != fp or e.payload_bytes != page:
                drop.append(e.meta.key)
                continue
            taken.add(e.slot)
            self._entries[e.meta.key] = e
        if drop:
            log.warning("disk tier %r: dropping %d impossible index entries", self.name, len(drop))
            try:
                assert self._index is not None
                self._index.delete(drop)
            except IndexReplaced:  # the drop found the index damaged: an empty one replaced it
                self._entries, taken = {}, set()
            except lmdb.Error as exc:
                log.error("disk tier %r: cannot drop them from the index: %s", self.name, exc)
        self._slots.load(taken)

    def close(self) -> None:
        """Flush last-access times and pending removals, close the index and the slab, release
        the directory. Idempotent; later calls raise StoreClosed."""
        super().close()
        with self._commit_lock:
            if self._closed:
                return
            self._closed = True
        if self._workers is not None:
            self._workers.shutdown(wait=True)
        with self._commit_lock:
            if self._index is not None and (self._dirty or self._pending):
                try:
                    self._commit([])
                except lmdb.Error as exc:
                    log.warning("disk tier %r: final index flush failed: %s", self.name, exc)
        if self._committer is not None:
            self._committer.close()  # a clean close leaves every put power-safe
        self._release()

    def _release(self) -> None:
        if self._committer is not None:
            self._committer.close()
        if self._workers is not None:
            self._workers.shutdown(wait=False)
        if self._index is not None:
            self._index.close()
        if self._slab is not None:
            self._slab.close()
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    def __enter__(self) -> DiskTier:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _ensure_open(self) -> None:
        if self._closed:
            raise TierUnavailable(f"disk tier {self.name!r} is closed")

    # ----------------------------------------------------------------- hooks

    def _contains(self, keys: Sequence[bytes]) -> list[bool]:
        entries = self._entries
        return [k in entries for k in keys]

    def _count_leading(self, keys: Sequence[bytes]) -> int:
        entries = self._entries
        n = 0
        for k in keys:
            if k not in entries:
                break
            n += 1
        return n

    def _meta(self, key: bytes) -> BlockMeta | None:
        entry = self._entries.get(key)
        return None if entry is None else entry.meta

    def _keys(self) -> Iterator[bytes]:
        """Least recently accessed first, so a policy rebuilt by inserting in this order (the
        store does so on a warm restart) starts with the right recency."""
        with self._lock:
            items = sorted(self._entries.values(), key=lambda e: e.atime)
        return iter([e.meta.key for e in items])

    def _used(self) -> int:
        return len(self._entries)

    def slot_of(self, key: bytes) -> int | None:
        """The slab slot holding ``key`` (record at ``slot * slot_bytes``), or None. For tools
        and tests that inspect the file."""
        entry = self._entries.get(key)
        return None if entry is None else entry.slot

    def sync(self) -> bool:
        """Make every put acknowledged so far power-safe now (``durability="group"``: run the
        group commit on this thread; "batch": they already are; "none": flush anyway). False
        when a flush failed (logged, counted in ``kvstore_tier_errors_total``)."""
        self._ensure_open()
        if self._committer is not None:
            return self._committer.flush()
        if self.durability == "batch":
            return True
        try:
            assert self._slab is not None
            self._slab.sync()
            self._sync_index()
        except (OSError, lmdb.Error) as exc:
            self._sync_failed(f"{type(exc).__name__}: {exc}")
            return False
        return True

    @property
    def unsynced(self) -> bool:
        """Whether an acknowledged put is not yet power-safe (``durability="group"``; the
        other modes report False: "batch" never has one, "none" never promises it)."""
        return self._committer is not None and self._committer.pending

    def _sync_index(self) -> None:
        with self._commit_lock:  # a commit may replace the index (moved aside) meanwhile
            assert self._index is not None
            self._index.flush()

    def _sync_failed(self, what: str) -> None:
        self.metrics.errors.labels(self.name, "sync").inc()
        log.error(
            "disk tier %r at %s: a group commit failed (%s): pages written since the last one "
            "are not yet safe from power loss; retrying", self.name, self.path, what,
        )

    def _write(self, metas: Sequence[BlockMeta], pages: Sequence[np.ndarray]) -> list[bool]:
        self._ensure_open()
        metas = [stored_meta(m, self.store_token_ids) for m in metas]  # record and index alike
        n = len(metas)
        with self._lock:
            got = [self._slots.alloc() for _ in range(n)]
        todo = sorted((i for i in range(n) if got[i] is not None), key=lambda i: got[i] or 0)
        slots = [s or 0 for s in got]
        stored = [False] * n
        failure: str | None = None
        try:
            failure = self._store(metas, pages, slots, todo, stored)
        finally:
            with self._lock:  # slots of refused pages were never published: nobody saw them
                for i in todo:
                    if not stored[i]:
                        self._slots.give_back(slots[i])
        if todo:
            self._write_failures.note(failure)
        return stored

    def _store(
        self,
        metas: Sequence[BlockMeta],
        pages: Sequence[np.ndarray],
        slots: list[int],
        todo: list[int],
        stored: list[bool],
    ) -> str | None:
        """Write ``todo`` (indices sorted by slot) into their ``slots``, make them durable,
        commit and publish them; set ``stored[i]``. Returns what failed, or None."""
        assert self._slab is not None and self._workers is not None
        slab = self._slab
        checksums, failure = self._workers.write(
            slab, metas, pages, slots, todo, hash_in_workers=self.hash_in_workers
        )
        if checksums and self.durability == "batch":
            try:
                slab.sync()
            except OSError as exc:
                return disk_io.describe(exc)
        if not checksums:
            return failure
        now, fp, page = time.time(), self.layout.fingerprint, self.layout.page_bytes
        puts = [
            (metas[i].key, IndexEntry(slots[i], checksums[i], metas[i], fp, page, now))
            for i in sorted(checksums)
        ]
        with self._commit_lock:
            try:
                self._commit(puts)
            except lmdb.Error as exc:
                return f"the index commit failed ({type(exc).__name__}: {exc})"
            with self._lock:
                for key, entry in puts:
                    old = self._entries.get(key)
                    self._entries[key] = entry
                    if old is not None:
                        self._slots.unlink(old.slot)
        if self._committer is not None:
            self._committer.note()
        for i in checksums:
            stored[i] = True
        return failure

    def _read(
        self, namespace_id: bytes, keys: Sequence[bytes], outs: Sequence[np.ndarray]
    ) -> list[bool]:
        self._ensure_open()
        assert self._slab is not None and self._workers is not None
        slab = self._slab
        found = [False] * len(keys)
        plan: list[tuple[int, IndexEntry]] = []
        now = time.time()
        with self._lock:
            for i, key in enumerate(keys):
                entry = self._entries.get(key)
                if entry is None:
                    continue
                if entry.meta.namespace_id != namespace_id:
                    self.count_corrupt("namespace")
                    continue
                self._slots.pin(entry.slot)
                entry.atime = now
                self._dirty.add(key)
                plan.append((i, entry))
        try:
            hits, bad, failure = self._workers.read(
                slab, namespace_id, keys, outs, plan, hash_in_workers=self.hash_in_workers
            )
        finally:
            with self._lock:
                for _, entry in plan:
                    self._slots.unpin(entry.slot)
        for i in hits:
            found[i] = True
        if plan:
            self._read_failures.note(failure)
        for key, slot, reason in bad:
            self.count_corrupt(reason)
            self._drop(key, slot)
        stale = time.monotonic() - self._last_flush > ATIME_FLUSH_S
        if self._dirty and stale and not self._flush_queued:
            self._flush_queued = True
            self._workers.submit(self._flush_atimes)
        return found

    def _delete(self, keys: Sequence[bytes]) -> int:
        self._ensure_open()
        with self._commit_lock:
            with self._lock:
                n = 0
                for key in keys:
                    entry = self._entries.pop(key, None)
                    if entry is not None:
                        self._pending.append((key, entry.slot))
                        self._dirty.discard(key)
                        n += 1
            if n:
                try:
                    self._commit([])
                except lmdb.Error as exc:
                    # The pages are gone from memory; their slots stay reserved until a later
                    # commit removes them from LMDB.
                    self.metrics.errors.labels(self.name, "delete").inc()
                    log.error("disk tier %r: index commit of a delete failed: %s", self.name, exc)
        return n

    # ----------------------------------------------------------------- index bookkeeping

    def _commit(self, puts: list[tuple[bytes, IndexEntry]]) -> None:
        """One LMDB transaction: pending removals, then dirty last-access times, then ``puts``.
        Frees the removed slots once it has committed. Called with ``_commit_lock`` held."""
        assert self._index is not None
        with self._lock:
            touched = [(k, self._entries[k]) for k in self._dirty if k in self._entries]
            self._dirty = set()
            removed = self._pending
        try:
            self._index.commit(touched + puts, [k for k, _ in removed])
        except IndexReplaced:
            # The old index is gone with every page it named; ``puts`` name records already
            # durable in the slab, so they go into the new one.
            self._forget_all()
            try:
                self._index.commit(puts)
            except IndexReplaced:
                self._forget_all()
                raise
        self._last_flush = time.monotonic()
        with self._lock:
            self._pending = []
            for _, slot in removed:
                self._slots.unlink(slot)

    def _forget_all(self) -> None:
        """Forget every published page: the index that named them was replaced by an empty
        one. Slots allocated to writes still in flight are in neither the index nor the free
        heap and stay theirs; slots being read are freed after their last reader."""
        with self._lock:
            for entry in self._entries.values():
                self._slots.unlink(entry.slot)
            self._entries = {}
            self._dirty = set()

    def _drop(self, key: bytes, slot: int) -> None:
        """Remove ``key`` if it still names ``slot`` (a read found its record damaged)."""
        with self._commit_lock:
            with self._lock:
                entry = self._entries.get(key)
                if entry is None or entry.slot != slot:
                    return
                del self._entries[key]
                self._dirty.discard(key)
                self._pending.append((key, slot))
            try:
                self._commit([])
            except lmdb.Error as exc:
                log.error("disk tier %r: index commit of a dropped page failed: %s", self.name, exc)

    def _flush_atimes(self) -> None:
        try:
            with self._commit_lock:
                if not self._closed:
                    self._commit([])
        except lmdb.Error as exc:
            log.warning("disk tier %r: last-access flush failed: %s", self.name, exc)
        finally:
            self._flush_queued = False


__all__ = ["ALIGN", "DiskTier", "Durability", "aligned_empty"]
