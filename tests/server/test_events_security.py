"""A client without the token gets no cache events, on any transport, and events carry no token
ids.

* The daemon's TCP gRPC listener: ReadEvents, EventSnapshot and WatchEvents without the bearer
  token, or with a wrong one, are UNAUTHENTICATED and return no event (here); the other calls
  are in ``tests/server/test_daemon_boundary.py::test_tcp_refuses_a_missing_or_wrong_token``.
* The admin API's SSE stream ``GET /v1/events``: 401 without the token, as every route but
  /healthz and /readyz, on a live daemon -- ``tests/admin/test_auth.py::
  test_every_route_but_healthz_and_readyz_refuses_a_missing_or_wrong_token`` (its route list
  includes /v1/events: ``test_the_route_list_covers_the_api``).
* The vLLM-format ZMQ publisher: a ``tcp://`` endpoint (or an abstract ``ipc://@name``)
  without a CURVE key is refused by the configuration, before ``kvstore serve`` starts anything
  (here); the publisher itself refuses one and CURVE keeps strangers out -- ``tests/server/test_vllm_events_access.py``, and for
  the daemon ``tests/server/test_daemon_vllm_publisher.py`` (ipc:// socket mode 0600, CURVE
  over TCP).
* No token ids unless the operator opts a namespace in (``store.event_token_ids``, empty by
  default): a default store's events carry none, a daemon client reads them only for a
  namespace opted in (here); the vLLM-format BlockStored has ``token_ids == []`` --
  ``tests/server/test_daemon_vllm_publisher.py`` (a real daemon) -- but a namespace opted in
  (``tests/vllm/test_vllm_kv_events.py``, vLLM's own classes).
"""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from connector.daemon import DaemonStore
from connector.proto import kvstore_daemon_pb2 as pb
from connector.proto import kvstore_daemon_pb2_grpc as pb_grpc
from kvstore import ConfigError, InvalidArgument, KVLayout, Namespace, load_config
from kvstore.event_log import Snapshot
from tests.server.daemon_proc import ROOT, TINY_LAYOUT, DaemonProc, write_config

TOKEN = "events-security-token-for-tests"
LAYOUT = KVLayout(**TINY_LAYOUT)  # type: ignore[arg-type]
NS = Namespace("model", LAYOUT, "tenant-a")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DaemonProc, str]]:
    """A daemon with TCP (token from the environment) whose log holds events of NS: pages saved
    over the Unix socket."""
    tmp = tmp_path_factory.mktemp("daemon")
    port = _free_port()
    cfg = write_config(tmp, disk=None, extra_daemon=f'tcp = "127.0.0.1:{port}"')
    with DaemonProc(cfg, env={"KVSTORE_DAEMON__TOKEN": TOKEN}) as d:
        with DaemonStore(d.target, namespace_id=NS.id) as client:
            metas = NS.chain(list(range(3 * LAYOUT.block_size))).metas()
            h = client.prepare_store(metas)
            for slot in h.slots:
                h.slab[slot] = np.zeros(LAYOUT.page_bytes, np.uint8)
            assert client.complete_store(h).stored == 3
        yield d, f"127.0.0.1:{port}"
        assert d.stop() == 0
    assert TOKEN not in d.log()


def _unauthenticated(call: object) -> None:
    with pytest.raises(grpc.RpcError) as info:
        reply = call()  # type: ignore[operator]
        raise AssertionError(f"answered without the token: {reply}")
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "bearer token" in (info.value.details() or "")


@pytest.mark.parametrize("token", [None, "wrong-token", TOKEN[:-1], TOKEN + "x"])
def test_event_calls_over_tcp_without_the_token_get_no_events(
        guarded: tuple[DaemonProc, str], token: str | None) -> None:
    md = [("authorization", f"Bearer {token}")] if token else []
    with grpc.insecure_channel(guarded[1]) as ch:
        stub = pb_grpc.KVStoreDaemonStub(ch)
        _unauthenticated(lambda: stub.ReadEvents(
            pb.ReadEventsRequest(namespace_id=NS.id, cursor=1, limit=1024), metadata=md,
            timeout=10))
        _unauthenticated(lambda: stub.EventSnapshot(
            pb.EventSnapshotRequest(namespace_id=NS.id), metadata=md, timeout=10))
        watch = stub.WatchEvents(pb.WatchRequest(namespace_id=NS.id), metadata=md, timeout=10)
        _unauthenticated(lambda: next(watch))


def test_with_the_token_the_same_calls_do_return_events(guarded: tuple[DaemonProc, str]) -> None:
    """The control: the log the refused calls asked for is not empty."""
    md = [("authorization", f"Bearer {TOKEN}")]
    with grpc.insecure_channel(guarded[1]) as ch:
        stub = pb_grpc.KVStoreDaemonStub(ch)
        batch = stub.ReadEvents(pb.ReadEventsRequest(namespace_id=NS.id, cursor=1, limit=1024),
                                metadata=md, timeout=10)
        snap = stub.EventSnapshot(pb.EventSnapshotRequest(namespace_id=NS.id), metadata=md,
                                  timeout=10)
    assert sum(len(e.keys) for e in batch.events if e.kind == "stored") == 3
    assert sum(len(e.keys) for e in snap.events) == 3
    # and a DaemonStore over TCP with the token reads them through the StoreAPI face
    with DaemonStore(guarded[1], NS.id, token=TOKEN) as client:
        assert isinstance(client.event_snapshot(), Snapshot)
        assert sum(len(e.keys) for e in client.event_snapshot().events) == 3


def test_a_tcp_publisher_without_curve_is_refused_by_the_configuration(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch
                                                                       ) -> None:
    with pytest.raises(ConfigError, match=r"events\.zmq_endpoint: 'tcp://\*:5557' is TCP "
                                          r"without CURVE: it would publish every event"):
        load_config(overrides={"events": {"zmq_endpoint": "tcp://*:5557"}})
    for other in ("inproc://kv", "pgm://x", "ws://127.0.0.1:1", "127.0.0.1:5557"):
        with pytest.raises(ConfigError, match="not an ipc:// path or a tcp://host:port"):
            load_config(overrides={"events": {"zmq_endpoint": other}})
    # an ipc:// path needs no key (its file's permissions decide); an abstract socket has none
    assert load_config(overrides={"events": {"zmq_endpoint": "ipc:///run/kv"}}).events
    with pytest.raises(ConfigError, match="abstract socket namespace, which has no file"):
        load_config(overrides={"events": {"zmq_endpoint": "ipc://@kv-events"}})
    # a malformed key is refused, and never echoed
    bad_key = "not-a-curve-key-but-a-secret-all-the-same"
    with pytest.raises(ConfigError) as info:
        load_config(overrides={"events": {"zmq_endpoint": "tcp://*:5557",
                                          "zmq_curve_secret_key": bad_key}})
    assert "is not a CURVE key" in info.value.message and bad_key not in str(info.value)
    # set from the environment, the error names the variable
    monkeypatch.setenv("KVSTORE_EVENTS__ZMQ_ENDPOINT", "tcp://0.0.0.0:5557")
    with pytest.raises(ConfigError, match="KVSTORE_EVENTS__ZMQ_ENDPOINT"):
        load_config()


def test_the_publisher_refuses_an_abstract_ipc_socket_without_curve(tmp_path: Path) -> None:
    """Beside tests/server/test_vllm_events_access.py's plain TCP: ``ipc://@name`` is an
    abstract socket, which any local process may connect to."""
    from server.vllm_events import VllmEventPublisher
    from tests.vllm_events_wire import store_at

    store = store_at(tmp_path)
    try:
        with pytest.raises(InvalidArgument, match="anyone who connects"):
            VllmEventPublisher(store, f"ipc://@kvstore-test-{tmp_path.name}")
    finally:
        store.close()


def test_kvstore_serve_refuses_to_start_a_tcp_publisher_without_curve(tmp_path: Path) -> None:
    port = _free_port()
    config = write_config(tmp_path, disk=None)
    config.write_text(config.read_text() + f'\n[events]\nzmq_endpoint = "tcp://127.0.0.1:{port}"\n')
    proc = subprocess.run([sys.executable, "-m", "server.cli", "serve", "--config", str(config)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr  # a configuration error
    assert "is TCP without CURVE" in proc.stderr
    assert not (tmp_path / "kvstore.sock").exists()  # it never listened
    with socket.socket() as s:  # nor bound the publisher's port
        s.bind(("127.0.0.1", port))


def test_by_default_no_event_carries_token_ids() -> None:
    """Token ids travel only for namespaces an operator lists in ``store.event_token_ids``,
    empty by default: a default store's events carry none, though its pages' metas have them."""
    from kvstore import TieredStore, build_tier
    from kvstore.config import StoreConfig

    assert StoreConfig().event_token_ids == []
    layout = KVLayout(1, 1, 16, 4, "float16")
    ns = Namespace("tokens", layout)
    store = TieredStore(layout, [build_tier({"kind": "host", "capacity": 8 * layout.page_bytes},
                                            layout)])
    try:
        chain = ns.chain(list(range(12)))
        assert all(m.token_ids for m in chain.metas())
        cursor = store.read_events().next_cursor
        store.put(chain.metas(), np.zeros((3, layout.page_bytes), np.uint8))
        events = store.read_events(cursor).events
        assert events and all(e.token_ids == () for e in events)
    finally:
        store.close()


def test_token_ids_reach_a_daemon_client_only_for_a_namespace_opted_in(tmp_path: Path) -> None:
    """``store.event_token_ids`` set by the operator (here through the environment): a client of
    that namespace reads its blocks' token ids in ``ReadEvents``; another namespace's events
    carry none."""
    from connector.daemon import DaemonStore
    from kvstore import KVLayout, Namespace
    from tests.server.daemon_proc import TINY_LAYOUT, DaemonProc, write_config
    from tests.store_api.test_conformance import _save

    layout = KVLayout(**TINY_LAYOUT)  # type: ignore[arg-type]
    told, untold = Namespace("tokens", layout, "told"), Namespace("tokens", layout, "untold")
    tokens = list(range(500, 500 + 3 * layout.block_size))
    env = {"KVSTORE_STORE__EVENT_TOKEN_IDS": f'["{told.id.hex()}"]'}
    with DaemonProc(write_config(tmp_path, disk=None), env=env) as d, \
            DaemonStore(d.target) as store:
        for ns in (told, untold):
            cursor = store.read_events(namespace_id=ns.id).next_cursor
            _save(store, ns, tokens)
            (event,) = store.read_events(cursor, namespace_id=ns.id).events
            want = ns.chain(tokens)
            assert event.keys == tuple(want.keys)
            if ns is told:
                assert event.token_ids == tuple(m.token_ids for m in want.metas())
            else:
                assert event.token_ids == ()
