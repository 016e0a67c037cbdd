"""Issue 35 item 4, one source of truth for stats: after a known sequence of client calls on a
real daemon, every row of the admin API's stats and of ``kvstore stats --json`` shows the same
numbers (tier read hits, client lookups, the namespace's counters, pages loaded), and
``kvstore stats`` piped at 80 columns is readable."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from connector.daemon.client import DaemonStore
from tests.admin.conftest import TOKEN, AdminDaemon, namespace
from tests.server.daemon_proc import ROOT


def kvstore(*args: str, columns: int = 200) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVSTORE_")}
    env.update(KVSTORE_ADMIN__TOKEN=TOKEN, COLUMNS=str(columns))
    return subprocess.run([sys.executable, "-m", "server.cli", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)  # stdout: a pipe


def known_sequence(d: AdminDaemon) -> str:
    """Store 3 pages through the staging path, look them up with a lease, load all 3, then one
    lookup of 2 blocks the daemon never saw. Returns the namespace id (hex)."""
    ns = namespace("agree")
    chain = ns.chain(list(range(3 * 16)))
    with DaemonStore(d.target, ns.id) as s:
        h = s.prepare_store(chain.metas())
        slab = h.slab  # the session's staging rows: the daemon copies them into the slab
        for slot in h.slots:
            slab[slot][:] = 7
        assert s.complete_store(h).stored == 3
        found = s.lookup(list(chain.keys), lease=True)
        assert found.num_blocks == 3
        load = s.prepare_load(ns.id, list(chain.keys), lease=found.lease)
        assert load.num_blocks == 3 and s.complete_load(load) == 3
        assert s.lookup(list(ns.chain(list(range(1000, 1000 + 2 * 16))).keys)).num_blocks == 0
    return ns.id.hex()


def check(st: dict[str, Any], ns: str) -> None:
    host = next(t for t in st["tiers"] if t["name"] == "host")
    assert host["hits"] == 3 and host["misses"]["absent"] == 0 and host["hit_rate_1m"] == 1.0
    store = st["store"]
    assert (store["lookup_hit_blocks"], store["lookup_miss_blocks"]) == (3, 2)
    assert store["lookup_hit_rate_1m"] == store["lookup_hit_rate_15m"] == 0.6
    assert (store["loaded_pages"], store["load_missed_pages"], store["declined_blocks"]) == (3, 0, 0)
    (row,) = [r for r in st["namespaces"] if r["namespace_id"] == ns]
    assert (row["lookup_hit_blocks"], row["lookup_miss_blocks"]) == (3, 2)
    assert row["hit_rate_1m"] == store["lookup_hit_rate_1m"]
    assert (row["loaded_pages"], row["load_missed_pages"]) == (3, 0)
    assert row["pages"]["host"] == 3


def test_every_row_counts_what_the_daemon_saw(admin_daemon: AdminDaemon) -> None:
    ns = known_sequence(admin_daemon)
    with admin_daemon.client() as api:
        # a where-is query of the admin API is no client traffic: it must not move the rows
        assert api.post("/v1/lookup", json={"namespace_id": ns, "block_keys": ["00" * 16]}
                        ).status_code == 200
        check(api.get("/v1/stats").json(), ns)
    r = kvstore("stats", "--json", "--url", admin_daemon.url)
    assert r.returncode == 0, r.stderr
    check(json.loads(r.stdout), ns)


def test_stats_piped_at_80_columns_is_readable(admin_daemon: AdminDaemon) -> None:
    ns = known_sequence(admin_daemon)
    r = kvstore("stats", "--url", admin_daemon.url, columns=80)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert "…" not in r.stdout and max(map(len, lines)) <= 80, r.stdout
    assert ns in r.stdout and "host (host)" in r.stdout
    assert "3 blocks hit, 2 missed" in r.stdout and "loads: 3 pages served" in r.stdout
