"""``kvstore stats`` and ``kvstore flush`` as a person runs them: real processes against a live
daemon's admin API, the token from the environment."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest

from connector.daemon.client import DaemonStore
from kvstore.errors import InvalidArgument
from tests.admin.conftest import TOKEN, AdminDaemon, namespace, pages
from tests.server.daemon_proc import ROOT


def kvstore(*args: str, token: str = TOKEN) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVSTORE_")}
    env.update(KVSTORE_ADMIN__TOKEN=token, COLUMNS="200")
    return subprocess.run([sys.executable, "-m", "server.cli", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def test_stats_and_flush_from_the_command_line(admin_daemon: AdminDaemon) -> None:
    a, b = namespace("a"), namespace("b")
    for ns, seed in ((a, 1), (b, 2)):
        with DaemonStore(admin_daemon.target, ns.id) as s:
            assert s.write_pages(ns.chain(list(range(64))).metas(), pages(4, seed)).stored == 4

    r = kvstore("stats", "--url", admin_daemon.url)
    assert r.returncode == 0, r.stderr
    assert "host (host)" in r.stdout and "disk (disk)" in r.stdout
    assert a.id.hex() in r.stdout and b.id.hex() in r.stdout and TOKEN not in r.stdout
    watched = kvstore("stats", "--url", admin_daemon.url, "--watch", "0.2", "--times", "3")
    assert watched.returncode == 0, watched.stderr
    assert "host (host)" in watched.stdout

    r = kvstore("flush", "--namespace", a.id.hex(), "--url", admin_daemon.url)
    assert r.returncode == 0, r.stderr
    assert f"flushed namespace {a.id.hex()}: 8 pages deleted across 2 tiers" in r.stdout
    after = kvstore("stats", "--url", admin_daemon.url).stdout
    assert a.id.hex() not in after and b.id.hex() in after

    denied = kvstore("stats", "--url", admin_daemon.url, token="not-the-token")
    assert denied.returncode == 2 and "refused the token" in denied.stderr
    assert "not-the-token" not in denied.stderr + denied.stdout
    bad = kvstore("flush", "--namespace", "xyz", "--url", admin_daemon.url)
    assert bad.returncode == 1 and "HTTP 422" in bad.stderr and "namespace_id" in bad.stderr


def _row_when(url: str, ns_hex: str, ok: Callable[[dict[str, Any]], bool]
              ) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """``kvstore stats --json``'s row of namespace ``ns_hex`` once ``ok`` holds for it (clients
    tell without waiting for the reply, and the admin API samples), else the last one seen."""
    deadline = time.monotonic() + 30
    while True:
        r = kvstore("stats", "--url", url, "--json")
        assert r.returncode == 0, r.stderr
        st = json.loads(r.stdout)
        row = next((n for n in st["namespaces"] if n["namespace_id"] == ns_hex), None)
        if (row is not None and ok(row)) or time.monotonic() > deadline:
            return row, st
        time.sleep(0.2)


def test_failed_loads_and_saves_a_client_counts_reach_the_daemons_stats(
        admin_daemon: AdminDaemon) -> None:
    """A worker's failures are counted by the daemon, per namespace and reason -- also those
    counted while the daemon was down (the usual cause): they are told to it once it is back."""
    ns = namespace("failing")
    url, key = admin_daemon.url, ns.id.hex()
    with DaemonStore(admin_daemon.target, ns.id, reconnect_interval_s=0.05) as s:
        s.count_failed(ns.id, "load", "timeout", 2)
        s.count_failed(ns.id, "save", "reserve", 1)
        row, st = _row_when(url, key, lambda r: r["save_failed_blocks"]["reserve"] == 1
                            and r["load_failed_blocks"]["timeout"] == 2)
        assert row is not None and row["load_failed_blocks"] == {
            "error": 0, "miss": 0, "timeout": 2, "lease_expired": 0, "not_prefetched": 0,
            "changed": 0, "unavailable": 0}, row
        assert row["save_failed_blocks"] == {"error": 0, "reserve": 1, "unavailable": 0}
        assert st["store"]["load_failed_blocks"]["timeout"] == 2
        text = kvstore("stats", "--url", url).stdout
        assert "failed blocks: load timeout 2; save reserve 1" in text

        assert admin_daemon.stop(signal.SIGKILL) == -signal.SIGKILL
        s.count_failed(ns.id, "load", "error", 3)  # the daemon is gone: kept, told later
        admin_daemon.start()
        assert s.wait_connected(60.0)
        with pytest.raises(InvalidArgument, match="unknown failure 'load'/'bogus'"):
            s.count_failed(ns.id, "load", "bogus", 1)  # a closed set: no row from a client
        assert s.namespace_counts.snapshot().get(ns.id).failed("load")["error"] == 3
        # the restarted daemon hears of the failure counted while it was down (the ones
        # before died with the old process)
        row, st = _row_when(url, key, lambda r: r["load_failed_blocks"]["error"] == 3)
    assert row is not None and row["load_failed_blocks"]["error"] == 3, st
    assert row["load_failed_blocks"]["timeout"] == 0
    assert st["store"]["load_failed_blocks"]["error"] == 3
    text = kvstore("stats", "--url", url).stdout
    assert "failed blocks: load error 3; save none" in text
