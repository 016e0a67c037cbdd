"""What the two sides of kvstore's vLLM connector (:mod:`connector.vllm`) share in one vLLM
engine process: the store -- embedded, or the sidecar daemon -- the worker-side connector over
it, and the counters; and the reading of ``kv_connector_extra_config``. No vLLM import here
(:mod:`connector.vllm` is the package's only module that imports vLLM).

One :class:`EngineState` per vLLM engine (``kv_transfer_config.engine_id``) per process, opened
by the first connector side that asks (:func:`attach`) and closed by the last (:func:`detach`).

Two modes, chosen by ``kv_connector_extra_config``:

* in-process (no ``daemon``): a :class:`~kvstore.store.TieredStore` built from the kvstore
  configuration (``config_file`` and inline fields), living in vLLM's engine process;
* daemon (``daemon: "unix:///path/kvstore.sock"``, or ``"host:port"`` with ``token``): a
  :class:`~connector.daemon.DaemonStore` over ``kvstore serve``, whose tiers (``tiers``,
  ``store`` are the daemon's own configuration, refused here) are shared by every engine of the
  node. Each request's namespace is named per call (:meth:`EngineState.store_for`); the
  daemon's ``[layout]`` must be vLLM's (refused at start otherwise, naming both). When the
  daemon is down every lookup is a miss and every save is dropped -- vLLM recomputes -- and
  each failed call is counted (:attr:`KVStoreVLLMStats.daemon_failures`).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from connector.base import ConnectorStats
from connector.build import build_worker, connect_daemon, staging_host
from connector.inprocess import InProcessWorker
from kvstore.api import StoreAPI
from kvstore.build import build_store
from kvstore.config import KVStoreConfig, load_config
from kvstore.errors import ConfigError, InvalidArgument
from kvstore.layout import KVLayout
from kvstore.store import TieredStore

if TYPE_CHECKING:
    from connector.daemon import DaemonStore

#: ``kv_connector_extra_config`` keys that are not kvstore configuration fields.
OWN_KEYS = frozenset({"config_file", "daemon", "token"})
#: top-level fields of :class:`~kvstore.config.KVStoreConfig` that may be given inline.
INLINE_KEYS = frozenset({"tiers", "store", "connector", "security", "tenant_salt", "model_id"})
#: fields that belong to the daemon's configuration in daemon mode.
DAEMON_OWNS = frozenset({"tiers", "store"})


def load_kvstore_config(extra: Mapping[str, Any], layout: KVLayout, model_id: str) -> KVStoreConfig:
    """The kvstore configuration given in ``kv_connector_extra_config``: ``config_file`` and
    inline fields; the layout is vLLM's, the model id vLLM's unless the config names one. With
    ``daemon``, the tiers and the store are the daemon's: naming them here is an error."""
    unknown = set(extra) - OWN_KEYS - INLINE_KEYS
    if unknown:
        raise ConfigError(
            f"unknown kv_connector_extra_config key(s) {sorted(unknown)}",
            hint=f"use {sorted(OWN_KEYS | INLINE_KEYS)}")
    daemon_target(extra)  # validates daemon and token
    if "daemon" in extra and DAEMON_OWNS & set(extra):
        raise ConfigError(
            f"kv_connector_extra_config: {sorted(DAEMON_OWNS & set(extra))} with daemon="
            f"{extra['daemon']!r}: the daemon's tiers and store are configured in its own "
            "config file (kvstore serve --config)",
            hint="drop them here, or drop daemon to run the tiers in vLLM's process")
    inline = {k: v for k, v in extra.items() if k in INLINE_KEYS}
    layout_cfg = {
        "num_layers": layout.num_layers, "num_kv_heads": layout.num_kv_heads,
        "head_dim": layout.head_dim, "block_size": layout.block_size, "dtype": layout.dtype,
        "block_format": layout.block_format,
    }
    cfg = load_config(extra.get("config_file"), overrides={**inline, "layout": layout_cfg})
    if "model_id" not in cfg.model_fields_set:
        cfg = cfg.model_copy(update={"model_id": model_id})
    return cfg


#: vLLM executors whose workers run in processes of their own, apart from the scheduler
SPLIT_EXECUTORS = frozenset({"mp", "ray"})


def check_process_layout(executor_backend: object, world_size: int, daemon: bool) -> None:
    """Refuse in-process mode where vLLM runs its workers apart from its scheduler, or runs
    several workers: each process would build a store of its own, and no load would ever find
    what a save stored (with a disk tier, the second process could not even open it). Through
    the daemon every side of every rank shares its store, in any layout but torchrun's
    (``external_launcher``) with several ranks: there each rank schedules on its own, and a
    hit must load every shard or none, which one scheduler over all shards decides."""
    if world_size > 1 and str(executor_backend) == "external_launcher":
        raise ConfigError(
            f"kvstore's connector cannot run {world_size} tensor-parallel ranks under "
            "distributed_executor_backend='external_launcher': each rank schedules on its own, "
            "and no one side sees every shard of a hit",
            hint="use vLLM's own executor (distributed_executor_backend='mp', the default) "
                 "with kv_connector_extra_config.daemon")
    if daemon or (str(executor_backend) not in SPLIT_EXECUTORS and world_size == 1):
        return
    why = (f"runs {world_size} tensor-parallel workers" if world_size > 1 else
           "runs its workers in processes of their own")
    raise ConfigError(
        f"kvstore's in-process mode needs vLLM's scheduler and one worker in one process, but "
        f"this engine {why} (distributed_executor_backend={executor_backend!r}: vLLM's CPU "
        "build always splits them unless VLLM_ENABLE_V1_MULTIPROCESSING=0, GPU builds with "
        "tensor or pipeline parallelism)",
        hint="run `kvstore serve` and set kv_connector_extra_config.daemon to its socket "
             "(unix:///path/kvstore.sock); or VLLM_ENABLE_V1_MULTIPROCESSING=0 with one worker")


def daemon_target(extra: Mapping[str, Any]) -> tuple[str, str | None] | None:
    """``(daemon address, token)`` of ``kv_connector_extra_config``, None for in-process.
    Raises ConfigError for an address or token that is not a non-empty string."""
    target, token = extra.get("daemon"), extra.get("token")
    if target is None:
        if token is not None:
            raise ConfigError("kv_connector_extra_config.token without daemon",
                              hint="token is the bearer token of a daemon on TCP")
        return None
    if not isinstance(target, str) or not target.strip():
        raise ConfigError(f"kv_connector_extra_config.daemon must be the daemon's address, "
                          f"got {target!r}",
                          hint='e.g. "unix:///run/kvstore/kvstore.sock" or "10.0.0.5:7070"')
    if token is not None and (not isinstance(token, str) or not token):
        raise ConfigError("kv_connector_extra_config.token must be a non-empty string",
                          hint="the daemon's [daemon] token (KVSTORE_DAEMON__TOKEN)")
    return target, token


@dataclass(frozen=True, slots=True)
class KVStoreVLLMStats:
    """What the connector did in this engine (totals). Scheduler side: ``matched_tokens``
    offered to vLLM by the tier they were found in (the hits), ``missed_tokens`` looked up past
    vLLM's own prefix and not found, ``pending_lookups`` answered "not known yet" (a lookup below
    host in flight; vLLM asks again next step), ``skipped_requests`` by reason (``multimodal``,
    ``prompt_embeds``). Worker side: the :class:`ConnectorStats` (None before it registered)
    and, in daemon mode, ``daemon_failures``: calls that could not reach the daemon, by call."""

    matched_tokens: dict[str, int]
    missed_tokens: int
    pending_lookups: int
    skipped_requests: dict[str, int]
    worker: ConnectorStats | None
    daemon_failures: dict[str, int]
    #: requests whose ``kv_transfer_params`` asked a pin: ``made``, ``refused`` (logged)
    pins: dict[str, int] = field(default_factory=dict)

    def counters(self, side: Literal["scheduler", "worker"]) -> dict[str, int]:
        """One side's totals as flat ``name`` / ``name:label`` counters (what vLLM's stats
        carry, see :class:`connector.vllm.KVStoreConnectorStats`)."""
        out: dict[str, int] = {}
        if side == "scheduler":
            out.update({f"hit_tokens:{t}": n for t, n in self.matched_tokens.items()})
            out["miss_tokens"] = self.missed_tokens
            out["pending_lookups"] = self.pending_lookups
            out.update({f"skipped_requests:{r}": n for r, n in self.skipped_requests.items()})
            out.update({f"pins:{r}": n for r, n in self.pins.items()})
        else:
            w = self.worker
            if w is not None:
                out["loaded_blocks"] = w.blocks_loaded
                out["saved_blocks"] = w.blocks_saved
                out["abandoned_saves"] = w.saves_abandoned
                out.update({f"load_errors:{r}": n for r, n in w.load_failures.items()})
                out.update({f"save_errors:{r}": n for r, n in w.save_failures.items()})
            out.update({f"daemon_failures:{c}": n for c, n in self.daemon_failures.items()})
        return out


class EngineState:
    """One vLLM engine's store (embedded, or the daemon), the worker-side connector over it,
    and the counters. ``store_for(namespace_id)`` is what a namespace's scheduler runs over.

    ``cpu_inline`` (vLLM's CPU backend): every load is synchronous and copies on vLLM's thread
    -- a load from disk or Redis waits there for its prefetch (bounded by
    ``connector.prefetch_timeout_s``; the lookup never waits, see the None path); saves keep
    their thread. A load thread of ours gets no CPU in time there: vLLM's OpenMP threads spin
    on every core between parallel regions, and while a request waits for an asynchronous load
    vLLM's engine loop polls.
    Measured on the 2-core machine (4K-token prompt, tiny Llama): a host hit ~200 ms with copy
    threads against ~15 ms inline; a disk hit ~390 ms asynchronous against ~30 ms inline."""

    def __init__(self, cfg: KVStoreConfig, layout: KVLayout, num_blocks: int,
                 daemon: tuple[str, str | None] | None) -> None:
        self.cfg = cfg
        self.num_blocks = num_blocks
        self.cpu_inline = layout.block_format == "vllm-cpu"
        self.store: TieredStore | None = None
        self.daemon: DaemonStore | None = None
        if daemon is None:
            self.store = build_store(cfg)
            try:
                self.host = staging_host(cfg.connector, self.store)
                self.worker: InProcessWorker = build_worker(cfg.connector, self.store, self.host,
                                                            cpu_inline=self.cpu_inline)
            except BaseException:
                self.store.close()
                raise
        else:
            self.daemon = connect_daemon(daemon[0], layout, token=daemon[1],
                                         secret=cfg.security.secret_bytes())
            try:
                self.host = self.daemon.staging_tier().name
                if cfg.connector.host_tier not in (None, self.host):
                    raise ConfigError(
                        f"connector.host_tier is {cfg.connector.host_tier!r}; the daemon at "
                        f"{daemon[0]} stages through {self.host!r}",
                        hint="leave connector.host_tier unset in daemon mode")
                self.worker = build_worker(cfg.connector, self.daemon, self.host,
                                           cpu_inline=self.cpu_inline)
            except BaseException:
                self.daemon.close()
                raise
        self.delayed: set[str] = set()  # requests whose blocks vLLM keeps until we say
        self.matched: Counter[str] = Counter()
        self.missed = 0
        self.pending = 0
        self.skipped: Counter[str] = Counter()
        self.pins: Counter[str] = Counter()  # requests' pins (kv_transfer_params): made, refused
        self.users = 0

    def store_for(self, namespace_id: bytes) -> StoreAPI:
        """The store a scheduler of namespace ``namespace_id`` runs over."""
        if self.daemon is not None:
            return self.daemon.scoped(namespace_id)
        assert self.store is not None
        return self.store

    def stats(self) -> KVStoreVLLMStats:
        return KVStoreVLLMStats(
            dict(self.matched), self.missed, self.pending, dict(self.skipped),
            self.worker.stats(), dict(self.daemon.failures) if self.daemon is not None else {},
            dict(self.pins))

    def close(self) -> None:
        self.worker.close()
        if self.store is not None:
            self.store.drain()
            self.store.close()
        if self.daemon is not None:
            self.daemon.close()


_ENGINES: dict[str, EngineState] = {}
_ENGINES_LOCK = threading.Lock()


def attach(engine_id: str, make: Callable[[], EngineState]) -> EngineState:
    """The state of engine ``engine_id`` in this process, made by ``make`` if there is none;
    one more user of it."""
    with _ENGINES_LOCK:
        eng = _ENGINES.get(engine_id)
        if eng is None:
            eng = _ENGINES[engine_id] = make()
        eng.users += 1
        return eng


def detach(engine_id: str) -> None:
    """One user less of engine ``engine_id``'s state; the last closes it."""
    with _ENGINES_LOCK:
        eng = _ENGINES.get(engine_id)
        if eng is None:
            return
        eng.users -= 1
        if eng.users > 0:
            return
        del _ENGINES[engine_id]
    eng.close()


def _engine(engine_id: str) -> EngineState:
    eng = _ENGINES.get(engine_id)
    if eng is None:
        raise InvalidArgument(f"no kvstore connector for vLLM engine {engine_id!r} in this process")
    return eng


def engine_store(engine_id: str) -> TieredStore | DaemonStore:
    """The store of the vLLM engine ``engine_id`` (its ``kv_transfer_config.engine_id``) in this
    process -- its embedded store, or its client of the daemon -- for admin tools and tests.
    Raises InvalidArgument when there is none."""
    eng = _engine(engine_id)
    store = eng.daemon if eng.daemon is not None else eng.store
    assert store is not None
    return store


def engine_stats(engine_id: str) -> KVStoreVLLMStats:
    """The connector's counters for the vLLM engine ``engine_id`` in this process."""
    return _engine(engine_id).stats()


__all__ = [
    "EngineState",
    "KVStoreVLLMStats",
    "attach",
    "daemon_target",
    "detach",
    "engine_stats",
    "engine_store",
    "load_kvstore_config",
]
