"""The event log over the daemon (ReadEvents / EventSnapshot): one indexer follows two real
``kvstore serve`` processes and routes a prompt to the one that holds its longest prefix; when
a daemon restarts with a new log, the indexer resynchronizes (never reads the new log's
numbers as the old one's)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from connector.daemon import DaemonStore
from kvstore import KVLayout, Namespace
from kvstore.indexer import Indexer
from tests.server.daemon_proc import TINY_LAYOUT, DaemonProc, write_config

LAYOUT = KVLayout(**TINY_LAYOUT)  # type: ignore[arg-type]
NS = Namespace("routing", LAYOUT)
PROMPT = list(range(7, 7 + 8 * LAYOUT.block_size))  # 8 pages


def _save(client: DaemonStore, n: int) -> None:
    metas = NS.chain(PROMPT).metas()[:n]
    h = client.prepare_store(metas)
    for slot in h.slots:
        h.slab[slot] = np.full(LAYOUT.page_bytes, 3, np.uint8)
    assert client.complete_store(h).stored == n


def _eventually(check: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "the indexer never caught up"
        time.sleep(0.02)


def _follow(index: Indexer, node: str, client: DaemonStore, stop: threading.Event
            ) -> threading.Thread:
    t = threading.Thread(target=index.follow, args=(node, client),
                         kwargs={"stop": stop, "timeout_s": 0.2}, daemon=True)
    t.start()
    return t


def test_one_indexer_routes_a_prompt_to_the_daemon_with_its_longest_prefix(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    index, stop = Indexer(), threading.Event()
    with DaemonProc(write_config(tmp_path / "a", disk=None)) as a, \
            DaemonProc(write_config(tmp_path / "b", disk=None)) as b:
        ca = DaemonStore(a.target, namespace_id=NS.id)
        cb = DaemonStore(b.target, namespace_id=NS.id)
        threads = [_follow(index, "a", ca, stop), _follow(index, "b", cb, stop)]
        try:
            _save(ca, 3)
            _save(cb, 6)
            keys = NS.chain(PROMPT).keys
            _eventually(lambda: [(m.node, m.length) for m in index.longest_prefix(keys)]
                        == [("b", 6), ("a", 3)])
            assert set(index.longest_prefix(keys)[0].tiers) == {"host"}
            cb.delete(list(keys[2:6]))  # b keeps 2 pages now: a holds the longer prefix
            _eventually(lambda: index.longest_prefix(keys)[0].node == "a")
        finally:
            stop.set()
            for t in threads:
                t.join(5)
            ca.close()
            cb.close()


def test_a_restarted_daemon_s_new_log_is_a_gap_and_the_indexer_resynchronizes(
        tmp_path: Path) -> None:
    config = write_config(tmp_path, host="1MiB", disk="4MiB", write_policy="write_through")
    index, stop = Indexer(), threading.Event()
    daemon = DaemonProc(config).start()
    client = DaemonStore(daemon.target, namespace_id=NS.id)
    thread = _follow(index, "node", client, stop)
    try:
        _save(client, 4)
        keys = NS.chain(PROMPT).keys
        _eventually(lambda: index.tiers_of("node", keys[3]) == frozenset({"host", "disk"}))
        assert daemon.stop() == 0
        daemon = DaemonProc(config).start()  # warm: its disk tier still holds the 4 pages
        assert client.wait_connected(30)
        # the new daemon's host tier is empty: only the disk copies survive
        _eventually(lambda: all(index.tiers_of("node", k) == frozenset({"disk"})
                                for k in keys[:4]))
        _save(client, 6)  # the new log's events follow the resynchronized state
        _eventually(lambda: index.longest_prefix(keys)[0].length == 6)
    finally:
        stop.set()
        thread.join(5)
        client.close()
        daemon.stop()


def test_a_watch_stream_reads_the_same_log_one_namespace_only(tmp_path: Path) -> None:
    other = Namespace("routing", LAYOUT, "someone else")
    with DaemonProc(write_config(tmp_path, disk=None)) as d:
        client = DaemonStore(d.target, namespace_id=NS.id)
        seen: list[tuple[str, str, tuple[bytes, ...]]] = []
        watching = threading.Event()

        def watch() -> None:
            stream = client.watch()
            watching.set()
            for ev in stream:
                seen.append(ev)
                if ev[0] == "removed":
                    return

        t = threading.Thread(target=watch, daemon=True)
        t.start()
        assert watching.wait(10)
        probes = iter(range(1000))

        def probe() -> bool:  # a watch starts when the daemon has taken the call: wait for it
            i = next(probes)
            h = client.prepare_store(NS.chain(list(range(5000 + 16 * i, 5016 + 16 * i))).metas())
            client.complete_store(h)
            return bool(seen)

        _eventually(probe)
        seen.clear()
        keys = NS.chain(PROMPT).keys
        _save(client, 2)
        with DaemonStore(d.target, namespace_id=other.id) as stranger:
            h = stranger.prepare_store(other.chain(PROMPT).metas()[:2])
            stranger.complete_store(h)
        client.delete([keys[0]])
        t.join(20)
        assert not t.is_alive()
        assert ("stored", "host", (keys[0], keys[1])) in seen
        assert seen[-1] == ("removed", "host", (keys[0],))
        theirs = set(other.chain(PROMPT).keys)
        assert not any(set(k) & theirs for _, _, k in seen)  # never another namespace's keys
        client.close()
