"""A store and a subscriber for the tests of server/vllm_events.py: real ZMQ sockets."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from kvstore import KVLayout, Namespace, TieredStore, build_tier

LAYOUT = KVLayout(num_layers=1, num_kv_heads=1, head_dim=16, block_size=4, dtype="float16")
NS = Namespace("vllm-events", LAYOUT)
HOST_PAGES = 4


def store_at(tmp: Path) -> TieredStore:
    return TieredStore(LAYOUT, [
        build_tier({"kind": "host", "capacity": HOST_PAGES * LAYOUT.page_bytes}, LAYOUT),
        build_tier({"kind": "disk", "capacity": 32 * LAYOUT.page_bytes, "path": str(tmp / "d"),
                    "durability": "none"}, LAYOUT),
    ], free_reserve=0.0)


def subscriber(endpoint: str, server_key: str | None = None) -> zmq.Socket:
    sub = zmq.Context.instance().socket(zmq.SUB)
    if server_key is not None:  # a CURVE client: its own throwaway key pair
        public, secret = zmq.curve_keypair()
        sub.curve_serverkey, sub.curve_publickey, sub.curve_secretkey = (
            server_key.encode(), public, secret)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoint)
    return sub


def first_message(store: TieredStore, sub: zmq.Socket, timeout_s: float = 10.0
                  ) -> list[bytes] | None:
    """Put a probe page until the subscriber receives a message (a SUB socket joins late: what
    a publisher sends before the subscription reached it is not delivered); None on timeout."""
    probe = Namespace("probe", LAYOUT)
    deadline, n = time.monotonic() + timeout_s, 0
    while time.monotonic() < deadline:
        chain = probe.chain(list(range(4 * n, 4 * n + 4)))
        store.put(chain.metas(), np.zeros((1, LAYOUT.page_bytes), np.uint8))
        n += 1
        if sub.poll(200):
            return sub.recv_multipart()
    return None


def drain(sub: zmq.Socket, quiet_ms: int = 500) -> list[list[bytes]]:
    """Every message until none arrives for ``quiet_ms``."""
    out = []
    while sub.poll(quiet_ms):
        out.append(sub.recv_multipart())
    return out


def pages(n: int) -> Any:
    return np.random.default_rng(n).integers(0, 256, (n, LAYOUT.page_bytes), np.uint8)
