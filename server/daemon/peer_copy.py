"""Peer copy: the daemon copying pages straight between its slab and a client process's memory
(:mod:`connector.daemon.peer_memory`; see :mod:`server.daemon.service`, "Peer copy"), with the
checks on the memory segments a client names and the pages counted by direction and result.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from connector.daemon.peer_memory import Peer, PeerMemoryError
from kvstore.errors import InvalidArgument
from kvstore.layout import KVLayout
from kvstore.metrics import Metrics

#: the most memory segments a peer copy may name per page and layer (a page spread over its
#: layers' K and V tensors is 2 per layer; more is a caller splitting pages for no reason)
_SEGMENTS_PER_PAGE = 4


class PeerCopy:
    """Copies between the slab's rows and a client's memory. Thread-safe: holds nothing that
    changes but its counter."""

    def __init__(self, slab_rows: np.ndarray, layout: KVLayout, metrics: Metrics) -> None:
        #: the slab as the staging tier's (P, page_bytes) rows: the daemon's writable mapping
        self._slab_rows = slab_rows
        self._layout = layout
        self._m_peer = metrics.counter(
            "kvstore_daemon_peer_copy_pages",
            "Pages the daemon copied straight from (save) or into (load) a client's memory, "
            "by result.", ["direction", "result"])

    def copy(self, peer: Peer | None, slots: Sequence[int], segments: np.ndarray, *,
             write: bool, what: str) -> None:
        """Copy between slab ``slots`` and the (address, length) ``segments`` of the session's
        client process (``peer``: None when the session has none): read into the slots, or with
        ``write`` from them."""
        if peer is None:
            raise InvalidArgument(f"{what} names pages in the client's memory, but this session "
                                  "has no peer copy (its MAP probe failed, or daemon.peer_copy "
                                  "is off)", hint="write the staging rows instead")
        page = self._layout.page_bytes
        want = len(slots) * page
        most = len(slots) * _SEGMENTS_PER_PAGE * self._layout.num_layers
        if len(segments) > most:
            raise InvalidArgument(f"{what} names {len(segments)} memory segments for "
                                  f"{len(slots)} pages; at most {most} are taken",
                                  hint="name whole pages, or one piece per layer's K and V")
        if segments.ndim != 2 or segments.shape[1] != 2 or int(segments[:, 1].sum()) != want \
                or (len(segments) and int(segments[:, 1].min()) == 0):
            raise InvalidArgument(f"{what} names {len(segments)} memory segments of "
                                  f"{int(segments[:, 1].sum()) if segments.ndim == 2 else 0} bytes "
                                  f"for {len(slots)} pages of {page} bytes (none may be empty)")
        base = self._slab_rows.__array_interface__["data"][0]
        local = np.empty((len(slots), 2), np.uint64)
        local[:, 0] = base + np.asarray(slots, np.uint64) * np.uint64(page)
        local[:, 1] = page
        direction = "load" if write else "save"
        try:
            peer.transfer(local, segments, write=write)
        except PeerMemoryError as exc:
            self._m_peer.labels(direction, "failed").inc(len(slots))
            raise InvalidArgument(f"{what}: the client's memory: {exc}",
                                  hint="name memory of this process that stays mapped until "
                                       "the call returns") from None
        self._m_peer.labels(direction, "ok").inc(len(slots))
