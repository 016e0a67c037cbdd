"""The daemon's health turns SERVING only once every listener takes connections: a client
that waits for SERVING (as an orchestrator's probe does) reaches the admin API at once."""

from __future__ import annotations

import socket
from pathlib import Path

from tests.admin.conftest import AdminDaemon


def test_the_admin_port_accepts_as_soon_as_health_says_serving(tmp_path: Path) -> None:
    # grpc's health servicer starts with "" SERVING; the daemon must not inherit that, or a
    # client polling health connects while the admin API is still starting (refused)
    for i in range(3):
        (tmp_path / str(i)).mkdir()
        with AdminDaemon(tmp_path / str(i)) as d:  # returns on the first SERVING it sees
            socket.create_connection(("127.0.0.1", d.port), timeout=5).close()
