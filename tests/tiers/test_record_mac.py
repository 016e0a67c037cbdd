"""Records on shared tiers are authenticated: someone who can write to the shared Redis or the
disk tier's files, but does not hold the deployment secret, cannot have a page of theirs served
as a verified hit. Real redis-server, real slab file and LMDB index; the attacker edits the
stored bytes directly, as they could.

The attacker keeps the victim's genuine header (namespace, key, parent and tokens, so the key
chain verifies), puts its own page behind it and recomputes both xxh3 checksums — everything a
non-cryptographic checksum offers. Where it holds a key of its own (another deployment's secret,
or none: the public key) it also re-tags the record with it. (A missed read's buffer holds
unspecified bytes by the tier contract — here the forged page, received in place — so what is
asserted is the miss.)
"""

from __future__ import annotations

import logging
import os
import struct
import threading
import time
from pathlib import Path

import lmdb
import numpy as np
import pytest
import xxhash

from kvstore.keys import Namespace
from kvstore.layout import KVLayout
from kvstore import record
from kvstore.record import RecordMac, encode_header, header_bytes, parse_header
from kvstore.tiers import disk_io, disk_slab, redis_records
from kvstore.tiers.disk import DiskTier
from kvstore.tiers.redis import RedisTier
from tests.redis_servers import RedisServer
from tests.tiers.test_redis import corrupt

pytestmark = pytest.mark.timeout(120)

LAYOUT = KVLayout(2, 2, 64, 16, "float16")  # 16 KiB pages: straight to disk under O_DIRECT
SECRET_A = b"deployment-A-secret-0123456789abcdef"
SECRET_B = b"deployment-B-secret-0123456789abcdef"
_HDR_CSUM = 108 + 4 * LAYOUT.block_size  # offset of the header checksum (record.py)


def pages(n: int, seed: int) -> np.ndarray:
    out = disk_io.aligned_empty(n * LAYOUT.page_bytes).reshape(n, LAYOUT.page_bytes)
    out[:] = np.random.default_rng(seed).integers(0, 256, out.shape, dtype=np.uint8)
    return out


def victim_chain():  # noqa: ANN201
    ns = Namespace("victim-model", LAYOUT, "tenant-v")
    return ns, ns.chain(np.arange(3 * LAYOUT.block_size) % 32000)


def forge(header: bytes, page: bytes, attacker_key: str) -> bytes:
    """The victim's ``header`` around the attacker's ``page``. ``attacker_key``: "none" (only
    the checksums are recomputed), "public" (also a MAC under the no-secret key) or "other"
    (a MAC under another deployment's secret)."""
    if attacker_key == "none":
        rec = bytearray(header)
        struct.pack_into("<Q", rec, 76, xxhash.xxh3_64_intdigest(page))
        struct.pack_into("<Q", rec, _HDR_CSUM, xxhash.xxh3_64_intdigest(bytes(rec[:_HDR_CSUM])))
        return bytes(rec) + page
    mac = RecordMac(None if attacker_key == "public" else SECRET_B)
    meta = parse_header(header, LAYOUT).meta()
    return encode_header(meta, LAYOUT, page, mac) + page


# --------------------------------------------------------------------- redis


def redis_tier(server: RedisServer, secret: bytes | None) -> RedisTier:
    return RedisTier.build("redis", LAYOUT, 100, url=server.url, timeout_s=5.0, mac=RecordMac(secret))


@pytest.mark.parametrize("attacker_key", ["none", "public", "other"])
def test_redis_forged_page_is_a_counted_miss(redis_server: RedisServer, attacker_key: str) -> None:
    ns, ch = victim_chain()
    genuine, evil = pages(3, 0), pages(1, 1)[0]
    t = redis_tier(redis_server, SECRET_A)
    r = redis_server.client()
    name = b"kvstore:" + ch.keys[1].hex().encode()
    try:
        assert t.write(ch.metas(), list(genuine)) == [True] * 3
        stored = r.get(name)
        r.set(name, forge(stored[: header_bytes(LAYOUT)], evil.tobytes(), attacker_key))
        outs = pages(3, 2)
        assert t.read(ns.id, ch.keys, list(outs)) == [True, False, True]
        assert corrupt(t) == {"mac": 1}
        assert np.array_equal(outs[0], genuine[0]) and np.array_equal(outs[2], genuine[2])
        assert r.exists(name) == 0  # a forged record is deleted like a damaged one
    finally:
        t.close()


def test_redis_record_of_another_secret_is_a_counted_miss(redis_server: RedisServer) -> None:
    ns, ch = victim_chain()
    genuine = pages(3, 0)
    a, b = redis_tier(redis_server, SECRET_A), redis_tier(redis_server, SECRET_B)
    try:
        assert all(a.write(ch.metas(), list(genuine)))
        outs = pages(3, 2)
        assert b.read(ns.id, ch.keys, list(outs)) == [False] * 3
        assert corrupt(b) == {"mac": 3}
        # (B deleted what it could not authenticate; A rewrites and reads its own again.)
        assert all(a.write(ch.metas(), list(genuine)))
        assert a.read(ns.id, ch.keys, list(outs)) == [True] * 3
        assert np.array_equal(outs, genuine) and corrupt(a) == {}
    finally:
        a.close()
        b.close()


def test_redis_compressed_records_are_authenticated(redis_server: RedisServer) -> None:
    """A compressed record (another size, read on the slow path) is checked the same way."""
    ns, ch = victim_chain()
    genuine = np.zeros((3, LAYOUT.page_bytes), np.uint8)  # compresses
    a = RedisTier.build("redis", LAYOUT, 100, url=redis_server.url, compression="zstd",
                  mac=RecordMac(SECRET_A))
    b = redis_tier(redis_server, SECRET_B)
    try:
        assert all(a.write(ch.metas(), list(genuine)))
        assert redis_server.client().strlen(b"kvstore:" + ch.keys[0].hex().encode()) < 4096
        outs = pages(3, 2)
        assert b.read(ns.id, ch.keys[:1], list(outs[:1])) == [False]
        assert corrupt(b) == {"mac": 1}
        assert a.read(ns.id, ch.keys[1:], list(outs[1:])) == [True, True]
        assert not outs[1:].any()
    finally:
        a.close()
        b.close()


# --------------------------------------------------------------------- disk


def disk_tier(path: Path, secret: bytes | None) -> DiskTier:
    return DiskTier.build("disk", LAYOUT, 8, path=path, check_index=False, durability="none",
                    mac=RecordMac(secret))


def forge_on_disk(path: Path, slot: int, key: bytes, evil: bytes, attacker_key: str) -> None:
    """Rewrite slot ``slot``'s record in the slab file with the attacker's page, and the
    index's copy of the payload checksum, while no tier has the directory open."""
    probe = disk_tier(path, None)  # only for the slab geometry
    S, hb = probe.slot_bytes, header_bytes(LAYOUT)
    probe.close()
    H = S - disk_io.round_up(LAYOUT.page_bytes)
    fd = os.open(path / "slots.dat", os.O_RDWR)
    try:
        header = os.pread(fd, hb, slot * S)
        rec = forge(header, evil, attacker_key)
        os.pwrite(fd, rec[:hb], slot * S)
        os.pwrite(fd, rec[hb:], slot * S + H)
    finally:
        os.close(fd)
    env = lmdb.open(str(path / "index"), subdir=True, max_dbs=4)
    try:
        db = env.open_db(b"pages")
        with env.begin(write=True, db=db) as txn:
            value = bytearray(txn.get(key))
            struct.pack_into("<Q", value, 8, xxhash.xxh3_64_intdigest(evil))
            txn.put(key, bytes(value))
    finally:
        env.close()


@pytest.mark.parametrize("attacker_key", ["none", "public", "other"])
def test_disk_forged_page_is_a_counted_miss(tmp_path: Path, attacker_key: str) -> None:
    ns, ch = victim_chain()
    genuine, evil = pages(3, 0), pages(1, 1)[0]
    path = tmp_path / "disk"
    t = disk_tier(path, SECRET_A)
    assert t.write(ch.metas(), list(genuine)) == [True] * 3
    slot = t.slot_of(ch.keys[1])
    t.close()
    assert slot is not None
    forge_on_disk(path, slot, ch.keys[1], evil.tobytes(), attacker_key)
    t = disk_tier(path, SECRET_A)
    try:
        outs = pages(3, 2)
        assert t.read(ns.id, ch.keys, list(outs)) == [True, False, True]
        assert corrupt(t) == {"mac": 1}
        assert np.array_equal(outs[0], genuine[0]) and np.array_equal(outs[2], genuine[2])
        assert t.used_pages == 2  # dropped
    finally:
        t.close()


@pytest.mark.parametrize("reader", ["same secret", "another secret"])
def test_disk_records_after_a_restart_under_the_same_or_another_secret(
    tmp_path: Path, reader: str
) -> None:
    ns, ch = victim_chain()
    genuine = pages(3, 0)
    path = tmp_path / "disk"
    with disk_tier(path, SECRET_A) as t:
        assert all(t.write(ch.metas(), list(genuine)))
    same = reader == "same secret"
    with disk_tier(path, SECRET_A if same else SECRET_B) as t:
        outs = pages(3, 2)
        assert t.read(ns.id, ch.keys, list(outs)) == [same] * 3
        if same:
            assert np.array_equal(outs, genuine) and corrupt(t) == {}
        else:
            assert corrupt(t) == {"mac": 3} and t.used_pages == 0


# --------------------------------------------------------------------- verified in parallel
#
# A batch's pages are hashed on several threads (the MAC pool for Redis, on here whatever the
# cores; the I/O workers for disk): a forged page in the middle of a batch is still a counted
# miss, its neighbours still verified hits, and nothing raises.

BATCH = 7  # within the 8 slots that forge_on_disk opens the tier with
MIDDLE = 3


def batch_chain():  # noqa: ANN201
    ns = Namespace("victim-model", LAYOUT, "tenant-v")
    return ns, ns.chain(np.arange(BATCH * LAYOUT.block_size) % 32000)


def spy_threads(monkeypatch: pytest.MonkeyPatch, module: object) -> set[str]:
    """Names of the threads that run ``module.verify_payload`` from now on."""
    names: set[str] = set()
    real = record.verify_payload

    def spy(*args: object, **kwargs: object) -> None:
        names.add(threading.current_thread().name)
        # hold the worker a little: the pool's idle workers take the batch's other pages (on a
        # loaded 2-core machine one worker could otherwise drain the queue before another woke)
        time.sleep(0.02)
        real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(module, "verify_payload", spy)
    return names


@pytest.mark.parametrize("attacker_key", ["none", "other"])
def test_redis_parallel_verification_catches_a_forged_page_mid_batch(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch, attacker_key: str
) -> None:
    ns, ch = batch_chain()
    genuine, evil = pages(BATCH, 0), pages(1, 1)[0]
    t = RedisTier.build("redis", LAYOUT, 100, url=redis_server.url, timeout_s=5.0,
                  mac=RecordMac(SECRET_A), mac_threads=3)
    r = redis_server.client()
    name = b"kvstore:" + ch.keys[MIDDLE].hex().encode()
    try:
        assert t.write(ch.metas(), list(genuine)) == [True] * BATCH  # headers from the pool
        stored = r.get(name)
        r.set(name, forge(stored[: header_bytes(LAYOUT)], evil.tobytes(), attacker_key))
        threads = spy_threads(monkeypatch, redis_records)
        outs = pages(BATCH, 2)
        want = [i != MIDDLE for i in range(BATCH)]
        assert t.read(ns.id, ch.keys, list(outs)) == want
        assert threads and all(n.startswith("kvstore-mac") for n in threads)
        assert corrupt(t) == {"mac": 1}
        for i in range(BATCH):
            if i != MIDDLE:
                assert np.array_equal(outs[i], genuine[i])
        assert r.exists(name) == 0  # deleted like a damaged record
        assert t.read(ns.id, ch.keys, list(outs)) == want  # now simply absent
        assert corrupt(t) == {"mac": 1}
    finally:
        t.close()


def test_redis_records_from_the_pool_read_without_it_and_back(redis_server: RedisServer) -> None:
    """Headers tagged on the pool are the ones the calling thread tags, and the other way round
    (raw and compressed records)."""
    ns, ch = batch_chain()
    genuine = pages(BATCH, 0)
    genuine[::2] = 0  # every other page compresses: records of both sizes in one batch

    def tier(threads: int) -> RedisTier:
        return RedisTier.build("redis", LAYOUT, 100, url=redis_server.url, compression="zstd",
                         mac=RecordMac(SECRET_A), mac_threads=threads)

    for writer, reader in ((tier(3), tier(0)), (tier(0), tier(3))):
        try:
            assert all(writer.write(ch.metas(), list(genuine)))
            outs = pages(BATCH, 2)
            assert reader.read(ns.id, ch.keys, list(outs)) == [True] * BATCH
            assert np.array_equal(outs, genuine) and corrupt(reader) == {}
            writer.delete(ch.keys)
        finally:
            writer.close()
            reader.close()


@pytest.mark.parametrize("in_workers", [True, False])
def test_disk_verification_catches_a_forged_page_mid_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, in_workers: bool
) -> None:
    """Whether the workers verify the runs they read (in parallel) or the calling thread
    verifies them as they arrive, the forged page in the middle of a batch is the one miss."""
    ns, ch = batch_chain()
    genuine, evil = pages(BATCH, 0), pages(1, 1)[0]
    path = tmp_path / "disk"

    def tier() -> DiskTier:  # one record per preadv: each run verified on its own
        return DiskTier.build("disk", LAYOUT, 8, path=path, check_index=False, durability="none",
                        io_threads=4, max_io_bytes=disk_io.ALIGN, mac=RecordMac(SECRET_A),
                        hash_in_workers=in_workers)

    t = tier()
    assert t.write(ch.metas(), list(genuine)) == [True] * BATCH
    slot = t.slot_of(ch.keys[MIDDLE])
    t.close()
    assert slot is not None
    forge_on_disk(path, slot, ch.keys[MIDDLE], evil.tobytes(), "other")
    t = tier()
    try:
        threads = spy_threads(monkeypatch, disk_slab)
        outs = pages(BATCH, 2)
        assert t.read(ns.id, ch.keys, list(outs)) == [i != MIDDLE for i in range(BATCH)]
        if in_workers:
            assert len(threads) > 1 and all(n.startswith("kvstore-disk") for n in threads)
        else:
            assert threads == {threading.current_thread().name}
        assert corrupt(t) == {"mac": 1}
        for i in range(BATCH):
            if i != MIDDLE:
                assert np.array_equal(outs[i], genuine[i])
        assert t.used_pages == BATCH - 1  # dropped
    finally:
        t.close()


# --------------------------------------------------------------------- built from the config


def _config(server: RedisServer, secret: str | None):  # noqa: ANN202
    from kvstore import load_config

    layout = {"num_layers": 2, "num_kv_heads": 2, "head_dim": 64, "block_size": 16,
              "dtype": "float16"}
    over: dict = {"layout": layout, "model_id": "victim-model", "tenant_salt": "tenant-v",
                  "tiers": [{"kind": "redis", "url": server.url, "capacity": "1MiB"}]}
    if secret is not None:
        over["security"] = {"secret": secret}
    return load_config(overrides=over)


def test_build_store_keys_the_redis_tier_with_the_configured_secret(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    from kvstore import build_namespace, build_store

    caplog.set_level(logging.DEBUG)
    cfg_a = _config(redis_server, SECRET_A.decode())
    cfg_b = _config(redis_server, SECRET_B.decode())
    ns = build_namespace(cfg_a)
    ch = ns.chain(np.arange(3 * LAYOUT.block_size) % 32000)
    genuine = pages(3, 0)
    with build_store(cfg_a) as a, build_store(cfg_b) as b:
        assert all(a.tiers[0].write(ch.metas(), list(genuine)))
        outs = pages(3, 2)
        assert b.tiers[0].read(ns.id, ch.keys, list(outs)) == [False] * 3
        assert corrupt(b.tiers[0]) == {"mac": 3}
    said = [r.getMessage() for r in caplog.records]
    assert not any(s in m for m in said for s in (SECRET_A.decode(), SECRET_B.decode()))
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_shared_tier_without_a_secret_warns_once_at_start(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    from kvstore import build_store

    caplog.set_level(logging.INFO)
    with build_store(_config(redis_server, None)):
        pass
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warned) == 1 and "security.secret" in warned[0]
