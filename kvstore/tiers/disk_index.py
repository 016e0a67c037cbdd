"""The disk tier's LMDB index: key -> slot, payload checksum, identity, last access.

One LMDB environment in ``<dir>/index/`` (mode 0700; ``data.mdb`` and ``lock.mdb`` 0600,
whatever the umask) with two named databases:

* ``pages``: 16-byte block key -> :data:`_VALUE`, then the block's token ids (int32le) where
  the tier stores them (``store_token_ids``; by default not: the value ends at 72)::

      offset  size  field
      0       8     slot                 u64
      8       8     payload checksum     xxh3_64 of the page bytes
      16      16    namespace id
      32      8     layout fingerprint
      40      16    parent key
      56      8     payload bytes        u64
      64      8     last access          f64, seconds since the epoch
      72      4*B   token ids            B = layout.block_size; absent by default

* ``meta``: ``b"geometry"`` -> the slot geometry the slab was written with::

      offset  size  field
      0       4     magic                b"kvg1"
      4       8     checksum             xxh3_64 of the JSON, little-endian
      12      ...   JSON of the geometry (sorted keys)

  (An index written before the checksum holds the bare JSON; when it equals the geometry asked
  for it is accepted and rewritten in this form.)

Opening is defensive. Unless told otherwise, the environment is first walked end to end by a
separate Python process that imports only ``lmdb``, so a damaged file that would crash LMDB
kills that process, not the server; the child also commits a put and a delete in every
database, because some damage (a flag in the free-page list) passes every read and fails every
commit. An index that fails this check, or raises ``lmdb.Error`` on open or on the first scan
(other than a full filesystem), or whose geometry record fails its checksum, is renamed to
``index.corrupt-<UTC time>`` and a fresh, empty one is created (logged as an error; every slot
of the slab becomes free). Entries that do not parse are dropped. A geometry that is intact but
differs from the one asked for is refused (ConfigError): the directory holds another layout's
cache and is not ours to wipe.

A commit that fails for any reason other than a full filesystem (:func:`is_space_error`) is
damage found late: the index is moved aside and replaced by an empty one at once, and the
commit raises :class:`IndexReplaced` so the tier forgets what the old index held.

Not thread-safe: the tier serialises every write transaction under its commit lock.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import struct
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lmdb
import xxhash

from kvstore.errors import ConfigError, TierUnavailable
from kvstore.keys import KEY_BYTES, BlockMeta
from kvstore.tiers.disk_io import FILE_MODE, private_dir, reserve_beyond_eof, tighten

log = logging.getLogger("kvstore.tiers.disk")

#: The files LMDB keeps in the index directory (mode 0600, as the directory is 0700).
_FILES = ("data.mdb", "lock.mdb")
_VALUE = struct.Struct("<QQ16s8s16sQd")
assert _VALUE.size == 72
_CHECK_TIMEOUT_S = 300.0

_GEOMETRY_MAGIC = b"kvg1"
_GEOMETRY_HEAD = struct.Struct("<4sQ")

# Walks every database of the environment at argv[1]; allocates pages in a write transaction
# it aborts (which reads the free list); then commits a put and a delete of one key in every
# database (which rewrites the free list and every database's record: the net content is
# unchanged). Exit 0 when all of it works, 3 with the error on stderr when lmdb raises. A crash
# (a signal) is the other way a damaged file shows. A full filesystem is not damage: exit 0.
# Runs while the tier holds the directory's flock, so no other process uses the environment.
_CHECK_SCRIPT = """
import errno, sys
sys.path[:0] = [p for p in sys.argv[2:] if p]
import lmdb
probe = b"kvstore-index-check"
try:
    env = lmdb.open(sys.argv[1], lock=False, max_dbs=4, subdir=True, map_size=1 << 40,
                    mode=0o600)
    with env.begin() as txn:
        names = [bytes(k) for k, _ in txn.cursor()]
        dbs = [env.open_db(name, txn=txn, create=False) for name in names]
        for db in dbs:
            n = 0
            for k, v in txn.cursor(db=db):
                n += len(k) + len(v)
    txn = env.begin(write=True)
    for i in range(64):
        txn.put(b"%s-%d" % (probe, i), bytes(4096))
    txn.abort()
    try:
        with env.begin(write=True) as txn:
            for db in [None, *[env.open_db(n, txn=txn, create=False) for n in names]]:
                txn.put(probe, b"x", db=db)
                txn.delete(probe, db=db)
    except lmdb.Error as exc:
        if not (isinstance(exc, lmdb.DiskError) or getattr(exc, "code", 0) in
                (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)):
            raise
    env.close()
except lmdb.Error as exc:
    print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
    sys.exit(3)
"""


class IndexReplaced(lmdb.Error):
    """A commit showed the index damaged: it was moved aside and an empty index stands in its
    place. Nothing of the failed transaction, nor of anything committed before, is in it."""


def is_space_error(exc: lmdb.Error) -> bool:
    """True when ``exc`` means the filesystem has no room (full, quota, file-size limit) or the
    medium failed (EIO): conditions that pass, unlike damage to the index's own bytes."""
    code = getattr(exc, "code", 0)
    return isinstance(exc, lmdb.DiskError) or code in (
        errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO,
    )


@dataclass(slots=True)
class IndexEntry:
    """One stored page as the index knows it. ``atime`` changes in memory on every hit and
    reaches LMDB lazily."""

    slot: int
    checksum: int
    meta: BlockMeta
    layout_fingerprint: bytes
    payload_bytes: int
    atime: float

    def pack(self) -> bytes:
        m = self.meta
        return (
            _VALUE.pack(
                self.slot,
                self.checksum,
                m.namespace_id,
                self.layout_fingerprint,
                m.parent,
                self.payload_bytes,
                self.atime,
            )
            + m.token_ids
        )

    @classmethod
    def unpack(cls, key: bytes, value: bytes, block_size: int) -> IndexEntry | None:
        if len(key) != KEY_BYTES or len(value) not in (_VALUE.size, _VALUE.size + 4 * block_size):
            return None
        slot, csum, ns, fp, parent, plen, atime = _VALUE.unpack_from(value)
        meta = BlockMeta(bytes(ns), bytes(key), bytes(parent), bytes(value[_VALUE.size :]))
        return cls(slot, csum, meta, bytes(fp), plen, atime)


class DiskIndex:
    """LMDB environment of one disk tier. ``entries`` holds what the index contained at open."""

    def __init__(
        self,
        directory: Path,
        geometry: dict[str, Any],
        *,
        block_size: int,
        capacity_pages: int,
        sync: bool,
        check: bool,
    ) -> None:
        self.path = directory / "index"
        self.geometry = geometry
        self.block_size = block_size
        self.sync = sync
        self.map_size = map_bytes(block_size, capacity_pages)
        self.reserve_bytes = reserve_bytes(block_size, capacity_pages)
        #: Where a damaged index was moved to at open, or None.
        self.moved_aside: Path | None = None
        self.entries: list[IndexEntry] = []
        self.dropped_at_open = 0
        if check and (self.path / "data.mdb").exists():
            problem = _check_in_child(self.path)
            if problem:
                self._move_aside(problem)
        try:
            self._open_and_scan()
        except IndexReplaced:
            pass  # a commit at open (dropping bad entries) found damage: already replaced
        except lmdb.Error as exc:
            self._close_quietly()
            if is_space_error(exc):
                raise _no_room(self.path, exc) from None
            self._move_aside(f"{type(exc).__name__}: {exc}")
            self._open_fresh()

    # ----------------------------------------------------------------- open

    def _open_fresh(self) -> None:
        """Create an empty index where the damaged one was moved from."""
        try:
            self._open_and_scan()
        except lmdb.Error as exc:
            self._close_quietly()
            if is_space_error(exc):
                raise _no_room(self.path, exc) from None
            raise TierUnavailable(
                f"cannot create an LMDB index in {self.path}: {exc}",
                hint="check the disk tier directory's permissions and free space",
            ) from exc

    def _open_and_scan(self) -> None:
        private_dir(self.path)
        self.env = lmdb.open(
            str(self.path),
            map_size=self.map_size,
            subdir=True,
            max_dbs=4,
            sync=self.sync,
            metasync=False,  # see the disk tier's docstring: at most the last commit is lost
            writemap=False,  # a sparse writable map turns ENOSPC into SIGBUS
            readahead=False,
            lock=True,
            create=True,
            mode=FILE_MODE,  # data.mdb and lock.mdb (LMDB creates both with it)
        )
        for name in _FILES:  # an older version's files (0644): ours, made private
            if (self.path / name).exists():
                tighten(self.path / name, FILE_MODE)
        self._meta_db = self.env.open_db(b"meta")
        self._pages = self.env.open_db(b"pages")
        with self.env.begin(write=True) as txn:
            got = txn.get(b"geometry", db=self._meta_db)
            raw = None if got is None else bytes(got)
            found = None if raw is None else _decode_geometry(raw)
            if raw is None or (found == self.geometry and raw[:4] != _GEOMETRY_MAGIC):
                txn.put(b"geometry", _encode_geometry(self.geometry), db=self._meta_db)
        if found is not None and found != self.geometry:
            self.env.close()
            raise ConfigError(
                f"disk tier directory {self.path.parent} holds pages of another geometry: "
                f"{found}, this tier is configured for {self.geometry}",
                hint="give each layout its own disk tier directory, or delete the old one",
            )
        self._reserve()
        entries: list[IndexEntry] = []
        bad: list[bytes] = []
        with self.env.begin() as txn:
            for key, value in txn.cursor(db=self._pages):
                entry = IndexEntry.unpack(bytes(key), bytes(value), self.block_size)
                if entry is None:
                    bad.append(bytes(key))
                else:
                    entries.append(entry)
        if bad:
            self.delete(bad)
            log.warning("disk index %s: dropped %d entries that do not parse", self.path, len(bad))
        self.entries = entries
        self.dropped_at_open = len(bad)

    def flush(self) -> None:
        """Flush every commit so far to the medium (an environment opened with ``sync``
        false flushes only here)."""
        self.env.sync(True)

    def _reserve(self) -> None:
        """Allocate room past the end of data.mdb so deletes (which free slab space) can still
        commit when the filesystem is full."""
        try:
            fd = os.open(self.path / "data.mdb", os.O_RDWR)
        except OSError:
            return
        try:
            reserve_beyond_eof(fd, self.reserve_bytes)
        finally:
            os.close(fd)

    def _move_aside(self, problem: str) -> None:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        target = self.path.with_name(f"index.corrupt-{stamp}")
        n = 1
        while target.exists():
            target = self.path.with_name(f"index.corrupt-{stamp}-{n}")
            n += 1
        try:
            os.rename(self.path, target)
        except OSError:
            shutil.rmtree(self.path, ignore_errors=True)
            target = self.path
        self.moved_aside = target
        log.error(
            "disk index %s is damaged (%s); moved it to %s and starting with an empty index: "
            "every page on this disk tier is forgotten and its slots are free",
            self.path, problem, target,
        )

    def _close_quietly(self) -> None:
        env = getattr(self, "env", None)
        if env is not None:
            try:
                env.close()
            except lmdb.Error:
                pass

    # ----------------------------------------------------------------- transactions

    def commit(
        self, puts: Iterable[tuple[bytes, IndexEntry]], deletes: Sequence[bytes] = ()
    ) -> None:
        """One transaction: ``deletes`` then ``puts``. Raises lmdb.Error (nothing changed): a
        full filesystem (:func:`is_space_error`), or :class:`IndexReplaced` for any other
        failure, which is damage."""
        items = [(k, e.pack()) for k, e in puts]
        for attempt in range(3):
            try:
                with self.env.begin(write=True, db=self._pages) as txn:
                    for key in deletes:
                        txn.delete(key)
                    for key, value in items:
                        txn.put(key, value)
                return
            except lmdb.MapFullError:
                if attempt == 2:
                    raise
                self.map_size *= 2
                self.env.set_mapsize(self.map_size)
                log.warning("disk index %s: map full, grown to %d bytes", self.path, self.map_size)
            except lmdb.Error as exc:
                if is_space_error(exc):
                    raise
                problem = f"a commit failed: {type(exc).__name__}: {exc}"
                self._close_quietly()
                self._move_aside(problem)
                self._open_fresh()
                raise IndexReplaced(problem) from exc

    def delete(self, keys: Sequence[bytes]) -> None:
        self.commit((), keys)

    def close(self) -> None:
        self._close_quietly()


def round_up_mib(n: int) -> int:
    return -(-n // 2**20) * 2**20


def _entry_bytes(block_size: int) -> int:
    """An upper bound of one entry's bytes in a B-tree leaf: key, value and node header."""
    return KEY_BYTES + _VALUE.size + 4 * block_size + 32


def map_bytes(block_size: int, capacity_pages: int) -> int:
    """The LMDB map size (virtual address space) for ``capacity_pages`` entries. B-tree pages
    run ~2/3 full and copy-on-write needs room for the old and new versions: 4x the raw bytes."""
    return round_up_mib(8 * 2**20 + 4 * _entry_bytes(block_size) * capacity_pages)


def reserve_bytes(block_size: int, capacity_pages: int) -> int:
    """Blocks reserved past the end of data.mdb so that deletes can commit on a full disk."""
    return 2**20 + reserve_bytes_per_page(block_size) * capacity_pages


def reserve_bytes_per_page(block_size: int) -> int:
    return 2 * _entry_bytes(block_size)


def _encode_geometry(geometry: dict[str, Any]) -> bytes:
    body = json.dumps(geometry, sort_keys=True).encode()
    return _GEOMETRY_HEAD.pack(_GEOMETRY_MAGIC, xxhash.xxh3_64_intdigest(body)) + body


def _decode_geometry(raw: bytes) -> dict[str, Any]:
    """The geometry a record holds; raises lmdb.CorruptedError (damage) when it fails its
    checksum or does not parse. A record without the magic is the bare JSON of old indexes."""
    body = raw
    if raw[:4] == _GEOMETRY_MAGIC:
        _, checksum = _GEOMETRY_HEAD.unpack_from(raw)
        body = raw[_GEOMETRY_HEAD.size :]
        if xxhash.xxh3_64_intdigest(body) != checksum:
            raise lmdb.CorruptedError("the geometry record fails its checksum")
    try:
        found = json.loads(body)
    except ValueError:
        raise lmdb.CorruptedError("the geometry record does not parse") from None
    if not isinstance(found, dict):
        raise lmdb.CorruptedError("the geometry record is not an object")
    return found


def _no_room(path: Path, exc: lmdb.Error) -> TierUnavailable:
    return TierUnavailable(
        f"cannot open the LMDB index in {path}: the filesystem has no room or failed "
        f"({type(exc).__name__}: {exc})",
        hint="free space on the disk tier's filesystem, then start the tier again",
    )


def _check_in_child(path: Path) -> str | None:
    """Walk the environment in a separate process. None when it reads end to end, else what went
    wrong. When no child can be started the check is skipped (the in-process open still catches
    every lmdb.Error)."""
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _CHECK_SCRIPT, str(path), *sys.path],
            capture_output=True,
            text=True,
            timeout=_CHECK_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return f"checking it took more than {_CHECK_TIMEOUT_S:.0f} s"
    except OSError as exc:
        log.warning("cannot start a process to check disk index %s (%s); skipping", path, exc)
        return None
    if proc.returncode == 0:
        return None
    if proc.returncode < 0:
        return f"reading it crashed LMDB (signal {-proc.returncode})"
    detail = proc.stderr.strip().splitlines()
    return detail[-1] if detail else f"checker exited with status {proc.returncode}"


__all__ = [
    "DiskIndex",
    "IndexEntry",
    "IndexReplaced",
    "is_space_error",
    "map_bytes",
    "reserve_bytes",
    "reserve_bytes_per_page",
]
