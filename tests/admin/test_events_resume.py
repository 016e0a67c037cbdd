"""The admin API's event stream reads the store's event log: each event's id resumes the
stream where it stopped (``Last-Event-ID``), and a client that was away past the log's window
gets a ``gap``, the store's contents and a ``snapshot_end`` -- never silent loss."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import httpx

from connector.daemon import DaemonStore
from tests.admin.conftest import AdminDaemon, namespace, pages

NS = namespace("resume")


def _save(d: AdminDaemon, first: int, n: int) -> list[bytes]:
    chain = NS.chain(list(range(16 * first, 16 * (first + n))))
    with DaemonStore(d.target, NS.id) as s:
        assert s.write_pages(chain.metas(), pages(n, first)).stored == n
    return list(chain.keys)


def _events(api: httpx.Client, until: str, last_id: str | None = None,
            act: object = None) -> list[tuple[str | None, str, dict]]:
    """(id, event, data) of the stream until an event named ``until``; ``act()`` runs once
    the stream is open."""
    got: list[tuple[str | None, str, dict]] = []
    opened = threading.Event()
    headers = {"Last-Event-ID": last_id} if last_id else {}

    def listen() -> None:
        with api.stream("GET", "/v1/events", params={"namespace_id": NS.id.hex()},
                        headers=headers) as r:
            assert r.status_code == 200
            ev_id, kind = None, ""
            for line in r.iter_lines():
                opened.set()
                if line.startswith("id: "):
                    ev_id = line[4:]
                elif line.startswith("event: "):
                    kind = line[7:]
                elif line.startswith("data: "):
                    got.append((ev_id, kind, json.loads(line[6:])))
                    ev_id = None
                    if kind == until:
                        return

    t = threading.Thread(target=listen)
    t.start()
    assert opened.wait(30)
    if callable(act):
        act()
    t.join(60)
    assert not t.is_alive()
    return got


def test_the_stream_resumes_from_its_last_id_or_resynchronizes_after_a_gap(
        tmp_path: Path) -> None:
    d = AdminDaemon(tmp_path, disk="4MiB")
    d.env["KVSTORE_STORE__EVENT_LOG_EVENTS"] = "4"  # a small window: easy to fall behind
    with d, d.client() as api:
        saved: list[bytes] = []
        first = _events(api, "stored", act=lambda: saved.extend(_save(d, 0, 1)))
        (last_id, kind, data) = first[-1]
        assert kind == "stored" and last_id and data["keys"] == [saved[0].hex()]
        # back right away: the next event is the one after the last seen
        after = _events(api, "stored", last_id=last_id, act=lambda: _save(d, 1, 1))
        assert after[0][1] == "stored" and after[0][2]["seq"] in (data["seq"] + 1,
                                                                   data["seq"] + 2)
        # away while more events than the log keeps happen: a gap, then the contents
        resume_id = after[-1][0]
        keys = _save(d, 2, 1) + _save(d, 3, 1) + _save(d, 4, 1)
        back = _events(api, "snapshot_end", last_id=resume_id)
        assert back[0][1] == "gap"
        snap = {(e["tier"], k) for _, kind, e in back if kind == "stored" for k in e["keys"]}
        assert {("host", k.hex()) for k in keys} <= snap and {("disk", k.hex()) for k in keys} <= snap
        assert back[-1][0] is not None  # snapshot_end carries the id to resume from
