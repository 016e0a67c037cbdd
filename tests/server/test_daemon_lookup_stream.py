"""The client's lookups travel as messages of one open call (``LookupStream``) or, on one node,
over the local lane: on either path answers agree with the unary call's from any number of
threads, a daemon that stops answering costs a counted miss (the call's deadline), and a daemon
with open lookup streams or lane connections still stops cleanly."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from connector.daemon import DaemonStore
from connector.proto import kvstore_daemon_pb2 as pb
from kvstore import KVLayout, Namespace
from tests.server.daemon_proc import TINY_LAYOUT, DaemonProc, write_config

LAYOUT = KVLayout(**TINY_LAYOUT)
NS = Namespace("model", LAYOUT, "stream")
PATHS = pytest.mark.parametrize("lane", [False, True], ids=["stream", "lane"])


def _saved(store: DaemonStore, num_blocks: int, salt: int = 0) -> list[bytes]:
    chain = NS.chain([(i + salt) % 250 for i in range(num_blocks * 16)])
    store.complete_store(store.prepare_store(chain.metas()))
    return list(chain.keys)


@PATHS
def test_lookups_from_many_threads_agree_with_the_unary_call(daemon: DaemonProc,
                                                             lane: bool) -> None:
    with DaemonStore(daemon.target, NS.id, lane=lane) as store:
        prompts = [_saved(store, n, salt) for salt, n in enumerate((3, 5, 8))]
        unary = [store._session.call("Lookup", pb.LookupRequest(namespace_id=NS.id, keys=b"".join(k)))
                 for k in prompts]
        assert [r.num_blocks for r in unary] == [3, 5, 8]
        wrong: list[str] = []

        def worker(i: int) -> None:
            for j in range(40):
                keys = prompts[(i + j) % 3]
                found = store.lookup(keys + [b"\xff" * 16], lease=bool(j % 2))
                if found.num_blocks != len(keys) or set(found.tiers) != {"host"}:
                    wrong.append(f"thread {i}: {found.num_blocks} of {len(keys)}")
                if found.lease is not None:
                    store.release(found.lease)

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert wrong == []
        st = store.stats(check_integrity=True)
        assert st.integrity_error == "" and st.active_leases == 0
        assert store.failures["lookup"] == 0
        assert (store.calls["lane"] > 100) if lane else (store.calls["lane"] == 0)


@PATHS
def test_a_daemon_that_stops_answering_costs_a_counted_miss(daemon: DaemonProc,
                                                            lane: bool) -> None:
    with DaemonStore(daemon.target, NS.id, timeout_s=0.5, reconnect_interval_s=0.1,
                     lane=lane) as store:
        keys = _saved(store, 4)
        assert store.lookup(keys).num_blocks == 4  # the stream is open
        daemon.pause()
        try:
            found = store.lookup(keys, lease=True)  # cancelled at the deadline
        finally:
            daemon.resume()
        assert found.num_blocks == 0 and found.lease is None
        assert store.failures["lookup"] == 1
        assert store.wait_connected(60)
        assert store.lookup(keys).num_blocks == 4  # a new stream on the new session


@PATHS
def test_open_lookup_streams_do_not_hold_up_a_stop(tmp_path: Path, lane: bool) -> None:
    # a drain that waited on the clients' lookup streams would take drain_timeout_s (here far
    # longer than the stop is given): the daemon ends them itself
    cfg = write_config(tmp_path, extra_daemon="drain_timeout_s = 600")
    with DaemonProc(cfg) as d:
        with DaemonStore(d.target, NS.id, lane=lane) as a, \
                DaemonStore(d.target, NS.id, lane=lane) as b:
            keys = _saved(a, 2)
            assert a.lookup(keys).num_blocks == 2 and b.lookup(keys).num_blocks == 2
            assert d.stop(timeout_s=60) == 0
            assert a.lookup(keys).num_blocks == 0 and a.failures["lookup"] == 1
