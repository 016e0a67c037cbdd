"""One :class:`DaemonStore` serving many namespaces over its one session (what an engine whose
requests carry their own salts needs): lookups name their namespace or go through a scoped
view, leases remember theirs, presence checks need none; and an engine whose page layout is not
the daemon's is refused, naming both; a namespace's label is told once per session, and a bad
label is refused at the daemon's boundary."""

from __future__ import annotations

import time

import grpc
import numpy as np
import pytest

from connector.build import connect_daemon
from connector.daemon import DaemonStore
from connector.inprocess import InProcessScheduler
from connector.proto import kvstore_daemon_pb2 as pb
from connector.proto import kvstore_daemon_pb2_grpc as pb_grpc
from kvstore import InvalidArgument, KVLayout, Namespace
from tests.server.daemon_proc import TINY_LAYOUT, DaemonProc

LAYOUT = KVLayout(**TINY_LAYOUT)
NS_A, NS_B = Namespace("model", LAYOUT, "tenant-a"), Namespace("model", LAYOUT, "tenant-b")


def _store(client: DaemonStore, ns: Namespace, tokens: list[int], fill: int) -> list[bytes]:
    chain = ns.chain(tokens)
    h = client.prepare_store(chain.metas())
    for slot in h.slots:
        h.slab[slot] = fill
    assert client.complete_store(h).stored == len(chain.keys)
    return list(chain.keys)


def test_one_client_many_namespaces(daemon: DaemonProc) -> None:
    tokens = list(range(48))  # 3 blocks, the same tokens in both namespaces
    with DaemonStore(daemon.target) as client:  # no default namespace
        keys_a = _store(client, NS_A, tokens, 0xA)
        keys_b = _store(client, NS_B, tokens, 0xB)
        assert keys_a != keys_b
        with pytest.raises(InvalidArgument, match="no default namespace and the call names none"):
            client.lookup(keys_a)
        a, b = client.scoped(NS_A.id), client.scoped(NS_B.id)
        assert a.layout == LAYOUT and a.staging_tier().name == client.staging_tier().name
        # presence needs no namespace
        assert client.tier("host").count_leading(keys_a) == 3
        # a lease from a scoped lookup is released, narrowed and loaded by the client, which
        # remembers the namespace it was granted under
        found = a.lookup(keys_a, lease=True)
        assert (found.num_blocks, found.tiers) == (3, ("host",) * 3)
        assert client.stats().active_leases == 1
        narrowed = client.narrow(found.lease, 2)  # type: ignore[arg-type]
        assert narrowed.keys == tuple(keys_a[:2])
        with pytest.raises(InvalidArgument, match="belongs to another namespace"):
            client.prepare_load(NS_B.id, keys_a[:2], lease=narrowed)
        client.release(narrowed)  # refused above: still held, under a's namespace
        found = b.lookup(keys_b, lease=True)
        h = client.prepare_load(NS_B.id, keys_b, lease=found.lease)
        assert h.num_blocks == 3
        assert all((h.slab[s] == 0xB).all() for s in h.slots)
        assert client.complete_load(h) == 3
        found = a.lookup(keys_a[:1], lease=True, local_only=True)
        client.release(found.lease)  # type: ignore[arg-type]
        assert client.stats().active_leases == 0
        # b's pages are not loaded under a's namespace, whatever a lookup says
        assert client.prepare_load(NS_A.id, keys_b).num_blocks == 0
        assert a.lookup_async(keys_a).result(timeout=10).num_blocks == 3
        # a scheduler of one namespace names its own, as it does to a store; never another's
        assert a.lookup(keys_a, namespace_id=NS_A.id).num_blocks == 3
        with pytest.raises(InvalidArgument, match="asked of the view of"):
            a.lookup(keys_b, namespace_id=NS_B.id)
        with pytest.raises(InvalidArgument, match="asked of the view of"):
            a.lookup_async(keys_b, namespace_id=NS_B.id)
        assert b.delete(keys_b) == 6  # host and disk (written through)
        assert (b.lookup(keys_b).num_blocks, a.lookup(keys_a).num_blocks) == (0, 3)
        assert client.stats(check_integrity=True).integrity_error == ""


def test_an_engine_layout_that_is_not_the_daemons_is_refused(daemon: DaemonProc) -> None:
    vllm_like = KVLayout(2, 2, 32, 32, "float32", "vllm-cpu")
    with pytest.raises(InvalidArgument) as info:
        connect_daemon(daemon.target, vllm_like)
    msg = f"{info.value.message} {info.value.hint}"
    assert f"stores pages of {LAYOUT} ({LAYOUT.page_bytes} bytes)" in msg
    assert f"this engine's are {vllm_like} ({vllm_like.page_bytes} bytes)" in msg
    assert ('start the daemon with [layout] num_layers = 2, num_kv_heads = 2, head_dim = 32, '
            'block_size = 32, dtype = "float32", block_format = "vllm-cpu"') in msg
    with connect_daemon(daemon.target, LAYOUT) as client:
        assert client.layout == LAYOUT
        np.testing.assert_equal(client.staging_tier().slab.shape[1], LAYOUT.page_bytes)


def test_a_label_is_told_once_per_namespace_and_bad_ones_are_refused(daemon: DaemonProc) -> None:
    with DaemonStore(daemon.target) as client:
        before = client.calls["grpc"]
        for _ in range(2):  # two schedulers of one namespace: told once
            InProcessScheduler(client.scoped(NS_A.id), NS_A, num_blocks=8)  # type: ignore[arg-type]
        deadline = time.monotonic() + 5  # the tell is fire-and-forget, on the client's pool
        while client.calls["grpc"] == before and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.1)  # a second tell, were there one, would have been counted by now
        assert client.calls["grpc"] - before == 1 and not client.failures
        with pytest.raises(InvalidArgument, match="1 to 256 bytes"):  # refused before sending
            client.label_namespace(NS_B.id, "x" * 300)
    # at the daemon's boundary: not UTF-8, too long, a control character, a bad id
    with grpc.insecure_channel(daemon.target) as ch:
        stub = pb_grpc.KVStoreDaemonStub(ch)
        for ns, label, match in ((NS_A.id, b"\xff\xfe", "UTF-8 text"),
                                 (NS_A.id, b"x" * 257, "1 to 256 bytes"),
                                 (NS_A.id, b"", "1 to 256 bytes"),
                                 (NS_A.id, b"a\x00b", "control character"),
                                 (b"abc", b"ok", "namespace id must be 16 bytes")):
            with pytest.raises(grpc.RpcError) as err:
                stub.LabelNamespace(pb.LabelRequest(namespace_id=ns, label=label), timeout=5)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value
            assert match in (err.value.details() or ""), err.value.details()
        stub.LabelNamespace(pb.LabelRequest(namespace_id=NS_B.id, label=NS_B.label.encode()),
                            timeout=5)  # and it still serves
