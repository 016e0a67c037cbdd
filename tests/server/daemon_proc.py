"""A real ``kvstore serve`` subprocess for tests: started from a config file in a temporary
directory, ready when its health service says SERVING, stopped with a signal."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

ROOT = Path(__file__).parents[2]
#: the tiny model's pages: 2 layers x 2 x 16 tokens x 2 heads x 16 dims x fp32 = 8 KiB
TINY_LAYOUT = {"num_layers": 2, "num_kv_heads": 2, "head_dim": 16, "block_size": 16,
               "dtype": "float32"}


def write_config(directory: Path, *, host: str = "1MiB", disk: str | None = "4MiB",
                 extra_daemon: str = "", write_policy: str = "write_through",
                 layout: dict[str, object] | None = None) -> Path:
    """A daemon config in ``directory``; ``layout``: the ``[layout]`` fields (TINY_LAYOUT)."""
    lines = ['model_id = "test"', "", "[layout]"]
    lines += [f"{k} = {v!r}" if isinstance(v, str) else f"{k} = {v}"
              for k, v in (layout or TINY_LAYOUT).items()]
    lines += ["", "[store]", f'write_policy = "{write_policy}"', "", "[daemon]",
              f'data_dir = "{directory}"', f'socket = "{directory}/kvstore.sock"', extra_daemon,
              "", "[[tiers]]", 'kind = "host"', f'capacity = "{host}"']
    if disk is not None:
        lines += ["", "[[tiers]]", 'kind = "disk"', f'path = "{directory}/disk"',
                  f'capacity = "{disk}"', 'durability = "none"', "preallocate = false"]
    path = directory / "kvstore.toml"
    path.write_text("\n".join(lines).replace("'", '"') + "\n")
    return path


class DaemonProc:
    def __init__(self, config: Path, env: dict[str, str] | None = None) -> None:
        self.config = config
        self.socket = config.parent / "kvstore.sock"
        self.log_path = config.parent / "daemon.log"
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def target(self) -> str:
        return f"unix://{self.socket}"

    def start(self, timeout_s: float = 60.0) -> DaemonProc:
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "server.cli", "serve", "--config", str(self.config)],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=self.env)
        deadline = time.monotonic() + timeout_s
        while not self.ready():
            if self.proc.poll() is not None:
                raise RuntimeError(f"daemon exited {self.proc.returncode}:\n{self.log()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"daemon not ready after {timeout_s}s:\n{self.log()}")
            time.sleep(0.05)
        return self

    def ready(self, target: str | None = None) -> bool:
        if not self.socket.exists():
            return False
        with grpc.insecure_channel(target or self.target) as ch:
            try:
                r = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=1)
            except grpc.RpcError:
                return False
            return r.status == health_pb2.HealthCheckResponse.SERVING

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 60.0) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout_s)

    def pause(self, timeout_s: float = 10.0) -> None:
        """SIGSTOP, and wait until the kernel has stopped every thread: a call on the local
        lane takes microseconds, and could be answered between the signal and the stop."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)
        tasks = Path(f"/proc/{self.proc.pid}/task")
        deadline = time.monotonic() + timeout_s
        while not all(_state(t) in "Tt" for t in tasks.iterdir()):
            if time.monotonic() > deadline:
                raise RuntimeError("the daemon did not stop")
            time.sleep(0.005)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def __enter__(self) -> DaemonProc:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:  # a clean stop removes the socket and the shared-memory segment
            self.stop(signal.SIGTERM, timeout_s=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _state(task: Path) -> str:
    """A thread's state letter (``T``: stopped); "T" for a thread that exited meanwhile."""
    try:
        return (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return "T"
