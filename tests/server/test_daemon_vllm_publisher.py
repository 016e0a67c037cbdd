"""``kvstore serve`` with ``events.zmq_endpoint``: the daemon publishes its store's event log in
vLLM's KV-events wire format. A real daemon, a client that saves pages, and a ZMQ SUB that
decodes what arrives with vLLM's own classes (``vllm.distributed.kv_events``) when vLLM is
installed, else with msgspec structs of the same wire format: the saved pages arrive as
BlockStored of their block keys, in host (CPU) and, written through, in disk (STORAGE)."""

from __future__ import annotations

import socket
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import zmq

from connector.daemon import DaemonStore
from kvstore import KVLayout, Namespace
from tests.server.daemon_proc import TINY_LAYOUT, DaemonProc, write_config
from tests.vllm_events_wire import drain, subscriber

LAYOUT = KVLayout(**TINY_LAYOUT)  # type: ignore[arg-type]
NS = Namespace("published", LAYOUT, "tenant-a")
PROMPT = list(range(100, 100 + 5 * LAYOUT.block_size))  # 5 pages


class _Stored(msgspec.Struct, tag="BlockStored"):
    """vLLM's BlockStored as it is on the wire (a map tagged ``type``), for when vLLM is not
    installed."""

    block_hashes: list[Any]
    parent_block_hash: Any
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    locality: str | None = None
    ownership: str | None = None


class _Removed(msgspec.Struct, tag="BlockRemoved"):
    block_hashes: list[Any]
    medium: str | None
    locality: str | None = None
    ownership: str | None = None


class _Cleared(msgspec.Struct, tag="AllBlocksCleared"):
    pass


class _Batch(msgspec.Struct, array_like=True):
    ts: float
    events: list[_Stored | _Removed | _Cleared]
    data_parallel_rank: int | None = None


def vllm_decoder() -> tuple[Callable[[bytes], Any], type[Any]]:
    """``(decode a message's payload, the BlockStored class)``: vLLM's when it imports."""
    try:
        from vllm.distributed.kv_events import BlockStored, KVEventBatch
    except ImportError:
        return msgspec.msgpack.Decoder(type=_Batch).decode, _Stored
    return msgspec.msgpack.Decoder(type=KVEventBatch).decode, BlockStored


def with_events(config: Path, *lines: str) -> Path:
    """``config`` with an ``[events]`` table of ``lines`` appended."""
    config.write_text(config.read_text() + "\n[events]\n" + "\n".join(lines) + "\n")
    return config


def save(client: DaemonStore, ns: Namespace, tokens: list[int]) -> list[bytes]:
    chain = ns.chain(tokens)
    h = client.prepare_store(chain.metas())
    for slot in h.slots:
        h.slab[slot] = np.full(LAYOUT.page_bytes, 7, np.uint8)
    assert client.complete_store(h).stored == len(chain)
    return chain.keys


def first_message(client: DaemonStore, sub: zmq.Socket, timeout_s: float = 20.0
                  ) -> list[bytes] | None:
    """Save a probe page of another namespace until the subscriber receives a message (a SUB
    socket joins late: what is published before its subscription arrived is not delivered)."""
    probe = Namespace("probe", LAYOUT)
    with DaemonStore(client.target, namespace_id=probe.id) as prober:
        deadline, n = time.monotonic() + timeout_s, 0
        while time.monotonic() < deadline:
            save(prober, probe, list(range(16 * n, 16 * n + 16)))
            n += 1
            if sub.poll(200):
                return sub.recv_multipart()
    return None


def test_a_daemon_publishes_saved_pages_as_vllm_block_stored_events(tmp_path: Path) -> None:
    endpoint = f"ipc://{tmp_path}/kv-events"
    config = with_events(write_config(tmp_path, write_policy="write_through"),
                         f'zmq_endpoint = "{endpoint}"', 'zmq_topic = "kv"')
    decode, block_stored = vllm_decoder()
    with DaemonProc(config) as d:
        # the ipc socket file is the daemon's user's alone, as its gRPC socket is
        assert stat.S_IMODE((tmp_path / "kv-events").stat().st_mode) == 0o600
        assert f"publishing KV events (vLLM's format) on {endpoint}" in d.log()
        sub = subscriber(endpoint)
        client = DaemonStore(d.target, namespace_id=NS.id)
        try:
            first = first_message(client, sub)
            assert first is not None, d.log()
            assert first[0] == b"kv" and len(first[1]) == 8
            drain(sub)
            keys = save(client, NS, PROMPT)
            msgs = drain(sub, 1000)
        finally:
            sub.close(linger=0)
            client.close()
        assert d.stop() == 0
    seqs = [int.from_bytes(m[1], "big") for m in [first, *msgs]]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    events = [ev for m in msgs for ev in decode(m[2]).events]
    stored = [e for e in events if isinstance(e, block_stored)]
    ours = set(keys)
    where = {(e.ownership, e.medium, e.locality) for e in stored if ours & set(e.block_hashes)}
    assert where == {("host", "CPU", "LOCAL"), ("disk", "STORAGE", "LOCAL")}
    for tier in ("host", "disk"):  # every saved block, in order, as its block key
        assert [k for e in stored if e.ownership == tier for k in e.block_hashes
                if k in ours] == keys
    # no prompt tokens leave the daemon: block hashes only
    assert all(e.token_ids == [] and e.block_size == LAYOUT.block_size for e in stored)
    # the fallback structs read the wire as vLLM's classes do (checked where vLLM is here)
    ours_decode = msgspec.msgpack.Decoder(type=_Batch).decode
    fallback = [e for m in msgs for e in ours_decode(m[2]).events if isinstance(e, _Stored)]
    assert [(e.ownership, e.medium, e.block_hashes) for e in fallback] == [
        (e.ownership, e.medium, e.block_hashes) for e in stored]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_over_tcp_only_a_subscriber_with_the_key_file_s_public_key_receives(
        tmp_path: Path) -> None:
    public, secret = (k.decode() for k in zmq.curve_keypair())
    key_file = tmp_path / "events.key_secret"
    # a ZMQ certificate, as zmq.auth.create_certificates writes it
    key_file.write_text(f'metadata\ncurve\n    public-key = "{public}"\n'
                        f'    secret-key = "{secret}"\n')
    endpoint = f"tcp://127.0.0.1:{_free_port()}"
    config = with_events(write_config(tmp_path, disk=None), f'zmq_endpoint = "{endpoint}"',
                         f'zmq_curve_secret_key_file = "{key_file}"')
    with DaemonProc(config) as d:
        keyed = subscriber(endpoint, server_key=public)
        stranger = subscriber(endpoint)
        wrong = subscriber(endpoint, server_key=zmq.curve_keypair()[0].decode())
        client = DaemonStore(d.target, namespace_id=NS.id)
        try:
            assert first_message(client, keyed) is not None, d.log()
            save(client, NS, PROMPT)
            assert drain(keyed, 1000)
            assert drain(stranger, 300) == [] and drain(wrong, 300) == []
        finally:
            for s in (keyed, stranger, wrong):
                s.close(linger=0)
            client.close()
        assert d.stop() == 0
    # the public key is logged for the subscribers' operators; the secret never
    assert f"curve_serverkey {public}" in d.log() and secret not in d.log()
