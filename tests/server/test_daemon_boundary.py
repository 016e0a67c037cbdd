"""The daemon's gRPC boundary: socket permissions, the TCP bearer token, typed errors for bad,
oversized and out-of-namespace requests -- and the daemon keeps serving after each."""

from __future__ import annotations

import os
import socket
import stat
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from connector.daemon import DaemonStore
from connector.daemon.lane import map_segments
from connector.proto import kvstore_daemon_pb2 as pb
from connector.proto import kvstore_daemon_pb2_grpc as pb_grpc
from kvstore import InvalidArgument, KVLayout, LeaseError, Namespace
from tests.server.daemon_proc import TINY_LAYOUT, DaemonProc, write_config

TOKEN = "s3cret-token-for-tests"
LAYOUT = KVLayout(**TINY_LAYOUT)
NS_A, NS_B = Namespace("model", LAYOUT, "tenant-a"), Namespace("model", LAYOUT, "tenant-b")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DaemonProc, str]]:
    """A daemon with TCP (token from the environment), small limits and a namespace quota."""
    tmp = tmp_path_factory.mktemp("daemon")
    port = _free_port()
    cfg = write_config(tmp, extra_daemon=(
        f'tcp = "127.0.0.1:{port}"\nmax_message_bytes = 262144\nmax_keys_per_call = 64\n'
        'namespace_quota = "64KiB"'))
    with DaemonProc(cfg, env={"KVSTORE_DAEMON__TOKEN": TOKEN}) as d:
        yield d, f"127.0.0.1:{port}"
        assert d.stop() == 0
    assert TOKEN not in d.log()


@pytest.fixture
def stub(guarded: tuple[DaemonProc, str]) -> Iterator[pb_grpc.KVStoreDaemonStub]:
    with grpc.insecure_channel(guarded[0].target) as ch:
        yield pb_grpc.KVStoreDaemonStub(ch)


def _code(call, *args, **kw) -> tuple[grpc.StatusCode, str]:  # noqa: ANN001
    with pytest.raises(grpc.RpcError) as info:
        call(*args, timeout=10, **kw)
    return info.value.code(), info.value.details()


def _still_serving(d: DaemonProc) -> None:
    with DaemonStore(d.target, NS_A.id) as s:
        assert s.lookup(NS_A.chain(list(range(16))).keys).num_blocks >= 0
        assert s.stats(check_integrity=True).integrity_error == ""


# ----------------------------------------------------------------- (b) transport security


def test_unix_socket_is_owner_only(guarded: tuple[DaemonProc, str]) -> None:
    mode = stat.S_IMODE(Path(guarded[0].socket).stat().st_mode)
    assert mode == 0o600


def test_shared_memory_is_allocated_when_created() -> None:
    # all of the slab's memory is taken at creation: memory too short fails the start instead
    # of a client's first write past what is left (SIGBUS), and no save pays for the
    # allocation of the pages it writes
    from connector.daemon.shm import SharedSlab

    slab = SharedSlab.create("kvstore-test", 64 << 20)
    try:
        assert os.fstat(slab.fd).st_blocks * 512 >= 64 << 20
    finally:
        slab.close()


@pytest.mark.parametrize("token", [None, "wrong-token", TOKEN[:-1]])
def test_tcp_refuses_a_missing_or_wrong_token(guarded: tuple[DaemonProc, str], token) -> None:
    with grpc.insecure_channel(guarded[1]) as ch:
        stub = pb_grpc.KVStoreDaemonStub(ch)
        md = [("authorization", f"Bearer {token}")] if token else []
        code, msg = _code(stub.Stats, pb.StatsRequest(), metadata=md)
        assert code == grpc.StatusCode.UNAUTHENTICATED and "bearer token" in msg
        code, _ = _code(lambda *a, **k: next(stub.OpenSession(*a, **k)), pb.OpenSessionRequest(),
                        metadata=md)
        assert code == grpc.StatusCode.UNAUTHENTICATED
        lookups = stub.LookupStream(iter([pb.LookupRequest(namespace_id=NS_A.id)]), metadata=md,
                                    timeout=10)
        with pytest.raises(grpc.RpcError) as info:
            next(lookups)
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        # health checks stay open, like /healthz
        r = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert r.status == health_pb2.HealthCheckResponse.SERVING


def test_tcp_with_the_token_works(guarded: tuple[DaemonProc, str]) -> None:
    with DaemonStore(guarded[1], NS_A.id, token=TOKEN) as s:
        assert s.stats().sessions >= 1
        # a TCP session is not told where the local lane is, and makes every call over gRPC
        assert s._session.lane is None
        assert s.lookup([b"k" * 16]).num_blocks == 0 and s.calls["lane"] == 0
    md = (("authorization", f"Bearer {TOKEN}"),)
    with grpc.insecure_channel(guarded[1]) as tcp, grpc.insecure_channel(guarded[0].target) as uds:
        infos = [next(pb_grpc.KVStoreDaemonStub(ch).OpenSession(pb.OpenSessionRequest(),
                                                                 metadata=md))
                 for ch in (tcp, uds)]
        assert infos[0].lane_socket == "" and infos[1].lane_socket.endswith("kvstore.sock.lane")
        # nor where its shared memory is: a TCP client maps none
        assert infos[0].shm_socket == "" and infos[1].shm_socket == infos[1].lane_socket


def test_a_tcp_client_maps_no_shared_memory_and_an_engine_refuses_it(
        guarded: tuple[DaemonProc, str]) -> None:
    from connector.build import connect_daemon

    with DaemonStore(guarded[1], NS_A.id, token=TOKEN) as s:
        assert not s.shared_memory
        chain = NS_A.chain(list(range(16)))
        with pytest.raises(InvalidArgument, match="shared memory"):
            s.prepare_store(chain.metas())
        with pytest.raises(InvalidArgument, match="shared memory"):
            s.prepare_load(NS_A.id, chain.keys)
    with pytest.raises(InvalidArgument, match="shares no memory"):
        connect_daemon(guarded[1], LAYOUT, token=TOKEN)
    with DaemonStore(guarded[0].target, NS_A.id) as local:
        assert local.shared_memory


# ----------------------------------------------------------------- (c) typed errors


def test_malformed_requests_get_invalid_argument(guarded, stub) -> None:  # noqa: ANN001
    d = guarded[0]
    code, msg = _code(stub.Lookup, pb.LookupRequest(namespace_id=b"abc", keys=b"k" * 16))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "namespace id must be 16 bytes" in msg
    code, msg = _code(stub.CountDeclined, pb.DeclinedRequest(namespace_id=b"abc", blocks=1))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "namespace id must be 16 bytes" in msg
    code, msg = _code(stub.Lookup, pb.LookupRequest(namespace_id=NS_A.id, keys=b"k" * 33))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "not a multiple of 16" in msg
    code, msg = _code(stub.Lookup, pb.LookupRequest(namespace_id=NS_A.id, keys=b"k" * 16 * 65))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "65 keys" in msg
    code, msg = _code(stub.Contains, pb.ContainsRequest(namespace_id=NS_A.id, tier="nope",
                                                       keys=[b"k" * 16]))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "no tier named 'nope'" in msg
    m = NS_A.chain(list(range(16))).meta(0)
    forged = pb.Block(key=m.key, parent=m.parent, token_ids=m.token_ids[:-4] + b"\1\0\0\0")
    code, msg = _code(stub.PrepareStore, pb.PrepareStoreRequest(namespace_id=NS_A.id, blocks=[forged]))
    assert code == grpc.StatusCode.NOT_FOUND and "session" in msg  # no session: nothing reserved
    with DaemonStore(d.target, NS_A.id) as s:
        with pytest.raises(InvalidArgument, match="does not hash"):
            s.prepare_store([type(m)(m.namespace_id, m.key, m.parent, forged.token_ids)])
        with pytest.raises(InvalidArgument, match="bytes; the layout's page"):
            s.write_pages([m], np.zeros((1, 100), np.uint8))
    code, msg = _code(stub.CompleteLoad, pb.HandleRequest(session_id="nope", namespace_id=NS_A.id,
                                                          handle_id=1))
    assert code == grpc.StatusCode.NOT_FOUND and "unknown or closed" in msg
    _still_serving(d)


def test_a_failed_lookup_on_the_stream_is_answered_and_the_stream_goes_on(guarded, stub) -> None:  # noqa: ANN001
    # the lookup stream answers each request in order; a bad one gets its status in the reply
    # (the unary call's codes and messages), and the next request on the same call is served
    chain = NS_A.chain(list(range(32)))
    requests = [pb.LookupRequest(namespace_id=b"abc", keys=b"k" * 16),
                pb.LookupRequest(namespace_id=NS_A.id, keys=b"k" * 33),
                pb.LookupRequest(namespace_id=NS_A.id, keys=b"k" * 16 * 65),
                pb.LookupRequest(namespace_id=NS_A.id, keys=b"".join(chain.keys), lease=True,
                                 session_id="nope"),
                pb.LookupRequest(namespace_id=NS_A.id, keys=b"".join(chain.keys))]
    replies = list(stub.LookupStream(iter(requests), timeout=10))
    assert len(replies) == len(requests)
    codes = [grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.INVALID_ARGUMENT,
             grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND]
    texts = ["namespace id must be 16 bytes", "not a multiple of 16", "65 keys", "unknown or closed"]
    for r, code, text in zip(replies, codes, texts):
        assert r.HasField("error") and r.error.code == code.value[0] and text in r.error.message
        assert r.num_blocks == 0 and r.lease_id == 0
    assert not replies[-1].HasField("error") and replies[-1].num_blocks == 0
    # through the client: the daemon's error is raised as the same kvstore error
    with DaemonStore(guarded[0].target, NS_A.id) as s:
        with pytest.raises(InvalidArgument, match="65 keys"):
            s.lookup(NS_A.chain(list(range(16 * 65))).keys)
        assert s.lookup(chain.keys).num_blocks == 0  # and the next lookup is served
    _still_serving(guarded[0])


def test_oversized_requests_get_resource_exhausted(guarded, stub) -> None:  # noqa: ANN001
    big = pb.LookupRequest(namespace_id=NS_A.id, keys=b"k" * 16 * 20000)  # > 256 KiB
    code, _ = _code(stub.Lookup, big)
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    _still_serving(guarded[0])


def test_quota_gets_resource_exhausted(guarded) -> None:  # noqa: ANN001
    # 64 KiB quota = 8 pages of 8 KiB; the client turns the refusal into a refused handle
    ns = Namespace("quota", LAYOUT, "q")
    metas = ns.chain(list(range(16 * 9))).metas()
    with grpc.insecure_channel(guarded[0].target) as ch:
        stub = pb_grpc.KVStoreDaemonStub(ch)
        sess = stub.OpenSession(pb.OpenSessionRequest())
        sid = next(sess).session_id
        mapped = map_segments(f"{guarded[0].socket}.lane", sid, 5.0)
        for fd in (mapped.slab_fd, mapped.staging_fd):
            os.close(fd)  # the session's staging area exists now: saves have rows to go to
        blocks = [pb.Block(key=m.key, parent=m.parent, token_ids=m.token_ids) for m in metas]
        code, msg = _code(stub.PrepareStore, pb.PrepareStoreRequest(
            session_id=sid, namespace_id=ns.id, blocks=blocks))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "quota" in msg.lower()
        ok = stub.PrepareStore(pb.PrepareStoreRequest(session_id=sid, namespace_id=ns.id,
                                                      blocks=blocks[:8]), timeout=10)
        assert len(ok.slots) == 8
        sess.cancel()
    with DaemonStore(guarded[0].target, ns.id) as s:
        h = s.prepare_store(metas)
        assert h.id == 0 and h.refused == len(metas) and s.failures["quota"] == 1
    _still_serving(guarded[0])


def test_out_of_namespace_requests_get_typed_errors(guarded) -> None:  # noqa: ANN001
    d = guarded[0]
    chain_a = NS_A.chain(list(range(48)))
    with DaemonStore(d.target, NS_A.id) as a, DaemonStore(d.target, NS_B.id) as b:
        h = a.prepare_store(chain_a.metas())
        a.complete_store(h)
        # b cannot load a's pages: the keys are held under another namespace
        assert b.prepare_load(NS_B.id, chain_a.keys).num_blocks == 0
        assert a.prepare_load(NS_A.id, chain_a.keys[:1]).num_blocks == 1
        # nor delete them, nor plant blocks under a's keys or chained from them
        with pytest.raises(InvalidArgument, match="another namespace"):
            b.delete(chain_a.keys[:1])
        m = chain_a.meta(1)
        with pytest.raises(InvalidArgument, match="another namespace"):
            b.prepare_store([type(m)(NS_B.id, m.key, m.parent, m.token_ids)])
        # a handle is its session's: another session does not see it
        lh = a.prepare_load(NS_A.id, chain_a.keys)
        req = pb.HandleRequest(session_id=b._session.session_id, namespace_id=NS_B.id, handle_id=lh.id)
        with pytest.raises(LeaseError, match="not this session's"):
            b._session.call("CompleteLoad", req)
        # ... and within its session, only under its namespace
        with pytest.raises(InvalidArgument, match="another namespace"):
            a._session.call("CompleteLoad", pb.HandleRequest(namespace_id=NS_B.id, handle_id=lh.id))
        assert a.complete_load(lh) == 3
        assert a.delete(chain_a.keys) > 0
    _still_serving(d)
