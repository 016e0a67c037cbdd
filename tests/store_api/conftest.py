"""The two implementations of the store's face every test here runs against: the in-process
``TieredStore`` and ``DaemonStore``, a client of a real ``kvstore serve`` subprocess, each with
one 1 MiB host tier of ``LAYOUT``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kvstore import KVLayout, TieredStore
from kvstore.tiers.host import HostTier
from tests.server.daemon_proc import TINY_LAYOUT, DaemonProc, write_config

LAYOUT = KVLayout(**TINY_LAYOUT)  # type: ignore[arg-type]
PAGES = (1 << 20) // LAYOUT.page_bytes  # the daemon's 1 MiB host tier


@pytest.fixture(params=["in-process", "daemon"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    if request.param == "in-process":
        s = TieredStore(LAYOUT, [HostTier.build("host", LAYOUT, PAGES, pin_memory=False)])
        yield s
        s.close()
        return
    from connector.daemon import DaemonStore

    with DaemonProc(write_config(tmp_path, host="1MiB", disk=None)) as d:
        c = DaemonStore(d.target)
        yield c
        c.close()
