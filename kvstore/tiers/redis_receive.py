"""Receiving a Redis tier's GET replies: the reply handler of a read, which reads each value
straight into the caller's page buffer and verifies it, and that of ``meta``, which reads one
value whole.

A raw record of this layout (the usual case) is verified as it arrives: its header is read, then
the page straight into the caller's buffer. With the MAC pool (``record.mac_jobs``) the page is
verified there while the calling thread receives the next one; without it the calling thread
feeds the MAC's hasher piece by piece as the page arrives. A value of another record size
(compressed, or damaged) is read whole and decoded into the buffer. A value of a size no record
of this layout has is classed by its header alone (its payload is skipped, unread).

Not thread-safe: one receiver serves one call; its jobs run on the MAC pool.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from kvstore.errors import RecordError
from kvstore.keys import BlockMeta
from kvstore.record import MacJobs, payload_digest
from kvstore.tiers.redis_records import Records, size_reason
from kvstore.tiers.redis_resp import ReplyError, RespIO

#: ``bad(key, reason, hdr)``: a value that failed verification for ``reason`` (``hdr``: its
#: header where one was read, else None).
Bad = Callable[[bytes, str, Any], None]
#: ``refused(reply)``: an error answer to one command: True to re-route it (MOVED/ASK).
Refused = Callable[[ReplyError], bool]


class PageReceiver:
    """What one read found: ``found[i]`` (verified into ``outs[i]``), the keys answered absent
    (``gone``) and the verified headers (``hits``). ``handle`` is the exchange's reply handler;
    with ``jobs``, :meth:`settle_jobs` must run once every job is done."""

    def __init__(
        self,
        records: Records,
        namespace_id: bytes,
        keys: Sequence[bytes],
        outs: Sequence[np.ndarray],
        jobs: MacJobs | None,
        bad: Bad,
        refused: Refused,
    ) -> None:
        self._records = records
        self._ns = namespace_id
        self._keys = keys
        self._outs = outs
        self._jobs = jobs
        self._bad = bad
        self._refused = refused
        self.found = [False] * len(keys)
        self.gone: list[bytes] = []
        self.hits: list[BlockMeta] = []
        self._hdr_mv = memoryview(bytearray(records.header_bytes))
        self._heads: dict[int, Any] = {}  # item -> its header (or record), for the pool's jobs

    def handle(self, io: RespIO, i: int) -> bool:
        records, jobs, keys, namespace_id = self._records, self._jobs, self._keys, self._ns
        hb, hdr_mv = records.header_bytes, self._hdr_mv
        n = io.read_bulk_len()
        if isinstance(n, ReplyError):
            if n.prefix == "WRONGTYPE":  # something that is not a string under our prefix
                self._bad(keys[i], "magic", None)
                return False
            return self._refused(n)
        if n < 0:
            self.gone.append(keys[i])
            return False
        out = self._outs[i]
        if n == records.record_bytes:  # raw record: header, then the page straight into the buffer
            if jobs is not None:  # verified on the MAC pool while the next page arrives
                head = bytearray(hb)
                io.read_into(memoryview(head))
                io.read_into(out.data)
                io.expect_crlf()
                self._heads[i] = head
                jobs.start(i, attempt, records.verify, head, out, None, namespace_id, keys[i])
                return False
            io.read_into(hdr_mv)
            digest = payload_digest(records.mac, hdr_mv)  # the MAC, fed as the page arrives
            io.read_into(out.data, digest)
            io.expect_crlf()
            self.settle(i, attempt(records.verify, hdr_mv, out, digest, namespace_id, keys[i]),
                        hdr_mv)
        elif hb <= n <= records.max_bytes:
            rec = bytearray(n)
            io.read_into(memoryview(rec))
            io.expect_crlf()
            if jobs is not None:
                self._heads[i] = rec
                jobs.start(i, attempt, records.verify_slow, rec, out, namespace_id, keys[i])
            else:
                self.settle(i, attempt(records.verify_slow, rec, out, namespace_id, keys[i]),
                            rec)
        else:  # no record of this layout has this size: its header says whose it is
            got = min(n, hb)
            io.read_into(hdr_mv[:got])
            io.skip(n - got)
            io.expect_crlf()
            # Classified by its first bytes (not authenticated: its payload was not read):
            # another layout's or version's well-formed record is left for its readers;
            # anything else -- this layout's header on a value of the wrong size, whatever
            # namespace it names -- is damage.
            self._bad(keys[i], size_reason(hdr_mv[:got], n, records.layout), None)
        return False

    def settle(self, i: int, got: BlockMeta | RecordError, hdr: Any) -> None:
        if isinstance(got, RecordError):
            self._bad(self._keys[i], got.reason, hdr)
        else:
            self.found[i] = True
            self.hits.append(got)

    def settle_jobs(self) -> None:
        """Settle the items verified on the MAC pool (after every job is done)."""
        assert self._jobs is not None
        for i, got in self._jobs.results():
            self.settle(i, got, self._heads[i])


class ValueReceiver:
    """The reply handler of ``meta``'s GET of one value: ``value`` is then the record (a value
    of a size a record of this layout has), or ``(its size, its first bytes)``, or a reason
    (``magic``: not a string), or None (gone, or never answered)."""

    def __init__(self, records: Records, is_moved: Refused) -> None:
        self._records = records
        self._is_moved = is_moved
        self.value: bytearray | tuple[int, bytearray] | str | None = None

    def handle(self, io: RespIO, i: int) -> bool:
        hb = self._records.header_bytes
        n = io.read_bulk_len()
        if isinstance(n, ReplyError):
            if n.prefix == "WRONGTYPE":  # not a string under our prefix, as a read sees it
                self.value = "magic"
                return False
            return self._is_moved(n)
        if n < 0:
            return False
        if hb <= n <= self._records.max_bytes:  # a record of this layout has such a size
            rec = bytearray(n)
            io.read_into(memoryview(rec))
            self.value = rec
        else:  # none has: its header says whose it is (as a read classes it)
            head = bytearray(min(n, hb))
            io.read_into(memoryview(head))
            io.skip(n - len(head))
            self.value = (n, head)
        io.expect_crlf()
        return False


def attempt(verify: Any, *args: Any) -> BlockMeta | RecordError:
    """``verify(*args)``, or the RecordError it raised."""
    try:
        return verify(*args)
    except RecordError as exc:
        return exc
