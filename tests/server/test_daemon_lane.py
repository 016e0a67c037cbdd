"""The local lane (``<socket>.lane``): a same-node client's hot calls take it; the socket is
0600; bad frames and bad requests get typed errors and the connection goes on; a hello without
a live session, or past the connection limit, is refused and the client uses gRPC; a
connection ends with its session; a daemon without the lane serves everything over gRPC."""

from __future__ import annotations

import socket
import stat
import time
from pathlib import Path

import grpc
import numpy as np
import pytest

from connector.daemon import DaemonStore
from connector.daemon.lane import FULL_BACKOFF_S, HELLO, METHOD_NUMBER, OK, recv_frame, send_frame
from connector.proto import kvstore_daemon_pb2 as pb
from kvstore import KVLayout, Namespace
from kvstore.keys import pack_keys
from tests.server.daemon_proc import TINY_LAYOUT, DaemonProc, write_config

LAYOUT = KVLayout(**TINY_LAYOUT)
NS = Namespace("model", LAYOUT, "lane")
OTHER = Namespace("model", LAYOUT, "other-tenant")
INVALID = grpc.StatusCode.INVALID_ARGUMENT.value[0]
NOT_FOUND = grpc.StatusCode.NOT_FOUND.value[0]
TOO_LARGE = grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]


def _lane(daemon: DaemonProc) -> Path:
    return daemon.socket.with_name(daemon.socket.name + ".lane")


def _connect(daemon: DaemonProc, session_id: str) -> tuple[socket.socket, tuple[int, bytes]]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.connect(str(_lane(daemon)))
    send_frame(sock, HELLO, session_id.encode())
    frame = recv_frame(sock, 1 << 20)
    assert frame is not None
    return sock, (frame[0], bytes(frame[1]))


def _ask(sock: socket.socket, kind: int, payload: bytes) -> tuple[int, bytes]:
    send_frame(sock, kind, payload)
    frame = recv_frame(sock, 1 << 20)
    assert frame is not None, "the daemon closed the lane"
    return frame[0], bytes(frame[1])


def _round_trip(store: DaemonStore, ns: Namespace, salt: int) -> None:
    """Save 3 pages through the slab, look them up, load them back: the bytes agree."""
    chain = ns.chain([(i + salt) % 250 for i in range(48)])
    pages = np.random.default_rng(salt).integers(0, 255, (3, LAYOUT.page_bytes), np.uint8)
    h = store.prepare_store(chain.metas())
    row = {m.key: i for i, m in enumerate(chain.metas())}
    for slot, m in zip(h.slots, h.metas):
        h.slab[slot] = pages[row[m.key]]
    assert store.complete_store(h).stored == 3
    found = store.lookup(list(chain.keys), lease=True, namespace_id=ns.id)
    assert found.num_blocks == 3 and found.lease is not None
    lh = store.prepare_load(ns.id, list(chain.keys), lease=found.lease)
    out = np.stack([lh.slab[s] for s in lh.slots])
    assert store.complete_load(lh) == 3
    assert np.array_equal(out, pages)


def test_a_local_client_makes_its_hot_calls_on_the_lane(daemon: DaemonProc) -> None:
    lane = _lane(daemon)
    assert stat.S_IMODE(lane.stat().st_mode) == 0o600
    with DaemonStore(daemon.target, NS.id) as store:
        _round_trip(store, NS, 0)
        # lookup, prepare/complete store, prepare/complete load: all five on the lane
        assert store.calls["lane"] == 5 and store.calls["grpc"] == 0
        st = store.stats(check_integrity=True)  # Stats is not a lane call
        assert store.calls["grpc"] == 1
        assert st.integrity_error == "" and st.active_leases == 0 and st.open_load_handles == 0


def test_bad_frames_get_typed_errors_and_the_lane_goes_on(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, extra_daemon="max_message_bytes = 65536")
    with DaemonProc(cfg) as daemon, DaemonStore(daemon.target, NS.id) as store, \
            DaemonStore(daemon.target, OTHER.id) as other:
        _round_trip(store, NS, 1)
        sock, (code, _) = _connect(daemon, store._session.session_id)
        try:
            assert code == OK
            code, msg = _ask(sock, 200, b"")
            assert (code, msg) == (INVALID, b"no lane call number 200")
            code, msg = _ask(sock, METHOD_NUMBER["Lookup"], b"\xff\xff\xff")
            assert code == INVALID and b"malformed Lookup" in msg
            code, msg = _ask(sock, METHOD_NUMBER["Lookup"], b"\0" * 70_000)  # over the limit
            assert code == TOO_LARGE and b"70000 bytes; the limit is 65536" in msg
            keys = NS.chain([(i + 1) % 250 for i in range(48)]).keys
            bad_keys = pb.LookupRequest(namespace_id=NS.id, keys=pack_keys(list(keys))[:-1])
            code, msg = _ask(sock, METHOD_NUMBER["Lookup"], bad_keys.SerializeToString())
            assert code == INVALID and b"16" in msg
            # another session's lease: this connection serves its own session only
            lease = other.lookup(list(keys), lease=True, namespace_id=NS.id).lease
            assert lease is not None
            req = pb.LeaseRequest(session_id=other._session.session_id, namespace_id=NS.id,
                                  lease_id=lease.id)
            code, msg = _ask(sock, METHOD_NUMBER["Release"], req.SerializeToString())
            assert code == NOT_FOUND and b"not this session's" in msg
            other.release(lease)
            # after all that, the same connection answers a good lookup
            good = pb.LookupRequest(namespace_id=NS.id, keys=pack_keys(list(keys)))
            code, payload = _ask(sock, METHOD_NUMBER["Lookup"], good.SerializeToString())
            assert code == OK and pb.LookupReply.FromString(payload).num_blocks == 3
            # a frame cut short: the daemon drops that connection and serves the others
            sock.sendall(b"\x10\x00\x00\x00\x01abc")
        finally:
            sock.close()
        _round_trip(store, NS, 2)
        st = store.stats(check_integrity=True)
        assert st.integrity_error == "" and st.active_leases == 0


def test_a_hello_without_a_live_session_is_refused(daemon: DaemonProc) -> None:
    sock, (code, msg) = _connect(daemon, "0" * 32)
    assert code == NOT_FOUND and b"no open session" in msg
    assert recv_frame(sock, 1 << 20) is None  # and the connection is closed
    sock.close()
    with DaemonStore(daemon.target, NS.id) as store:
        sock, (code, _) = _connect(daemon, store._session.session_id)
        assert code == OK
        session = store._session.session_id
    # the session ended with its client: so does the lane connection bound to it
    try:
        lookup = pb.LookupRequest(namespace_id=NS.id, keys=b"\1" * 16)
        code, msg = _ask(sock, METHOD_NUMBER["Lookup"], lookup.SerializeToString())
        assert code == NOT_FOUND and session[:8].encode() in msg
        assert recv_frame(sock, 1 << 20) is None
    finally:
        sock.close()


def test_past_the_connection_limit_the_client_uses_grpc(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, extra_daemon="lane_connections = 1")
    with DaemonProc(cfg) as daemon, DaemonStore(daemon.target, OTHER.id) as b:
        with DaemonStore(daemon.target, NS.id) as a:
            _round_trip(a, NS, 3)  # a holds the one lane connection
            _round_trip(b, OTHER, 4)  # b is refused it: gRPC, the same answers
            assert a.calls["lane"] == 5 and a.calls["grpc"] == 0
            assert b.calls["lane"] == 0 and b.calls["grpc"] == 5
        # a full lane is a passing state, not a verdict: once a's connection is gone and the
        # back-off has passed, b's calls take the lane
        time.sleep(FULL_BACKOFF_S + 0.2)
        assert b._session.lane is not None
        b.lookup(OTHER.chain(list(range(32))).keys)
        assert b.calls["lane"] == 1


@pytest.mark.parametrize("lane", [False, True], ids=["daemon-without-lane", "client-without-lane"])
def test_without_the_lane_everything_goes_over_grpc(tmp_path: Path, lane: bool) -> None:
    cfg = write_config(tmp_path, extra_daemon="" if lane else "lane = false")
    with DaemonProc(cfg) as daemon, DaemonStore(daemon.target, NS.id, lane=not lane) as store:
        assert _lane(daemon).exists()  # it hands out the shared memory either way
        _round_trip(store, NS, 5)
        assert store.calls["lane"] == 0 and store.calls["grpc"] == 5


def test_a_connection_that_never_says_hello_is_closed(tmp_path: Path) -> None:
    # in this process, to give the hello a short deadline; a real socket all the same
    import threading

    from kvstore import TieredStore
    from kvstore.tiers.host import HostTier
    from server.daemon.lane import LaneServer
    from server.daemon.service import DaemonService
    from server.daemon.servicer import Servicer

    from connector.daemon.shm import SharedSlab

    slab = SharedSlab.create("test-slab", 8 * LAYOUT.page_bytes)
    store = TieredStore(LAYOUT, [HostTier.build("host", LAYOUT, 8, slab=slab.array)])
    service = DaemonService(store, slab)
    lane = LaneServer(tmp_path / "x.lane", Servicer(service, threading.Event()),
                      max_frame=1 << 20, max_connections=4, hello_timeout_s=0.2)
    try:
        silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        silent.settimeout(10)
        silent.connect(str(tmp_path / "x.lane"))
        assert recv_frame(silent, 1 << 20) is None  # closed without a word
        silent.close()
        session, _ = service.open_session()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(10)
        sock.connect(str(tmp_path / "x.lane"))
        send_frame(sock, HELLO, session.id.encode())
        assert recv_frame(sock, 1 << 20) == (OK, bytearray())
        lookup = pb.LookupRequest(namespace_id=NS.id, keys=b"\1" * 16)
        code, payload = _ask(sock, METHOD_NUMBER["Lookup"], lookup.SerializeToString())
        assert code == OK and pb.LookupReply.FromString(payload).num_blocks == 0
        sock.close()
    finally:
        lane.close()
        store.close()
        slab.close()
    assert not (tmp_path / "x.lane").exists()
