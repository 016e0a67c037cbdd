"""Retention that outlives the process: a store with a disk tier keeps its pins and budgets in
``<disk dir>/retention.json``, so a restarted store (a daemon restart) keeps a pinned system
prompt pinned and each tenant within its budget.

Format (JSON, version 1)::

    {"version": 1,
     "pins": [{"id": 7, "namespace": "<32 hex>", "keys": ["<32 hex>", ...],
               "expires_unix": 1765000000.5}],
     "budgets": [{"namespace": "<32 hex>", "tier": "host", "bytes": 1073741824}]}

Expiry is kept as wall-clock time (the store's clock is monotonic and restarts with the
process); a pin that lapsed while the store was down is not restored. Written atomically
(temporary file, fsync, rename, directory fsync), outside the store lock, newest state last
(a writer that finds a newer write done skips its older one). A write that fails (a full disk)
leaves the last good file as it was; the store logs it and the change holds in memory. A file that does not parse --
damaged, or written by someone else -- is set aside as ``retention.json.bad`` and logged: the
store starts with no retention rather than with a wrong one.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("kvstore.retention")

FILE_NAME = "retention.json"
VERSION = 1


@dataclass(frozen=True, slots=True)
class SavedPin:
    id: int
    namespace_id: bytes
    keys: tuple[bytes, ...]
    expires_unix: float


@dataclass(frozen=True, slots=True)
class SavedBudget:
    namespace_id: bytes
    tier: str
    nbytes: int


class RetentionFile:
    def __init__(self, directory: Path) -> None:
        self.path = Path(directory) / FILE_NAME
        self._lock = threading.Lock()
        self._written = 0  # the newest version on disk

    def load(self) -> tuple[list[SavedPin], list[SavedBudget]]:
        """What the file holds ([] and [] when there is none; a bad file is set aside)."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return [], []
        try:
            return _parse(json.loads(raw))
        except (ValueError, TypeError, KeyError) as exc:
            bad = self.path.with_name(FILE_NAME + ".bad")
            os.replace(self.path, bad)
            log.error("%s is not a retention file this store wrote (%s); set aside as %s, "
                      "starting with no pins and no budgets", self.path, exc, bad)
            return [], []

    def save(self, version: int, pins: Sequence[SavedPin], budgets: Sequence[SavedBudget]) -> None:
        """Write state ``version`` (a number that grows with each change), unless a newer one
        was written already."""
        body = json.dumps({
            "version": VERSION,
            "pins": [{"id": p.id, "namespace": p.namespace_id.hex(),
                      "keys": [k.hex() for k in p.keys], "expires_unix": p.expires_unix}
                     for p in pins],
            "budgets": [{"namespace": b.namespace_id.hex(), "tier": b.tier, "bytes": b.nbytes}
                        for b in budgets],
        }).encode()
        with self._lock:
            if version <= self._written:
                return
            tmp = self.path.with_name(FILE_NAME + ".tmp")
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                try:
                    if os.write(fd, body) != len(body):
                        raise OSError(errno.ENOSPC, "short write")
                    os.fsync(fd)
                finally:
                    os.close(fd)
                os.replace(tmp, self.path)
            except OSError:
                tmp.unlink(missing_ok=True)  # the last good file stays as it was
                raise
            dfd = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
            self._written = version


def _parse(doc: Any) -> tuple[list[SavedPin], list[SavedBudget]]:
    if not isinstance(doc, dict) or doc.get("version") != VERSION:
        raise ValueError(f"version {doc.get('version') if isinstance(doc, dict) else doc!r}")
    pins = [SavedPin(int(p["id"]), _id(p["namespace"]), tuple(_id(k) for k in p["keys"]),
                     float(p["expires_unix"])) for p in doc["pins"]]
    budgets = [SavedBudget(_id(b["namespace"]), str(b["tier"]), int(b["bytes"]))
               for b in doc["budgets"]]
    if any(b.nbytes < 0 for b in budgets):
        raise ValueError("a negative budget")
    return pins, budgets


def _id(text: Any) -> bytes:
    raw = bytes.fromhex(text)
    if len(raw) != 16:
        raise ValueError(f"an identity of {len(raw)} bytes")
    return raw


__all__ = ["FILE_NAME", "RetentionFile", "SavedBudget", "SavedPin"]
