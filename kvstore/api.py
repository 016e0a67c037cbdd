"""The store's one face: what an engine, a connector or a bench may call on a store, whichever
store it is -- the in-process :class:`~kvstore.store.TieredStore` or a client of the sidecar
daemon (``connector.daemon.DaemonStore``). Both implement :class:`StoreAPI`; code that takes a
store takes a ``StoreAPI`` and reaches no tier. ``tests/store_api`` holds every contract below
against both, and fails when one implementation grows a method of the face the other lacks.

Identities: a page is named by its key (:mod:`kvstore.keys`) under a namespace (16 bytes,
``Namespace.id``). Calls that take ``namespace_id=None`` use the store's default namespace
where it has one (a daemon client bound to one); the in-process store checks keys, not
namespaces, there.

Errors: bad input raises :class:`~kvstore.errors.InvalidArgument` naming the problem and
changes nothing; a closed store raises :class:`~kvstore.errors.StoreClosed`; a handle or lease
that is unknown, already ended or another store's raises LeaseError / InvalidArgument. A store
that cannot be reached (a daemon down) answers lookups with a miss and saves with refusals,
counted, so an engine degrades to recompute.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any, Protocol, runtime_checkable

import numpy as np

from kvstore.event_log import EventBatch, Snapshot
from kvstore.keys import BlockMeta
from kvstore.layout import KVLayout
from kvstore.metrics import Metrics
from kvstore.results import Lease, LookupResult, PutResult
from kvstore.retention import Pin, RetentionInfo
from kvstore.staging import LoadHandle, StoreHandle


@runtime_checkable
class StagingSlab(Protocol):
    """The tier loads and saves stage through, as a connector sees it: the slab its loads copy
    out of, the rows its saves write, and membership checks."""

    @property
    def name(self) -> str: ...

    @property
    def slab(self) -> np.ndarray:
        """``(capacity_pages, page_bytes)`` uint8: where a load handle's slots are."""

    @property
    def slab_tensor(self) -> Any:
        """The same memory as a torch uint8 tensor (pinned where the store could pin it)."""

    @property
    def save_slab(self) -> np.ndarray:
        """Where a store handle's slots are (the slab itself in process; a daemon client's own
        staging area)."""

    @property
    def save_slab_tensor(self) -> Any: ...

    def contains(self, keys: Sequence[bytes]) -> list[bool]:
        """Per key, whether this tier holds it now (a hint: it may go before a load)."""

    def count_leading(self, keys: Sequence[bytes]) -> int:
        """How many leading ``keys`` this tier holds now."""


@runtime_checkable
class LocalStagingSlab(StagingSlab, Protocol):
    """The staging tier of an in-process store (:class:`~kvstore.store.TieredStore`), whose slab
    lives in this process: what a daemon serving the store needs beyond the face. A daemon
    client's staging tier has no such counts (they are the daemon's)."""

    @property
    def capacity_pages(self) -> int:
        """How many pages (slab rows) the tier holds at most."""

    def pages_of(self, namespace_id: bytes) -> int:
        """How many published pages the tier holds under ``namespace_id``, exactly and at once
        (a per-namespace quota asks this on every save)."""


@runtime_checkable
class StoreAPI(Protocol):
    """A KV-cache page store. Every method may be called from many threads."""

    @property
    def layout(self) -> KVLayout:
        """The page layout every page of this store has."""

    # ---------------------------------------------------------------- finding pages

    def lookup(self, keys: Sequence[bytes], *, lease: bool = False, local_only: bool = False,
               namespace_id: bytes | None = None) -> LookupResult:
        """The leading run of ``keys`` the store holds, with the tier of each page, its runs
        of one tier and the estimated seconds to load each (``LookupResult.runs``, ``load_s``:
        a caller weighs load against recompute with this answer alone). ``lease``:
        pin the run against eviction until the lease is released, narrowed or expires
        (``LookupResult.lease``); ``local_only``: skip tiers shared with other nodes."""

    def lookup_async(self, keys: Sequence[bytes], *, lease: bool = False,
                     namespace_id: bytes | None = None) -> Future[LookupResult]:
        """:meth:`lookup` off the caller's thread. A caller that drops the future before it is
        done must release the lease it carries (``add_done_callback``)."""

    def release(self, lease: Lease, *, namespace_id: bytes | None = None) -> None:
        """Unpin a lease's pages. A lease already released or expired is no error."""

    def narrow(self, lease: Lease, n: int, *, namespace_id: bytes | None = None) -> Lease:
        """Keep only the first ``n`` pages of a lease pinned; returns the narrowed lease."""

    def prefetch(self, namespace_id: bytes, keys: Sequence[bytes], *,
                 to: str | None = None) -> Future[int]:
        """Copy the leading run of ``keys`` into tier ``to`` (default the fastest staging tier)
        in the background; the future gives how many leading keys it holds then."""

    # ---------------------------------------------------------------- moving pages

    def staging_tier(self, name: str | None = None) -> StagingSlab:
        """The tier loads and saves stage through: ``name``, or the store's first tier of page
        slots. Raises InvalidArgument when there is none or ``name`` is not one."""

    def prepare_load(self, namespace_id: bytes, keys: Sequence[bytes], *,
                     lease: Lease | None = None, tier: str | None = None) -> LoadHandle:
        """Pin the leading run of ``keys`` the staging tier holds under ``namespace_id`` (the
        handle takes ``lease`` over). ``handle.slots[i]`` holds ``handle.keys[i]`` until
        :meth:`complete_load`."""

    def complete_load(self, handle: LoadHandle, *, into: Any = None) -> int:
        """End a load (with ``into``: first copy its pages there, one per key); unpins and
        releases its lease. Returns how many leading pages were valid."""

    def prepare_store(self, metas: Sequence[BlockMeta], *, tier: str | None = None) -> StoreHandle:
        """Reserve slots for the pages of ``metas`` (one namespace) the store does not hold;
        ``handle.slots[i]`` takes ``handle.metas[i]``. Pages held already count as
        ``existing``, pages no room was made for as ``refused``."""

    def complete_store(self, handle: StoreHandle, ok: bool = True, *,
                       pages: Any = None) -> PutResult:
        """Publish a handle's pages (``ok``: every byte written, or ``pages`` -- one per
        ``handle.metas`` -- copied in first); ``ok=False`` aborts. A handle completes once."""

    def abort(self, handle: StoreHandle) -> None:
        """Free a handle's reserved slots unpublished."""

    def delete(self, keys: Sequence[bytes], *, namespace_id: bytes | None = None) -> int:
        """Remove ``keys`` from every tier; returns how many were held."""

    # ---------------------------------------------------------------- retention

    def pin(self, namespace_id: bytes, keys: Sequence[bytes], *, ttl_s: float) -> Pin:
        """Keep ``keys`` of ``namespace_id`` cached for ``ttl_s`` seconds in every tier (no
        eviction takes them; a key not stored yet is kept once it arrives). Refused
        (InvalidArgument, nothing changes) for another namespace's key, a TTL out of bounds,
        or pins past ``store.max_pinned_fraction``."""

    def unpin(self, pin: Pin | int, *, namespace_id: bytes | None = None) -> bool:
        """Remove a pin; False when it lapsed or was removed already."""

    def set_budget(self, namespace_id: bytes, tier: str, nbytes: int | None) -> None:
        """Hold ``namespace_id`` to ``nbytes`` of tier ``tier`` (whole pages; None removes
        the budget). A namespace at its budget makes room among its own pages there (by the
        tier's policy, sparing pinned and leased ones) and never evicts another's; what it
        cannot make room for is refused. Pages held over a lowered budget go as it writes
        more. InvalidArgument for an unknown tier or a size that is not a whole number >= 0."""

    def retention(self, namespace_id: bytes) -> RetentionInfo:
        """A namespace's live pins and, per tier, the bytes it holds, its pinned bytes there
        and its budget."""

    # ---------------------------------------------------------------- events

    def read_events(self, cursor: int | None = None, *, limit: int = 1024,
                    timeout_s: float = 0.0, epoch: bytes | None = None,
                    namespace_id: bytes | None = None) -> EventBatch:
        """The store's event log (:mod:`kvstore.event_log`) from ``cursor`` (None: from now
        on): every page stored, removed, moved, each with its sequence number, waiting up to
        ``timeout_s`` for one. ``gap``: events were lost (past the log's window, or ``epoch``
        is another log's): resynchronize from :meth:`event_snapshot`. ``namespace_id``: only
        that namespace's keys (the daemon serves a client its namespace's only)."""

    def event_snapshot(self, *, namespace_id: bytes | None = None) -> Snapshot:
        """The contents as "stored" events and the cursor :meth:`read_events` goes on from:
        every event at or after it happened after the snapshot."""

    # ---------------------------------------------------------------- accounting

    @property
    def metrics(self) -> Metrics:
        """The Prometheus registry this store counts in (a connector over it counts there too)."""

    @property
    def tier_names(self) -> tuple[str, ...]:
        """The store's tiers, fastest first (the names lookups report)."""

    @property
    def commits_pool_itself(self) -> bool:
        """The store copies an engine pool's committed pages down by itself (write-through over
        a pool it owns): a connector need not save them."""

    @property
    def has_remote_tiers(self) -> bool:
        """Some tier is shared with other nodes (a lookup of it is a network round trip)."""

    def read_bandwidth(self, tier_name: str) -> float | None:
        """Measured read bytes/s of a tier, None until measured."""

    def label_namespace(self, namespace_id: bytes, label: str) -> None:
        """Name a namespace for stats (once is enough)."""

    def count_declined(self, namespace_id: bytes, num_blocks: int) -> None:
        """Count pages a connector found but chose to recompute."""

    def count_failed(self, namespace_id: bytes, what: str, reason: str, num_blocks: int) -> None:
        """Count pages whose load or save failed in a connector (``what``: load or save)."""

    @property
    def open_store_handles(self) -> int:
        """Saves prepared and not yet completed or aborted (by this client, over a daemon)."""

    def check_integrity(self) -> None:
        """Assert the store's invariants (policies track exactly their tiers' pages, no slot
        leaked); AssertionError names the first broken. For tests and debugging."""

    @property
    def closed(self) -> bool:
        """:meth:`close` was called."""

    def close(self) -> None:
        """Release the store's resources; later calls raise StoreClosed. Idempotent."""


__all__ = ["LocalStagingSlab", "StagingSlab", "StoreAPI"]
