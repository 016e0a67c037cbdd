"""Group commit for the disk tier: one background thread makes the slab and the index
power-safe on a timer, so a put never waits for a device flush.

In ``durability="group"`` a put returns once its record is written to the slab (O_DIRECT: handed
to the device; buffered: in the page cache) and its index entry is committed to LMDB without a
sync (in the page cache). Both survive a crash of the process. This module then makes them
survive power loss: at most ``interval_s`` after the first unsynced put, it runs

    fdatasync(slab)  ->  sync(index)

in that order, so an index entry that the sync makes durable names a record the slab flush
already made durable. Every put acknowledged before a sync *starts* is power-safe when that
sync returns: at most ``interval_s`` plus one sync's duration after its acknowledgement.

Concurrency: one thread; ``note()`` bumps a counter and sets an Event; ``flush()`` (used by
``close`` and by callers who need a barrier now) runs a sync on the calling thread, serialised
with the timer's by ``_sync_lock``. The index sync runs under the tier's commit lock (passed in
as part of ``sync_index``), because the index may be replaced (moved aside) by a commit.
Errors: a failed sync is logged and counted by ``on_error``; the next put schedules another.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger("kvstore.tiers.disk")


class GroupCommitter:
    """Syncs ``sync_slab`` then ``sync_index`` at most ``interval_s`` after a ``note()``."""

    def __init__(
        self,
        name: str,
        sync_slab: Callable[[], None],
        sync_index: Callable[[], None],
        interval_s: float,
        on_error: Callable[[str], None],
    ) -> None:
        self._sync_slab = sync_slab
        self._sync_index = sync_index
        self.interval_s = interval_s
        self._on_error = on_error
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._sync_lock = threading.Lock()
        self._note_lock = threading.Lock()
        #: Bumped by every ``note()``; ``synced`` is the value the last completed sync covered.
        self.noted = 0
        self.synced = 0
        #: Completed syncs (for tests and stats).
        self.syncs = 0
        self._thread = threading.Thread(
            target=self._run, name=f"kvstore-disk-sync-{name}", daemon=True
        )
        self._thread.start()

    def note(self) -> None:
        """A put was acknowledged: schedule a sync within ``interval_s``."""
        with self._note_lock:
            self.noted += 1
        if not self._wake.is_set():
            self._wake.set()

    @property
    def pending(self) -> bool:
        """Whether an acknowledged put is not yet power-safe."""
        return self.synced != self.noted

    def flush(self) -> bool:
        """Sync now on the calling thread: every put acknowledged before this call is
        power-safe when it returns True (False: the sync failed, logged and counted)."""
        return self._sync()

    def close(self) -> None:
        """Stop the thread after a last sync of whatever is pending."""
        self._stop.set()
        self._wake.set()
        self._thread.join()
        if self.pending:
            self._sync()

    def _run(self) -> None:
        # The stop is checked on every turn, not only while waiting out the interval: a close
        # that lands between that wait and the clear below has its wake-up cleared, and a
        # thread that then waited for the next one would never end (close joins it).
        while not self._stop.is_set():
            self._wake.wait()
            # Let puts gather for one interval: one flush then covers all of them.
            if self._stop.wait(self.interval_s):
                return
            self._wake.clear()
            self._sync()

    def _sync(self) -> bool:
        with self._sync_lock:
            target = self.noted
            if target == self.synced:
                return True
            try:
                self._sync_slab()
                self._sync_index()
            except Exception as exc:  # noqa: BLE001 - OSError or lmdb.Error: count, retry later
                self._on_error(f"{type(exc).__name__}: {exc}")
                self._wake.set()
                return False
            self.synced = target
            self.syncs += 1
            return True


__all__ = ["GroupCommitter"]
