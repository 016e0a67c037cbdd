"""The daemon's fault paths found by the independent campaign (issue 33), each against a real
``kvstore serve``: a handle that reserved nothing, a stopped daemon, watchers, signals, a
stream too big, a slow hello."""

from __future__ import annotations

import signal
import socket
import subprocess
import time
from pathlib import Path

import grpc
import numpy as np
import pytest

from connector.daemon import DaemonStore
from connector.daemon.errors import DaemonUnavailable
from connector.proto import kvstore_daemon_pb2 as pb
from connector.proto import kvstore_daemon_pb2_grpc as pb_grpc
from kvstore import KVLayout, Namespace
from kvstore.errors import InvalidArgument, LeaseError
from kvstore.record import RecordMac, wire_fields
from tests.server.daemon_proc import TINY_LAYOUT, DaemonProc, write_config

LAYOUT = KVLayout(**TINY_LAYOUT)
NS = Namespace("faults", LAYOUT, "a")


def _tokens(n_blocks: int, seed: int = 1) -> list[int]:
    return [(seed * 7919 + i * 31) % 30000 + 1 for i in range(n_blocks * LAYOUT.block_size)]


def test_a_store_handle_that_reserved_nothing_completes_and_aborts_without_a_default_namespace(
        tmp_path: Path) -> None:
    """Two saves of one prefix race: the second reserves nothing (the first is writing every
    block). A client with no default namespace (the vLLM plug-in's) must still complete and
    abort such a handle, or the daemon keeps it until the session's handle limit refuses
    every save and every leased lookup."""
    cfg = write_config(tmp_path, extra_daemon="max_handles_per_session = 8")
    metas = NS.chain(_tokens(3)).metas()
    with DaemonProc(cfg) as d, DaemonStore(d.target) as first, DaemonStore(d.target) as second:
        writing = first.prepare_store(metas)
        assert writing.num_blocks == 3
        for i in range(20):  # well past the limit of 8 handles
            empty = second.prepare_store(metas)
            assert empty.id and empty.num_blocks == 0 and empty.existing == 3
            if i % 2:
                assert second.complete_store(empty).stored == 0
            else:
                second.abort(empty)
        stats = second.stats()
        assert stats.open_store_handles == 1  # the first client's, nothing of the second's
        found = second.lookup(NS.chain(_tokens(3)).keys, lease=True, namespace_id=NS.id)
        if found.lease is not None:
            second.release(found.lease)
        first.abort(writing)
        assert first.stats().open_store_handles == 0


def test_a_leased_lookup_past_the_handle_limit_is_a_counted_miss(tmp_path: Path) -> None:
    """At the session's handle limit a leased lookup is refused by the daemon; the client
    answers a miss (the connector recomputes) and counts it, instead of raising into the
    scheduler."""
    cfg = write_config(tmp_path, extra_daemon="max_handles_per_session = 2")
    chain = NS.chain(_tokens(2, seed=5))
    with DaemonProc(cfg) as d, DaemonStore(d.target, NS.id) as c:
        h = c.prepare_store(chain.metas())
        for slot in h.slots:
            h.slab[slot] = 1
        c.complete_store(h)
        leases = [c.lookup(chain.keys, lease=True).lease for _ in range(2)]
        assert all(lease is not None for lease in leases)
        third = c.lookup(chain.keys, lease=True)  # the limit: a miss, counted
        assert third.num_blocks == 0 and third.lease is None
        assert c.failures["quota"] == 1
        assert c.lookup(chain.keys).num_blocks == 2  # an unleased lookup still answers
        for lease in leases:
            assert lease is not None
            c.release(lease)
        assert c.lookup(chain.keys, lease=True).num_blocks == 2


@pytest.mark.timeout(120)
def test_connect_while_the_daemon_is_stopped_fails_within_its_timeout(tmp_path: Path) -> None:
    """A process that already holds a connection shares gRPC's subchannel, so the channel is
    READY while the daemon is SIGSTOPped: the session's handshake must still have a
    deadline."""
    with DaemonProc(write_config(tmp_path)) as d, DaemonStore(d.target, NS.id) as held:
        assert held.connected
        d.pause()
        try:
            t0 = time.monotonic()
            with pytest.raises(DaemonUnavailable):
                DaemonStore(d.target, NS.id, connect_timeout_s=1.0, lane=False)
            assert time.monotonic() - t0 < 10.0  # a hang would run to the test's timeout
        finally:
            d.resume()
        with DaemonStore(d.target, NS.id, connect_timeout_s=5.0) as again:
            assert again.connected


@pytest.mark.timeout(120)
def test_event_watchers_are_bounded_and_never_starve_other_calls(tmp_path: Path) -> None:
    """Each WatchEvents stream holds a handler thread: past ``max_watchers`` they are refused
    with RESOURCE_EXHAUSTED, and the threads they hold never leave Stats or a new session
    waiting (before the limit, 14 watchers on a small pool blocked both)."""
    cfg = write_config(tmp_path, extra_daemon="workers = 4\nmax_sessions = 2\nmax_watchers = 4")
    with DaemonProc(cfg) as d, grpc.insecure_channel(d.target) as ch:
        stub = pb_grpc.KVStoreDaemonStub(ch)
        calls = [stub.WatchEvents(pb.WatchRequest(namespace_id=NS.id), timeout=60)
                 for _ in range(14)]
        try:
            # which 4 are admitted depends on the order the streams reach the daemon
            deadline = time.monotonic() + 30
            while sum(c.done() for c in calls) < 10 and time.monotonic() < deadline:
                time.sleep(0.05)
            done = [c for c in calls if c.done()]
            assert len(done) == 10
            for call in done:
                assert call.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert "max_watchers" in call.details()
            # 4 watchers hold their threads: other calls and a new session still get theirs
            with DaemonStore(d.target, NS.id, connect_timeout_s=5, timeout_s=5) as c:
                assert c.stats().sessions == 1
            assert sum(c.done() for c in calls) == 10
        finally:
            for call in calls:
                call.cancel()
        # the cancelled watchers' handlers notice within their poll and give their places back
        with grpc.insecure_channel(d.target) as ch2:
            stub2 = pb_grpc.KVStoreDaemonStub(ch2)
            deadline = time.monotonic() + 20
            while True:
                again = stub2.WatchEvents(pb.WatchRequest(namespace_id=NS.id), timeout=1.5)
                with pytest.raises(grpc.RpcError) as err:
                    next(again)
                if err.value.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                    break
                assert time.monotonic() < deadline, "the watchers' places were never freed"
                time.sleep(0.2)
            assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED  # admitted, no events


@pytest.mark.timeout(300)
def test_sigterm_right_after_sigcont_stops_the_daemon_every_time(tmp_path: Path) -> None:
    """A signal the kernel hands to one of gRPC's threads (it does right after SIGCONT, while
    the main thread is still stopped) must still end ``serve()`` within the drain timeout."""
    cfg = write_config(tmp_path, extra_daemon="drain_timeout_s = 2", disk=None)
    for _ in range(6):
        d = DaemonProc(cfg).start()
        with DaemonStore(d.target, NS.id) as c:
            assert c.connected
            for _ in range(3):
                d.pause()
                d.resume()
            assert d.proc is not None
            d.proc.send_signal(signal.SIGTERM)
            try:
                assert d.proc.wait(2 + 10) == 0
            except subprocess.TimeoutExpired:
                d.proc.kill()
                d.proc.wait()
                raise AssertionError("SIGTERM after SIGCONT was ignored") from None


def _vm_hwm_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


def test_a_write_pages_stream_past_the_page_limit_is_refused_without_buffering_it(
        tmp_path: Path) -> None:
    """WritePages used to hold the whole stream before checking its size: 80 MiB of pages
    raised the daemon's memory by 155 MiB before it refused them."""
    cfg = write_config(tmp_path, extra_daemon="max_keys_per_call = 64", host="4MiB")
    n = 10_240  # 80 MiB of 8 KiB pages
    mac = RecordMac(None)
    chain = NS.chain(_tokens(70, seed=9))
    page = np.full(LAYOUT.page_bytes, 7, np.uint8)
    with DaemonProc(cfg) as d, DaemonStore(d.target, NS.id) as c:
        assert d.proc is not None
        c.write_pages(chain.metas(0, 2), np.stack([page, page]))  # warm the path
        peak = _vm_hwm_kib(d.proc.pid)

        def messages():  # noqa: ANN202
            for i in range(n):
                m = chain.meta(i % len(chain))
                yield pb.WritePage(
                    namespace_id=NS.id if i == 0 else b"",
                    block=pb.Block(key=m.key, parent=m.parent, token_ids=m.token_ids),
                    data=page.tobytes(),
                    seal=mac.seal(wire_fields(b"W", NS.id, m.key, m.parent, m.token_ids), page))

        with grpc.insecure_channel(d.target) as ch, pytest.raises(grpc.RpcError) as err:
            pb_grpc.KVStoreDaemonStub(ch).WritePages(messages(), timeout=60)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "more than 64 pages" in err.value.details()
        grown_mib = (_vm_hwm_kib(d.proc.pid) - peak) / 1024
        assert grown_mib < 40, f"the daemon's peak memory grew {grown_mib:.0f} MiB"
        # the daemon goes on: a stream within the limit stores
        r = c.write_pages(chain.metas(0, 4), np.stack([page] * 4))
        assert r.stored + r.existing == 4 and r.refused == 0


def test_a_slow_hello_is_closed_at_its_deadline_however_it_trickles(tmp_path: Path) -> None:
    """``hello_timeout_s`` (5 s) bounds the whole hello: a client sending a byte a second
    used to hold a lane slot for as long as it kept sending."""
    cfg = write_config(tmp_path, extra_daemon="lane_connections = 1")
    with DaemonProc(cfg) as d:
        lane_path = str(d.socket) + ".lane"
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(lane_path)
        t0 = time.monotonic()
        hello = b"\x20\x00\x00\x00\x00" + b"0" * 32
        closed_at = None
        try:
            for byte in hello:
                time.sleep(0.9)
                try:
                    sock.sendall(bytes([byte]))
                except (BrokenPipeError, ConnectionResetError):
                    closed_at = time.monotonic() - t0
                    break
                sock.settimeout(0.01)
                try:
                    if sock.recv(64) == b"":
                        closed_at = time.monotonic() - t0
                        break
                except TimeoutError:
                    pass
        finally:
            sock.close()
        assert closed_at is not None and closed_at < 9, closed_at
        # the slot is free again: a client gets its lane
        with DaemonStore(d.target, NS.id) as c:
            chain = NS.chain(_tokens(1, seed=3))
            c.lookup(chain.keys)
            assert c.calls["lane"] >= 1


def test_an_error_quoting_a_huge_name_fits_in_a_status(tmp_path: Path) -> None:
    """A 10 KB tier name is echoed in the error; the reply must still be a clean
    INVALID_ARGUMENT (not an error from gRPC's metadata limit) with a bounded message."""
    with DaemonProc(write_config(tmp_path)) as d, grpc.insecure_channel(d.target) as ch:
        stub = pb_grpc.KVStoreDaemonStub(ch)
        req = pb.ContainsRequest(tier="x" * 10_000, keys=[b"k" * 16])
        with pytest.raises(grpc.RpcError) as err:
            stub.Contains(req, timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert len(err.value.details()) <= 1024


def test_garbage_requests_are_invalid_argument_and_logged_once_per_client(tmp_path: Path) -> None:
    """Bytes that do not parse as the method's request: INVALID_ARGUMENT every time, one log
    line per client (not a traceback per call), and the daemon serves on."""
    with DaemonProc(write_config(tmp_path)) as d, grpc.insecure_channel(d.target) as ch:
        for method in ("Lookup", "Stats", "Contains", "WatchEvents", "ReadPages"):
            path = f"/kvstore.daemon.v1.KVStoreDaemon/{method}"
            call = (ch.unary_stream if method in ("WatchEvents", "ReadPages") else ch.unary_unary)(path)
            for _ in range(10):
                with pytest.raises(grpc.RpcError) as err:
                    reply = call(b"\xff\xff\xff\xff", timeout=10)
                    if method in ("WatchEvents", "ReadPages"):
                        next(iter(reply))
                assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, method
                assert "malformed" in err.value.details()
        with DaemonStore(d.target, NS.id) as c:
            assert c.stats().sessions == 1
        log = d.log()
        assert "Traceback" not in log
        assert log.count("does not parse") == 1, log


def test_a_lease_is_taken_over_by_another_process_with_its_ticket(tmp_path: Path) -> None:
    """vLLM's default layout: the scheduler (one process) looks up and leases, a worker
    (another process, its own session) loads. The lease travels pickled in vLLM's metadata;
    its ticket lets the worker's session take it over. A wrong ticket, or another namespace,
    changes nothing."""
    import pickle

    other = Namespace("faults", LAYOUT, "b")
    chain = NS.chain(_tokens(3, seed=11))
    with DaemonProc(write_config(tmp_path)) as d, DaemonStore(d.target) as sched, \
            DaemonStore(d.target) as worker:
        h = sched.prepare_store(chain.metas())
        for i, slot in enumerate(h.slots):
            h.slab[slot] = i + 1
        assert sched.complete_store(h).stored == 3
        found = sched.lookup(chain.keys, lease=True, namespace_id=NS.id)
        assert found.lease is not None and len(found.lease.ticket) == 16
        sent = pickle.loads(pickle.dumps(found.lease))
        # a forged ticket, or the right one under another namespace: refused, nothing changes
        forged = type(sent)(sent.id, sent.keys, sent.expires_at, sent.owner, b"\0" * 16)
        with pytest.raises(LeaseError):
            worker.prepare_load(NS.id, chain.keys, lease=forged)
        with pytest.raises(InvalidArgument):
            worker.prepare_load(other.id, chain.keys, lease=sent)
        assert worker.stats().active_leases == 1
        # the worker loads under the scheduler's lease
        lh = worker.prepare_load(NS.id, chain.keys, lease=sent)
        assert lh.num_blocks == 3
        assert [int(worker.staging_tier().slab[s][0]) for s in lh.slots] == [1, 2, 3]
        assert worker.complete_load(lh) == 3
        st = worker.stats()
        assert (st.active_leases, st.open_load_handles) == (0, 0)
        # used up: neither process can use it again
        with pytest.raises(LeaseError):
            worker.prepare_load(NS.id, chain.keys, lease=sent)
        with pytest.raises(LeaseError):
            sched.release(found.lease)
        # a lease handed over and released by the worker instead (the load was not needed)
        again = sched.lookup(chain.keys, lease=True, namespace_id=NS.id).lease
        assert again is not None
        worker.release(pickle.loads(pickle.dumps(again)), namespace_id=NS.id)
        assert worker.stats().active_leases == 0
