"""Retention outlives a daemon restart with a disk tier: a pin and a budget set through a
``DaemonStore`` are there after ``kvstore serve`` is stopped (SIGTERM) and started again on the
same config; the pinned prefix then survives a flood of ten times the disk tier's pages and
loads its exact bytes, and the budget still holds its tenant to its share; a pin that lapsed
while the daemon was down is not restored."""

from __future__ import annotations

import time
from pathlib import Path

from connector.daemon import DaemonStore
from kvstore import Namespace
from tests.server.daemon_proc import DaemonProc, write_config
from tests.store_api.conftest import LAYOUT
from tests.store_api.test_conformance import TOKENS, _flood, _load, _save

DISK_PAGES = (4 << 20) // LAYOUT.page_bytes


def test_pins_and_budgets_survive_a_daemon_restart(tmp_path: Path) -> None:
    config = write_config(tmp_path, host="1MiB", disk="4MiB")
    pinned, budgeted = Namespace("restart", LAYOUT, "pinned"), Namespace("restart", LAYOUT, "b")
    keys = pinned.chain(TOKENS).keys
    with DaemonProc(config) as d, DaemonStore(d.target) as store:
        assert _save(store, pinned, TOKENS).stored == 6
        held = store.pin(pinned.id, keys, ttl_s=3600)
        short = store.pin(pinned.id, keys[:2], ttl_s=0.5)
        store.set_budget(budgeted.id, "disk", 32 * LAYOUT.page_bytes)
    time.sleep(0.6)  # the short pin lapses while the daemon is down
    with DaemonProc(config) as d, DaemonStore(d.target) as store:
        info = store.retention(pinned.id)
        assert [p.id for p in info.pins] == [held.id] and short.id != held.id
        assert info.pins[0].keys == tuple(keys)
        budgets = {t.tier: t.budget_bytes for t in store.retention(budgeted.id).tiers}
        assert budgets == {"host": None, "disk": 32 * LAYOUT.page_bytes}
        _flood(store, budgeted, 64)  # the budgeted tenant: held to 32 pages of disk
        used = {t.tier: t.used_bytes for t in store.retention(budgeted.id).tiers}
        assert used["disk"] == 32 * LAYOUT.page_bytes
        flood = Namespace("restart", LAYOUT, "flood")
        _flood(store, flood, 10 * DISK_PAGES)
        assert store.lookup(keys, namespace_id=pinned.id).tiers == ("disk",) * 6
        assert store.prefetch(pinned.id, keys, to="host").result(timeout=30) == 6
        assert _load(store, pinned, keys) == [True] * 6
        assert store.unpin(held.id, namespace_id=pinned.id)
