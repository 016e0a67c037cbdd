"""A real uvicorn serving an engine server's app on a free loopback port, in a thread (the
engine-server tests share it)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn

from server.engine_server.app import build_app
from server.engine_server.build import Served
from server.engine_server.engine_loop import EngineLoop


@contextmanager
def serving(served: Served) -> Iterator[tuple[str, EngineLoop]]:
    """Serve ``served`` until the block ends; yields its URL and engine loop (which must end
    without an error)."""
    loop = EngineLoop(served.engine)
    app = build_app(loop, served.name, served.tokenizer)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    th = threading.Thread(target=srv.run, daemon=True)
    th.start()
    deadline = time.monotonic() + 60
    while not srv.started:
        assert time.monotonic() < deadline and th.is_alive(), "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}", loop
    finally:
        srv.should_exit = True
        th.join(30)
    assert loop.error is None
