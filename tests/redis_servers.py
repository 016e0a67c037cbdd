"""Real redis-server processes for the tests: one server, or a 3-master Redis Cluster.

Every server runs on a free loopback port with ``--save "" --appendonly no`` in its own temporary
directory, and is always stopped (SIGCONT first if the test paused it, then SIGKILL) — by the
fixtures' teardown, or at interpreter exit for anything left over. Never the machine's own
redis-server on 6379.

Use from a test module::

    # the root conftest.py registers this module as a plugin (pytest_plugins)

Fixtures: ``redis_server`` (a fresh server per test), ``redis_cluster`` (one cluster per module,
flushed before each test that uses it).

PYTEST_DONT_REWRITE (imported by test modules too; nothing here relies on assert rewriting)
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence

import pytest
import redis

REDIS_SERVER = shutil.which("redis-server")
REDIS_CLI = shutil.which("redis-cli")
_LIVE: set[RedisServer] = set()


def free_port(*, with_bus: bool = False) -> int:
    """A loopback port nobody listens on (and port + 10000 too, for a cluster bus)."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if not with_bus:
            return port
        if port + 10000 > 65535:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port pair found")


class RedisServer:
    """One redis-server process. ``restart()`` keeps its port and directory (and a cluster
    node's nodes.conf, so it rejoins its cluster)."""

    def __init__(self, *args: str, port: int | None = None, cluster: bool = False) -> None:
        if REDIS_SERVER is None:
            pytest.skip("redis-server is not installed")
        self.cluster = cluster
        self.port = port or free_port(with_bus=cluster)
        self.dir = tempfile.mkdtemp(prefix=f"kvstore-redis-{self.port}-")
        self.args = list(args)
        self.proc: subprocess.Popen[bytes] | None = None
        self.paused = False
        self.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def node(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        cmd = [
            REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1",
            "--save", "", "--appendonly", "no", "--dir", self.dir,
            "--daemonize", "no", "--logfile", os.path.join(self.dir, "redis.log"),
        ]
        if self.cluster:
            cmd += ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                    "--cluster-node-timeout", "2000", "--cluster-require-full-coverage", "no"]
        self.proc = subprocess.Popen(cmd + self.args, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        _LIVE.add(self)
        self.wait_ready()

    def wait_ready(self, timeout_s: float = 10.0) -> None:
        end = time.monotonic() + timeout_s
        while True:
            if self.proc is not None and self.proc.poll() is not None:
                log = self.log()
                raise RuntimeError(f"redis-server on {self.port} exited: {log[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                    s.sendall(b"PING\r\n")
                    reply = s.recv(64)
                    if reply.startswith((b"+PONG", b"-NOAUTH")):
                        return
            except OSError:
                pass
            if time.monotonic() > end:
                raise RuntimeError(f"redis-server on {self.port} did not start")
            time.sleep(0.02)

    def log(self) -> str:
        try:
            with open(os.path.join(self.dir, "redis.log"), encoding="utf-8", errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def client(self, **kwargs: object) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5, **kwargs)  # type: ignore[arg-type]

    # ----------------------------------------------------------------- faults

    def kill(self) -> None:
        """SIGKILL, and wait for the process to be gone."""
        if self.proc is not None and self.proc.poll() is None:
            if self.paused:
                self.proc.send_signal(signal.SIGCONT)
                self.paused = False
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None
        _LIVE.discard(self)

    def pause(self) -> None:
        """SIGSTOP: the server keeps its socket, accepts TCP connections, and answers nothing."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)
        self.paused = False

    def restart(self) -> None:
        self.kill()
        for _ in range(100):  # the port may linger a moment after the kill
            try:
                self.start()
                return
            except RuntimeError:
                time.sleep(0.05)
        raise RuntimeError(f"redis-server on {self.port} could not restart")

    def stop(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


class RedisClusterProcs:
    """A Redis Cluster of ``n`` masters (no replicas) on loopback, created by redis-cli."""

    def __init__(self, n: int = 3) -> None:
        if REDIS_CLI is None:
            pytest.skip("redis-cli is not installed")
        self.servers: list[RedisServer] = []
        try:
            for _ in range(n):
                self.servers.append(RedisServer(cluster=True))
            out = subprocess.run(
                [REDIS_CLI, "--cluster", "create", *self.nodes, "--cluster-replicas", "0",
                 "--cluster-yes"],
                capture_output=True, text=True, timeout=60,
            )
            if out.returncode != 0:
                raise RuntimeError(f"redis-cli --cluster create failed: {out.stdout}{out.stderr}")
            self.wait_ok()
        except BaseException:
            self.stop()
            raise

    @property
    def nodes(self) -> list[str]:
        return [s.node for s in self.servers]

    def wait_ok(
        self, timeout_s: float = 30.0, servers: Sequence[RedisServer] | None = None
    ) -> None:
        """Until every (given) node reports cluster_state:ok and knows all the others."""
        end = time.monotonic() + timeout_s
        for s in servers or self.servers:
            while True:
                try:
                    c = s.client()
                    info = c.execute_command("CLUSTER", "INFO")
                    text = info.decode() if isinstance(info, bytes) else str(info)
                    known = int(_field(text, "cluster_known_nodes") or 0)
                    if "cluster_state:ok" in text and known >= len(self.servers):
                        c.close()
                        break
                    c.close()
                except redis.RedisError:
                    pass
                if time.monotonic() > end:
                    raise RuntimeError(f"cluster node {s.node} not ok: {s.log()[-1500:]}")
                time.sleep(0.05)

    def flushall(self) -> None:
        for s in self.servers:
            if s.proc is not None:
                c = s.client()
                c.flushall()
                c.close()

    def stop(self) -> None:
        for s in self.servers:
            s.stop()


class DelayProxy:
    """A loopback TCP proxy in front of a server that delays every server->client byte by
    ``delay_s`` (settable at any time): adds latency without limiting throughput. A batch that
    takes one round trip costs about one ``delay_s``; N round trips cost N of them."""

    def __init__(self, target_port: int, delay_s: float = 0.0) -> None:
        self.target_port = target_port
        self.delay_s = delay_s
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._socks: list[socket.socket] = [self._listener]
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
                upstream = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:
                return
            self._socks += [client, upstream]
            self._serve(client, upstream)

    def _serve(self, client: socket.socket, upstream: socket.socket) -> None:
        """Start the threads that carry one connection (subclasses change what they carry)."""
        queue: deque[tuple[float, bytes]] = deque()
        ready = threading.Condition()
        threading.Thread(target=self._pipe, args=(client, upstream), daemon=True).start()
        threading.Thread(target=self._delayed_in, args=(upstream, queue, ready),
                         daemon=True).start()
        threading.Thread(target=self._delayed_out, args=(client, queue, ready),
                         daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(1 << 20):
                dst.sendall(data)
        except OSError:
            pass
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def _delayed_in(self, src: socket.socket, queue: deque[tuple[float, bytes]],
                    ready: threading.Condition) -> None:
        try:
            while data := src.recv(1 << 20):
                with ready:
                    queue.append((time.monotonic() + self.delay_s, data))
                    ready.notify()
        except OSError:
            pass
        with ready:
            queue.append((0.0, b""))
            ready.notify()

    @staticmethod
    def _delayed_out(dst: socket.socket, queue: deque[tuple[float, bytes]],
                     ready: threading.Condition) -> None:
        while True:
            with ready:
                while not queue:
                    ready.wait()
                due, data = queue.popleft()
            if not data:
                break
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            try:
                dst.sendall(data)
            except OSError:
                break
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self._closed = True
        for s in self._socks:
            with contextlib.suppress(OSError):
                s.close()


def _field(text: str, name: str) -> str | None:
    for line in text.splitlines():
        if line.startswith(name + ":"):
            return line.split(":", 1)[1].strip()
    return None


@atexit.register
def _stop_leftovers() -> None:
    for s in list(_LIVE):
        with contextlib.suppress(Exception):
            s.kill()


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def _cluster_procs() -> Iterator[RedisClusterProcs]:
    cluster = RedisClusterProcs(3)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def redis_cluster(_cluster_procs: RedisClusterProcs) -> RedisClusterProcs:
    for s in _cluster_procs.servers:  # a test may have killed or paused a node
        if s.paused:
            s.resume()
        if s.proc is None:
            s.restart()
    _cluster_procs.wait_ok()
    _cluster_procs.flushall()
    return _cluster_procs


__all__ = ["DelayProxy", "RedisClusterProcs", "RedisServer", "free_port"]
