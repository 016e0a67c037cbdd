""":class:`WirePages`: a daemon client's byte path -- pages as bytes over gRPC, each sealed
with the deployment secret (the cross-node path: a TCP client maps no shared memory) -- and
its watch of a namespace's cache events."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Any

import grpc
import numpy as np

from connector.daemon.errors import error_of
from connector.proto import kvstore_daemon_pb2 as pb
from kvstore.keys import BlockMeta
from kvstore.metrics import Metrics
from kvstore.record import WIRE, RecordMac, wire_fields
from kvstore.results import PutResult

# the client's logger: its messages kept their name when they moved out of client.py
log = logging.getLogger("connector.daemon.client")


class WirePages:
    """The byte path's calls, on a stub of the client's live session with its metadata
    ``md``. ``secret``: the deployment secret (``security.secret``, the daemon's), which keys
    the pages' seals (None: the public key, an integrity check only); a short one raises."""

    def __init__(self, md: Any, secret: bytes | None, metrics: Metrics) -> None:
        self._md = md
        self._mac = RecordMac(secret)  # the byte path's page seals; raises for a short secret
        #: pages read over the wire whose seal does not verify (misses)
        self._m_bad_seal = metrics.corrupt.labels(WIRE, "mac")

    def read(self, stub: Any, ns: bytes, keys: list[bytes], out: np.ndarray,
             timeout_s: float) -> int:
        """See :meth:`~connector.daemon.client.DaemonStore.read_pages`."""
        req = pb.ReadPagesRequest(namespace_id=ns, keys=keys)
        n = 0
        call = stub.ReadPages(req, timeout=timeout_s, metadata=self._md)
        try:
            for page in call:
                i = page.index
                if i >= len(keys) or not self._mac.verify_seal(
                        wire_fields(b"R", ns, keys[i]), page.data, page.seal):
                    self._m_bad_seal.inc()  # a miss: the run of pages ends here
                    log.warning("read_pages: the page of key %d arrived with a seal that does "
                                "not verify (another deployment secret, or changed on the way)", i)
                    call.cancel()
                    break
                out[i] = np.frombuffer(page.data, np.uint8)
                n = i + 1
        except grpc.RpcError as err:
            raise error_of(err) from None
        return n

    def write(self, stub: Any, metas: Sequence[BlockMeta], pages: np.ndarray,
              timeout_s: float) -> PutResult:
        """See :meth:`~connector.daemon.client.DaemonStore.write_pages`."""

        def messages() -> Iterator[Any]:
            for i, m in enumerate(metas):
                seal = self._mac.seal(
                    wire_fields(b"W", m.namespace_id, m.key, m.parent, m.token_ids), pages[i])
                yield pb.WritePage(namespace_id=m.namespace_id if i == 0 else b"",
                                   block=pb.Block(key=m.key, parent=m.parent, token_ids=m.token_ids),
                                   data=pages[i].tobytes(), seal=seal)

        try:
            r = stub.WritePages(messages(), timeout=timeout_s, metadata=self._md)
        except grpc.RpcError as err:
            raise error_of(err) from None
        return PutResult(r.stored, r.existing, r.refused)

    def watch(self, stub: Any, ns: bytes) -> Iterator[tuple[str, str, tuple[bytes, ...]]]:
        """See :meth:`~connector.daemon.client.DaemonStore.watch`."""
        call = stub.WatchEvents(pb.WatchRequest(namespace_id=ns), metadata=self._md)
        try:
            for ev in call:
                kind = "stored" if ev.kind == pb.CacheEvent.STORED else "removed"
                yield kind, ev.tier, tuple(ev.keys)
        except grpc.RpcError as err:
            raise error_of(err) from None
        finally:
            call.cancel()
