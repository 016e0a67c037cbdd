"""The connector's worker side, :class:`InProcessWorker`: it runs the loads and saves of the
plan the scheduler side built (see :mod:`connector.inprocess`).

Loads (worker side, one thread per bound load)::

    lease still valid?  -- no --> every block fails ("lease_expired")
    pages below host?   -- prefetch them into host (store.prefetch); how long the load waits is
                           the worker's prefetch policy (below)
    store.prepare_load  -- pins the leading pages host holds (policy touched, hits counted);
                           the first block absent from host (a miss, a page dropped by its
                           check, a timeout) fails, with every later block of the request
    for l in layers:    copy layer l of each page (slab row slice, zero-copy source) into the
                        engine block; set event[l]        <- wait_for_layer_load(l) waits here
    store.complete_load -- unpins the slots (they kept their bytes throughout), releases the lease

A page's layer ``l`` is bytes ``[l * S, (l + 1) * S)`` of the page, ``S = page_bytes /
num_layers``; an engine block's layer ``l`` is the same ``S`` bytes (see :class:`KVCacheSpec`).

Prefetch policy (worker side, ``prefetch_policy``) for matched pages still below the host tier
(disk, Redis) when the load starts:

* ``best_effort``   -- load only what host holds now; the pages below are not waited for: they
                       fail at once (reason ``not_prefetched``) and the engine recomputes them from
                       the first missing block. The prefetch still runs in the background, so host
                       is warm for the next request with this prefix.
* ``wait_complete`` -- wait until the prefetch has finished (every matched page arrived, or a read
                       of it failed); only real misses fail.
* ``timeout``       -- (default) wait at most ``prefetch_timeout_s``; what has not arrived by then
                       fails (reason ``timeout``), from the first missing block on.

Saves (worker side, one save thread, in submission order): binding a plan reserves host slots
for each save (``store.prepare_store``: pages host already holds are skipped; eviction makes
room); ``save_kv_layer(l)`` queues the copy of layer ``l`` of every bound save's blocks straight
into its reserved slots; after the last layer the save thread publishes them
(``store.complete_store``; write policies then copy down), or aborts a save that did not finish.
``wait_for_save`` waits for the copies out of engine blocks only, never for the publishing.

Concurrency: the store holds leases, so eviction cannot take a leased page, and a load handle
pins its slots, so a page deleted or replaced during the copy keeps its bytes until the copy
is done. Worker-side state shared with its threads is guarded by one lock; public methods are
for one engine thread.

Layer-wise or not (``layerwise``, default True): with False, ``wait_for_layer_load(l)`` waits
for the whole load before layer 0 computes -- the load-then-compute baseline of the overlap
ablation in ``bench.ttft``.

CPU and GPU: the copies themselves are :mod:`kvstore.transfer`'s -- memcpy on the load and save
threads for a CPU cache; for a CUDA cache one scatter/gather kernel per layer on a load stream and
a save stream, ordered against the engine's stream by CUDA events, so neither a load nor a save
blocks the engine thread on a copy.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Literal

from connector.base import (
    ConnectorMetadata,
    ConnectorStats,
    FinishedRequests,
    KVCacheSpec,
    KVConnectorWorker,
    SaveSpec,
)
from connector.failure_log import FailureLog
from connector.inprocess.block_ids import check_block_ids
from connector.inprocess.jobs import LayersQueued, LoadJob, SaveJob
from kvstore.transfer import CopyFn, LayerTransfer, make_transfer
from kvstore.api import StagingSlab, StoreAPI
from kvstore.errors import InvalidArgument
from kvstore.ops import copy_spans
from kvstore.staging import StoreHandle

log = logging.getLogger("kvstore.connector")

PrefetchPolicy = Literal["best_effort", "wait_complete", "timeout"]
PREFETCH_POLICIES: tuple[str, ...] = ("best_effort", "wait_complete", "timeout")


class InProcessWorker(KVConnectorWorker):
    """Worker side over ``store``. ``prefetch_policy``: ``best_effort``, ``wait_complete`` or
    ``timeout`` (the default) -- how a load treats pages still below the host tier (see the
    module docstring). ``prefetch_timeout_s``: the ``timeout`` policy's wait (default:
    ``load_timeout_s``, its older name). ``layerwise``: False waits for a whole load before
    layer 0 (the ablation baseline). Saves go straight into host slots the store reserves; a
    save the host tier has no room for (everything evictable pinned) is counted in
    ``saves_abandoned``.
    ``clock``: the store's clock (lease expiry is judged by it). ``copy_fn``: copies one
    layer's spans of a CPU cache (tests inject a slow one). ``cpu_inline``: a CPU cache's
    synchronous loads run whole on the engine thread in ``start_load_kv`` (pin, copy, complete:
    no load thread), and a synchronous load of pages below host waits for their prefetch there
    (per the prefetch policy; pair it with a scheduler's ``async_below_host=False``) -- for
    engines whose threads leave no CPU to ours: vLLM's CPU backend, whose OpenMP threads spin on
    every core between parallel regions (and stall when anything else runs during a forward:
    a load completed over the daemon's socket meanwhile made a host hit ~200 ms instead of
    ~18), and whose engine loop polls while a request waits for an asynchronous load (see
    :class:`~kvstore.transfer.CpuTransfer`). Saves keep the save thread."""

    skips_first_layer = True

    def __init__(
        self,
        store: StoreAPI,
        *,
        host_tier: str = "host",
        load_timeout_s: float = 5.0,
        prefetch_policy: PrefetchPolicy = "timeout",
        prefetch_timeout_s: float | None = None,
        layerwise: bool = True,
        clock: Callable[[], float] = time.monotonic,
        copy_fn: CopyFn = copy_spans,
        cpu_inline: bool = False,
    ) -> None:
        if not load_timeout_s > 0:
            raise InvalidArgument(f"load_timeout_s must be > 0, got {load_timeout_s!r}")
        if prefetch_policy not in PREFETCH_POLICIES:
            raise InvalidArgument(
                f"unknown prefetch policy {prefetch_policy!r}",
                hint=f"use one of {list(PREFETCH_POLICIES)}",
            )
        if prefetch_timeout_s is not None and not prefetch_timeout_s > 0:
            raise InvalidArgument(f"prefetch_timeout_s must be > 0, got {prefetch_timeout_s!r}")
        self.store = store
        layout = store.layout
        self.layout = layout
        self._host_name = host_tier
        self._host: StagingSlab = store.staging_tier(host_tier)
        self._layer_bytes = layout.page_bytes // layout.num_layers
        self.load_timeout_s = load_timeout_s if prefetch_timeout_s is None else prefetch_timeout_s
        self.prefetch_policy = prefetch_policy
        self.layerwise = bool(layerwise)
        self._clock = clock
        self._copy = copy_fn
        self._cpu_inline = bool(cpu_inline)
        self._spec: KVCacheSpec | None = None
        self._xfer: LayerTransfer | None = None
        self._lock = threading.Lock()
        self._meta: ConnectorMetadata | None = None
        self._step_loads: list[LoadJob] = []
        self._step_saves: list[SaveJob] | None = []  # None: bound, not yet reserved
        self._step_layers: set[int] = set()  # layers save_kv_layer saw this step
        self._jobs: list[LoadJob] = []  # loads not yet reported
        self._saver = ThreadPoolExecutor(1, thread_name_prefix="kvconnector-save")
        # threads for loads from host, kept (starting a thread per load costs the engine thread
        # a GIL hand-off); loads from below host, which wait on prefetches, get their own
        self._loader = ThreadPoolExecutor(8, thread_name_prefix="kvconnector-load")
        self._inflight: Counter[str] = Counter()  # saves + async loads per request
        self._tracked: set[str] = set()  # requests that had saves or async loads
        self._finishing: set[str] = set()
        self._errors: set[int] = set()
        self._loaded = 0
        self._saved = 0
        self._abandoned = 0
        self._failures: Counter[str] = Counter()
        self._save_failures: Counter[str] = Counter()
        self._failure_log = FailureLog(log)

    @property
    def prefetch_timeout_s(self) -> float:
        """The ``timeout`` policy's wait (the same setting as ``load_timeout_s``)."""
        return self.load_timeout_s

    # ----------------------------------------------------------------- registration, plan

    def register_kv_caches(self, spec: KVCacheSpec) -> None:
        if not isinstance(spec, KVCacheSpec):
            raise InvalidArgument(f"register_kv_caches takes a KVCacheSpec, got {type(spec).__name__}")
        spec.validate(self.layout)
        with self._lock:
            if self._meta is not None or any(not j.done.is_set() for j in self._jobs) or any(self._inflight.values()):
                raise InvalidArgument("cannot re-register KV caches while transfers are in flight")
        layers = spec.layer_views(self.layout)
        assert all(tuple(v.shape) == (spec.num_blocks, self._layer_bytes) for v in layers)
        xfer = make_transfer(layers, self._host.slab_tensor, self.layout.num_layers,
                             self.layout.page_bytes, self._copy, self._saver,
                             cpu_inline=self._cpu_inline, save_slab=self._host.save_slab_tensor)
        if self._xfer is not None:
            self._xfer.close()
        self._spec, self._xfer = spec, xfer

    def bind_connector_metadata(self, meta: ConnectorMetadata) -> None:
        if not isinstance(meta, ConnectorMetadata):
            raise InvalidArgument(f"expected ConnectorMetadata, got {type(meta).__name__}")
        if self._spec is None:
            raise InvalidArgument("no KV caches registered", hint="call register_kv_caches first")
        if self._meta is not None:
            raise InvalidArgument("a plan is already bound", hint="call clear_connector_metadata")
        nb = self._spec.num_blocks
        for spec in meta.loads:
            check_block_ids(spec.block_ids, nb)
        for save in meta.saves:
            check_block_ids(save.block_ids, nb)
        assert self._xfer is not None
        self._meta = meta
        self._step_loads = []
        # host slots are reserved at the first save_kv_layer that needs them, not here: a
        # reservation may evict host pages, and the engine binds before it queues the step's
        # forward -- there it would delay the GPU; in a hook the GPU is busy meanwhile
        self._step_saves = None
        self._step_layers = set()
        with self._lock:
            for s in meta.saves:
                self._inflight[s.request_id] += 1
                self._tracked.add(s.request_id)

    def _reserve_step_saves(self) -> list[SaveJob]:
        """This step's save jobs, reserving their host slots on the first call."""
        if self._step_saves is None:
            assert self._meta is not None
            jobs: list[SaveJob] = []
            for spec in self._meta.saves:
                try:
                    jobs.append(self._reserve(spec))
                except Exception as exc:  # noqa: BLE001 - a save that can't start is a later miss
                    with self._lock:
                        self._save_failures["reserve"] += len(spec.block_ids)
                    self._report("save", "reserve", spec.metas[0].namespace_id,
                                 len(spec.block_ids), exc)
                    self._drop_unreserved(spec)
            short = sum(j.handle.refused > 0 for j in jobs)
            gone = [j for j in jobs if j.handle.unavailable]  # the store could not be asked
            with self._lock:
                self._abandoned += short  # host had no room for some pages: they are not saved
                for j in gone:
                    self._save_failures["unavailable"] += j.handle.refused
            for j in gone:
                self._report("save", "unavailable", j.spec.metas[0].namespace_id,
                             j.handle.refused, j.handle.unavailable)
            self._step_saves = jobs
        return self._step_saves

    def _drop_unreserved(self, spec: SaveSpec) -> None:
        with self._lock:
            self._abandoned += 1
            self._inflight[spec.request_id] -= 1

    def _reserve(self, spec: SaveSpec) -> SaveJob:
        handle = self.store.prepare_store(spec.metas, tier=self._host_name)
        block_of = {m.key: b for m, b in zip(spec.metas, spec.block_ids)}
        assert self._xfer is not None
        buf = self._xfer.new_save([block_of[m.key] for m in handle.metas], handle.slots)
        return SaveJob(spec, handle, buf)

    def clear_connector_metadata(self) -> None:
        if self._meta is not None and len(self._step_layers) < self.layout.num_layers:
            if self._step_saves is None:
                for spec in self._meta.saves:
                    self._drop_unreserved(spec)
            else:
                for job in self._step_saves:
                    self._abandon(job)
        self._meta, self._step_loads, self._step_saves = None, [], []
        self._step_layers = set()

    # ----------------------------------------------------------------- loads

    def start_load_kv(self) -> None:
        if self._meta is None:
            raise InvalidArgument("no plan bound", hint="call bind_connector_metadata first")
        if self._step_loads:
            raise InvalidArgument("this step's loads were already started")
        assert self._xfer is not None
        gate = self._xfer.gate() if self._meta.loads else None
        for spec in self._meta.loads:
            job = LoadJob(spec, LayersQueued(), gate)
            with self._lock:
                self._jobs.append(job)
                if spec.load_async:
                    self._inflight[spec.request_id] += 1
                    self._tracked.add(spec.request_id)
            queued: tuple[int, str] | None = None
            if not spec.load_async:
                self._step_loads.append(job)
                if self._xfer.queue_on_caller:
                    # GPU copies are asynchronous: queue them here, on the engine thread, before
                    # its forward (a load thread would contend with it for the GIL while it
                    # launches the layers' kernels); the thread only waits for them to land.
                    try:
                        queued = self._resolve_and_queue(job, may_wait=self._cpu_inline)
                    except Exception as exc:  # noqa: BLE001 - a failed load is recomputed
                        queued, job.error = (0, "error"), exc  # reported by _run_load
                    job.queued = queued
            if spec.load_async:  # may wait on a prefetch for long: a thread of its own
                threading.Thread(target=self._run_load, args=(job, None), daemon=True,
                                 name=f"kvconnector-load-{spec.request_id}").start()
            elif self._cpu_inline:  # completed before the forward: no thread of ours wakes in it
                self._run_load(job, queued)
            else:
                self._loader.submit(self._run_load, job, queued)

    def wait_for_layer_load(self, layer: int) -> None:
        self._check_layer(layer)
        if not self.layerwise:
            layer = self.layout.num_layers - 1  # the whole load, before any layer computes
        xfer = self._xfer
        assert xfer is not None or not self._step_loads
        for job in self._step_loads:
            job.layers.wait(layer)
            if job.ctx is not None and (layer or not job.spec.skip_first_layer):
                xfer.wait_layer(job.ctx, layer)  # type: ignore[union-attr]

    def _resolve_and_queue(self, job: LoadJob, *, may_wait: bool) -> tuple[int, str]:
        """Pin the pages' host slots through the store -- prefetching what is below host per
        the prefetch policy, when ``may_wait`` -- and queue (or, on the CPU, run) every layer's
        copy, marking each layer queued. Returns (how many blocks load, failure reason)."""
        spec, xfer = job.spec, self._xfer
        assert xfer is not None
        keys, n = spec.keys, len(spec.keys)
        good, reason = 0, ""
        if spec.lease is not None and spec.lease.expires_at <= self._clock():
            reason = "lease_expired"
        else:
            deadline = time.monotonic() + self.prefetch_timeout_s
            # without waiting, prepare_load pins the leading run host holds, a miss ends it;
            # pages the lookup found in host are there still (the lease): not asked again (over
            # the daemon a round trip, on the engine thread of a CPU engine)
            first_missing = (self._host.count_leading(keys)
                             if may_wait and spec.in_host < n else n)
            usable = n
            if first_missing < n:
                fut = self.store.prefetch(spec.namespace_id, keys[first_missing:], to=self._host_name)
                if self.prefetch_policy == "best_effort":
                    usable, reason = first_missing, "not_prefetched"  # fut warms host
                elif self.prefetch_policy == "wait_complete":
                    fut.result()
                else:
                    try:
                        fut.result(timeout=max(0.0, deadline - time.monotonic()))
                    except FutureTimeout:
                        reason = "timeout"
            job.handle = self.store.prepare_load(spec.namespace_id,
                                                 keys if usable == n else keys[:usable],
                                                 lease=spec.lease, tier=self._host_name)
            good = job.handle.num_blocks
            if good < n and not reason:
                reason = "unavailable" if job.handle.unavailable else "miss"
        if good:
            assert job.handle is not None
            job.ctx = xfer.load_context(job.gate, spec.block_ids[:good], job.handle.slots)
        skip = 1 if spec.skip_first_layer else 0  # the engine writes layer 0 itself
        for lyr in range(self.layout.num_layers):
            if good and lyr >= skip:
                xfer.load_layer(job.ctx, lyr)
            job.layers.reach(lyr + 1)
        return good, reason

    def _run_load(self, job: LoadJob, queued: tuple[int, str] | None = None) -> None:
        """The load thread: pin and copy (unless ``queued`` already did), wait until the copies
        landed, complete the load (unpin, release the lease), report."""
        spec, xfer = job.spec, self._xfer
        assert xfer is not None
        good, reason = 0, ""
        try:
            good, reason = queued if queued is not None else self._resolve_and_queue(job, may_wait=True)
            if job.ctx is not None:
                xfer.finish_load(job.ctx)
        except Exception as exc:  # noqa: BLE001 - a failed load is recomputed, never fatal
            good, reason, job.error = 0, "error", exc
            if job.ctx is not None:
                try:  # queued copies must land before the blocks are recomputed
                    xfer.finish_load(job.ctx)
                except Exception:  # noqa: BLE001
                    pass
        finally:
            job.layers.reach(self.layout.num_layers)
            if job.handle is not None:
                try:
                    self.store.complete_load(job.handle)  # releases the lease too
                except Exception:  # noqa: BLE001 - the store closed under us: pins die with it
                    pass
            elif spec.lease is not None:
                try:
                    self.store.release(spec.lease)
                except Exception:  # noqa: BLE001 - expired, or the store closed
                    pass
            with self._lock:
                job.failed = list(spec.block_ids[good:])
                job.reason = reason
                self._loaded += good
                if job.failed:
                    self._failures[reason] += len(job.failed)
                    self._errors.update(job.failed)
                if spec.load_async:
                    self._inflight[spec.request_id] -= 1
            if job.failed:
                self._report("load", reason, spec.namespace_id, len(job.failed),
                             job.error or (job.handle.unavailable if job.handle else ""))
            job.done.set()

    # ----------------------------------------------------------------- saves

    def save_kv_layer(self, layer: int) -> None:
        self._check_layer(layer)
        if self._meta is None:
            raise InvalidArgument("no plan bound", hint="call bind_connector_metadata first")
        if layer in self._step_layers:
            raise InvalidArgument(f"layer {layer} was already saved this step")
        self._step_layers.add(layer)
        if not self._meta.saves:
            return
        L, xfer = self.layout.num_layers, self._xfer
        assert xfer is not None
        done = len(self._step_layers) == L
        if xfer.saves_whole_pages:
            # one copy of whole pages once every layer is written (DMA: no SMs taken from the
            # compute it overlaps); nothing to do before that
            if done:
                for job in self._reserve_step_saves():
                    xfer.save_pages(job.buf)
                    xfer.mark_saved(job.buf)
                    self._saver.submit(self._put, job)
            return
        jobs = self._reserve_step_saves()
        if jobs:
            xfer.begin_save_layer(layer)
        for job in jobs:
            xfer.save_layer(job.buf, layer)
            if done:
                xfer.mark_saved(job.buf)
                self._saver.submit(self._put, job)

    def wait_for_loads(self) -> None:
        for job in list(self._jobs):
            if not job.done.is_set():  # (the usual case after a step's token: no lock taken)
                job.done.wait()

    def settled_load_errors(self) -> set[int] | None:
        # A load queued on the caller pinned its pages first (a pinned slot keeps its bytes:
        # complete_load finds every page valid), so what fails is known at queue time; only a
        # device error in the copy itself can add to it, and then the device is lost anyway.
        if self._meta is None or any(spec.load_async for spec in self._meta.loads):
            return None
        bad: set[int] = set()
        for job in self._step_loads:
            if job.queued is None:
                return None
            bad.update(job.spec.block_ids[job.queued[0]:])
        return bad

    def wait_for_save(self) -> None:
        if self._xfer is not None:
            self._xfer.wait_for_save()

    def _put(self, job: SaveJob) -> None:
        """Save thread: once the copies into the reserved slots landed, publish them."""
        assert self._xfer is not None
        try:
            self._xfer.wait_saved(job.buf)
            res = self.store.complete_store(job.handle)
            with self._lock:
                self._saved += res.stored
        except Exception as exc:  # noqa: BLE001 - a failed save is a cache miss later, never fatal
            with self._lock:
                self._abandoned += 1
                self._save_failures["error"] += len(job.spec.block_ids)
            self._report("save", "error", job.spec.metas[0].namespace_id,
                         len(job.spec.block_ids), exc)
            self._abort(job.handle)
        finally:
            self._xfer.release(job.buf)
            with self._lock:
                self._inflight[job.spec.request_id] -= 1

    def _report(self, what: str, reason: str, namespace_id: bytes, num_blocks: int,
                detail: object = "") -> None:
        """The one place a failed load or save leaves the worker (its own counters were bumped
        by the caller, under the lock): logged with its reason, rate-limited, and told to the
        store, which counts it for the namespace by reason -- over the daemon, in the
        daemon's stats (``kvstore stats``). Never raises: the store may be why it failed."""
        self._failure_log.failed(what, reason, num_blocks, detail)
        try:
            self.store.count_failed(namespace_id, what, reason, num_blocks)
        except Exception:  # noqa: BLE001 - closed or unreachable: counted and logged here
            pass

    def _abandon(self, job: SaveJob) -> None:
        xfer = self._xfer
        assert xfer is not None
        xfer.mark_saved(job.buf)

        def drop() -> None:  # slots are freed only after the copies queued into them landed
            try:
                xfer.wait_saved(job.buf)
            finally:
                xfer.release(job.buf)
                self._abort(job.handle)

        self._saver.submit(drop)
        with self._lock:
            self._abandoned += 1
            self._inflight[job.spec.request_id] -= 1

    def _abort(self, handle: StoreHandle) -> None:
        try:
            self.store.abort(handle)
        except Exception:  # noqa: BLE001 - completed already, or the store closed
            pass

    # ----------------------------------------------------------------- completion

    def get_finished(self, finished_req_ids: Sequence[str]) -> FinishedRequests:
        with self._lock:
            recving = set()
            for job in [j for j in self._jobs if j.done.is_set()]:
                self._jobs.remove(job)
                if job.spec.load_async:
                    recving.add(job.spec.request_id)
            self._finishing.update(r for r in finished_req_ids if r in self._tracked)
            sending = {r for r in self._finishing if self._inflight[r] <= 0}
            for r in sending:
                self._finishing.discard(r)
                self._tracked.discard(r)
                self._inflight.pop(r, None)
        return FinishedRequests(frozenset(sending), frozenset(recving))

    def get_block_ids_with_load_errors(self) -> set[int]:
        with self._lock:
            errors, self._errors = self._errors, set()
        return errors

    def stats(self) -> ConnectorStats:
        with self._lock:
            return ConnectorStats(self._loaded, self._saved, self._abandoned,
                                  dict(self._failures), dict(self._save_failures))

    def close(self) -> None:
        """Wait for every load and save, then stop the save thread."""
        for job in list(self._jobs):
            job.done.wait()
        self._loader.shutdown(wait=True)
        self._saver.shutdown(wait=True)
        if self._xfer is not None:
            self._xfer.close()

    def _check_layer(self, layer: int) -> None:
        L = self.layout.num_layers
        if not isinstance(layer, int) or isinstance(layer, bool) or not 0 <= layer < L:
            raise InvalidArgument(f"layer {layer!r} is not in [0, {L})")

