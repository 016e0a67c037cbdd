"""``kvstore stats`` and ``kvstore flush`` as a person runs them: real processes against a live
daemon's admin API, the token from the environment."""

from __future__ import annotations

import os
import subprocess
import sys

from connector.daemon.client import DaemonStore
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
