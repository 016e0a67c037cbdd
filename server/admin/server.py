"""The admin app on uvicorn in a thread of the calling process (the daemon, or a library
user's process with an in-process store)."""

from __future__ import annotations

import ipaddress
import logging
import threading
import time

import uvicorn

from kvstore.errors import ConfigError

log = logging.getLogger("kvstore.admin")


class AdminServer:
    """A running admin API; :meth:`stop` shuts it down (idempotent)."""

    def __init__(self, app, host: str, port: int) -> None:  # noqa: ANN001 - a FastAPI app
        self._server = uvicorn.Server(uvicorn.Config(
            app, host=host, port=port, log_level="warning", access_log=False, lifespan="on",
            timeout_graceful_shutdown=2))
        self._thread = threading.Thread(target=self._server.run, name="kvstore-admin", daemon=True)
        self.host = host
        self.port = port

    def start(self, timeout_s: float = 30.0) -> AdminServer:
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive():
                raise ConfigError(f"the admin API could not listen on {self.host}:{self.port}",
                                  hint="set admin.listen to a free host:port")
            if time.monotonic() > deadline:
                raise ConfigError(f"the admin API did not start within {timeout_s}s")
            time.sleep(0.02)
        self.port = self._server.servers[0].sockets[0].getsockname()[1]
        return self

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def stop(self) -> None:
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(10)


def split_listen(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    return host.strip("[]"), int(port)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
