"""Open sessions and lookup streams each hold one of the daemon's handler threads for as long as
they last: with every session the daemon allows open (more than its ``workers``), each with its
lookup stream, other calls are still answered; a lookup stream past the limit is refused and the
client looks up with unary calls instead. (These clients keep off the local lane, which holds
no gRPC thread: :mod:`tests.server.test_daemon_lane`.)"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from connector.daemon import DaemonStore
from kvstore import KVLayout, Namespace
from tests.server.daemon_proc import TINY_LAYOUT, DaemonProc, write_config

LAYOUT = KVLayout(**TINY_LAYOUT)
NS = Namespace("model", LAYOUT, "threads")


@pytest.mark.timeout(90)  # before the fix, the fifth session waited forever for a thread
def test_sessions_beyond_the_workers_leave_threads_for_calls(tmp_path: Path) -> None:
    config = write_config(tmp_path, disk=None, extra_daemon="workers = 4\nmax_sessions = 6")
    with DaemonProc(config) as daemon:
        chain = NS.chain([i % 200 for i in range(64)])
        clients = [DaemonStore(daemon.target, NS.id, timeout_s=5.0, lane=False) for _ in range(6)]
        try:
            clients[0].complete_store(clients[0].prepare_store(chain.metas()))
            for c in clients:  # six sessions and six lookup streams: twelve threads held
                assert c.lookup(list(chain.keys)).num_blocks == 4
            for c in clients:  # and short calls still get a thread
                assert c.stats().sessions == 6
                found = c.lookup(list(chain.keys), lease=True)
                assert found.num_blocks == 4 and found.lease is not None
                c.release(found.lease)
            assert all(c.failures["lookup"] == 0 for c in clients)
        finally:
            for c in clients:
                c.close()


def test_a_lookup_stream_past_the_limit_falls_back_to_unary(tmp_path: Path) -> None:
    config = write_config(tmp_path, disk=None, extra_daemon="max_sessions = 2")
    with DaemonProc(config) as daemon:
        chain = NS.chain([i % 200 for i in range(32)])
        a = DaemonStore(daemon.target, NS.id, lane=False)
        b = DaemonStore(daemon.target, NS.id, lane=False)
        try:
            a.complete_store(a.prepare_store(chain.metas()))
            assert a.lookup(list(chain.keys)).num_blocks == 2  # stream 1
            assert b.lookup(list(chain.keys)).num_blocks == 2  # stream 2: the limit
            held, b._session.lookup_stream = b._session.lookup_stream, None
            assert held is not None
            assert b.lookup(list(chain.keys)).num_blocks == 2  # a third: refused, unary instead
            assert b._session.lookup_stream is None and b._session.stream_refused_until > time.monotonic()
            assert b.failures["lookup"] == 0
            held.close()
        finally:
            a.close()
            b.close()
