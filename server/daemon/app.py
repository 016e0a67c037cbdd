"""``kvstore serve``: build the store on a shared-memory host slab, listen, drain on a signal.

Start: the configured tiers (or the embedded default: a host tier over a disk tier in the data
directory), the host tier's slab in ``/dev/shm`` (0600), a gRPC server on a Unix socket (0600),
the local lane beside it (``<socket>.lane``, 0600: :mod:`server.daemon.lane`) and, when
configured, a gRPC server on TCP that needs the bearer token, and the store's event log
published as vLLM's KV events (``events.zmq_endpoint``: :mod:`server.vllm_events`, started
before any listener, so that it sees every client's first save). One log line per listener.

Stop (SIGTERM/SIGINT): health goes NOT_SERVING, session streams end (each client's handles are
completed or aborted), in-flight calls get ``drain_timeout_s`` to finish, then the store closes
(the disk tier's index is closed cleanly, so the next start is warm), the segment and the socket
are removed, and the process exits 0.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import socket
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from connector.daemon import shm
from connector.proto import kvstore_daemon_pb2 as pb
from kvstore.build import build_store
from kvstore.config import DaemonConfig, KVStoreConfig, load_config
from kvstore.errors import ConfigError
from kvstore.record import RecordMac
from server.daemon.handlers import add_servicer
from server.daemon.lane import LaneServer
from server.daemon.service import DaemonService, Limits
from server.daemon.servicer import Servicer, TokenAuth

log = logging.getLogger("kvstore.daemon")
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["KVStoreDaemon"].full_name


def data_dir(cfg: KVStoreConfig) -> Path:
    if cfg.daemon.data_dir is not None:
        return cfg.daemon.data_dir
    xdg = os.environ.get("XDG_DATA_HOME")
    return Path(xdg, "kvstore") if xdg else Path("kvstore-data")


def default_overrides(directory: Path) -> dict[str, Any]:
    """The embedded default: a 512 MiB host tier over a 4 GiB disk tier in ``directory``,
    write-through (what the daemon saves survives its restart)."""
    return {
        "store": {"write_policy": "write_through"},
        "tiers": [
            {"kind": "host", "capacity": "512MiB"},
            {"kind": "disk", "path": str(directory / "disk"), "capacity": "4GiB",
             "preallocate": False},
        ],
    }


def load_serve_config(path: Path | None) -> KVStoreConfig:
    if path is not None:
        return load_config(path)
    cfg = load_config()
    return load_config(overrides=default_overrides(data_dir(cfg)))


@dataclass
class Daemon:
    """A running daemon; :meth:`stop` drains and closes it."""

    cfg: KVStoreConfig
    service: DaemonService
    servers: list[grpc.Server]
    health: health.HealthServicer
    slab: shm.SharedSlab
    socket_path: Path
    stopping: threading.Event
    servicer: Servicer
    lane: LaneServer
    copy_pool: ThreadPoolExecutor
    admin: Any = None  # a server.admin.AdminServer when the admin API is on
    publisher: Any = None  # a server.vllm_events.VllmEventPublisher when events.zmq_endpoint is set

    def stop(self) -> None:
        self.health.enter_graceful_shutdown()
        self.stopping.set()
        if self.admin is not None:
            self.admin.stop()
        self.service.close()  # sessions end: handles completed/aborted, streams return
        self.servicer.close()  # lookup streams end (they wait on their clients otherwise)
        self.lane.close()  # each connection ends after its call in progress
        grace = self.cfg.daemon.drain_timeout_s
        for ev in [s.stop(grace) for s in self.servers]:
            ev.wait(grace + 1)
        if self.publisher is not None:  # once no client call changes the store any more
            self.publisher.close()
        self.service.store.close()
        self.copy_pool.shutdown()
        self.slab.close()
        self.socket_path.unlink(missing_ok=True)
        log.info("stopped")


def start(cfg: KVStoreConfig) -> Daemon:
    dcfg = cfg.daemon
    host = next((t for t in cfg.tiers if t.kind == "host"), None)
    if host is None:
        raise ConfigError("the daemon needs a host tier: it is the shared-memory slab clients map",
                          hint="add a tier of kind 'host' to tiers")
    root = data_dir(cfg)
    sock = (dcfg.socket or root / "kvstore.sock").absolute()
    sock.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    _claim_socket(sock)
    layout = cfg.layout.build()
    pages = int(host.capacity) // layout.page_bytes
    slab = shm.SharedSlab.create("kvstore-slab", pages * layout.page_bytes)
    try:
        # clients map it read-only: from here on only this mapping writes it
        slab.seal(read_only=True)
        store = build_store(cfg, tier_runtime={host.name: {"slab": slab.array}})
    except BaseException:
        slab.close()
        raise
    try:
        return _serve_store(cfg, store, slab, sock, pages, host.name)
    except BaseException:
        store.close()
        slab.close()
        raise


def page_limits(dcfg: DaemonConfig, page_bytes: int, pages: int) -> tuple[int | None, int]:
    """``(namespace quota, staging rows per session)`` in pages of ``page_bytes`` for a host
    slab of ``pages``. A size under one page is refused naming the field: a quota of 0 pages
    would refuse every save of every namespace, a staging area of 0 rows every save of every
    client -- a capacity typo ("1KiB" for "1GiB") must not start a daemon that stores nothing.
    The staging area is capped at the slab (a save never holds more)."""
    def whole_pages(field: str, size: int) -> int:
        if size < page_bytes:
            raise ConfigError(
                f"daemon.{field} is {size} bytes, less than one page ({page_bytes} bytes of "
                "this layout): every save would be refused",
                hint=f"set daemon.{field} to at least one page, or leave it unset")
        return size // page_bytes

    quota = None if dcfg.namespace_quota is None else whole_pages(
        "namespace_quota", int(dcfg.namespace_quota))
    staging = pages if dcfg.staging_bytes is None else min(
        pages, whole_pages("staging_bytes", int(dcfg.staging_bytes)))
    return quota, staging


def _serve_store(cfg: KVStoreConfig, store: Any, slab: shm.SharedSlab, sock: Path, pages: int,
                 host_name: str) -> Daemon:
    publisher = _publish_events(cfg, store)
    try:
        daemon = _listen(cfg, store, slab, sock, pages, host_name)
    except BaseException:
        if publisher is not None:
            publisher.close()
        raise
    daemon.publisher = publisher
    return daemon


def _listen(cfg: KVStoreConfig, store: Any, slab: shm.SharedSlab, sock: Path, pages: int,
            host_name: str) -> Daemon:
    dcfg, layout = cfg.daemon, store.layout
    quota, staging_pages = page_limits(dcfg, layout.page_bytes, pages)
    copy_pool = ThreadPoolExecutor(dcfg.copy_threads, thread_name_prefix="kvstore-copy")
    service = DaemonService(store, slab, limits=Limits(
        dcfg.max_keys_per_call, dcfg.max_handles_per_session, dcfg.max_sessions, quota,
        staging_pages), copy_pool=copy_pool, peer_copy=dcfg.peer_copy)
    stopping = threading.Event()
    lane_path = sock.with_name(sock.name + ".lane")
    servicer = Servicer(service, stopping, max_streams=dcfg.max_sessions,
                        max_watchers=dcfg.max_watchers,
                        mac=RecordMac(cfg.security.secret_bytes()),
                        lane_socket=str(lane_path) if dcfg.lane else "", shm_socket=str(lane_path))
    hs = health.HealthServicer()
    for name in ("", SERVICE_NAME):  # grpc's servicer starts "" as SERVING: not before we are
        hs.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
    options = [("grpc.max_receive_message_length", int(dcfg.max_message_bytes)),
               ("grpc.max_send_message_length", int(dcfg.max_message_bytes)),
               ("grpc.so_reuseport", 0)]

    # Every open session holds a handler thread for its life (OpenSession streams until the
    # client goes), and so does every lookup stream (at most one per session) and every event
    # watcher (at most max_watchers): threads for those come on top of `workers`, or a few
    # long-lived streams would leave no thread for any other call. The pool starts threads
    # only as calls need them.
    held = 2 * dcfg.max_sessions + dcfg.max_watchers

    def server(interceptors: tuple[grpc.ServerInterceptor, ...] = ()) -> grpc.Server:
        s = grpc.server(ThreadPoolExecutor(dcfg.workers + held, thread_name_prefix="kvstore-rpc"),
                        interceptors=interceptors, options=options,
                        maximum_concurrent_rpcs=dcfg.workers * 4 + held)
        add_servicer(servicer, s)
        health_pb2_grpc.add_HealthServicer_to_server(hs, s)
        return s

    servers = []
    # the lane listens before gRPC does: every session's handshake names it (its MAP frame
    # hands out the shared memory even when its calls are off)
    lane = LaneServer(lane_path, servicer, max_frame=int(dcfg.max_message_bytes),
                      max_connections=dcfg.lane_connections, calls=dcfg.lane)
    log.info("local lane on %s (mode 0600)%s", lane_path, "" if dcfg.lane else
             ": shared memory only, calls over gRPC")
    old = os.umask(0o177)  # the socket file is created 0600
    try:
        uds = server()
        uds.add_insecure_port(f"unix://{sock}")
        uds.start()
    except BaseException:
        lane.close()
        raise
    finally:
        os.umask(old)
    os.chmod(sock, 0o600)
    servers.append(uds)
    log.info("listening on unix://%s (mode 0600)", sock)
    if dcfg.tcp is not None:
        assert dcfg.token is not None  # the config requires it
        tcp = server((TokenAuth(dcfg.token.get_secret_value()),))
        port = tcp.add_insecure_port(dcfg.tcp)
        tcp.start()
        servers.append(tcp)
        log.info("listening on tcp %s (port %d, bearer token required)", dcfg.tcp, port)
    log.info("shared memory: %d pages of %d bytes in tier %r (clients map it read-only; each "
             "session saves through %d staging rows of its own)", pages, layout.page_bytes,
             host_name, staging_pages)
    daemon = Daemon(cfg, service, servers, hs, slab, sock, stopping, servicer, lane, copy_pool)
    try:
        daemon.admin = _serve_admin(cfg, store)
    except BaseException:
        daemon.stop()
        raise
    # SERVING only once every listener, the admin API's too, accepts connections
    for name in ("", SERVICE_NAME):
        hs.set(name, health_pb2.HealthCheckResponse.SERVING)
    return daemon


def _publish_events(cfg: KVStoreConfig, store: Any) -> Any:
    """The vLLM-format KV-events publisher of ``events.zmq_endpoint`` (None when unset), reading
    ``store``'s event log from now on. An ``ipc://`` socket file is created mode 0600."""
    ecfg = cfg.events
    if ecfg.zmq_endpoint is None:
        return None
    # imported only when on: a daemon without the publisher needs no pyzmq or msgspec
    try:
        import zmq
    except ImportError:
        raise ConfigError("events.zmq_endpoint is set, and publishing KV events needs pyzmq "
                          "and msgspec", hint="pip install 'kvstore[events]'") from None
    from server.vllm_events import VllmEventPublisher

    endpoint = ecfg.zmq_endpoint
    try:
        key = ecfg.curve_secret_key()  # the key file is read again: it may have changed
    except ValueError as exc:
        raise ConfigError(f"events: {exc}", hint="fix the CURVE key") from None
    path = endpoint[len("ipc://"):] if endpoint.startswith("ipc://") else ""
    if path.startswith("@"):  # Linux's abstract namespace: no file, no permissions
        path = ""
    if path:
        try:
            Path(path).parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as exc:
            raise ConfigError(f"events.zmq_endpoint {endpoint!r}: cannot create its directory: "
                              f"{exc.strerror}", hint="give a path in a writable directory") from None
    old = os.umask(0o177)  # an ipc:// socket file is created 0600, as the gRPC socket is
    try:
        publisher = VllmEventPublisher(store, endpoint, topic=ecfg.zmq_topic,
                                       curve_secret_key=key)
    except zmq.ZMQError as exc:  # in use, no such address: the operator's to fix
        raise ConfigError(f"cannot bind events.zmq_endpoint {endpoint!r}: {exc}",
                          hint="give a free address, or a path in a writable directory") from None
    finally:
        os.umask(old)
    try:
        if path:
            os.chmod(path, 0o600)
    except BaseException:
        publisher.close()
        raise
    access = [] if not path else ["socket file mode 0600"]
    if key is not None:
        public = zmq.curve_public(key.encode()).decode()
        access.append(f"CURVE: subscribers set curve_serverkey {public}")
    log.info("publishing KV events (vLLM's format) on %s%s", publisher.endpoint,
             f" ({'; '.join(access)})" if access else "")
    return publisher


def _serve_admin(cfg: KVStoreConfig, store: Any) -> Any:
    acfg = cfg.admin
    if acfg.token is None or not acfg.token.get_secret_value():
        log.info("admin API off (set admin.token or KVSTORE_ADMIN__TOKEN to serve it)")
        return None
    # imported only when on: a daemon without the admin API needs no FastAPI or uvicorn
    from server.admin import NamespaceDefaults, serve_admin
    from server.admin.server import is_loopback, split_listen

    host, port = split_listen(acfg.listen)
    secret = cfg.security.secret_bytes()
    admin = serve_admin(store, host, port, acfg.token.get_secret_value(),
                        namespace=NamespaceDefaults(cfg.model_id, cfg.tenant_salt, secret),
                        sample_interval_s=acfg.sample_interval_s,
                        max_body_bytes=int(acfg.max_body_bytes))
    log.info("admin API and dashboard on %s (bearer token required%s)", admin.url,
             "" if is_loopback(host) else "; NOT loopback: reachable from the network")
    return admin


def _claim_socket(path: Path) -> None:
    """Remove a socket file left by a daemon that died; refuse to start beside a live one."""
    if not path.exists():
        return
    probe = socket.socket(socket.AF_UNIX)
    try:
        probe.connect(str(path))
    except OSError:
        path.unlink()
        return
    finally:
        probe.close()
    raise ConfigError(f"another daemon is listening on {path}",
                      hint="stop it, or set daemon.socket to another path")


def _not_dumpable() -> None:
    """No process of this user may ptrace the daemon, read or write its memory through
    ``/proc/<pid>/mem``, or open its descriptors through ``/proc/<pid>/fd`` (the slab's
    writable mapping and every session's staging area are there); no core dump holds pages.
    Root still can (a debugger run as root)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        log.warning("prctl(PR_SET_DUMPABLE, 0) failed: %s; processes of this user can read "
                    "the daemon's memory", os.strerror(ctypes.get_errno()))


_PR_SET_DUMPABLE = 4


def serve(cfg: KVStoreConfig, *, ready: Callable[[Daemon], None] | None = None) -> int:
    """Run until SIGTERM or SIGINT; returns the exit status (0 after a clean drain)."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    _not_dumpable()
    daemon = start(cfg)
    if ready is not None:
        ready(daemon)
    # Python runs a signal's handler on the main thread only, and only between bytecodes: a
    # signal the kernel delivered to one of gRPC's threads does not interrupt a wait without a
    # timeout, so the main thread looks at the flag every fraction of a second
    while not stop.wait(0.2):
        pass
    log.info("signal received: draining")
    daemon.stop()
    return 0


__all__ = ["Daemon", "default_overrides", "load_serve_config", "serve", "start"]
