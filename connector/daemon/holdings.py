""":class:`Holdings`: what a daemon client holds in its session, as the client keeps track of
it -- its open handles, and the namespace of each lease and store handle."""

from __future__ import annotations

import threading
import time

from kvstore.results import Lease


class Holdings:
    """The handles a client opened and has not completed or aborted (while any is open the
    session does not reconnect: copies must not straddle a remap); the namespace each lease
    was granted under and each store handle was prepared under (a store handle that reserved
    nothing has no block to tell it by). Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: set[int] = set()  # handle ids issued and not yet completed/aborted
        #: lease id -> (the namespace it was granted under, its expiry); pruned of expired
        #: leases (one handed to another process by its ticket is used up there, unseen here)
        self._lease_ns: dict[int, tuple[bytes, float]] = {}
        #: store handle id -> its namespace
        self._store_ns: dict[int, bytes] = {}

    def busy(self) -> bool:
        """Whether a handle is open."""
        with self._lock:
            return bool(self._open)

    def opened(self, handle_id: int, store_namespace: bytes | None = None) -> None:
        """A handle was issued; a store handle with the namespace it was prepared under."""
        with self._lock:
            self._open.add(handle_id)
            if store_namespace is not None:
                self._store_ns[handle_id] = store_namespace

    def ended_load(self, handle_id: int) -> None:
        with self._lock:
            self._open.discard(handle_id)

    def ended_store(self, handle_id: int) -> bytes | None:
        """The namespace the store handle was prepared under (forgotten), None if unknown."""
        with self._lock:
            self._open.discard(handle_id)
            return self._store_ns.pop(handle_id, None)

    @property
    def open_store_handles(self) -> int:
        with self._lock:
            return len(self._store_ns)

    def lease_namespace(self, lease_id: int) -> bytes | None:
        """The namespace the lease was granted under, None if it is not remembered."""
        with self._lock:
            held = self._lease_ns.get(lease_id)
        return None if held is None else held[0]

    def take_lease(self, lease_id: int) -> bytes | None:
        """As :meth:`lease_namespace`, and forgotten: the lease is being used up."""
        with self._lock:
            held = self._lease_ns.pop(lease_id, None)
        return None if held is None else held[0]

    def remember_lease(self, lease: Lease, ns: bytes) -> None:
        with self._lock:
            if len(self._lease_ns) >= 1024:  # drop what expired (the daemon has, too)
                now = time.monotonic()
                for lid in [i for i, (_, t) in self._lease_ns.items() if t <= now]:
                    del self._lease_ns[lid]
            self._lease_ns[lease.id] = (ns, lease.expires_at)
