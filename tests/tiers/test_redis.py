"""Redis tier against a real redis-server (one per test, on a free port): round trips, one round
trip per batch, TTL, big values, big batches, sharing between instances, verification of what
is read back, maxmemory, credentials, TLS."""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import redis

from kvstore.errors import ConfigError, TierUnavailable
from kvstore.keys import Namespace
from kvstore.layout import KVLayout
from kvstore.record import header_bytes, stored_meta
from kvstore.store import TieredStore
from kvstore.tiers.host import HostTier
from kvstore.tiers.base import MissTally
from kvstore.tiers import redis as redis_tier
from kvstore.tiers.redis import RedisTier
from tests.redis_servers import DelayProxy, RedisServer, free_port

pytestmark = pytest.mark.timeout(120)

LLAMA = KVLayout(32, 8, 128, 16, "bfloat16")  # 2 MiB pages
SMALL = KVLayout(2, 1, 64, 16, "float16")  # 8 KiB pages


def pages_for(layout: KVLayout, n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, layout.page_bytes), dtype=np.uint8)


def chain(layout: KVLayout, n: int, *, model: str = "m", salt: str = "", start: int = 0):
    ns = Namespace(model, layout, salt)
    return ns, ns.chain(np.arange(start, start + n * layout.block_size) % 50_000)


def tier(server_or_url, layout: KVLayout = SMALL, **kw) -> RedisTier:
    url = server_or_url if isinstance(server_or_url, str) else server_or_url.url
    kw.setdefault("timeout_s", 5.0)
    return RedisTier.build("redis", layout, kw.pop("capacity", 10_000), url=url, **kw)


def corrupt(t: RedisTier) -> dict[str, int]:
    out: dict[str, int] = {}
    for metric in t.metrics.corrupt.collect():
        for s in metric.samples:
            if s.name.endswith("_total") and s.value:
                out[s.labels["reason"]] = int(s.value)
    return out


# --------------------------------------------------------------------- round trips


def test_round_trip_of_2mib_pages(redis_server: RedisServer) -> None:
    ns, ch = chain(LLAMA, 6)
    pages = pages_for(LLAMA, 6)
    with_tier = tier(redis_server, LLAMA)
    try:
        assert with_tier.write(ch.metas(), list(pages)) == [True] * 6
        outs = np.zeros_like(pages)
        assert with_tier.read(ns.id, ch.keys, list(outs)) == [True] * 6
        assert np.array_equal(outs, pages)
        assert with_tier.contains(ch.keys + [b"\x01" * 16]) == [True] * 6 + [False]
        assert with_tier.count_leading(ch.keys) == 6
        assert with_tier.meta(ch.keys[2]) == stored_meta(ch.meta(2), False)
        assert with_tier.used_pages == 6
        assert with_tier.delete(ch.keys[4:] + [b"\x02" * 16]) == 2
        assert with_tier.used_pages == 4
        assert with_tier.count_leading(ch.keys) == 4
        st = with_tier.stats()
        assert (st.hits, st.writes, st.deletes, st.errors, st.corrupt) == (6, 6, 2, 0, 0)
        assert st.bytes_read == 6 * LLAMA.page_bytes
        # Values are header || page, under <prefix>:<key hex>, with no hash tag.
        r = redis_server.client()
        name = b"kvstore:" + ch.keys[0].hex().encode()
        assert r.strlen(name) == header_bytes(LLAMA) + LLAMA.page_bytes
        assert r.getrange(name, 0, 3) == b"KVPG"
    finally:
        with_tier.close()


def test_lookup_of_a_whole_prompt_is_one_round_trip(redis_server: RedisServer) -> None:
    """Through a proxy that adds 150 ms to every reply, a lookup of 120 keys, a get of 120 pages
    and a put of 120 pages each take about one delay, not 120 (the put's lanes run at once:
    one exchange each, in parallel)."""
    ns, ch = chain(SMALL, 120)
    pages = pages_for(SMALL, 120)
    proxy = DelayProxy(redis_server.port, 0.0)
    t = tier(proxy.url)
    try:
        assert all(t.write(ch.metas(0, 80), list(pages[:80])))
        t.contains(ch.keys[:1])  # connection pooled before the delay starts
        proxy.delay_s = 0.15
        before = t.server_stats()[0].exchanges
        t0 = time.monotonic()
        assert t.count_leading(ch.keys) == 80
        lookup_s = time.monotonic() - t0
        t0 = time.monotonic()
        assert t.read(ns.id, ch.keys, list(np.empty_like(pages))) == [True] * 80 + [False] * 40
        get_s = time.monotonic() - t0
        t0 = time.monotonic()
        assert all(t.write(ch.metas(80), list(pages[80:])))
        put_s = time.monotonic() - t0
        assert (t.write_lanes, t.put_lanes) == (2, 1)  # 8 KiB pages go over one lane
        assert t.server_stats()[0].exchanges - before == 2 + 1
        for took in (lookup_s, get_s, put_s):
            assert 0.15 <= took < 0.5, (lookup_s, get_s, put_s)
    finally:
        t.close()
        proxy.close()


def test_batches_of_hundreds_of_pages(redis_server: RedisServer) -> None:
    n = 600
    ns, ch = chain(SMALL, n)
    pages = pages_for(SMALL, n, seed=1)
    t = tier(redis_server)
    try:
        assert t.write(ch.metas(), list(pages)) == [True] * n
        assert t.count_leading(ch.keys) == n
        outs = np.empty_like(pages)
        assert t.read(ns.id, ch.keys, list(outs)) == [True] * n
        assert np.array_equal(outs, pages)
        assert t.delete(ch.keys) == n
        assert t.used_pages == 0
    finally:
        t.close()


def test_a_big_get_keeps_a_bounded_window_in_flight(redis_server: RedisServer) -> None:
    """64 pages of 2 MiB in one get: correct, and the server never buffers the whole batch."""
    n = 64
    ns, ch = chain(LLAMA, n)
    pages = pages_for(LLAMA, n, seed=2)
    t = tier(redis_server, LLAMA, timeout_s=20.0)
    try:
        assert all(t.write(ch.metas(), list(pages)))
        r = redis_server.client()
        r.config_resetstat()  # resets used_memory_peak
        stored = r.info("memory")["used_memory"]
        outs = np.empty_like(pages)
        assert all(t.read(ns.id, ch.keys, list(outs)))
        assert np.array_equal(outs, pages)
        peak = r.info("memory")["used_memory_peak"]
        assert peak - stored < 32 * 2**20, "the get parked the whole batch in output buffers"
    finally:
        t.close()


def test_second_instance_sees_pages_the_first_wrote(redis_server: RedisServer) -> None:
    ns, ch = chain(SMALL, 10)
    pages = pages_for(SMALL, 10)
    a, b = tier(redis_server), tier(redis_server)
    try:
        assert all(a.write(ch.metas(), list(pages)))
        assert b.count_leading(ch.keys) == 10
        # no cached header: one GETRANGE
        assert b.meta(ch.keys[7]) == stored_meta(ch.meta(7), False)
        outs = np.empty_like(pages)
        assert all(b.read(ns.id, ch.keys, list(outs)))
        assert np.array_equal(outs, pages)
        assert b.used_pages == 0  # b wrote nothing: a shared cache's pages are not b's budget
        assert list(b.keys()) == []
        assert b.delete(ch.keys[:3]) == 3
        assert a.used_pages == 10  # a notices on its next read or contains of those keys
        assert a.count_leading(ch.keys) == 0
        assert a.used_pages == 7
    finally:
        a.close()
        b.close()


def test_concurrent_callers_share_one_tier(redis_server: RedisServer) -> None:
    t = tier(redis_server, LLAMA)
    errors: list[BaseException] = []

    def worker(w: int) -> None:
        try:
            for i in range(4):
                ns, ch = chain(LLAMA, 3, start=(w * 10 + i) * 100)
                pages = pages_for(LLAMA, 3, seed=w * 10 + i)
                assert all(t.write(ch.metas(), list(pages)))
                outs = np.empty_like(pages)
                assert all(t.read(ns.id, ch.keys, list(outs)))
                assert np.array_equal(outs, pages)
                assert t.count_leading(ch.keys) == 3
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(4)]
    try:
        for th in threads:
            th.start()
        for th in threads:
            th.join(60)
        assert not errors, errors
        assert t.used_pages == 48 and t.stats().errors == 0
    finally:
        t.close()


def test_ttl_expires_pages_and_hits_refresh_it(redis_server: RedisServer) -> None:
    ns, ch = chain(SMALL, 2)
    pages = pages_for(SMALL, 2)
    t = tier(redis_server, ttl_s=1.0)
    try:
        t0 = time.monotonic()
        assert all(t.write(ch.metas(), list(pages)))
        pttl = redis_server.client().pttl(b"kvstore:" + ch.keys[0].hex().encode())
        assert 0 < pttl <= 1000
        time.sleep(0.5)
        assert t.read(ns.id, ch.keys[:1], [np.empty(SMALL.page_bytes, np.uint8)]) == [True]
        time.sleep(max(0.0, 1.2 - (time.monotonic() - t0)))
        # Page 1 expired at 1.0 s; page 0's hit at 0.5 s moved its expiry to 1.5 s.
        outs = list(np.empty_like(pages))
        assert t.read(ns.id, ch.keys, outs) == [True, False]
        assert t.used_pages == 1
        time.sleep(1.2)
        assert t.count_leading(ch.keys) == 0
        assert t.used_pages == 0
    finally:
        t.close()


def expired(t: RedisTier) -> dict[str, int]:
    return {op: int(t.metrics.value("kvstore_tier_expired_pages_total", tier=t.name, op=op))
            for op in ("read", "contains")}


def test_pages_found_gone_after_their_ttl_count_as_expired_and_earlier_ones_as_absent(
        redis_server: RedisServer) -> None:
    ns, ch = chain(SMALL, 4)
    pages = pages_for(SMALL, 4)
    t = tier(redis_server, ttl_s=1.0)
    try:
        assert all(t.write(ch.metas(), list(pages)))
        # page 3 vanishes before its TTL (another node's delete, maxmemory): absent, not expired
        redis_server.client().delete(b"kvstore:" + ch.keys[3].hex().encode())
        outs = list(np.empty_like(pages))
        tally = MissTally()
        assert t.read(ns.id, ch.keys, outs, tally) == [True, True, True, False]
        assert tally == MissTally() and expired(t) == {"read": 0, "contains": 0}
        time.sleep(1.2)  # pages 0-2 expire (their hits above refreshed them to ~1 s from then)
        tally = MissTally()
        assert t.read(ns.id, ch.keys[:1], outs[:1], tally) == [False]
        assert tally.expired == 1 and expired(t) == {"read": 1, "contains": 0}
        tally = MissTally()
        assert t.count_leading(ch.keys[1:], tally) == 0  # a lookup finds pages 1-2 gone
        assert tally.expired == 2 and expired(t) == {"read": 1, "contains": 2}
        # each page counts once: it is no longer this node's after it was found gone
        assert t.read(ns.id, ch.keys, outs) == [False] * 4
        assert expired(t) == {"read": 1, "contains": 2} and t.used_pages == 0
    finally:
        t.close()

    plain = tier(redis_server)  # without a TTL nothing expires: a vanished page is absent
    try:
        assert all(plain.write(ch.metas(0, 1), list(pages[:1])))
        redis_server.client().delete(b"kvstore:" + ch.keys[0].hex().encode())
        assert plain.read(ns.id, ch.keys[:1], outs[:1]) == [False]
        assert expired(plain) == {"read": 0, "contains": 0}
    finally:
        plain.close()


def test_zstd_compression_round_trip(redis_server: RedisServer) -> None:
    pytest.importorskip("zstandard")
    ns, ch = chain(SMALL, 4)
    pages = pages_for(SMALL, 4)
    pages[:2] = 7  # compressible; pages 2-3 are random and stored raw
    t = tier(redis_server, compression="zstd")
    plain = tier(redis_server)  # a node without compression still reads compressed records
    try:
        assert all(t.write(ch.metas(), list(pages)))
        r = redis_server.client()
        sizes = [r.strlen(b"kvstore:" + k.hex().encode()) for k in ch.keys]
        assert sizes[0] < SMALL.page_bytes // 10
        assert sizes[2] == header_bytes(SMALL) + SMALL.page_bytes
        for reader in (t, plain):
            outs = np.zeros_like(pages)
            assert all(reader.read(ns.id, ch.keys, list(outs)))
            assert np.array_equal(outs, pages)
    finally:
        t.close()
        plain.close()


def test_as_the_bottom_tier_of_a_store(redis_server: RedisServer) -> None:
    """Host over Redis, write-back: evicted pages go down to Redis, and a get of them comes back
    up (promotion uses ``meta`` from the cached header: no extra round trip)."""
    ns, ch = chain(SMALL, 12)
    pages = pages_for(SMALL, 12)
    host = HostTier.build("host", SMALL, 4, pin_memory=False)
    red = tier(redis_server, capacity=100)
    store = TieredStore(SMALL, [host, red], write_policy="write_back")
    try:
        for i in range(12):
            store.put(ch.metas(i, i + 1), pages[i : i + 1])
        assert host.used_pages == 4 and red.used_pages == 8
        assert store.lookup(ch.keys).num_blocks == 12
        outs = np.zeros_like(pages)
        got = store.get(ns.id, ch.keys[:8], outs[:8])
        assert got.tiers == ("redis",) * 8
        assert np.array_equal(outs[:8], pages[:8])
        store.drain()  # promotion runs on the store's mover thread
        assert store.lookup(ch.keys[4:8]).tiers == ("host",) * 4  # promoted
        assert "cmdstat_getrange" not in redis_server.client().info("commandstats")
        store.check_integrity()
    finally:
        store.close()
        red.close()


# --------------------------------------------------------------------- what is read back


def test_garbage_values_are_misses_and_are_deleted(redis_server: RedisServer) -> None:
    ns, ch = chain(SMALL, 6)
    pages = pages_for(SMALL, 6)
    t = tier(redis_server)
    r = redis_server.client()
    names = [b"kvstore:" + k.hex().encode() for k in ch.keys]
    hb = header_bytes(SMALL)
    try:
        assert all(t.write(ch.metas(), list(pages)))
        r.set(names[0], b"\x00" * (hb + SMALL.page_bytes))  # right size, no record
        r.set(names[1], r.get(names[1])[:-10])  # truncated payload
        flipped = bytearray(r.get(names[2]))
        flipped[hb + 100] ^= 1
        r.set(names[2], bytes(flipped))  # one bit of the page
        r.set(names[3], b"short")  # shorter than a header
        r.delete(names[4])
        r.hset(names[4], "field", "value")  # not even a string
        outs = np.zeros_like(pages)
        assert t.read(ns.id, ch.keys, list(outs)) == [False] * 5 + [True]
        assert np.array_equal(outs[5], pages[5])
        assert corrupt(t) == {"magic": 2, "length": 1, "payload_checksum": 1, "truncated": 1}
        assert r.exists(*names[:5]) == 0  # damaged values are deleted
        assert t.stats().misses == 5
    finally:
        t.close()


def test_another_namespaces_record_is_never_returned(redis_server: RedisServer) -> None:
    ns_a, a = chain(SMALL, 3, salt="tenant-a")
    ns_b, b = chain(SMALL, 3, salt="tenant-b")
    pages = pages_for(SMALL, 3)
    t = tier(redis_server)
    r = redis_server.client()
    try:
        assert all(t.write(a.metas(), list(pages)))
        # B's key now holds A's record (a copy attack, or a bug): never served to B, deleted.
        r.set(b"kvstore:" + b.keys[0].hex().encode(), r.get(b"kvstore:" + a.keys[0].hex().encode()))
        outs = np.zeros_like(pages)
        assert t.read(ns_b.id, b.keys[:1], [outs[0]]) == [False]
        assert r.exists(b"kvstore:" + b.keys[0].hex().encode()) == 0
        # B asking for A's key under B's namespace: a miss, and A's genuine page stays.
        assert t.read(ns_b.id, a.keys[:1], [outs[0]]) == [False]
        assert corrupt(t) == {"namespace": 2}
        assert t.read(ns_a.id, a.keys, list(outs)) == [True] * 3
        assert np.array_equal(outs, pages)
        # Another layout's record under this key: a miss.
        other = tier(redis_server, KVLayout(2, 1, 64, 16, "bfloat16"))
        try:
            buf = np.zeros(SMALL.page_bytes, np.uint8)
            assert other.read(ns_a.id, a.keys[:1], [buf]) == [False]
        finally:
            other.close()
    finally:
        t.close()


# --------------------------------------------------------------------- server limits, settings


def test_maxmemory_refuses_puts_and_keeps_serving_reads() -> None:
    server = RedisServer("--maxmemory", "6mb", "--maxmemory-policy", "noeviction")
    ns, ch = chain(SMALL, 2000)
    pages = pages_for(SMALL, 2000)
    t = tier(server)
    try:
        stored = t.write(ch.metas(), list(pages))
        ok = [i for i, s in enumerate(stored) if s]
        refused = [i for i, s in enumerate(stored) if not s]
        assert ok and refused
        assert t.oom_refused == len(refused)
        st = t.stats()
        assert st.writes_refused == len(refused) and st.errors == 0
        assert t.server_stats()[0].breaker == "closed"
        outs = np.empty_like(pages[ok])
        assert all(t.read(ns.id, [ch.keys[i] for i in ok], list(outs)))
        assert np.array_equal(outs, pages[ok])
        late = refused[-1]
        assert t.write(ch.metas(late, late + 1), [pages[late]]) == [False]
        assert t.delete([ch.keys[i] for i in ok[:100]]) == 100  # room again
        assert t.write(ch.metas(late, late + 1), [pages[late]]) == [True]
    finally:
        t.close()
        server.stop()


def test_credentials_and_acl_users_pass_through() -> None:
    server = RedisServer("--requirepass", "s3cret")
    ns, ch = chain(SMALL, 2)
    pages = pages_for(SMALL, 2)
    try:
        with pytest.raises(ConfigError, match="credentials|password") as err:
            tier(server, password="wrong")
        assert "password" in err.value.hint
        with pytest.raises(ConfigError, match="password"):
            tier(server)
        t = tier(server, password="s3cret")
        t.close()
        admin = server.client(password="s3cret")
        # A least-privilege user: its own keys, data commands only (not even INFO).
        admin.execute_command("ACL", "SETUSER", "kv", "on", ">kvpw", "~kvstore:*", "+@read",
                              "+@write", "+@keyspace", "+@connection", "-info")
        t = tier(f"redis://kv@127.0.0.1:{server.port}/0", password="kvpw")  # user in the url
        try:
            assert all(t.write(ch.metas(), list(pages)))
            assert t.read(ns.id, ch.keys, list(np.empty_like(pages))) == [True, True]
        finally:
            t.close()
        # The same user under another prefix: the server answers NOPERM, puts are refused.
        t = tier(server, username="kv", password="kvpw", key_prefix="elsewhere")
        try:
            assert t.write(ch.metas(), list(pages)) == [False, False]
            assert t.stats().errors == 1
        finally:
            t.close()
    finally:
        server.stop()


def test_unreachable_server_fails_at_start_with_a_hint() -> None:
    t0 = time.monotonic()
    with pytest.raises(TierUnavailable) as err:
        RedisTier.build("r", SMALL, 10, url=f"redis://127.0.0.1:{free_port()}/0",
                  connect_timeout_s=0.3)
    assert time.monotonic() - t0 < 2
    assert "url" in err.value.hint


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"url": "redis://x:1", "cluster_nodes": ["x:1"]},
        {"url": "redis://x:1", "timeout_s": 0},
        {"url": "redis://x:1", "retries": -1},
        {"url": "redis://x:1", "ttl_s": 0},
        {"url": "redis://x:1", "compression": "lzma"},
        {"url": "redis://x:1", "key_prefix": "{kv}"},
        {"url": "redis://x:1", "breaker_failures": 0},
    ],
)
def test_bad_settings_are_rejected_before_connecting(kwargs: dict) -> None:
    with pytest.raises(ConfigError, match="invalid tier configuration of tier 'r'"):
        RedisTier.build("r", SMALL, 10, **kwargs)


def test_tls(tmp_path: Path) -> None:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    ca, cert, key = _make_certs(tmp_path)
    port = free_port()
    server = RedisServer("--tls-port", str(port), "--tls-cert-file", cert,
                         "--tls-key-file", key, "--tls-ca-cert-file", ca,
                         "--tls-auth-clients", "no")
    ns, ch = chain(LLAMA, 3)
    pages = pages_for(LLAMA, 3)
    try:
        t = RedisTier.build("r", LLAMA, 10, url=f"rediss://127.0.0.1:{port}/0", tls_ca_certs=ca,
                      timeout_s=5.0)
        try:
            assert all(t.write(ch.metas(), list(pages)))
            outs = np.empty_like(pages)
            assert all(t.read(ns.id, ch.keys, list(outs)))
            assert np.array_equal(outs, pages)
        finally:
            t.close()
        with pytest.raises((ConfigError, TierUnavailable)):  # an unknown CA: no connection
            RedisTier.build("r", LLAMA, 10, url=f"rediss://127.0.0.1:{port}/0", connect_timeout_s=1)
    finally:
        server.stop()


def _make_certs(d: Path) -> tuple[str, str, str]:
    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
        "-days", "2", "-subj", "/CN=kvstore-test-ca")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "srv.key", "-out", "srv.csr",
        "-subj", "/CN=localhost")
    (d / "ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    run("x509", "-req", "-in", "srv.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", "srv.crt", "-days", "2", "-extfile", "ext")
    return str(d / "ca.crt"), str(d / "srv.crt"), str(d / "srv.key")


def test_redis_py_baseline_blobs_are_not_records(redis_server: RedisServer) -> None:
    """A raw blob a user stored under our prefix (no header) is a miss, never bytes."""
    ns, ch = chain(SMALL, 1)
    r = redis.Redis(port=redis_server.port)
    page = pages_for(SMALL, 1)[0]
    r.set(b"kvstore:" + ch.keys[0].hex().encode(), page.tobytes())
    t = tier(redis_server)
    try:
        assert t.read(ns.id, ch.keys, [np.empty_like(page)]) == [False]
        assert corrupt(t) == {"magic": 1}
    finally:
        t.close()


@pytest.mark.parametrize("lanes", [1, 3])
def test_a_put_split_over_lanes_stores_every_page_in_order(
    redis_server: RedisServer, lanes: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch of puts cut into lanes stores each page under its own key (the parts are
    contiguous and joined in order), over as many connections as lanes."""
    monkeypatch.setattr(redis_tier, "LANES_MIN_PAGE_BYTES", SMALL.page_bytes)
    ns, ch = chain(SMALL, 50)
    pages = pages_for(SMALL, 50, seed=lanes)
    t = tier(redis_server, write_lanes=lanes)
    try:
        assert t.put_lanes == lanes
        before = t.server_stats()[0].exchanges
        assert t.write(ch.metas(), list(pages)) == [True] * 50
        assert t.server_stats()[0].exchanges - before == lanes
        assert t.write(ch.metas(0, 3), list(pages[:3])) == [True] * 3  # too few for lanes
        outs = np.zeros_like(pages)
        assert t.read(ns.id, ch.keys, list(outs)) == [True] * 50
        assert np.array_equal(outs, pages)
    finally:
        t.close()


def test_pages_below_a_mib_are_put_over_one_lane_and_larger_ones_over_write_lanes(
    redis_server: RedisServer,
) -> None:
    """Lanes pay only for large pages (redis.py, LANES_MIN_PAGE_BYTES): a batch of small pages
    is one exchange whatever write_lanes says; a batch of 1 MiB pages is one per lane."""
    mib = KVLayout(16, 8, 128, 16, "bfloat16")
    assert SMALL.page_bytes < redis_tier.LANES_MIN_PAGE_BYTES == mib.page_bytes
    for layout, lanes in ((SMALL, 1), (mib, 3)):
        ns, ch = chain(layout, 12)
        pages = pages_for(layout, 12, seed=7)
        t = tier(redis_server, layout, write_lanes=3, key_prefix=f"lanes{lanes}")
        try:
            assert (t.write_lanes, t.put_lanes) == (3, lanes)
            before = t.server_stats()[0].exchanges
            assert t.write(ch.metas(), list(pages)) == [True] * 12
            assert t.server_stats()[0].exchanges - before == lanes
            outs = np.zeros_like(pages)
            assert t.read(ns.id, ch.keys, list(outs)) == [True] * 12
            assert np.array_equal(outs, pages)
        finally:
            t.close()


def test_write_lanes_out_of_range_are_refused(redis_server: RedisServer) -> None:
    with pytest.raises(ConfigError, match="write_lanes"):
        tier(redis_server, write_lanes=0)
