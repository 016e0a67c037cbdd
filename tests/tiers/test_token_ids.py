"""Token ids reach the disk and Redis only where configured (DESIGN: Security; issue 33): by
default neither a record nor the disk index holds a block's token ids -- whoever reads the
slab file, the LMDB index or a Redis value does not read the prompt -- and the key alone
identifies the page; with ``security.store_token_ids`` they are kept and readers check the
chain again. Real redis-server, real slab file and LMDB index; the raw bytes are read as
someone with access to the disk or Redis would."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from kvstore import build_store, load_config
from kvstore.keys import BlockChain, BlockMeta, Namespace
from kvstore.layout import KVLayout
from kvstore.record import RecordMac, encode_header
from kvstore.tiers.disk import DiskTier
from kvstore.tiers.redis import RedisTier
from tests.redis_servers import RedisServer
from tests.tiers.test_redis import corrupt

pytestmark = pytest.mark.timeout(120)

LAYOUT = KVLayout(2, 1, 64, 16, "float16")  # 8 KiB pages
SECRET = b"a-deployment-secret-of-32-bytes!"
_NUM_TOKENS = 84  # offset of num_tokens in a record header (record.py)


def chain() -> tuple[Namespace, BlockChain]:
    ns = Namespace("m", LAYOUT, "tenant-a")
    rng = np.random.default_rng(7)  # ids no page byte pattern repeats by chance
    return ns, ns.chain(rng.integers(1 << 20, 1 << 31, 3 * LAYOUT.block_size))


def pages(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, LAYOUT.page_bytes), dtype=np.uint8)


def holds_tokens(data: bytes, ch: BlockChain) -> list[bool]:
    """Whether ``data`` contains each block's token ids (int32le), anywhere."""
    return [m.token_ids in data for m in ch.metas()]


def _name(key: bytes) -> bytes:
    return b"kvstore:" + key.hex().encode()


# --------------------------------------------------------------------- disk


@pytest.mark.parametrize("store_token_ids", [False, True])
def test_disk_stores_token_ids_only_when_configured(tmp_path: Path, store_token_ids: bool) -> None:
    ns, ch = chain()
    genuine = pages(3, 0)
    path = tmp_path / "disk"
    with DiskTier.build("disk", LAYOUT, 8, path=path, check_index=False, durability="batch",
                  mac=RecordMac(SECRET), store_token_ids=store_token_ids) as t:
        assert t.write(ch.metas(), list(genuine)) == [True] * 3
    slab = (path / "slots.dat").read_bytes()
    index = (path / "index" / "data.mdb").read_bytes()
    assert holds_tokens(slab, ch) == [store_token_ids] * 3
    assert holds_tokens(index, ch) == [store_token_ids] * 3
    # A warm restart reads the pages back either way; meta() says what was kept.
    with DiskTier.build("disk", LAYOUT, 8, path=path, check_index=False,
                  mac=RecordMac(SECRET), store_token_ids=store_token_ids) as t:
        outs = pages(3, 1)
        assert t.read(ns.id, ch.keys, list(outs)) == [True] * 3
        assert np.array_equal(outs, genuine) and corrupt(t) == {}  # type: ignore[arg-type]
        meta = t.meta(ch.keys[1])
        assert meta is not None and (meta.key, meta.parent) == (ch.keys[1], ch.keys[0])
        assert meta.token_ids == (ch.meta(1).token_ids if store_token_ids else b"")


def test_disk_reads_the_records_the_other_setting_wrote(tmp_path: Path) -> None:
    """The setting changes what new records hold, never whether old ones read: records with
    and without token ids share one size and one slot layout."""
    ns, ch = chain()
    genuine = pages(3, 0)
    path = tmp_path / "disk"
    for writer, reader in ((True, False), (False, True)):
        with DiskTier.build("disk", LAYOUT, 8, path=path, check_index=False,
                      mac=RecordMac(SECRET), store_token_ids=writer) as t:
            assert all(t.write(ch.metas(), list(genuine)))
        with DiskTier.build("disk", LAYOUT, 8, path=path, check_index=False,
                      mac=RecordMac(SECRET), store_token_ids=reader) as t:
            outs = pages(3, 1)
            assert t.read(ns.id, ch.keys, list(outs)) == [True] * 3
            assert np.array_equal(outs, genuine)
            t.delete(ch.keys)


# --------------------------------------------------------------------- redis


def redis_tier(server: RedisServer, store_token_ids: bool = False) -> RedisTier:
    return RedisTier.build("redis", LAYOUT, 100, url=server.url, timeout_s=5.0,
                     mac=RecordMac(SECRET), store_token_ids=store_token_ids)


@pytest.mark.parametrize("store_token_ids", [False, True])
def test_redis_stores_token_ids_only_when_configured(
    redis_server: RedisServer, store_token_ids: bool
) -> None:
    ns, ch = chain()
    genuine = pages(3, 0)
    r = redis_server.client()
    w, fresh = redis_tier(redis_server, store_token_ids), redis_tier(redis_server)
    try:
        assert w.write(ch.metas(), list(genuine)) == [True] * 3
        values = [r.get(_name(k)) for k in ch.keys]
        assert [holds_tokens(v, ch)[i] for i, v in enumerate(values)] == [store_token_ids] * 3
        n = LAYOUT.block_size if store_token_ids else 0
        assert {struct.unpack_from("<I", v, _NUM_TOKENS)[0] for v in values} == {n}
        outs = pages(3, 1)  # another node, whatever its own setting, reads both kinds
        assert fresh.read(ns.id, ch.keys, list(outs)) == [True] * 3
        assert np.array_equal(outs, genuine) and corrupt(fresh) == {}
        other = redis_tier(redis_server)  # no headers cached: meta() reads the record
        try:
            meta = other.meta(ch.keys[2])
            assert meta is not None and (meta.namespace_id, meta.parent) == (ns.id, ch.keys[1])
            assert meta.token_ids == (ch.meta(2).token_ids if store_token_ids else b"")
        finally:
            other.close()
    finally:
        w.close()
        fresh.close()


def test_redis_record_whose_tokens_do_not_hash_to_its_key_is_a_chain_miss(
    redis_server: RedisServer,
) -> None:
    """With token ids stored, a record that a holder of the secret wrote (the MAC verifies)
    but whose tokens do not hash to its key is a ``chain`` miss, deleted as damage."""
    ns, ch = chain()
    t = redis_tier(redis_server, store_token_ids=True)
    r = redis_server.client()
    try:
        m = ch.meta(1)
        altered = BlockMeta(m.namespace_id, m.key, m.parent, bytes(len(m.token_ids)))
        page = pages(1, 0)[0].tobytes()
        r.set(_name(m.key), encode_header(altered, LAYOUT, page, RecordMac(SECRET)) + page)
        outs = pages(1, 1)
        assert t.read(ns.id, [m.key], list(outs)) == [False]
        assert corrupt(t) == {"chain": 1}
        assert r.exists(_name(m.key)) == 0
    finally:
        t.close()


def test_redis_record_without_tokens_under_another_namespace_is_left_to_its_owner(
    redis_server: RedisServer,
) -> None:
    """Without token ids there is no chain to check: an authenticated record asked for under
    the wrong namespace is a ``namespace`` miss and stays for its owner (a genuine page);
    under the wrong key it is a ``key`` miss and is deleted (no writer stores a page there)."""
    ns, ch = chain()
    other = Namespace("m", LAYOUT, "tenant-b")
    t = redis_tier(redis_server)
    r = redis_server.client()
    try:
        assert all(t.write(ch.metas(), list(pages(3, 0))))
        outs = pages(1, 1)
        assert t.read(other.id, ch.keys[:1], list(outs)) == [False]
        assert corrupt(t) == {"namespace": 1} and r.exists(_name(ch.keys[0])) == 1
        r.set(_name(ch.keys[0]), r.get(_name(ch.keys[1])))  # a record under another key
        assert t.read(ns.id, ch.keys[:1], list(outs)) == [False]
        assert corrupt(t) == {"namespace": 1, "key": 1} and r.exists(_name(ch.keys[0])) == 0
    finally:
        t.close()


# --------------------------------------------------------------------- configuration


@pytest.mark.parametrize("setting", [None, "true"])
def test_the_setting_reaches_the_record_tiers(
    tmp_path: Path, redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch,
    setting: str | None,
) -> None:
    if setting is not None:
        monkeypatch.setenv("KVSTORE_SECURITY__STORE_TOKEN_IDS", setting)
    cfg = tmp_path / "c.toml"
    cfg.write_text(f"""
model_id = "m"
[layout]
num_layers = 2
num_kv_heads = 1
head_dim = 64
block_size = 16
dtype = "float16"
[[tiers]]
kind = "disk"
name = "disk"
capacity = "64KiB"
path = "{tmp_path / 'disk'}"
[[tiers]]
kind = "redis"
name = "redis"
capacity = "64KiB"
url = "{redis_server.url}"
""")
    with build_store(load_config(cfg)) as store:
        assert [getattr(t, "store_token_ids") for t in store.tiers] == [setting is not None] * 2
