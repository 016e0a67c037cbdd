"""No decision uses a record header read back from Redis before the record's MAC has verified
it (DESIGN: Security). Someone who can write to Redis but lacks the deployment secret rewrites
the namespace in a genuine record's header -- and recomputes the header checksum, as anyone can
-- so that it claims another namespace. Then:

* ``meta()`` does not vouch for it (None), and counts it as a ``mac`` failure;
* flushing the namespace it now claims (the admin API's flush: SCAN of Redis, each key's
  header, then a delete by key from every tier) leaves the genuine owner's page on the local
  disk tier alone, while the flushed namespace's own pages are gone from every tier;
* a read of it is a ``mac`` miss (not a well-formed record of another namespace), and the
  value is deleted like any damaged one.

Real redis-server, real slab file and LMDB index; the attacker edits Redis with redis-py."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
import xxhash

from kvstore.keys import Namespace
from kvstore.layout import KVLayout
from kvstore.record import RecordMac, header_bytes, parse_header, stored_meta
from kvstore.store import TieredStore
from kvstore.tiers.disk import DiskTier
from kvstore.tiers.redis import RedisTier
from tests.redis_servers import RedisServer
from tests.tiers.test_redis import corrupt

pytestmark = pytest.mark.timeout(120)

LAYOUT = KVLayout(2, 1, 64, 16, "float16")  # 8 KiB pages
SECRET = b"a-deployment-secret-of-32-bytes!"
_NS = 12  # offset of the namespace id in a record header (record.py)
_HDR_CSUM = 108 + 4 * LAYOUT.block_size  # offset of the header checksum


def _name(key: bytes) -> bytes:
    return b"kvstore:" + key.hex().encode()


def _claim(value: bytes, namespace_id: bytes, *, fix_checksum: bool = True) -> bytes:
    """``value`` (a stored record) with its header's namespace rewritten to ``namespace_id``,
    the header checksum recomputed; the MAC is left as it was (the attacker lacks the key)."""
    rec = bytearray(value)
    rec[_NS:_NS + 16] = namespace_id
    if fix_checksum:
        struct.pack_into("<Q", rec, _HDR_CSUM, xxhash.xxh3_64_intdigest(bytes(rec[:_HDR_CSUM])))
    return bytes(rec)


def _chains():  # noqa: ANN202
    a, b = Namespace("m", LAYOUT, "tenant-a"), Namespace("m", LAYOUT, "tenant-b")
    tokens = np.arange(3 * LAYOUT.block_size) % 32000
    return (a, a.chain(tokens)), (b, b.chain(tokens))


def _pages(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, LAYOUT.page_bytes), dtype=np.uint8)


def _redis(server: RedisServer) -> RedisTier:
    return RedisTier.build("redis", LAYOUT, 100, url=server.url, timeout_s=5.0, mac=RecordMac(SECRET))


def _disk(path: Path) -> DiskTier:
    return DiskTier.build("disk", LAYOUT, 16, path=path, check_index=False, durability="none",
                    mac=RecordMac(SECRET))


@pytest.mark.parametrize("fix_checksum", [True, False])
def test_meta_does_not_vouch_for_a_rewritten_header(
    redis_server: RedisServer, fix_checksum: bool
) -> None:
    (a, _), (b, chb) = _chains()
    r = redis_server.client()
    writer = _redis(redis_server)
    try:
        assert all(writer.write(chb.metas(), list(_pages(3, 0))))
    finally:
        writer.close()
    name = _name(chb.keys[1])
    r.set(name, _claim(r.get(name), a.id, fix_checksum=fix_checksum))
    if fix_checksum:  # a well-formed header, that names tenant A
        assert parse_header(r.get(name)[: header_bytes(LAYOUT)], LAYOUT).namespace_id == a.id
    t = _redis(redis_server)  # another node (or this one restarted): nothing cached
    try:
        # a genuine header is vouched for (as stored: without token ids)
        assert t.meta(chb.keys[0]) == stored_meta(chb.meta(0), False)
        assert t.meta(chb.keys[1]) is None
        assert corrupt(t) == {"mac" if fix_checksum else "header_checksum": 1}
        assert t.meta(chb.keys[2]) == stored_meta(chb.meta(2), False)
        assert t.contains(chb.keys) == [True, False, True]  # its owner's next put rewrites it
    finally:
        t.close()


def test_a_read_of_a_rewritten_header_is_a_mac_miss(redis_server: RedisServer) -> None:
    """Whoever reads it -- its owner, or the namespace it now claims -- gets a miss counted as
    ``mac``, and the damaged value is deleted."""
    (a, cha), (b, chb) = _chains()
    r = redis_server.client()
    t = _redis(redis_server)
    try:
        assert all(t.write(chb.metas(), list(_pages(3, 0))))
        for i, reader in ((1, b), (2, a)):
            name = _name(chb.keys[i])
            r.set(name, _claim(r.get(name), a.id))
            out = np.zeros(LAYOUT.page_bytes, np.uint8)
            assert t.read(reader.id, chb.keys[i:i + 1], [out]) == [False]
            assert r.exists(name) == 0
        assert corrupt(t) == {"mac": 2}
    finally:
        t.close()


def test_a_flush_does_not_delete_a_page_whose_redis_header_claims_the_namespace(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    from server.admin.service import AdminService

    (a, cha), (b, chb) = _chains()
    pages_a, pages_b = _pages(3, 1), _pages(3, 2)
    path = tmp_path / "disk"
    # Node 1 saves both tenants' prefixes: on its disk tier and, written through, in Redis.
    with TieredStore(LAYOUT, [_disk(path), _redis(redis_server)],
                     write_policy="write_through") as store:
        store.put(cha.metas(), pages_a)
        store.put(chb.metas(), pages_b)
        store.drain()
        assert store.tiers[0].contains(cha.keys + chb.keys) == [True] * 6
        assert store.tiers[1].contains(cha.keys + chb.keys) == [True] * 6
    # The attacker rewrites tenant B's records in Redis to claim tenant A.
    r = redis_server.client()
    for k in chb.keys:
        r.set(_name(k), _claim(r.get(_name(k)), a.id))
    # Node 1 restarts (warm disk, nothing cached about Redis) and flushes tenant A.
    disk, red = _disk(path), _redis(redis_server)
    with TieredStore(LAYOUT, [disk, red], write_policy="write_through") as store:
        admin = AdminService(store)
        try:
            job = admin.wait_flush(admin.start_flush(a.id).id)
        finally:
            admin.close()
        assert job.state == "done", job.error
        # Tenant A's pages are gone from every tier ...
        assert disk.contains(cha.keys) == [False] * 3
        assert r.exists(*[_name(k) for k in cha.keys]) == 0
        # ... tenant B's genuine pages are still on the disk tier, and read back intact.
        assert disk.contains(chb.keys) == [True] * 3
        outs = np.zeros_like(pages_b)
        assert disk.read(b.id, chb.keys, list(outs)) == [True] * 3
        assert np.array_equal(outs, pages_b)
        got = store.get(b.id, chb.keys, np.zeros_like(pages_b))
        assert got.num_found == 3
        # The rewritten headers were counted, not trusted.
        assert corrupt(red) == {"mac": 3}
        assert corrupt(disk) == {}
