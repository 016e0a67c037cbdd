"""The retention routes of the admin API -- pins, budgets, a namespace's retention -- through the
real app: in process over a TieredStore (each route's effect checked on the store itself), and
on the live port of a real daemon (the token, and a pin made over REST seen by a client of the
daemon's store). Bad input is a 4xx naming the problem and changes nothing."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient

from connector.daemon.client import DaemonStore
from kvstore import KVLayout, Metrics, Namespace, TieredStore
from kvstore.retention import MAX_TTL_S
from kvstore.tiers.host import HostTier
from server.admin import NamespaceDefaults, app_for
from tests.admin.conftest import TOKEN, AdminDaemon, namespace, pages

LAYOUT = KVLayout(1, 1, 8, 4, "float16")  # 4-token blocks, 128-byte pages
PAGE = LAYOUT.page_bytes
A = Namespace("m", LAYOUT, "a")  # the configured namespace of the app below
B = Namespace("m", LAYOUT, "b")
PROMPT = list(range(100, 116))  # 4 blocks


def put(store: TieredStore, ns: Namespace, tokens: list[int], seed: int = 0) -> list[bytes]:
    chain = ns.chain(tokens)
    data = np.random.default_rng(seed).integers(0, 256, (len(chain), PAGE), dtype=np.uint8)
    assert store.put(chain.metas(), data).stored == len(chain)
    return list(chain.keys)


@pytest.fixture
def store() -> Iterator[TieredStore]:
    m = Metrics()
    s = TieredStore(LAYOUT, [HostTier.build("host", LAYOUT, 8, m),
                             HostTier.build("slow", LAYOUT, 32, m)])
    yield s
    s.close()


@pytest.fixture
def rest(store: TieredStore) -> Iterator[TestClient]:
    app = app_for(store, TOKEN, namespace=NamespaceDefaults("m", "a"))
    with TestClient(app, headers={"Authorization": f"Bearer {TOKEN}"}) as c:
        yield c


def url(ns: Namespace, tail: str) -> str:
    return f"/v1/namespaces/{ns.id.hex()}{tail}"


def pinned_keys(store: TieredStore, ns: Namespace) -> dict[int, tuple[bytes, ...]]:
    return {p.id: p.keys for p in store.retention(ns.id).pins}


def budgets(store: TieredStore, ns: Namespace) -> dict[str, int | None]:
    return {t.tier: t.budget_bytes for t in store.retention(ns.id).tiers}


# ------------------------------------------------------------------ pins


def test_a_prompt_pinned_by_its_tokens_stays_through_eviction(store: TieredStore,
                                                              rest: TestClient) -> None:
    keys = put(store, A, PROMPT)
    r = rest.put(url(A, "/pins"), json={"tokens": PROMPT + [1, 2], "ttl_s": 600})  # a partial tail
    assert r.status_code == 201, r.text
    out = r.json()
    assert out["pages"] == 4 and 599 < out["expires_in_s"] <= 600
    assert pinned_keys(store, A) == {out["pin_id"]: tuple(keys)}  # the prompt's own keys
    # another namespace writes twice the host tier: eviction takes none of the pinned pages
    other = [k for i in range(8) for k in put(store, B, list(range(8 * i, 8 * i + 8)), seed=i)]
    assert store.tier("host").contains(keys) == [True] * 4
    assert 0 < sum(store.tier("host").contains(other)) <= 4

    # /v1/lookup's names of the same fields, and the namespace named as a cross-check
    r = rest.put(url(A, "/pins"), json={"token_ids": PROMPT[:8], "ttl_s": 60,
                                        "namespace": {"model_id": "m", "tenant_salt": "a"}})
    assert r.status_code == 201 and r.json()["pages"] == 2, r.text
    second = r.json()["pin_id"]

    r = rest.delete(url(A, f"/pins/{out['pin_id']}"))
    assert r.status_code == 200 and r.json() == {"removed": True}
    assert pinned_keys(store, A) == {second: tuple(keys[:2])}
    # removed already: no error, removed false (a DELETE may be repeated)
    r = rest.delete(url(A, f"/pins/{out['pin_id']}"))
    assert r.status_code == 200 and r.json() == {"removed": False}
    assert rest.delete(url(A, "/pins/999999")).json() == {"removed": False}


def test_a_pin_by_block_keys_takes_keys_not_stored_yet(store: TieredStore,
                                                       rest: TestClient) -> None:
    keys = list(A.chain(PROMPT).keys)
    r = rest.put(url(A, "/pins"), json={"keys": [k.hex().upper() for k in keys[:3]],
                                       "ttl_s": 30.5})
    assert r.status_code == 201, r.text
    assert r.json()["pages"] == 3 and pinned_keys(store, A) == {r.json()["pin_id"]: tuple(keys[:3])}
    r = rest.put(url(A, "/pins"), json={"block_keys": [keys[3].hex()], "ttl_s": 1})
    assert r.status_code == 201 and len(pinned_keys(store, A)) == 2


# ------------------------------------------------------------------ budgets


def test_budgets_are_set_rounded_to_pages_and_removed(store: TieredStore,
                                                      rest: TestClient) -> None:
    put(store, A, PROMPT)
    r = rest.put(url(A, "/budgets/host"), json={"bytes": "1KiB"})
    assert r.status_code == 200, r.text
    assert r.json() == {"tier": "host", "used_bytes": 4 * PAGE, "pinned_bytes": 0,
                        "budget_bytes": 1024}
    assert budgets(store, A) == {"host": 1024, "slow": None}
    r = rest.put(url(A, "/budgets/slow"), json={"bytes": 3 * PAGE + 5})  # whole pages
    assert r.status_code == 200 and r.json()["budget_bytes"] == 3 * PAGE
    assert budgets(store, A) == {"host": 1024, "slow": 3 * PAGE}
    assert budgets(store, B) == {"host": None, "slow": None}  # one namespace's only

    # a budget of 2 pages: the namespace's next writes make room among its own pages
    assert rest.put(url(A, "/budgets/host"), json={"bytes": 2 * PAGE}).status_code == 200
    put(store, A, list(range(200, 208)), seed=2)
    host = next(t for t in store.retention(A.id).tiers if t.tier == "host")
    assert host.used_bytes <= 2 * PAGE

    r = rest.delete(url(A, "/budgets/host"))
    assert r.status_code == 200 and r.json()["budget_bytes"] is None
    assert budgets(store, A) == {"host": None, "slow": 3 * PAGE}
    assert rest.delete(url(A, "/budgets/host")).status_code == 200  # none left: still fine


# ------------------------------------------------------------------ retention


def test_retention_shows_pins_and_per_tier_bytes_as_the_store_has_them(
        store: TieredStore, rest: TestClient) -> None:
    keys = put(store, A, PROMPT)
    p = store.pin(A.id, keys[:3], ttl_s=120)
    store.set_budget(A.id, "slow", 16 * PAGE)
    r = rest.get(url(A, "/retention"))
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["namespace_id"] == A.id.hex()
    (row,) = out["pins"]
    assert (row["pin_id"], row["pages"]) == (p.id, 3) and 119 < row["expires_in_s"] <= 120
    info = store.retention(A.id)
    assert out["tiers"] == [{"tier": t.tier, "used_bytes": t.used_bytes,
                             "pinned_bytes": t.pinned_bytes, "budget_bytes": t.budget_bytes}
                            for t in info.tiers]
    assert out["tiers"][0] == {"tier": "host", "used_bytes": 4 * PAGE,
                               "pinned_bytes": 3 * PAGE, "budget_bytes": None}
    assert out["tiers"][1]["budget_bytes"] == 16 * PAGE
    empty = rest.get(url(B, "/retention")).json()
    assert empty["pins"] == [] and all(t["used_bytes"] == 0 for t in empty["tiers"])


# ------------------------------------------------------------------ bad input


def _problem(r: Any) -> str:
    """The message of a 400/404 (the app's own), or the failing fields of a 422."""
    detail = r.json()["detail"]
    if isinstance(detail, str):
        return detail
    return "; ".join(f"{'.'.join(map(str, d['loc']))}: {d['msg']}" for d in detail)


BAD: list[tuple[str, str, dict[str, Any] | None, int, str]] = [
    ("PUT", "/pins", {"keys": ["xyz"], "ttl_s": 60}, 422, "body.keys.0: String should match"),
    ("PUT", "/pins", {"keys": ["ab" * 17], "ttl_s": 60}, 422, "body.keys.0"),
    ("PUT", "/pins", {"keys": [], "ttl_s": 60}, 422, "body.keys"),
    ("PUT", "/pins", {"tokens": [-1] * 4, "ttl_s": 60}, 422, "body.tokens.0"),
    ("PUT", "/pins", {"tokens": PROMPT, "ttl_s": 0}, 422, "body.ttl_s: Input should be greater"),
    ("PUT", "/pins", {"tokens": PROMPT, "ttl_s": -5}, 422, "body.ttl_s"),
    ("PUT", "/pins", {"tokens": PROMPT, "ttl_s": MAX_TTL_S + 1}, 422, "body.ttl_s: Input should "
                                                                     "be less than or equal"),
    ("PUT", "/pins", {"tokens": PROMPT}, 422, "body.ttl_s: Field required"),
    ("PUT", "/pins", {"tokens": PROMPT, "ttl_s": 60, "tll": 1}, 422, "body.tll: Extra inputs"),
    ("PUT", "/pins", {"ttl_s": 60}, 400, "give exactly one of keys"),
    ("PUT", "/pins", {"tokens": PROMPT, "keys": ["00" * 16], "ttl_s": 60}, 400,
     "give exactly one of keys"),
    ("PUT", "/pins", {"tokens": [1, 2, 3], "ttl_s": 60}, 400,
     "3 token ids make no whole block of 4"),
    ("PUT", "/pins", {"tokens": PROMPT, "ttl_s": 60, "namespace": {"tenant_salt": "b"}}, 400,
     f"is {B.id.hex()}, not the path's {A.id.hex()}"),
    ("PUT", "/pins", {"tokens": PROMPT, "ttl_s": 60, "namespace_label": "nobody"}, 404,
     "no namespace is labelled 'nobody'"),
    ("PUT", "/budgets/nvme", {"bytes": 1024}, 404, "no tier named 'nvme'; the tiers are host, slow"),
    ("DELETE", "/budgets/nvme", None, 404, "no tier named 'nvme'"),
    ("PUT", "/budgets/host", {"bytes": -1}, 422, "body.bytes: Value error, negative sizes"),
    ("PUT", "/budgets/host", {"bytes": "-1GiB"}, 422, "negative sizes"),
    ("PUT", "/budgets/host", {"bytes": "4GB"}, 422, "'GB' is a decimal (SI) unit"),
    ("PUT", "/budgets/host", {"bytes": "1.5B"}, 422, "not a whole number of bytes"),
    ("PUT", "/budgets/host", {"bytes": "lots"}, 422, "not a size"),
    ("PUT", "/budgets/host", {"bytes": True}, 422, "not a size"),
    ("PUT", "/budgets/host", {}, 422, "body.bytes: Field required"),
    ("DELETE", "/pins/0", None, 422, "path.pin_id"),
    ("DELETE", "/pins/x", None, 422, "path.pin_id"),
]


@pytest.mark.parametrize(("method", "tail", "body", "status", "problem"), BAD,
                         ids=[f"{m} {t} {b}" for m, t, b, _, _ in BAD])
def test_bad_input_is_a_4xx_naming_the_problem_and_changes_nothing(
        store: TieredStore, rest: TestClient, method: str, tail: str,
        body: dict[str, Any] | None, status: int, problem: str) -> None:
    keys = put(store, A, PROMPT)
    store.set_budget(A.id, "slow", 8 * PAGE)
    before = store.retention(A.id)
    r = rest.request(method, url(A, tail), json=body)
    assert r.status_code == status, r.text
    assert problem in _problem(r), r.text
    assert store.retention(A.id) == before
    assert store.retention(B.id).pins == () and budgets(store, B) == {"host": None, "slow": None}
    assert store.tier("host").contains(keys) == [True] * 4


def test_a_key_or_a_pin_of_another_namespace_is_refused(store: TieredStore,
                                                        rest: TestClient) -> None:
    keys = put(store, A, PROMPT)
    r = rest.put(url(B, "/pins"), json={"keys": [keys[0].hex()], "ttl_s": 60})
    assert r.status_code == 400 and f"key {keys[0].hex()} is held under another namespace" in \
        r.json()["detail"]
    assert store.retention(B.id).pins == ()
    p = store.pin(A.id, keys, ttl_s=60)
    r = rest.delete(url(B, f"/pins/{p.id}"))
    assert r.status_code == 200 and r.json()["removed"] is False  # not B's: nothing is told
    assert pinned_keys(store, A) == {p.id: tuple(keys)}  # still there


def test_pins_past_the_bound_are_refused(store: TieredStore, rest: TestClient) -> None:
    # max_pinned_fraction 0.5 of the smallest local tier (8 pages): 4 pages
    keys = list(A.chain(list(range(40))).keys)
    assert rest.put(url(A, "/pins"), json={"keys": [k.hex() for k in keys[:4]],
                                          "ttl_s": 60}).status_code == 201
    r = rest.put(url(A, "/pins"), json={"keys": [k.hex() for k in keys[4:6]], "ttl_s": 60})
    assert r.status_code == 400 and "more than the 4 pins may hold" in r.json()["detail"]
    assert [len(k) for k in pinned_keys(store, A).values()] == [4]


def test_bad_namespace_ids_in_the_path(store: TieredStore, rest: TestClient) -> None:
    for method, tail, body in ROUTES:
        for bad in ("xyz", "00" * 15, "00" * 17, "g" * 32):
            r = rest.request(method, f"/v1/namespaces/{bad}{tail}", json=body)
            assert r.status_code == 422, (method, tail, bad, r.text)
            assert r.json()["detail"][0]["loc"] == ["path", "namespace_id"]
    assert store.retention(A.id).pins == ()


# ------------------------------------------------------------------ the token, a live daemon

ROUTES = [("PUT", "/pins", {"tokens": PROMPT, "ttl_s": 60}), ("DELETE", "/pins/1", None),
          ("PUT", "/budgets/host", {"bytes": "1MiB"}), ("DELETE", "/budgets/host", None),
          ("GET", "/retention", None)]


def test_each_route_needs_the_token_in_process(store: TieredStore) -> None:
    put(store, A, PROMPT)
    app = app_for(store, TOKEN)
    with TestClient(app) as c:
        for method, tail, body in ROUTES:
            for headers in ({}, {"Authorization": "Bearer wrong"}):
                r = c.request(method, url(A, tail), json=body, headers=headers)
                assert r.status_code == 401, (method, tail, r.text)
                assert "missing or wrong token" in r.json()["detail"]
    assert store.retention(A.id).pins == () and budgets(store, A) == {"host": None, "slow": None}


def test_on_a_live_daemon(admin_daemon: AdminDaemon, api: httpx.Client) -> None:
    ns = namespace("pins")
    chain = ns.chain(list(range(64)))
    base = f"/v1/namespaces/{ns.id.hex()}"
    with httpx.Client(base_url=admin_daemon.url, timeout=30) as anon:
        for method, tail, body in ROUTES:
            r = anon.request(method, base + tail, json=body)
            assert r.status_code == 401, (method, tail, r.text)
    with DaemonStore(admin_daemon.target, ns.id) as s:
        assert s.write_pages(chain.metas(), pages(4, 1)).stored == 4
        r = api.put(base + "/pins", json={"tokens": list(range(64)), "ttl_s": 600})
        assert r.status_code == 201, r.text
        pin_id = r.json()["pin_id"]
        assert r.json()["pages"] == 4
        got = api.get(base + "/retention").json()
        assert [p["pin_id"] for p in got["pins"]] == [pin_id]
        host = got["tiers"][0]
        assert host["tier"] == "host" and host["pinned_bytes"] == host["used_bytes"] > 0
        # the daemon's store holds the pin: its own client removes it
        assert s.unpin(pin_id, namespace_id=ns.id) is True
        assert api.get(base + "/retention").json()["pins"] == []
        # and a pin made by a client is removed over REST
        held = s.pin(ns.id, list(chain.keys[:2]), ttl_s=60)
        r = api.delete(f"{base}/pins/{held.id}")
        assert r.status_code == 200 and r.json() == {"removed": True}
        assert s.unpin(held, namespace_id=ns.id) is False
        r = api.put(base + "/budgets/disk", json={"bytes": "2MiB"})
        assert r.status_code == 200 and r.json()["budget_bytes"] == 2 << 20
        r = api.put(base + "/budgets/nvme", json={"bytes": "2MiB"})
        assert r.status_code == 404 and "the tiers are host, disk" in r.json()["detail"]


def test_stats_show_each_namespace_s_pins_and_budgets(store: TieredStore,
                                                      rest: TestClient) -> None:
    keys = put(store, A, PROMPT)
    put(store, B, PROMPT, seed=1)
    store.pin(A.id, keys[:3], ttl_s=600)
    store.set_budget(B.id, "host", 6 * LAYOUT.page_bytes)
    rows = {r["namespace_id"]: r for r in rest.get("/v1/stats").json()["namespaces"]}
    a, b = rows[A.id.hex()], rows[B.id.hex()]
    assert (a["pins"], a["pinned_bytes"], a["budget_bytes"]) == \
        (1, {"host": 3 * LAYOUT.page_bytes}, {})
    assert (b["pins"], b["pinned_bytes"], b["budget_bytes"]) == \
        (0, {}, {"host": 6 * LAYOUT.page_bytes})
