"""The record format: a tampered record is never returned, whatever was changed."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvstore import KVLayout, Namespace, RecordError
from kvstore.record import (
    REASONS,
    decode_record,
    encode_header,
    header_bytes,
    pack_header,
    parse_header,
)
from tests.conftest import random_pages


@pytest.fixture
def record(layout: KVLayout, ns: Namespace) -> tuple[bytes, bytes, bytes]:
    chain = ns.chain(list(range(40)))
    payload = random_pages(layout, 1)[0].tobytes()
    meta = chain.meta(3)
    return encode_header(meta, layout, payload) + payload, meta.key, payload


def _decode(buf: bytes, layout: KVLayout, ns: Namespace, key: bytes) -> bytes:
    return bytes(decode_record(buf, layout, namespace_id=ns.id, key=key)[1])


def test_round_trip(record, layout, ns) -> None:
    buf, key, payload = record
    assert _decode(buf, layout, ns, key) == payload
    assert len(buf) == header_bytes(layout) + layout.page_bytes == 104 + 4 * 4 + 256


@given(bit=st.integers(min_value=0))
def test_any_bit_flip_is_detected(record, layout, ns, bit: int) -> None:
    buf, key, _ = record
    bit %= len(buf) * 8
    damaged = bytearray(buf)
    damaged[bit // 8] ^= 1 << (bit % 8)
    with pytest.raises(RecordError) as info:
        _decode(bytes(damaged), layout, ns, key)
    assert info.value.reason in REASONS


@given(cut=st.integers(min_value=0))
def test_truncation_is_detected(record, layout, ns, cut: int) -> None:
    buf, key, _ = record
    with pytest.raises(RecordError):
        _decode(buf[: cut % len(buf)], layout, ns, key)


def test_extra_bytes_are_detected(record, layout, ns) -> None:
    buf, key, _ = record
    with pytest.raises(RecordError, match="payload"):
        _decode(buf + b"\0", layout, ns, key)


def test_zeroed_record(record, layout, ns) -> None:
    buf, key, _ = record
    with pytest.raises(RecordError) as info:
        _decode(bytes(len(buf)), layout, ns, key)
    assert info.value.reason == "magic"


def test_wrong_namespace(record, layout, ns) -> None:
    buf, key, _ = record
    other = Namespace("test-model", layout, "tenant-b")
    with pytest.raises(RecordError) as info:
        _decode(buf, layout, other, key)
    assert info.value.reason == "namespace"


def test_other_key_asked(record, layout, ns) -> None:
    buf, _, _ = record
    with pytest.raises(RecordError) as info:
        _decode(buf, layout, ns, ns.chain(list(range(40))).keys[0])
    assert info.value.reason == "key"


def test_wrong_tokens_even_with_a_valid_header_checksum(layout, ns) -> None:
    """An attacker who rewrites the tokens and recomputes every checksum is still caught:
    the key no longer hashes from parent || tokens."""
    chain = ns.chain(list(range(40)))
    meta = chain.meta(2)
    forged = type(meta)(meta.namespace_id, meta.key, meta.parent, struct.pack("<4i", 9, 9, 9, 9))
    payload = random_pages(layout, 1)[0].tobytes()
    buf = encode_header(forged, layout, payload) + payload
    with pytest.raises(RecordError) as info:
        _decode(buf, layout, ns, meta.key)
    assert info.value.reason == "chain"


def test_other_layout(record, ns) -> None:
    buf, key, _ = record
    other = KVLayout(2, 2, 4, 4, "bfloat16")  # same page size, other dtype
    with pytest.raises(RecordError) as info:
        decode_record(buf, other, namespace_id=ns.id, key=key)
    assert info.value.reason == "layout"


def test_swapped_payloads(layout, ns) -> None:
    chain = ns.chain(list(range(40)))
    p1, p2 = (p.tobytes() for p in random_pages(layout, 2))
    h1 = encode_header(chain.meta(0), layout, p1)
    with pytest.raises(RecordError) as info:
        _decode(h1 + p2, layout, ns, chain.keys[0])
    assert info.value.reason == "payload_checksum"


def test_header_fields(record, layout) -> None:
    buf, key, payload = record
    header = parse_header(buf, layout)
    assert header.key == key and header.payload_bytes == len(payload) and header.codec == 0
    assert header.meta().verify_chain()


def test_pack_rejects_wrong_token_count(layout, ns) -> None:
    meta = ns.chain(list(range(40))).meta(0)
    bad = type(meta)(meta.namespace_id, meta.key, meta.parent, meta.token_ids[:-4])
    with pytest.raises(ValueError, match="tokens"):
        pack_header(bad, layout, payload_bytes=1, checksum=0)


def test_numpy_payload(layout, ns) -> None:
    page = random_pages(layout, 1)[0]
    meta = ns.chain(list(range(8))).meta(1)
    buf = encode_header(meta, layout, page) + page.tobytes()
    assert np.array_equal(
        np.frombuffer(_decode(buf, layout, ns, meta.key), dtype=np.uint8), page
    )
