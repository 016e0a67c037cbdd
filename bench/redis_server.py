"""A private redis-server for a benchmark: found on the PATH or in the repository's ``.redis/``
(where the GPU machine carries one, with its shared libraries beside it), started on a free
loopback port with ``--save "" --appendonly no`` in a temporary directory, and always stopped.

    exe = find_redis_server()          # None: the caller skips its redis cases
    with redis_server(exe) as url:     # "redis://127.0.0.1:<port>/0"
        ...
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def find_redis_server() -> Path | None:
    """``redis-server`` from the PATH, else ``<repo>/.redis/redis-server``, else None."""
    exe = shutil.which("redis-server")
    if exe is not None:
        return Path(exe)
    local = REPO_ROOT / ".redis" / "redis-server"
    if local.is_file() and os.access(local, os.X_OK):
        return local
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_ready(port: int, proc: subprocess.Popen[bytes], timeout_s: float = 10.0) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"redis-server exited at start (status {proc.returncode})")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                if s.recv(16).startswith(b"+PONG"):
                    return
        except OSError:
            pass
        time.sleep(0.02)
    raise RuntimeError(f"redis-server on port {port} did not answer within {timeout_s:.0f} s")


@contextmanager
def redis_server(exe: Path) -> Iterator[str]:
    """Run ``exe`` on a free loopback port; yield its URL; kill it and remove its directory on
    exit (also when the body raises). A binary in ``.redis/`` gets ``LD_LIBRARY_PATH`` pointing
    at its directory (its jemalloc and lzf live there)."""
    env = dict(os.environ)
    if exe.parent.name == ".redis":
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            p for p in (str(exe.parent), env.get("LD_LIBRARY_PATH", "")) if p)
    workdir = tempfile.mkdtemp(prefix="kvbench-redis-")
    port = _free_port()
    proc = subprocess.Popen(
        [str(exe), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", workdir, "--daemonize", "no",
         "--logfile", os.path.join(workdir, "redis.log")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
    )
    try:
        _wait_ready(port, proc)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        shutil.rmtree(workdir, ignore_errors=True)


__all__ = ["find_redis_server", "redis_server"]
