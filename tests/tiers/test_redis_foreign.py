"""Foreign records in the real Redis: well-formed values that are not the page asked for.

A foreign record under a key (another namespace's record with a valid chain, another layout's
record, a zstd record nobody can decode) is a miss for its reader, and must not block the key's
owner: once a read has verified the mismatch, the owner's put overwrites it. And reading a key of
another layout must leave that layout's genuine record alone, whatever its size."""

from __future__ import annotations

import numpy as np
import pytest

from kvstore.keys import BlockMeta
from kvstore.layout import KVLayout
from kvstore.record import RecordMac, encode_header, pack_header, payload_checksum

MAC = RecordMac()  # the tiers' key when no deployment secret is set
from kvstore.store import TieredStore
from kvstore.tiers.redis import CODEC_ZSTD
from tests.redis_servers import RedisServer
from tests.tiers.test_redis import SMALL, chain, corrupt, pages_for, tier

pytestmark = pytest.mark.timeout(120)

SMALL_BF16 = KVLayout(2, 1, 64, 16, "bfloat16")  # same sizes as SMALL, another fingerprint
BIG = KVLayout(8, 1, 64, 16, "float16")  # 32 KiB pages: too large to be a SMALL record


def _name(key: bytes) -> bytes:
    return b"kvstore:" + key.hex().encode()


def _foreign_record(kind: str, meta: BlockMeta) -> bytes:
    """A well-formed record that is not ``meta``'s page of SMALL, for storing under its key."""
    page = pages_for(SMALL, 1, seed=99)[0].tobytes()
    if kind == "other_namespace_valid_chain":  # the owner's key, parent and tokens: chain holds
        other_ns, _ = chain(SMALL, 1, salt="intruder")
        forged = BlockMeta(other_ns.id, meta.key, meta.parent, meta.token_ids)
        return encode_header(forged, SMALL, page, MAC) + page
    if kind == "other_layout":  # another layout's genuine record, copied under this key
        ns, ch = chain(SMALL_BF16, 1)
        return encode_header(ch.meta(0), SMALL_BF16, page, MAC) + page
    assert kind == "undecodable_zstd"  # says zstd, checksum right, not a zstd frame
    junk = b"\x00not a zstd frame" * 64
    header = pack_header(meta, SMALL, junk, MAC, checksum=payload_checksum(junk),
                         flags=CODEC_ZSTD)
    return header + junk


@pytest.mark.parametrize("kind", ["other_namespace_valid_chain", "other_layout",
                                  "undecodable_zstd"])
def test_a_foreign_record_does_not_block_the_owners_put(redis_server: RedisServer, kind: str):
    ns, ch = chain(SMALL, 3)
    pages = pages_for(SMALL, 3)
    r = redis_server.client()
    foreign = _foreign_record(kind, ch.meta(0))
    r.set(_name(ch.keys[0]), foreign)
    red = tier(redis_server)
    store = TieredStore(SMALL, [red])
    try:
        outs = np.zeros_like(pages)
        for _ in range(2):  # the engine's loop: look up, load, recompute and save what missed
            hit = store.lookup(ch.keys).num_blocks
            got = store.get(ns.id, ch.keys[:hit], outs[:hit]) if hit else None
            if got is None or got.num_found < 3:
                store.put(ch.metas(), pages)
        assert store.lookup(ch.keys).num_blocks == 3
        got = store.get(ns.id, ch.keys, outs)
        assert got.num_found == 3 and np.array_equal(outs, pages)
        assert r.get(_name(ch.keys[0])) != foreign  # the owner's page replaced it
        assert sum(corrupt(red).values()) == 1  # one verified mismatch, then the owner's page
    finally:
        store.close()
        red.close()


def test_a_foreign_record_answers_absent_to_the_node_that_verified_it(
    redis_server: RedisServer,
) -> None:
    """After one read found a foreign record, this node's lookups say miss for it (not a hit
    that every get turns into a miss), and its meta() does not vouch for it."""
    ns, ch = chain(SMALL, 2)
    r = redis_server.client()
    r.set(_name(ch.keys[0]), _foreign_record("other_namespace_valid_chain", ch.meta(0)))
    t = tier(redis_server)
    try:
        assert t.read(ns.id, ch.keys[:1], [np.zeros(SMALL.page_bytes, np.uint8)]) == [False]
        assert t.contains(ch.keys[:1]) == [False]
        assert t.count_leading(ch.keys) == 0
        assert t.meta(ch.keys[0]) is None
        assert r.exists(_name(ch.keys[0])) == 1  # left in place: it may be some tenant's page
        page = pages_for(SMALL, 1)[0]
        assert t.write(ch.metas(0, 1), [page]) == [True]
        assert t.contains(ch.keys[:1]) == [True]
        out = np.zeros_like(page)
        assert t.read(ns.id, ch.keys[:1], [out]) == [True] and np.array_equal(out, page)
    finally:
        t.close()


def test_reading_another_layouts_key_keeps_its_record(redis_server: RedisServer) -> None:
    """A BIG page is larger than any SMALL record: a SMALL reader of that key gets a miss,
    counted as another layout's, and the BIG record stays for BIG readers."""
    ns_big, big_chain = chain(BIG, 2)
    big_pages = pages_for(BIG, 2)
    big, small = tier(redis_server, BIG), tier(redis_server, SMALL)
    try:
        assert all(big.write(big_chain.metas(), list(big_pages)))
        out = np.zeros(SMALL.page_bytes, np.uint8)
        assert small.read(ns_big.id, big_chain.keys[:1], [out]) == [False]
        assert redis_server.client().exists(_name(big_chain.keys[0])) == 1
        assert corrupt(small) == {"layout": 1}
        outs = np.zeros_like(big_pages)
        assert big.read(ns_big.id, big_chain.keys, list(outs)) == [True, True]
        assert np.array_equal(outs, big_pages)
    finally:
        big.close()
        small.close()


def test_a_value_too_large_for_any_record_is_still_deleted(redis_server: RedisServer) -> None:
    """Oversized values whose header is damaged, or a genuine header of this layout with a size
    that does not match it, are damage: a miss, and deleted."""
    ns, ch = chain(SMALL, 2)
    pages = pages_for(SMALL, 2)
    t = tier(redis_server)
    r = redis_server.client()
    try:
        assert all(t.write(ch.metas(), list(pages)))
        padding = b"\x00" * (2 * SMALL.page_bytes)
        r.append(_name(ch.keys[0]), padding)  # our header, a value far too long
        r.set(_name(ch.keys[1]), b"\x07" * (3 * SMALL.page_bytes))  # no header at all
        outs = np.zeros_like(pages)
        assert t.read(ns.id, ch.keys, list(outs)) == [False, False]
        assert corrupt(t) == {"length": 1, "magic": 1}
        assert r.exists(*[_name(k) for k in ch.keys]) == 0
    finally:
        t.close()
