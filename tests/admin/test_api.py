"""The admin API on a live daemon: stats after real traffic, Prometheus text that
prometheus-client's own parser reads, readiness, a policy switch, bad input answered with a
4xx naming the problem (404 for a tier or a job that does not exist), server-sent events
of stored and removed pages, and namespaces named by their label (stats, lookups)."""

from __future__ import annotations

import json
import threading
import time

import httpx
from prometheus_client.parser import text_string_to_metric_families

from connector.daemon.client import DaemonStore
from connector.inprocess import InProcessScheduler
from kvstore import Namespace
from tests.admin.conftest import LAYOUT, AdminDaemon, namespace, pages

NS = namespace()


def load(d: AdminDaemon, n_blocks: int = 8, seed: int = 1) -> list[bytes]:
    chain = NS.chain(list(range(seed * 1000, seed * 1000 + n_blocks * 16)))
    with DaemonStore(d.target, NS.id) as s:
        assert s.write_pages(chain.metas(), pages(n_blocks, seed)).stored == n_blocks
        out = pages(n_blocks, 0)
        assert s.read_pages(list(chain.keys), out) == n_blocks
    return list(chain.keys)


def test_stats_metrics_and_readiness(admin_daemon: AdminDaemon, api: httpx.Client) -> None:
    load(admin_daemon)
    deadline = time.monotonic() + 10  # the namespace counts follow the event log on a thread
    while (st := api.get("/v1/stats").json())["namespaces"][0]["stored_pages"] < 16:
        assert time.monotonic() < deadline, st["namespaces"]
        time.sleep(0.05)
    host, disk = st["tiers"]
    assert (host["name"], host["used_pages"], host["policy"]) == ("host", 8, "lru")
    assert disk["used_pages"] == 8 and disk["bytes_in"] == 8 * host["page_bytes"]
    assert host["hits"] == 8 and host["hit_rate_1m"] == 1.0 and host["hit_rate_15m"] == 1.0
    assert host["latency"]["read"]["count"] >= 1 and host["latency"]["read"]["p50_s"] > 0
    assert set(host["misses"]) == {"absent", "corrupt", "timeout", "expired"}
    (row,) = st["namespaces"]
    assert row["namespace_id"] == NS.id.hex() and row["label"] == "test"
    assert row["pages"] == {"host": 8, "disk": 8} and row["stored_pages"] == 16

    r = api.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(r.text)}
    pages_read = {(s.labels["tier"], s.labels["result"]): s.value
                  for s in families["kvstore_tier_pages"].samples
                  if s.name.endswith("_total") and s.labels["op"] == "read"}
    assert pages_read[("host", "hit")] == 8
    assert {s.labels["tier"] for s in families["kvstore_tier_occupancy_pages"].samples} == {"host", "disk"}

    ready = api.get("/readyz")
    assert ready.status_code == 200 and ready.json()["ready"] is True


def test_policy_switch_and_bad_input(admin_daemon: AdminDaemon, api: httpx.Client) -> None:
    load(admin_daemon)
    r = api.post("/v1/tiers/host/policy", json={"policy": "s3fifo"})
    assert r.status_code == 200, r.text
    assert r.json() == {"tier": "host", "policy": "s3fifo", "tracked_pages": 8}
    assert api.get("/v1/stats").json()["tiers"][0]["policy"] == "s3fifo"
    r = api.post("/v1/tiers/nvme/policy", json={"policy": "lru"})
    assert r.status_code == 404, r.text  # a resource that does not exist, named, and the known
    assert r.json()["detail"] == "no tier named 'nvme'; the tiers are host, disk"
    assert "host, disk" in r.json()["hint"]
    r = api.post("/v1/tiers/host/policy", json={"policy": "os:system"})  # no import paths
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "policy"]
    r = api.post("/v1/lookup", json={"token_ids": [1] * 16, "block_keys": ["00" * 16]})
    assert r.status_code == 400 and "exactly one of token_ids and block_keys" in r.json()["detail"]
    r = api.post("/v1/lookup", json={"block_keys": ["xyz"]})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "block_keys", 0]
    r = api.delete("/v1/namespaces/not-hex")
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["path", "namespace_id"]
    r = api.get("/v1/flushes/99")
    assert r.status_code == 404 and "flush 99 is unknown" in r.json()["detail"]
    assert api.get("/v1/stats").json()["tiers"][0]["used_pages"] == 8  # nothing changed


def test_events_stream_stored_and_removed_pages(admin_daemon: AdminDaemon,
                                                api: httpx.Client) -> None:
    got: list[tuple[str, dict]] = []
    opened = threading.Event()

    def listen() -> None:
        with api.stream("GET", "/v1/events", params={"namespace_id": NS.id.hex()}) as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            kind = ""
            for line in r.iter_lines():
                opened.set()
                if line.startswith("event: "):
                    kind = line[len("event: "):]
                elif line.startswith("data: "):
                    got.append((kind, json.loads(line[len("data: "):])))
                    if kind == "removed" and len(got) >= 3:
                        return

    t = threading.Thread(target=listen)
    t.start()
    assert opened.wait(30)
    keys = load(admin_daemon, 4)
    with DaemonStore(admin_daemon.target, NS.id) as s:
        s.delete(keys)
    t.join(60)
    assert not t.is_alive()
    stored = [d for k, d in got if k == "stored"]
    assert {d["tier"] for d in stored} == {"host", "disk"}  # write-through: both tiers
    assert all(set(d["namespace_ids"]) == {NS.id.hex()} for d in stored)
    removed = [d for k, d in got if k == "removed"]
    assert removed and set(removed[0]["keys"]) == {k.hex() for k in keys}


def test_history_serves_the_window_asked_for_and_its_hit_rate_while_idle(
        admin_daemon: AdminDaemon, api: httpx.Client) -> None:
    keys = load(admin_daemon)
    with DaemonStore(admin_daemon.target, NS.id) as s:
        for _ in range(2):
            assert s.lookup(keys).num_blocks == 8
    time.sleep(1.5)  # idle for several sample intervals (0.25 s)
    h = api.get("/v1/stats/history", params={"window_s": 60}).json()
    assert h["window_s"] == 60 and h["interval_s"] == 0.25
    w = h["window"]
    assert w["end"] - w["start"] <= 60 + 0.25 and h["points"][-1]["at"] <= w["end"]
    assert all(p["at"] >= w["end"] - 60 - 0.25 for p in h["points"])
    last = h["points"][-1]  # idle: this interval looked nothing up ...
    assert last["lookup_hit_blocks"] == 0 and last["lookup_hit_rate"] is None
    # ... but the window did: its rate stays (two lookups of the 8 stored blocks, all found)
    assert (w["lookup_hit_blocks"], w["lookup_miss_blocks"], w["lookup_hit_rate"]) == (16, 0, 1.0)
    assert sum(p["lookup_hit_blocks"] for p in h["points"]) == 16
    assert w["tier_hit_rate"]["host"] == 1.0
    assert sum(p["tiers"]["host"]["hits"] for p in h["points"]) == 8  # the reads of load()

    short = api.get("/v1/stats/history", params={"window_s": 0.5}).json()  # after the traffic
    assert short["window"]["lookup_hit_blocks"] == 0 and short["window"]["lookup_hit_rate"] is None
    assert 1 <= len(short["points"]) <= 4
    assert api.get("/v1/stats/history").json()["window_s"] == 900  # the default: 15 minutes
    for bad in (0, -1, 3601, "an hour"):
        r = api.get("/v1/stats/history", params={"window_s": bad})
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", "window_s"]


def test_namespaces_carry_their_label_in_stats_and_lookups(admin_daemon: AdminDaemon,
                                                           api: httpx.Client) -> None:
    """An engine of another model than the daemon's default ("test"): its scheduler labels the
    namespace; the stats name it, /v1/lookup finds its pages by that label, and a label no
    namespace has is answered with the namespaces there are."""
    ns = Namespace("some/model", LAYOUT, "t1")
    tokens = list(range(500, 500 + 3 * 16))
    chain = ns.chain(tokens)
    with DaemonStore(admin_daemon.target) as client:
        InProcessScheduler(client.scoped(ns.id), ns, num_blocks=8)  # type: ignore[arg-type]
        assert client.write_pages(chain.metas(), pages(3, 7)).stored == 3
    deadline = time.monotonic() + 10
    while True:  # the label is told without waiting; the stats scan pages once per interval
        rows = {r["namespace_id"]: r for r in api.get("/v1/stats").json()["namespaces"]}
        row = rows.get(ns.id.hex())
        if (row and row["label"] and row["pages"]) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert row is not None and row["label"] == "some/model · tenant t1", rows
    assert row["pages"] == {"host": 3, "disk": 3}

    found = api.post("/v1/lookup", json={"token_ids": tokens,
                                         "namespace_label": "some/model · tenant t1"})
    assert found.status_code == 200, found.text
    body = found.json()
    assert (body["namespace_id"], body["num_leading"]) == (ns.id.hex(), 3)
    assert body["namespaces"] is None
    # the default namespace ("test") holds nothing: the answer lists the ones that do
    default = api.post("/v1/lookup", json={"token_ids": tokens}).json()
    assert default["num_leading"] == 0
    assert default["namespaces"] == [
        {"namespace_id": ns.id.hex(), "label": "some/model · tenant t1", "pages": 6}]

    unknown = api.post("/v1/lookup", json={"token_ids": tokens, "namespace_label": "other/model"})
    assert unknown.status_code == 404, unknown.text
    err = unknown.json()
    assert "no namespace is labelled 'other/model'" in err["detail"]
    assert err["namespaces"] == [
        {"namespace_id": ns.id.hex(), "label": "some/model · tenant t1", "pages": 6}]
    both = api.post("/v1/lookup", json={"token_ids": tokens, "namespace_id": ns.id.hex(),
                                        "namespace_label": "x"})
    assert both.status_code == 400 and "at most one of" in both.json()["detail"]
