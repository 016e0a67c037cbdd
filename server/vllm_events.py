"""The store's event log published in the wire format of vLLM's KV events, so a router that
consumes vLLM's events (llm-d's precise prefix routing, Dynamo's KV router) consumes ours
unchanged.

The wire (vLLM's ``ZmqEventPublisher``): a ZMQ PUB socket sends three frames per batch --
the topic, an 8-byte big-endian batch sequence number, and a msgpack ``KVEventBatch``
(``[ts, [event, ...], data_parallel_rank]``, each event a map tagged ``type``:
``BlockStored`` / ``BlockRemoved`` / ``AllBlocksCleared``). From our log:

* ``stored`` -> BlockStored of its keys (``block_hashes``: our block keys, as bytes);
* ``removed`` -> BlockRemoved; ``moved`` -> BlockRemoved from its tier, BlockStored in the other;
* ``cleared`` -> AllBlocksCleared;
* a gap (the publisher fell behind the log's window) -> AllBlocksCleared, then the store's
  snapshot as BlockStored: a consumer that applies events in order ends up exact again.

``medium`` is vLLM's (hbm: GPU, host: CPU, disk and redis: STORAGE); ``ownership`` names our
tier (vLLM: "secondary offloading tier identifier"), ``locality`` is LOCAL or REMOTE (a shared
tier). ``token_ids`` stays empty -- events carry no prompt tokens (vLLM's publisher sends them;
a router keyed by block hashes needs none) -- except for the namespaces an operator opted in
(``store.event_token_ids``), whose BlockStored carry every block's tokens.
``parent_block_hash`` is left unset.

Access: bind an ``ipc://`` path (the socket file's permissions decide who reads; an abstract
``ipc://@name`` has none, and needs CURVE as TCP does), or a TCP
address with CURVE (``curve_secret_key``: the publisher's Z85 secret key; subscribers must know
its public key, see :func:`curve_keypair`) -- a subscriber without it receives nothing.
"""

from __future__ import annotations

import logging
import struct
import threading
import time
from collections.abc import Iterable
from typing import Any

from kvstore.errors import InvalidArgument
from kvstore.event_log import CacheEvent
from kvstore.store import TieredStore

log = logging.getLogger("kvstore.events")

#: vLLM's media, by our tier kind
MEDIUM = {"hbm": "GPU", "host": "CPU", "disk": "STORAGE", "redis": "STORAGE"}


def _wire() -> tuple[Any, Any]:
    """pyzmq and msgspec, imported where a publisher starts (the ``events`` extra)."""
    try:
        import msgspec
        import zmq
    except ImportError as e:  # pragma: no cover - the extra is installed in CI
        raise InvalidArgument("publishing vLLM-format KV events needs pyzmq and msgspec",
                              hint="pip install 'kvstore[events]'") from e
    return zmq, msgspec


def curve_keypair() -> tuple[str, str]:
    """A new CURVE key pair, Z85 text: (public, secret). The publisher takes the secret; every
    subscriber sets the public one as its ``curve_serverkey``."""
    zmq, _ = _wire()
    public, secret = zmq.curve_keypair()
    return public.decode(), secret.decode()


class VllmEventPublisher:
    """Follows ``store``'s event log from now on and publishes it on ``endpoint`` (a PUB
    socket it binds) until :meth:`close`. ``block_size``: tokens per block, as the events
    carry it. ``topic``: the first frame of every message (vLLM's ``KVEventsConfig.topic``)."""

    def __init__(self, store: TieredStore, endpoint: str, *, topic: str = "",
                 curve_secret_key: str | None = None, poll_s: float = 0.1,
                 max_events: int = 1024) -> None:
        zmq, msgspec = _wire()
        # an ipc:// path's file permissions decide who connects; Linux's abstract namespace
        # (ipc://@name) has none
        private = endpoint.startswith("ipc://") and not endpoint.startswith("ipc://@")
        if not (private or curve_secret_key is not None):
            raise InvalidArgument(
                f"the KV-events endpoint {endpoint!r} would publish to anyone who connects",
                hint="bind an ipc:// path, or give curve_secret_key (see curve_keypair())")
        self._store, self._topic = store, topic.encode()
        self._block_size = store.layout.block_size
        kinds = {t.name: t.kind for t in store.tiers}
        self._medium = {name: MEDIUM.get(kind, "STORAGE") for name, kind in kinds.items()}
        self._remote = {t.name for t in store.tiers if t.shared}
        self._encode = msgspec.msgpack.Encoder().encode
        # before the socket: a store whose log is off raises with nothing left open
        self._cursor = store.read_events().next_cursor
        self._ctx = zmq.Context.instance()
        self._pub = self._ctx.socket(zmq.PUB)
        try:
            if curve_secret_key is not None:
                self._pub.curve_server = True
                self._pub.curve_secretkey = curve_secret_key.encode()
                self._pub.curve_publickey = zmq.curve_public(curve_secret_key.encode())
            self._pub.bind(endpoint)
        except BaseException:  # a bad key, an address in use: the socket is not left open
            self._pub.close(linger=0)
            raise
        self.endpoint = self._pub.getsockopt_string(zmq.LAST_ENDPOINT)
        self._seq = 0
        self._poll_s, self._max = poll_s, max_events
        self._stop = threading.Event()
        self.sent = 0  # batches sent
        self._thread = threading.Thread(target=self._run, name="kvstore-vllm-events",
                                        daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._pub.close(linger=0)

    def __enter__(self) -> VllmEventPublisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ the loop

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                batch = self._store.read_events(self._cursor, limit=self._max,
                                                timeout_s=self._poll_s)
            except Exception:  # noqa: BLE001 - the store closed: nothing more to publish
                log.debug("KV-events publisher stops: the store's log is gone", exc_info=True)
                return
            if batch.gap:
                snap = self._store.event_snapshot()
                self._send([_cleared(), *self._convert(snap.events)])
                self._cursor = snap.cursor
                continue
            if batch.events:
                self._send(list(self._convert(batch.events)))
            self._cursor = batch.next_cursor
            if batch.closed and not batch.events:
                return

    def _send(self, events: list[dict[str, Any]]) -> None:
        if not events:
            return
        payload = self._encode([time.time(), events, None])
        self._pub.send_multipart((self._topic, self._seq.to_bytes(8, "big"), payload))
        self._seq += 1
        self.sent += 1

    def _convert(self, events: Iterable[CacheEvent]) -> Iterable[dict[str, Any]]:
        for ev in events:
            if ev.kind == "stored":
                yield self._stored(ev.tier, ev.keys, ev.token_ids)
            elif ev.kind == "removed":
                yield self._removed(ev.tier, ev.keys)
            elif ev.kind == "moved":
                yield self._removed(ev.tier, ev.keys)
                assert ev.to_tier is not None
                yield self._stored(ev.to_tier, ev.keys)
            elif ev.kind == "cleared":
                yield _cleared()

    def _where(self, tier: str) -> dict[str, Any]:
        return {"medium": self._medium.get(tier, "STORAGE"), "ownership": tier,
                "locality": "REMOTE" if tier in self._remote else "LOCAL"}

    def _stored(self, tier: str, keys: tuple[bytes, ...],
                token_ids: tuple[bytes, ...] = ()) -> dict[str, Any]:
        # every block's tokens, or none: vLLM's field is one flat list for all the blocks
        tokens = ([t for b in token_ids for t in struct.unpack(f"<{len(b) // 4}i", b)]
                  if token_ids and all(token_ids) else [])
        return {"type": "BlockStored", "block_hashes": list(keys), "parent_block_hash": None,
                "token_ids": tokens, "block_size": self._block_size, "lora_id": None,
                "lora_name": None, **self._where(tier)}

    def _removed(self, tier: str, keys: tuple[bytes, ...]) -> dict[str, Any]:
        return {"type": "BlockRemoved", "block_hashes": list(keys), **self._where(tier)}


def _cleared() -> dict[str, Any]:
    return {"type": "AllBlocksCleared"}


__all__ = ["MEDIUM", "VllmEventPublisher", "curve_keypair"]
