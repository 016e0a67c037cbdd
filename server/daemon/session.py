"""What the daemon records per client session: the handshake it answers with
(:class:`SessionInfo`), what the session maps (:class:`Segments`) and the session's own records
(:class:`Session`: its handles, leases, staging rows and peer), which
:class:`~server.daemon.service.DaemonService` guards with its lock and cleans up when the
session ends.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from connector.daemon.peer_memory import Peer
from connector.daemon.shm import SharedSlab
from kvstore.results import Lease
from kvstore.staging import LoadHandle, StoreHandle
from server.daemon.staging_area import StagingArea


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """The handshake: what a client needs to check its layout (it maps the slab through
    :meth:`DaemonService.segments`)."""

    session_id: str
    shm_bytes: int
    staging_tier: str
    lease_ttl_s: float
    staging_pages: int


@dataclass(frozen=True, slots=True)
class Segments:
    """What a session maps: the slab (read-only to it) and its own staging area."""

    slab: SharedSlab
    staging: StagingArea


@dataclass(eq=False)
class Session:
    id: str
    loads: dict[int, tuple[bytes, LoadHandle]] = field(default_factory=dict)
    stores: dict[int, tuple[bytes, StoreHandle]] = field(default_factory=dict)
    leases: dict[int, tuple[bytes, Lease]] = field(default_factory=dict)
    #: store handle id -> the staging rows its pages are written into
    staged: dict[int, list[int]] = field(default_factory=dict)
    #: store handles taken by complete_store and not yet published (their pages are still
    #: "being written": a later block of the prompt chains from them)
    completing: dict[int, tuple[bytes, StoreHandle]] = field(default_factory=dict)
    staging: StagingArea | None = None
    #: the client process, where the daemon may copy to and from its memory (peer copy)
    peer: Peer | None = None
    ended: threading.Event = field(default_factory=threading.Event)

    @property
    def num_records(self) -> int:
        return len(self.loads) + len(self.stores) + len(self.leases)
