"""A router that consumes vLLM's KV events consumes ours unchanged: every message our publisher
sends decodes with vLLM's own classes (``vllm.distributed.kv_events``), and says what happened
to the store -- pages stored in host, demoted to disk, deleted."""

from __future__ import annotations

import threading
from pathlib import Path

import msgspec
from vllm.distributed.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
)

from kvstore import TieredStore, build_tier
from server.vllm_events import VllmEventPublisher
from tests.vllm_events_wire import (
    HOST_PAGES,
    LAYOUT,
    NS,
    drain,
    first_message,
    pages,
    store_at,
    subscriber,
)


def test_vllm_decodes_our_events_and_they_tell_where_pages_went(tmp_path: Path) -> None:
    store = store_at(tmp_path)
    pub = VllmEventPublisher(store, f"ipc://{tmp_path}/kv-events", topic="kv")
    sub = subscriber(pub.endpoint)
    decode = msgspec.msgpack.Decoder(type=KVEventBatch).decode
    try:
        first = first_message(store, sub)
        assert first is not None and first[0] == b"kv" and len(first[1]) == 8
        drain(sub)
        chain = NS.chain(list(range(4 * (HOST_PAGES + 2))))  # two more than host holds
        store.put(chain.metas(), pages(HOST_PAGES + 2))
        store.drain()
        store.delete([chain.keys[-1]])
        msgs = drain(sub)
        seqs = [int.from_bytes(m[1], "big") for m in [first, *msgs]]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
        events = [ev for m in msgs for ev in decode(m[2]).events]
        ours = set(chain.keys)
        stored = {(e.ownership, e.medium, k) for e in events if isinstance(e, BlockStored)
                  for k in e.block_hashes if k in ours}
        removed = [(e.ownership, e.medium, k) for e in events if isinstance(e, BlockRemoved)
                   for k in e.block_hashes if k in ours]
        assert {k for o, med, k in stored if (o, med) == ("host", "CPU")} == ours
        demoted = {k for o, med, k in stored if (o, med) == ("disk", "STORAGE")}
        assert len(demoted) == 2  # written back on eviction: stored on disk, removed from host
        assert {k for o, _, k in removed if o == "host"} >= demoted
        assert ("host", "CPU", chain.keys[-1]) in removed  # the delete
        assert all(e.token_ids == [] and e.block_size == 4 for e in events
                   if isinstance(e, BlockStored))  # no prompt tokens leave the store
        assert not any(isinstance(e, AllBlocksCleared) for e in events)
    finally:
        sub.close(linger=0)
        pub.close()
        store.close()


def test_a_publisher_that_fell_behind_clears_then_sends_the_contents(tmp_path: Path) -> None:
    """Past the log's window the publisher cannot say what it missed: it sends
    AllBlocksCleared, then the store's contents as BlockStored -- a consumer that applies
    vLLM's events in order is exact again."""
    store = TieredStore(LAYOUT, [build_tier({"kind": "host", "capacity": 64 * LAYOUT.page_bytes},
                                            LAYOUT)], event_log_events=2)
    pub = VllmEventPublisher(store, f"ipc://{tmp_path}/kv-events")
    sub = subscriber(pub.endpoint)
    decode = msgspec.msgpack.Decoder(type=KVEventBatch).decode
    held, go = threading.Event(), threading.Event()
    send = pub._send

    def slow_send(events: list) -> None:  # the publisher stalls on its next batch
        if not go.is_set():
            held.set()
            go.wait(10)
        send(events)

    try:
        assert first_message(store, sub) is not None
        pub._send = slow_send  # type: ignore[method-assign]
        chain = NS.chain(list(range(4 * 6)))
        store.put(chain.metas()[:1], pages(1))
        assert held.wait(10)
        for i in range(1, 6):  # five more events: past the 2-event window
            store.put(chain.metas()[i:i + 1], pages(1))
        go.set()
        events = [ev for m in drain(sub, 1000) for ev in decode(m[2]).events]
        cleared = [i for i, e in enumerate(events) if isinstance(e, AllBlocksCleared)]
        assert cleared, "no AllBlocksCleared after the gap"
        after = {k for e in events[cleared[-1]:] if isinstance(e, BlockStored)
                 for k in e.block_hashes}
        assert set(chain.keys) <= after
    finally:
        go.set()
        sub.close(linger=0)
        pub.close()
        store.close()


def test_a_namespace_opted_in_sends_its_token_ids_and_no_other_does(tmp_path: Path) -> None:
    """``store.event_token_ids``: the namespaces whose BlockStored carry their blocks' tokens
    (vLLM's flat ``token_ids``, decoded by vLLM's classes); every other namespace's carry none."""
    other = type(NS)("vllm-events", LAYOUT, "not-opted-in")
    store = TieredStore(LAYOUT, [build_tier({"kind": "host", "capacity": 16 * LAYOUT.page_bytes},
                                            LAYOUT)], event_token_ids=[NS.id])
    pub = VllmEventPublisher(store, f"ipc://{tmp_path}/kv-events")
    sub = subscriber(pub.endpoint)
    decode = msgspec.msgpack.Decoder(type=KVEventBatch).decode
    try:
        assert first_message(store, sub) is not None
        drain(sub)
        tokens = list(range(1000, 1000 + 4 * 3))
        mine, theirs = NS.chain(tokens), other.chain(tokens)
        store.put(mine.metas(), pages(3))
        store.put(theirs.metas(), pages(3))
        events = [ev for m in drain(sub) for ev in decode(m[2]).events
                  if isinstance(ev, BlockStored)]
        by_keys = {tuple(e.block_hashes): e.token_ids for e in events}
        assert by_keys[tuple(mine.keys)] == tokens
        assert by_keys[tuple(theirs.keys)] == []
        log = store.read_events(1, limit=100).events
        assert [e.token_ids for e in log if e.keys == tuple(theirs.keys)] == [()]
    finally:
        pub.close()
        store.close()
