"""The record format: a tampered record is never returned, whatever was changed; a record
forged without the deployment secret fails its MAC."""

from __future__ import annotations

import struct

import blake3
import xxhash

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from hypothesis import given
from hypothesis import strategies as st

from kvstore import InvalidArgument, KVLayout, Namespace, RecordError
from kvstore.keys import BlockMeta
from kvstore.record import (
    REASONS,
    TAG_BYTES,
    WIRE_CONTEXT,
    WIRE_SEAL_BYTES,
    RecordMac,
    decode_record,
    encode_header,
    header_bytes,
    pack_header,
    parse_header,
    payload_digest,
    stored_meta,
    verify_payload,
    wire_fields,
)
from tests.conftest import random_pages

SECRET = b"a-deployment-secret-of-32-bytes!"
MAC = RecordMac(SECRET)


@pytest.fixture
def record(layout: KVLayout, ns: Namespace) -> tuple[bytes, bytes, bytes]:
    chain = ns.chain(list(range(40)))
    payload = random_pages(layout, 1)[0].tobytes()
    meta = chain.meta(3)
    return encode_header(meta, layout, payload, MAC) + payload, meta.key, payload


def _decode(
    buf: bytes, layout: KVLayout, ns: Namespace, key: bytes, mac: RecordMac = MAC
) -> bytes:
    return bytes(decode_record(buf, layout, mac, namespace_id=ns.id, key=key)[1])


def test_round_trip(record, layout, ns) -> None:
    buf, key, payload = record
    assert _decode(buf, layout, ns, key) == payload
    assert len(buf) == header_bytes(layout) + layout.page_bytes == 132 + 4 * 4 + 256


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
    buf = encode_header(forged, layout, payload, MAC) + payload
    with pytest.raises(RecordError) as info:
        _decode(buf, layout, ns, meta.key)
    assert info.value.reason == "chain"


def test_other_layout(record, ns) -> None:
    buf, key, _ = record
    other = KVLayout(2, 2, 4, 4, "bfloat16")  # same page size, other dtype
    with pytest.raises(RecordError) as info:
        decode_record(buf, other, MAC, namespace_id=ns.id, key=key)
    assert info.value.reason == "layout"


def test_swapped_payloads(layout, ns) -> None:
    chain = ns.chain(list(range(40)))
    p1, p2 = (p.tobytes() for p in random_pages(layout, 2))
    h1 = encode_header(chain.meta(0), layout, p1, MAC)
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
        pack_header(bad, layout, b"x", MAC, checksum=0)


def test_numpy_payload(layout, ns) -> None:
    page = random_pages(layout, 1)[0]
    meta = ns.chain(list(range(8))).meta(1)
    buf = encode_header(meta, layout, page, MAC) + page.tobytes()
    assert np.array_equal(
        np.frombuffer(_decode(buf, layout, ns, meta.key), dtype=np.uint8), page
    )


# --------------------------------------------------------------------- authentication


def _recompute_checksums(rec: bytearray, layout: KVLayout) -> None:
    """What anyone can do: fix both xxh3 checksums after changing the record."""
    hb, n = header_bytes(layout), layout.block_size
    struct.pack_into("<Q", rec, 76, xxhash.xxh3_64_intdigest(bytes(rec[hb:])))
    struct.pack_into("<Q", rec, 108 + 4 * n, xxhash.xxh3_64_intdigest(bytes(rec[: 108 + 4 * n])))


def test_forged_payload_with_recomputed_checksums_fails_the_mac(record, layout, ns) -> None:
    buf, key, payload = record
    forged = bytearray(buf)
    forged[header_bytes(layout) :] = bytes(len(payload))
    _recompute_checksums(forged, layout)
    with pytest.raises(RecordError) as info:
        _decode(bytes(forged), layout, ns, key)
    assert info.value.reason == "mac"


@pytest.mark.parametrize("other", [None, b"another-deployment-secret-123456"])
def test_record_of_another_secret_fails_the_mac(record, layout, ns, other) -> None:
    buf, key, payload = record
    with pytest.raises(RecordError) as info:
        _decode(buf, layout, ns, key, RecordMac(other))
    assert info.value.reason == "mac"
    # ... and a record written without a secret is not accepted where one is set.
    meta = parse_header(buf, layout).meta()
    public = encode_header(meta, layout, payload, RecordMac(other)) + payload
    with pytest.raises(RecordError) as info:
        _decode(public, layout, ns, key)
    assert info.value.reason == "mac"
    assert _decode(public, layout, ns, key, RecordMac(other)) == payload


def test_the_mac_is_aes_gmac_over_header_and_payload(record, layout) -> None:
    """The spec (docs/keys-and-pages.md): tag = AES-256-GCM keyed with BLAKE3 derive_key("kvstore record MAC
    v3", secret), under the record's nonce (header bytes 96+4n..108+4n), no plaintext, every
    header byte before the tag then the stored payload as associated data."""
    buf, _, payload = record
    hb, n = header_bytes(layout), layout.block_size
    nonce = buf[96 + 4 * n: 108 + 4 * n]
    key = blake3.blake3(SECRET, derive_key_context="kvstore record MAC v3").digest()
    expect = AESGCM(key).encrypt(nonce, b"", buf[: hb - TAG_BYTES] + payload)
    assert buf[hb - TAG_BYTES : hb] == expect
    public = blake3.blake3(b"", derive_key_context="kvstore record MAC v3").digest()
    buf2 = encode_header(parse_header(buf, layout).meta(), layout, payload, RecordMac(None))
    assert buf2[-TAG_BYTES:] == AESGCM(public).encrypt(
        buf2[96 + 4 * n: 108 + 4 * n], b"", buf2[:-TAG_BYTES] + payload)


def test_a_wire_seal_is_aes_gmac_of_the_context_fields_and_page(ns) -> None:
    """The daemon's wire (docs/keys-and-pages.md): seal = nonce (12 random bytes) || AES-256-GCM tag under the
    records' key and that nonce, no plaintext, WIRE_CONTEXT || fields || page as associated
    data; any change to the fields, the page or the seal, or another secret, fails it."""
    page = np.arange(256, dtype=np.uint8)
    chain = ns.chain(list(range(8)))
    fields = wire_fields(b"R", ns.id, chain.keys[0])
    seal = MAC.seal(fields, page)
    assert len(seal) == WIRE_SEAL_BYTES == 28
    key = blake3.blake3(SECRET, derive_key_context="kvstore record MAC v3").digest()
    assert seal[12:] == AESGCM(key).encrypt(seal[:12], b"", WIRE_CONTEXT + fields + page.tobytes())
    assert MAC.verify_seal(fields, page, seal)
    assert MAC.seal(fields, page)[:12] != seal[:12]  # a fresh nonce per page
    flipped = page.copy()
    flipped[3] ^= 1
    assert not MAC.verify_seal(fields, flipped, seal)
    assert not MAC.verify_seal(wire_fields(b"W", ns.id, chain.keys[0]), page, seal)
    assert not MAC.verify_seal(wire_fields(b"R", ns.id, chain.keys[1]), page, seal)
    for i in (0, 13, 27):
        assert not MAC.verify_seal(fields, page, seal[:i] + bytes([seal[i] ^ 1]) + seal[i + 1:])
    assert not MAC.verify_seal(fields, page, seal[:-1])
    assert not MAC.verify_seal(fields, page, b"")
    assert not RecordMac(None).verify_seal(fields, page, seal)
    assert not RecordMac(b"another-secret-0123456789").verify_seal(fields, page, seal)


def test_every_record_gets_its_own_nonce(record, layout) -> None:
    """Two records of the same page never share a nonce (GMAC's security rests on it)."""
    buf, _, payload = record
    n = layout.block_size
    meta = parse_header(buf, layout).meta()
    nonces = {encode_header(meta, layout, payload, MAC)[96 + 4 * n: 108 + 4 * n]
              for _ in range(64)}
    assert len(nonces) == 64 and buf[96 + 4 * n: 108 + 4 * n] not in nonces


def test_a_version_2_record_reads_as_a_version_miss(record, layout, ns) -> None:
    buf, key, _ = record
    old = bytearray(buf)
    struct.pack_into("<H", old, 4, 2)
    with pytest.raises(RecordError) as info:
        _decode(bytes(old), layout, ns, key)
    assert info.value.reason == "version"


def test_streaming_digest_agrees_with_the_whole_payload(record, layout) -> None:
    buf, _, payload = record
    hb = header_bytes(layout)
    header = parse_header(buf, layout)
    digest = payload_digest(MAC, buf[:hb])
    for i in range(0, len(payload), 7):  # fed piece by piece, as the Redis tier receives it
        digest.update(memoryview(payload)[i : i + 7])
    verify_payload(header, payload, MAC, digest)
    damaged = payload[:-1] + bytes([payload[-1] ^ 1])
    wrong = payload_digest(MAC, buf[:hb])
    wrong.update(damaged)
    with pytest.raises(RecordError) as info:  # a failed MAC is named by the checksum: damage
        verify_payload(header, damaged, MAC, wrong)
    assert info.value.reason == "payload_checksum"


def test_records_of_format_v1_read_as_version(record, layout, ns) -> None:
    buf, key, _ = record
    old = bytearray(buf)
    struct.pack_into("<H", old, 4, 1)
    _recompute_checksums(old, layout)
    with pytest.raises(RecordError) as info:
        _decode(bytes(old), layout, ns, key)
    assert info.value.reason == "version"


def test_the_secret_is_in_no_repr_or_message(record, layout, ns) -> None:
    assert "mac" in REASONS
    for text in (repr(MAC), str(MAC), repr(RecordMac(None))):
        assert SECRET.decode() not in text and SECRET.hex() not in text
    assert "authenticated=True" in repr(MAC) and "authenticated=False" in repr(RecordMac(None))
    buf, key, _ = record
    with pytest.raises(RecordError) as info:
        _decode(buf, layout, ns, key, RecordMac(b"another-deployment-secret-123456"))
    assert SECRET.decode() not in str(info.value) + info.value.hint
    with pytest.raises(TypeError):
        import pickle

        pickle.dumps(MAC)


def test_secret_must_be_bytes_of_some_length() -> None:
    with pytest.raises(InvalidArgument):
        RecordMac(b"short")
    with pytest.raises(InvalidArgument):
        RecordMac("a-str-not-bytes-of-32-characters")  # type: ignore[arg-type]


# --------------------------------------------------------------------- the MAC pool


@pytest.mark.parametrize(("cores", "threads"), [(1, 0), (2, 0), (3, 0), (4, 2), (16, 8), (64, 8)])
def test_the_mac_pool_is_sized_by_the_cores(cores: int, threads: int) -> None:
    from kvstore import record

    assert record.default_mac_threads(cores) == threads


def test_no_pool_for_no_threads_or_one_page() -> None:
    from kvstore import record

    assert record.mac_pool(0) is None and record.mac_jobs(8, 0) is None
    assert record.mac_jobs(1, 2) is None  # one page: hashed where it moves
    assert record.mac_pool(2) is record.mac_pool(2)  # one per process and size


def test_mac_jobs_verify_like_the_calling_thread(layout: KVLayout, ns: Namespace) -> None:
    """The pool's results are the calling thread's: a damaged payload in the middle fails, the
    others pass; a block that raises leaves no job running."""
    from kvstore import record

    chain = ns.chain(list(range(5 * layout.block_size)))
    payloads = random_pages(layout, 5)
    heads = [parse_header(encode_header(m, layout, p, MAC), layout)
             for m, p in zip(chain.metas(), payloads)]
    payloads[2, 7] ^= 1

    def check(i: int) -> str | None:
        try:
            verify_payload(heads[i], payloads[i], MAC)
        except RecordError as exc:
            return exc.reason
        return None

    jobs = record.mac_jobs(5, 2)
    assert jobs is not None
    with jobs:
        for i in range(5):
            jobs.start(i, check, i)
    assert dict(jobs.results()) == {0: None, 1: None, 2: "payload_checksum", 3: None, 4: None}
    jobs = record.mac_jobs(5, 2)
    assert jobs is not None
    with pytest.raises(KeyError), jobs:
        for i in range(5):
            jobs.start(i, check, i)
        raise KeyError("the call failed")
    assert jobs.done()


# --------------------------------------------------------------------- token ids (record v4)


@pytest.fixture
def tokenless(layout: KVLayout, ns: Namespace) -> tuple[bytes, bytes, bytes]:
    """A record as the tiers write it by default: no token ids."""
    meta = stored_meta(ns.chain(list(range(1000, 1040))).meta(3), False)
    payload = random_pages(layout, 1)[0].tobytes()
    return encode_header(meta, layout, payload, MAC) + payload, meta.key, payload


def test_a_record_without_token_ids_holds_none_and_reads_back(tokenless, layout, ns) -> None:
    buf, key, payload = tokenless
    tokens = ns.chain(list(range(1000, 1040))).meta(3).token_ids
    n = layout.block_size
    assert len(buf) == header_bytes(layout) + len(payload)  # one record size either way
    assert tokens not in buf
    assert struct.unpack_from("<I", buf, 84)[0] == 0 and buf[92 : 92 + 4 * n] == bytes(4 * n)
    assert _decode(buf, layout, ns, key) == payload
    header = parse_header(buf, layout)
    assert header.token_ids == b"" and header.chains()
    assert header.meta() == BlockMeta(ns.id, key, ns.chain(list(range(1000, 1040))).keys[2], b"")


def test_stored_meta_drops_token_ids_unless_configured(ns) -> None:
    meta = ns.chain(list(range(8))).meta(1)
    assert stored_meta(meta, True) is meta
    assert stored_meta(meta, False) == BlockMeta(meta.namespace_id, meta.key, meta.parent, b"")
    assert stored_meta(stored_meta(meta, False), True).token_ids == b""


def test_a_record_without_token_ids_under_another_namespace_or_key(tokenless, layout) -> None:
    """Without tokens there is no chain to check: the authenticated namespace and key are the
    identity, and either differing from what was asked for is a miss."""
    buf, key, _ = tokenless
    other = Namespace("test-model", layout, "tenant-b")
    with pytest.raises(RecordError) as info:
        _decode(buf, layout, other, key)
    assert info.value.reason == "namespace"
    with pytest.raises(RecordError) as info:
        _decode(buf, layout, other, bytes(16))
    assert info.value.reason == "namespace"
    with pytest.raises(RecordError) as info:
        decode_record(buf, layout, MAC, namespace_id=None, key=bytes(16))
    assert info.value.reason == "key"


@pytest.mark.parametrize("field, offset", [("namespace", 12), ("key", 36), ("parent", 52)])
def test_a_rewritten_identity_without_token_ids_fails_the_mac(
    tokenless, layout, ns, field: str, offset: int
) -> None:
    """Someone without the secret who rewrites the namespace, key or parent of a record that
    carries no tokens (checksums recomputed) gets a ``mac`` miss, whatever they ask for."""
    buf, key, _ = tokenless
    forged = bytearray(buf)
    forged[offset : offset + 16] = bytes(range(16))
    _recompute_checksums(forged, layout)
    for asked_ns, asked_key in ((ns.id, key), (None, bytes(forged[36:52]))):
        with pytest.raises(RecordError) as info:
            decode_record(bytes(forged), layout, MAC, namespace_id=asked_ns, key=asked_key)
        assert info.value.reason == "mac", field


def test_token_ids_are_all_or_none(layout, ns) -> None:
    meta = ns.chain(list(range(8))).meta(0)
    rec = bytearray(encode_header(meta, layout, b"x", MAC) + b"x")
    struct.pack_into("<I", rec, 84, 1)  # a count no writer writes
    _recompute_checksums(rec, layout)
    with pytest.raises(RecordError) as info:
        decode_record(bytes(rec), layout, MAC, namespace_id=ns.id, key=meta.key)
    assert info.value.reason == "layout"


@pytest.mark.parametrize("store_token_ids", [False, True])
def test_version_3_records_read_as_a_version_miss(layout, ns, store_token_ids: bool) -> None:
    """v3 always stored token ids in clear; v4 reads it as a ``version`` miss (recomputed once),
    never serving on a record that holds a prompt the configuration says not to keep."""
    meta = stored_meta(ns.chain(list(range(8))).meta(1), store_token_ids)
    payload = random_pages(layout, 1)[0].tobytes()
    old = bytearray(encode_header(meta, layout, payload, MAC) + payload)
    struct.pack_into("<H", old, 4, 3)
    _recompute_checksums(old, layout)
    with pytest.raises(RecordError) as info:
        _decode(bytes(old), layout, ns, meta.key)
    assert info.value.reason == "version"
