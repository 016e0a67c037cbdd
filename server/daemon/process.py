"""A ``kvstore serve`` child process, for a program that runs the daemon beside itself (the demo,
benches): started on the embedded default with settings from the environment, ready when its
health service says SERVING, stopped with SIGTERM (a drain; exit status 0 when clean)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from kvstore.errors import KVStoreError
from kvstore.layout import KVLayout


def layout_env(layout: KVLayout) -> dict[str, str]:
    """``KVSTORE_LAYOUT__*`` variables that give the daemon ``layout``."""
    return {f"KVSTORE_LAYOUT__{k.upper()}": str(v) for k, v in (
        ("num_layers", layout.num_layers), ("num_kv_heads", layout.num_kv_heads),
        ("head_dim", layout.head_dim), ("block_size", layout.block_size),
        ("dtype", layout.dtype), ("block_format", layout.block_format))}


class DaemonProcess:
    """``kvstore serve`` with its data directory, socket and log in ``directory``; ``env`` adds
    ``KVSTORE_*`` settings (a layout, a capacity) to the embedded default."""

    def __init__(self, directory: Path, env: Mapping[str, str] | None = None) -> None:
        self.directory = directory
        self.socket = directory / "kvstore.sock"
        self.log_path = directory / "daemon.log"
        self._env = {**os.environ, "KVSTORE_DAEMON__DATA_DIR": str(directory),
                     "KVSTORE_DAEMON__SOCKET": str(self.socket), **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def target(self) -> str:
        return f"unix://{self.socket}"

    def start(self, timeout_s: float = 60.0) -> DaemonProcess:
        """Start it and wait until it serves; raises KVStoreError with its log's tail if it
        exits or is not serving within ``timeout_s``."""
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "server.cli", "serve"], stdin=subprocess.DEVNULL,
                stdout=log, stderr=subprocess.STDOUT, env=self._env)
        deadline = time.monotonic() + timeout_s
        while not self._serving():
            if self.proc.poll() is not None:
                raise KVStoreError(f"kvstore serve exited {self.proc.returncode}: {self.tail()}")
            if time.monotonic() > deadline:
                self.stop()
                raise KVStoreError(f"kvstore serve not serving after {timeout_s}s: {self.tail()}")
            time.sleep(0.05)
        return self

    def _serving(self) -> bool:
        if not self.socket.exists():
            return False
        with grpc.insecure_channel(self.target) as ch:
            try:
                r = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=1)
            except grpc.RpcError:
                return False
        return r.status == health_pb2.HealthCheckResponse.SERVING

    def tail(self, lines: int = 5) -> str:
        return " | ".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self, timeout_s: float = 60.0) -> int:
        """SIGTERM (a drain), then its exit status; SIGKILL if it has not exited in
        ``timeout_s``."""
        assert self.proc is not None, "not started"
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def __enter__(self) -> DaemonProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.stop()
