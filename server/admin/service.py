"""The admin API's domain layer over one :class:`~kvstore.store.TieredStore`: stats snapshots,
readiness, where-is lookups, namespace flushes (as jobs with progress), policy switches and
retention (a namespace's pins and byte budgets). It returns the wire models of :mod:`.schemas`
but knows nothing of HTTP; the routers translate.

Everything goes through the store's public API (``lookup``, ``delete``, ``set_policy``,
``tier(...).contains/keys/meta``), so a flush updates the policies and emits events like any
delete. Nothing here holds a lock during tier I/O.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from kvstore.errors import InvalidArgument, KVStoreError
from kvstore.keys import Namespace, chain_keys, token_bytes
from kvstore.metrics import TierStats
from kvstore.namespace_stats import NamespaceCounts
from kvstore.policy import POLICIES, EvictionPolicy
from kvstore.retention import Pin, RetentionInfo
from kvstore import Tier
from kvstore.store import TieredStore
from server.admin import schemas as s
from server.admin.events import EventBroker
from server.admin.sampler import WINDOW_15M_S, Sample, Sampler, ratio, totals

#: keys deleted per store call during a flush (progress is reported between calls)
FLUSH_BATCH = 256
_LAT_OPS = ("read", "write", "contains", "delete")
_TOP_NAMESPACES = 20
_JOBS_KEPT = 32


class NotFound(KVStoreError):
    """A resource the request names (a tier, a flush job) does not exist. The admin API's own:
    the store's calls raise InvalidArgument for an unknown tier, a library caller's misuse; to
    a REST client it is a missing resource. (Its place is kvstore/errors.py, beside the others.)"""

    http_status = 404


class UnknownNamespace(NotFound):
    """No namespace goes by the label a lookup asked for; ``namespaces``: the ones there are,
    so the client can pick (the error body carries them)."""

    def __init__(self, message: str, namespaces: list[s.NamespaceRef], hint: str = "") -> None:
        super().__init__(message, hint=hint)
        self.namespaces = namespaces


@dataclass(frozen=True, slots=True)
class NamespaceDefaults:
    """The configured namespace: what lookups by token ids use unless told otherwise."""

    model_id: str = "default"
    tenant_salt: str = ""
    secret: bytes | None = field(default=None, repr=False)


@dataclass
class _Flush:
    id: int
    namespace_id: bytes
    tiers: dict[str, list[int]]  # tier -> [scanned, matched, deleted, done]
    state: str = "running"
    error: str = ""

    def out(self) -> s.FlushOut:
        tiers = [s.TierFlush(tier=n, scanned=v[0], matched=v[1], deleted=v[2], done=bool(v[3]))
                 for n, v in self.tiers.items()]
        return s.FlushOut(id=self.id, namespace_id=self.namespace_id.hex(),
                          state=self.state, error=self.error, tiers=tiers,  # type: ignore[arg-type]
                          deleted=sum(t.deleted for t in tiers))


class AdminService:
    def __init__(self, store: TieredStore, *, namespace: NamespaceDefaults = NamespaceDefaults(),
                 sample_interval_s: float = 2.0) -> None:
        self.store = store
        self.defaults = namespace
        self.sampler = Sampler(store, sample_interval_s)
        self.events = EventBroker(store)
        self._flushes: dict[int, _Flush] = {}
        self._flush_ids = itertools.count(1)
        self._lock = threading.Lock()
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="kvstore-admin-flush")
        self._futures: dict[int, Future[None]] = {}
        self._ns_cache: tuple[float, dict[bytes, dict[str, int]]] = (0.0, {})
        #: the store's clock, which pins expire by (TieredStore's default)
        self.clock: Callable[[], float] = time.monotonic

    def start(self) -> None:
        self.sampler.start()

    def close(self) -> None:
        self.sampler.stop()
        self.events.close()
        self._worker.shutdown(wait=True, cancel_futures=True)

    # ----------------------------------------------------------------- health

    def readiness(self) -> s.Readiness:
        out = []
        for t in self.store.tiers:
            h = t.health()  # a tier over servers pings them and reports their breakers
            breakers = [s.Breaker(server=b.server, state=b.breaker, trips=b.trips,
                                  failures=b.failures) for b in h.servers]
            out.append(s.TierReadiness(name=t.name, kind=t.kind, ready=h.ready, detail=h.detail,
                                       breakers=breakers))
        return s.Readiness(ready=all(t.ready for t in out) and not self.store.closed, tiers=out)

    # ----------------------------------------------------------------- stats

    def stats(self) -> s.StatsOut:
        st = self.store.stats()
        now = self.sampler.now()
        m1 = self.sampler.since(now, 60.0)
        m15 = self.sampler.since(now, WINDOW_15M_S)
        lat = self._latencies()
        tiers = [self._tier_stats(t, ts, now, m1, m15, lat.get(t.name, {}))
                 for t, ts in zip(self.store.tiers, st.tiers)]
        # one source for the store row: the per-namespace counters (summed), which the daemon
        # keeps for every client call that names its namespace -- lookups, loads (the staging
        # path's prepare_load, gets) and declines -- so the row agrees with the namespaces'
        total = totals(now.namespaces)
        store = s.StoreStatsOut(
            lookup_hit_blocks=total.lookup_hit, lookup_miss_blocks=total.lookup_miss,
            lookup_hit_rate_1m=ratio(now.lookup_hit - m1.lookup_hit, now.lookup_miss - m1.lookup_miss),
            lookup_hit_rate_15m=ratio(now.lookup_hit - m15.lookup_hit,
                                      now.lookup_miss - m15.lookup_miss),
            loaded_pages=total.load_hit, load_missed_pages=total.load_miss,
            declined_blocks=total.declined,
            load_failed_blocks=total.failed("load"), save_failed_blocks=total.failed("save"),
            active_leases=st.active_leases, copies_pages=dict(st.copies))
        removals = [s.Removal(at=r.at, tier=r.tier, pages=r.pages,
                              namespace_ids=[n.hex() for n in r.namespace_ids])
                    for r in list(self.events.recent)]
        ns = now.namespaces
        other = s.OtherNamespaces(calls=ns.other_calls, **_traffic(
            ns.other, m1.namespaces.other, m15.namespaces.other))
        return s.StatsOut(at=now.at, tiers=tiers, store=store,
                          namespaces=self.namespaces(now, m1, m15), other_namespaces=other,
                          recent_removals=removals)

    def _tier_stats(self, t: Tier, ts: TierStats, now: Sample, m1: Sample, m15: Sample,
                    lat: dict[str, s.Latency]) -> s.TierStatsOut:
        def window(old: Sample) -> float | None:
            a, b = now.tiers[t.name], old.tiers[t.name]
            return ratio(a.hits - b.hits, a.misses - b.misses)

        v = self.store.metrics.value
        timeouts = int(v("kvstore_tier_errors_total", tier=t.name, op="read"))
        has_ttl = bool(t.ttl_s)
        expired_read = int(v("kvstore_tier_expired_pages_total", tier=t.name, op="read"))
        expired = expired_read + int(v("kvstore_tier_expired_pages_total", tier=t.name,
                                       op="contains"))
        misses = s.Misses(absent=max(0, ts.misses - ts.corrupt - expired_read),
                          corrupt=ts.corrupt, timeout=timeouts,
                          expired=expired if has_ttl else None)
        return s.TierStatsOut(
            name=t.name, kind=t.kind, policy=policy_name(self.store.policies[self.store.tiers.index(t)]),
            capacity_pages=ts.capacity_pages, used_pages=ts.used_pages, page_bytes=ts.page_bytes,
            capacity_bytes=ts.capacity_pages * ts.page_bytes, used_bytes=ts.used_pages * ts.page_bytes,
            hits=ts.hits, misses=misses, hit_rate_1m=window(m1), hit_rate_15m=window(m15),
            bytes_in=ts.bytes_written, bytes_out=ts.bytes_read, writes=ts.writes,
            writes_refused=ts.writes_refused, deletes=ts.deletes, evictions=ts.evictions,
            errors=ts.errors, latency=lat)

    def _latencies(self) -> dict[str, dict[str, s.Latency]]:
        """p50/p99 per tier and op from the latency histogram's cumulative buckets (linear
        inside the bucket that holds the quantile)."""
        buckets: dict[tuple[str, str], list[tuple[float, float]]] = {}
        for metric in self.store.metrics.latency.collect():
            for smp in metric.samples:
                if smp.name.endswith("_bucket"):
                    key = (smp.labels["tier"], smp.labels["op"])
                    buckets.setdefault(key, []).append((float(smp.labels["le"]), smp.value))
        out: dict[str, dict[str, s.Latency]] = {}
        for (tier, op), bs in buckets.items():
            bs.sort()
            total = bs[-1][1] if bs else 0
            out.setdefault(tier, {})[op] = s.Latency(
                p50_s=_quantile(bs, 0.5), p99_s=_quantile(bs, 0.99), count=int(total))
        return out

    def history(self, window_s: float = WINDOW_15M_S) -> s.HistoryOut:
        """Rates per sample interval over the last ``window_s`` (at most ``sampler.RETAIN_S``, what
        the sampler keeps) and the window's totals: the hit rates over the whole window, which
        stay defined while the store is idle as long as the window saw a lookup."""
        page = self.store.layout.page_bytes
        now = self.sampler.now()
        samples = [x for x in self.sampler.samples()
                   if now.mono - x.mono <= window_s + self.sampler.interval_s / 2]
        points = []
        for a, b in itertools.pairwise(samples):
            dt = max(b.mono - a.mono, 1e-9)
            tiers = {n: s.TierPoint(
                hit_rate=ratio(tb.hits - ta.hits, tb.misses - ta.misses), used_pages=tb.used_pages,
                hits=tb.hits - ta.hits, misses=tb.misses - ta.misses,
                bytes_in_per_s=(tb.bytes_in - ta.bytes_in) / dt,
                bytes_out_per_s=(tb.bytes_out - ta.bytes_out) / dt,
                evictions_per_s=(tb.evictions - ta.evictions) / dt)
                for n, tb in b.tiers.items() if (ta := a.tiers.get(n)) is not None}
            copies = {k: (c - a.copies.get(k, 0.0)) * page / dt for k, c in b.copies.items()}
            points.append(s.HistoryPoint(
                at=b.at, tiers=tiers, copies_bytes_per_s={k: x for k, x in copies.items() if x},
                lookup_hit_blocks=b.lookup_hit - a.lookup_hit,
                lookup_miss_blocks=b.lookup_miss - a.lookup_miss,
                lookup_hit_rate=ratio(b.lookup_hit - a.lookup_hit, b.lookup_miss - a.lookup_miss)))
        first = samples[0] if samples else now
        hits, misses = now.lookup_hit - first.lookup_hit, now.lookup_miss - first.lookup_miss
        totals_ = s.HistoryWindow(
            start=first.at, end=now.at, lookup_hit_blocks=hits, lookup_miss_blocks=misses,
            lookup_hit_rate=ratio(hits, misses),
            tier_hit_rate={n: ratio(t.hits - first.tiers[n].hits, t.misses - first.tiers[n].misses)
                           for n, t in now.tiers.items() if n in first.tiers})
        return s.HistoryOut(interval_s=self.sampler.interval_s, window_s=window_s,
                            window=totals_, points=points)

    def namespaces(self, now: Sample, m1: Sample, m15: Sample) -> list[s.NamespaceStats]:
        """Pages per namespace in each local tier (a scan of the tiers' indexes, at most once
        per sample interval) and each namespace's traffic (``now``'s counters, windowed
        against ``m1`` and ``m15``): largest first, then busiest."""
        held = self._held()
        page = self.store.layout.page_bytes
        label = self._labeller()
        traffic = now.namespaces

        def order(ns: bytes) -> tuple[int, int, bytes]:
            c = traffic.get(ns)
            return -sum(held.get(ns, {}).values()), -(c.lookup_hit + c.lookup_miss), ns

        top = sorted(held.keys() | traffic.rows.keys(), key=order)[:_TOP_NAMESPACES]
        return [s.NamespaceStats(
            namespace_id=ns.hex(), label=label(ns),
            pages=held.get(ns, {}), bytes=sum(held.get(ns, {}).values()) * page,
            stored_pages=self.events.stored.get(ns, 0),
            removed_pages=self.events.removed.get(ns, 0),
            **_retention_of(self.store.retention(ns)),
            **_traffic(traffic.get(ns), m1.namespaces.get(ns), m15.namespaces.get(ns)))
            for ns in top]

    def _held(self) -> dict[bytes, dict[str, int]]:
        """Pages per namespace id per local tier: a scan of the tiers' indexes, at most once
        per sample interval (shared tiers are not scanned)."""
        at, held = self._ns_cache
        if time.monotonic() - at >= self.sampler.interval_s:
            held = {}
            for t in self.store.tiers:
                if t.shared:
                    continue
                for k in list(t.keys()):
                    meta = t.meta(k)
                    if meta is not None:
                        per = held.setdefault(meta.namespace_id, {})
                        per[t.name] = per.get(t.name, 0) + 1
            self._ns_cache = (time.monotonic(), held)
        return held

    def _labeller(self) -> Callable[[bytes], str | None]:
        """The label of a namespace id: the one its users registered with the store, else the
        configured namespace's for its id; None when neither (never an empty string)."""
        labels = self.store.namespace_labels.snapshot()
        mine = self._default_namespace()
        return lambda ns: labels.get(ns) or (mine.label if ns == mine.id else None)

    def known_namespaces(self) -> list[s.NamespaceRef]:
        """The namespaces holding pages in local tiers or labelled, most pages first."""
        held = self._held()
        label = self._labeller()
        pages = {ns: sum(per.values()) for ns, per in held.items()}
        ids = pages.keys() | self.store.namespace_labels.snapshot().keys()
        top = sorted(ids, key=lambda ns: (-pages.get(ns, 0), ns))[:_TOP_NAMESPACES]
        return [s.NamespaceRef(namespace_id=ns.hex(), label=label(ns), pages=pages.get(ns, 0))
                for ns in top]

    # ----------------------------------------------------------------- lookup

    def _default_namespace(self, model_id: str | None = None, salt: str | None = None) -> Namespace:
        d = self.defaults
        return Namespace(model_id if model_id is not None else d.model_id, self.store.layout,
                         salt if salt is not None else d.tenant_salt, d.secret)

    def lookup(self, req: s.LookupIn) -> s.LookupOut:
        if (req.token_ids is None) == (req.block_keys is None):
            raise InvalidArgument("give exactly one of token_ids and block_keys")
        if sum(x is not None for x in (req.namespace, req.namespace_id, req.namespace_label)) > 1:
            raise InvalidArgument("give at most one of namespace, namespace_id and "
                                  "namespace_label")
        if req.namespace_label is not None:
            # the id is the namespace's seed (kvstore.keys), so token ids chain from it
            ns_id = self._id_of_label(req.namespace_label)
            keys = (chain_keys(ns_id, token_bytes(req.token_ids), self.store.layout.block_size)
                    if req.token_ids is not None else
                    [bytes.fromhex(k) for k in req.block_keys or []])
        elif req.namespace_id is not None:
            if req.token_ids is not None:
                raise InvalidArgument("token_ids need a namespace (model_id, tenant_salt), "
                                      "not a namespace_id: keys are computed from its seed")
            ns_id = bytes.fromhex(req.namespace_id)
            keys = [bytes.fromhex(k) for k in req.block_keys or []]
        else:
            n = req.namespace or s.NamespaceIn()
            ns = self._default_namespace(n.model_id, n.tenant_salt)
            ns_id = ns.id
            if req.token_ids is not None:
                keys = list(ns.chain(req.token_ids).keys)
            else:
                keys = [bytes.fromhex(k) for k in req.block_keys or []]
        where = self._where(ns_id, keys)
        leading = self.store.lookup(keys).num_blocks if keys else 0
        # a page held under another namespace is not this namespace's: the load would miss it
        leading = next((i for i, w in enumerate(where[:leading]) if w is None), leading)
        blocks = []
        for i, (k, tier) in enumerate(zip(keys, where)):
            reason = "loadable" if i < leading else ("absent" if tier is None else "after_miss")
            blocks.append(s.BlockWhere(index=i, key=k.hex(), tier=tier, loadable=i < leading,
                                       reason=reason))  # type: ignore[arg-type]
        empty = all(w is None for w in where) and ns_id not in self._held()
        return s.LookupOut(namespace_id=ns_id.hex(), num_blocks=len(keys), num_leading=leading,
                           blocks=blocks, namespaces=self.known_namespaces() if empty else None)

    def _id_of_label(self, label: str) -> bytes:
        """The namespace id labelled ``label`` (registered, or the configured namespace's).
        UnknownNamespace, listing the namespaces there are, when none is."""
        ids = self.store.namespace_labels.ids_of(label)
        mine = self._default_namespace()
        if not ids and label == mine.label:
            ids = [mine.id]
        if len(ids) > 1:
            raise InvalidArgument(
                f"{len(ids)} namespaces are labelled {label!r}: "
                f"{', '.join(ns.hex() for ns in sorted(ids))}",
                hint="name it by namespace (model_id, tenant_salt), or by namespace_id with "
                     "block_keys")
        if not ids:
            known = self.known_namespaces()
            raise UnknownNamespace(
                f"no namespace is labelled {label!r}; there are {len(known)}"
                + "".join(f"; {n.namespace_id} ({n.label or 'no label'})" for n in known[:5]),
                known, hint="use one of the labels in namespaces (or in /v1/stats)")
        return ids[0]

    def _where(self, ns: bytes, keys: list[bytes]) -> list[str | None]:
        """The fastest tier holding each key under ``ns`` (a local tier's index tells the
        namespace; a shared tier's record header does, one read each)."""
        where: list[str | None] = [None] * len(keys)
        todo = list(range(len(keys)))
        for t in self.store.tiers:
            if not todo:
                break
            present = t.contains([keys[i] for i in todo])
            left = []
            for i, here in zip(todo, present):
                meta = t.meta(keys[i]) if here else None
                if meta is not None and meta.namespace_id == ns:
                    where[i] = t.name
                else:
                    left.append(i)
            todo = left
        return where

    # ----------------------------------------------------------------- flush

    def start_flush(self, namespace_id: bytes) -> s.FlushOut:
        """Delete every page of ``namespace_id`` from every tier (Redis: every node's pages
        under the tier's key prefix, found by SCAN), in the background; progress per tier in
        :meth:`flush_status`."""
        job = _Flush(next(self._flush_ids), namespace_id,
                     {t.name: [0, 0, 0, 0] for t in self.store.tiers})
        with self._lock:
            self._flushes[job.id] = job
            for old in sorted(self._flushes)[:-_JOBS_KEPT]:
                if self._flushes[old].state != "running":
                    del self._flushes[old]
                    self._futures.pop(old, None)
            self._futures[job.id] = self._worker.submit(self._flush, job)
        return job.out()

    def wait_flush(self, job_id: int) -> s.FlushOut:
        with self._lock:
            fut = self._futures.get(job_id)
        if fut is not None:
            fut.result()
        return self.flush_status(job_id)

    def flush_status(self, job_id: int) -> s.FlushOut:
        with self._lock:
            job = self._flushes.get(job_id)
        if job is None:
            raise NotFound(f"flush {job_id} is unknown (or old enough to be forgotten)",
                           hint="start one with DELETE /v1/namespaces/{id}")
        return job.out()

    def _flush(self, job: _Flush) -> None:
        try:
            for t in self.store.tiers:
                progress = job.tiers[t.name]
                batch: list[bytes] = []
                for k in t.scan_keys():  # a shared tier: every node's pages
                    progress[0] += 1
                    meta = t.meta(k)
                    if meta is None or meta.namespace_id != job.namespace_id:
                        continue
                    progress[1] += 1
                    batch.append(k)
                    if len(batch) >= FLUSH_BATCH:
                        self._delete(job, batch)
                        batch = []
                if batch:
                    self._delete(job, batch)
                progress[3] = 1
            job.state = "done"
        except KVStoreError as exc:
            job.state, job.error = "failed", exc.message
        except Exception as exc:  # noqa: BLE001 - reported in the job, the API keeps serving
            job.state, job.error = "failed", f"{type(exc).__name__}: {exc}"

    def _delete(self, job: _Flush, keys: list[bytes]) -> None:
        """Delete through the store (policies, events, every tier), counting each tier's copies."""
        for t in self.store.tiers:
            job.tiers[t.name][2] += sum(t.contains(keys))
        self.store.delete(keys)

    # ----------------------------------------------------------------- retention

    def pin(self, namespace_id: bytes, req: s.PinIn) -> s.PinOut:
        """Pin the pages ``req`` names in ``namespace_id`` for ``req.ttl_s`` (the store checks
        the rest: another namespace's key, the bound on pinned pages; nothing changes then)."""
        if (req.keys is None) == (req.tokens is None):
            raise InvalidArgument("give exactly one of keys (block keys, hex) and tokens "
                                  "(the prompt's token ids)")
        if req.namespace is not None and req.namespace_label is not None:
            raise InvalidArgument("give at most one of namespace and namespace_label")
        if req.namespace is not None:
            n = req.namespace
            named = self._default_namespace(n.model_id, n.tenant_salt)
            if named.id != namespace_id:
                raise InvalidArgument(
                    f"namespace {named.label!r} is {named.id.hex()}, not the path's "
                    f"{namespace_id.hex()}", hint="pin under that id, or name its namespace")
        elif req.namespace_label is not None:
            labelled = self._id_of_label(req.namespace_label)
            if labelled != namespace_id:
                raise InvalidArgument(
                    f"the namespace labelled {req.namespace_label!r} is {labelled.hex()}, not "
                    f"the path's {namespace_id.hex()}", hint="pin under that id")
        if req.tokens is not None:
            # a namespace's id is its seed (kvstore.keys): a prompt chains from it
            block = self.store.layout.block_size
            keys = chain_keys(namespace_id, token_bytes(req.tokens), block)
            if not keys:
                raise InvalidArgument(f"{len(req.tokens)} token ids make no whole block of "
                                      f"{block}: nothing to pin",
                                      hint="only whole blocks are stored, hence pinned")
        else:
            keys = [bytes.fromhex(k) for k in req.keys or []]
        held = self.store.pin(namespace_id, keys, ttl_s=req.ttl_s)
        return self._pin_out(held)

    def unpin(self, namespace_id: bytes, pin_id: int) -> s.UnpinOut:
        return s.UnpinOut(removed=self.store.unpin(pin_id, namespace_id=namespace_id))

    def set_budget(self, namespace_id: bytes, tier: str, nbytes: int | None) -> s.TierRetentionOut:
        """Set (None: remove) a namespace's budget in ``tier``; its retention row there after."""
        self._tier_named(tier, "/v1/namespaces/{id}/budgets/{tier}")
        self.store.set_budget(namespace_id, tier, nbytes)
        return next(t for t in self.retention(namespace_id).tiers if t.tier == tier)

    def retention(self, namespace_id: bytes) -> s.RetentionOut:
        info = self.store.retention(namespace_id)
        return s.RetentionOut(
            namespace_id=namespace_id.hex(), pins=[self._pin_out(p) for p in info.pins],
            tiers=[s.TierRetentionOut(tier=t.tier, used_bytes=t.used_bytes,
                                      pinned_bytes=t.pinned_bytes, budget_bytes=t.budget_bytes)
                   for t in info.tiers])

    def _pin_out(self, held: Pin) -> s.PinOut:
        # Pin.expires_at is on the store's clock: time.monotonic, unless a library user gave
        # the store another (the store does not expose it); the daemon's is the default
        left = max(0.0, held.expires_at - self.clock())
        return s.PinOut(pin_id=held.id, pages=len(held.keys), expires_in_s=round(left, 3))

    def _tier_named(self, tier: str, route: str) -> None:
        names = [t.name for t in self.store.tiers]
        if tier not in names:
            raise NotFound(f"no tier named {tier!r}; the tiers are {', '.join(names)}",
                           hint=f"use one of {', '.join(names)} in {route}")

    # ----------------------------------------------------------------- policy

    def set_policy(self, tier: str, policy: str) -> s.PolicyOut:
        names = [t.name for t in self.store.tiers]
        if tier not in names:
            raise NotFound(f"no tier named {tier!r}; the tiers are {', '.join(names)}",
                           hint=f"use one of {', '.join(names)} in /v1/tiers/{{name}}/policy")
        p = self.store.set_policy(tier, policy)
        return s.PolicyOut(tier=tier, policy=policy_name(p), tracked_pages=len(p))


def policy_name(policy: EvictionPolicy) -> str:
    """The registry name of a policy, else its import path."""
    path = f"{type(policy).__module__}:{type(policy).__name__}"
    return next((n for n, p in POLICIES.items() if p == path), path)


def _traffic(now: NamespaceCounts, m1: NamespaceCounts, m15: NamespaceCounts) -> dict[str, Any]:
    """The wire fields of one namespace's counters (hit rates windowed against ``m1``/``m15``)."""
    return dict(
        lookup_hit_blocks=now.lookup_hit, lookup_miss_blocks=now.lookup_miss,
        hit_rate_1m=ratio(now.lookup_hit - m1.lookup_hit, now.lookup_miss - m1.lookup_miss),
        hit_rate_15m=ratio(now.lookup_hit - m15.lookup_hit, now.lookup_miss - m15.lookup_miss),
        loaded_pages=now.load_hit, load_missed_pages=now.load_miss,
        misses=s.NamespaceMisses(absent=now.lookup_miss, corrupt=now.corrupt,
                                 expired=now.expired, timeout=now.timeout,
                                 declined=now.declined),
        load_failed_blocks=now.failed("load"), save_failed_blocks=now.failed("save"))


def _quantile(buckets: list[tuple[float, float]], q: float) -> float | None:
    if not buckets or buckets[-1][1] <= 0:
        return None
    target = q * buckets[-1][1]
    lo_le, lo_n = 0.0, 0.0
    for le, n in buckets:
        if n >= target:
            if le == float("inf"):
                return lo_le
            span = n - lo_n
            return lo_le + (le - lo_le) * ((target - lo_n) / span if span else 1.0)
        lo_le, lo_n = le, n
    return lo_le


def _retention_of(info: RetentionInfo) -> dict[str, Any]:
    """A namespace row's retention fields: pinned bytes and budgets, per tier where set."""
    return {"pins": len(info.pins),
            "pinned_bytes": {t.tier: t.pinned_bytes for t in info.tiers if t.pinned_bytes},
            "budget_bytes": {t.tier: t.budget_bytes for t in info.tiers
                             if t.budget_bytes is not None}}

