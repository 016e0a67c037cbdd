"""The store's one face (:class:`kvstore.api.StoreAPI`): both implementations have every member
with the face's exact signature, and neither grows a public method the other lacks without this
file saying so (issue 36 empties the two pinned sets below, one move at a time)."""

from __future__ import annotations

import inspect
from pathlib import Path

from connector.daemon import DaemonNamespace, DaemonStore
from kvstore import KVLayout, TieredStore
from kvstore.api import StagingSlab, StoreAPI
from kvstore.tiers.host import HostTier
from tests.server.daemon_proc import TINY_LAYOUT, DaemonProc, write_config

LAYOUT = KVLayout(**TINY_LAYOUT)  # type: ignore[arg-type]
IMPLEMENTATIONS = (TieredStore, DaemonStore)

#: public methods only the in-process store has: its owner's controls (events, eviction, policy,
#: integrity, the byte API) -- to move behind the face or out of the public surface
IN_PROCESS_ONLY = {"drain", "evict", "get", "is_pinned", "namespace_of", "put", "set_policy"}
#: public methods only the daemon client has: its connection, the cross-node byte path, DMA
DAEMON_ONLY = {"connected", "dma_registered", "peer_copy", "read_pages", "register_for_dma",
               "scoped", "shared_memory", "wait_connected", "watch", "write_pages"}


def _face_members() -> dict[str, object]:
    return {n: v for n, v in vars(StoreAPI).items() if not n.startswith("_")}


def _public(cls: type) -> set[str]:
    return {n for n in dir(cls) if not n.startswith("_")}


def test_every_member_of_the_face_has_its_signature_in_both() -> None:
    for name, member in _face_members().items():
        for impl in IMPLEMENTATIONS:
            if isinstance(member, property):
                continue  # a property or an attribute: the instances below have it
            got = inspect.signature(getattr(impl, name))
            want = inspect.signature(member)  # type: ignore[arg-type]
            assert [(p.name, p.kind, p.default) for p in got.parameters.values()] == \
                [(p.name, p.kind, p.default) for p in want.parameters.values()], \
                f"{impl.__name__}.{name}{got} is not the face's {name}{want}"


def test_the_implementations_differ_only_where_pinned() -> None:
    t, d = _public(TieredStore), _public(DaemonStore)
    assert t - d == IN_PROCESS_ONLY
    assert d - t == DAEMON_ONLY
    assert set(_face_members()) <= t & d | {"layout", "metrics"}


def test_the_daemon_client_checks_and_counts_as_the_store_does(tmp_path: Path) -> None:
    with DaemonProc(write_config(tmp_path, host="1MiB", disk=None)) as d:
        client = DaemonStore(d.target)
        assert not client.closed and client.open_store_handles == 0
        client.check_integrity()  # the daemon's store holds its invariants
        client.close()
        assert client.closed


def test_real_instances_are_the_face(tmp_path: Path) -> None:
    store = TieredStore(LAYOUT, [HostTier.build("host", LAYOUT, 16, pin_memory=False)])
    try:
        assert isinstance(store, StoreAPI)
        assert isinstance(store.staging_tier(), StagingSlab)
        assert store.tier_names == ("host",) and not store.commits_pool_itself
        assert store.has_remote_tiers is False  # a property of the face, not a method
    finally:
        store.close()
    with DaemonProc(write_config(tmp_path, host="1MiB", disk=None)) as d, \
            DaemonStore(d.target) as client:
        for face in (client, client.scoped(b"\x01" * 16)):
            assert isinstance(face, StoreAPI)
            assert isinstance(face.staging_tier(), StagingSlab)
            assert face.tier_names == ("host",) and not face.commits_pool_itself
        assert isinstance(DaemonNamespace(client, b"\x01" * 16).has_remote_tiers, bool)


#: RPCs of the daemon's service that are the transport's own, not a method of the face: the
#: session (and its lease/handle scope), a lookup stream (the scheduler's answer-or-not-yet),
#: the staging tier's presence check, stats, events and the cross-node byte path
TRANSPORT_RPCS = {"open_session", "lookup_stream", "contains", "stats", "watch_events",
                  "read_pages", "write_pages"}


def test_the_proto_mirrors_the_face() -> None:
    """Each RPC of connector/proto is a method of the face of the same name, or pinned above as
    the transport's own; and every face method that does work on the daemon has its RPC."""
    import re

    proto = (Path(__file__).parents[2] / "connector" / "proto").glob("*.proto")
    rpcs = {re.sub(r"(?<!^)([A-Z])", r"_\1", name).lower()
            for p in proto for name in re.findall(r"^\s*rpc (\w+)\(", p.read_text(), re.M)}
    face = set(_face_members())
    assert rpcs - face == TRANSPORT_RPCS
    served = {"lookup", "release", "narrow", "prepare_load", "complete_load", "prepare_store",
              "complete_store", "abort", "prefetch", "delete", "count_declined", "count_failed",
              "label_namespace"}
    assert served <= rpcs & face
