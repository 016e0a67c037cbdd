"""Who may read the vLLM-format KV events: an ipc:// socket (file permissions) or CURVE over
TCP; a subscriber without the publisher's key receives nothing, and a plain TCP endpoint is
refused before anything is published."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvstore import InvalidArgument
from server.vllm_events import VllmEventPublisher, curve_keypair
from tests.vllm_events_wire import drain, first_message, store_at, subscriber


def test_a_plain_tcp_endpoint_is_refused(tmp_path: Path) -> None:
    store = store_at(tmp_path)
    try:
        with pytest.raises(InvalidArgument, match="anyone who connects"):
            VllmEventPublisher(store, "tcp://127.0.0.1:*")
    finally:
        store.close()


def test_only_a_subscriber_with_the_key_receives_curve_events(tmp_path: Path) -> None:
    public, secret = curve_keypair()
    store = store_at(tmp_path)
    pub = VllmEventPublisher(store, "tcp://127.0.0.1:*", curve_secret_key=secret)
    keyed = subscriber(pub.endpoint, server_key=public)
    stranger = subscriber(pub.endpoint)  # no CURVE: its handshake fails
    wrong = subscriber(pub.endpoint, server_key=curve_keypair()[0])  # another server's key
    try:
        assert first_message(store, keyed) is not None
        assert drain(stranger, 300) == [] and drain(wrong, 300) == []
    finally:
        for s in (keyed, stranger, wrong):
            s.close(linger=0)
        pub.close()
        store.close()
