"""Fixtures of the admin API tests: a real ``kvstore serve`` with the admin API on a free
loopback port (its token from the environment, as an operator would give it), and httpx
clients against that live port."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from kvstore import Namespace
from kvstore.layout import KVLayout
from tests.redis_servers import free_port
from tests.server.daemon_proc import TINY_LAYOUT, DaemonProc, write_config

TOKEN = "admin-test-token-0123456789abcdef"
LAYOUT = KVLayout(**TINY_LAYOUT)  # type: ignore[arg-type]


def namespace(salt: str = "") -> Namespace:
    """A namespace of the test daemon's model (its config says model_id "test")."""
    return Namespace("test", LAYOUT, salt)


def pages(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, LAYOUT.page_bytes), dtype=np.uint8)


class AdminDaemon(DaemonProc):
    """A daemon whose admin API listens on ``self.url``."""

    def __init__(self, directory: Path, *, redis_url: str | None = None, host: str = "1MiB",
                 disk: str = "4MiB", redis: str = "4MiB", write_policy: str = "write_through",
                 sample_interval_s: float = 0.25, promote_on_hit: bool = True,
                 redis_ttl_s: float | None = None) -> None:
        config = write_config(directory, host=host, disk=disk, write_policy=write_policy)
        text = config.read_text()
        if not promote_on_hit:
            text = text.replace("[store]\n", "[store]\npromote_on_hit = false\n")
        if redis_url is not None:
            text += (f'\n[[tiers]]\nkind = "redis"\nurl = "{redis_url}"\ncapacity = "{redis}"\n'
                     'timeout_s = 2.0\n' + (f"ttl_s = {redis_ttl_s}\n" if redis_ttl_s else ""))
        self.port = free_port()
        text += (f'\n[admin]\nlisten = "127.0.0.1:{self.port}"\n'
                 f"sample_interval_s = {sample_interval_s}\n")
        config.write_text(text)
        super().__init__(config, env={"KVSTORE_ADMIN__TOKEN": TOKEN})
        self.url = f"http://127.0.0.1:{self.port}"

    def client(self, token: str | None = TOKEN) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=60)


@pytest.fixture
def admin_daemon(tmp_path: Path) -> Iterator[AdminDaemon]:
    with AdminDaemon(tmp_path) as d:
        yield d


@pytest.fixture
def api(admin_daemon: AdminDaemon) -> Iterator[httpx.Client]:
    with admin_daemon.client() as c:
        yield c
