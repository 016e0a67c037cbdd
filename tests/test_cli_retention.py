"""``kvstore pin``, ``unpin``, ``budget`` and ``retention`` against a real admin API (uvicorn on a
free loopback port, over an in-process store whose state each test checks), the token from the
environment as an operator gives it: in process through typer's runner, and once as a real
process. Usage mistakes are exit 2 naming the option; refusals of the API are exit 1 with its
message; neither changes anything."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from kvstore import KVLayout, Metrics, Namespace, TieredStore
from kvstore.tiers.host import HostTier
from server.admin import AdminServer, NamespaceDefaults, serve_admin
from server.cli import app

ROOT = Path(__file__).parents[1]
TOKEN = "cli-retention-token-0123456789"
LAYOUT = KVLayout(1, 1, 8, 4, "float16")  # 4-token blocks, 128-byte pages
PAGE = LAYOUT.page_bytes
A = Namespace("m", LAYOUT, "a")
B = Namespace("m", LAYOUT, "b")
PROMPT = list(range(100, 116))  # 4 blocks


@pytest.fixture
def store() -> Iterator[TieredStore]:
    m = Metrics()
    s = TieredStore(LAYOUT, [HostTier.build("host", LAYOUT, 16, m),
                             HostTier.build("slow", LAYOUT, 32, m)])
    chain = A.chain(PROMPT)
    data = np.random.default_rng(0).integers(0, 256, (len(chain), PAGE), dtype=np.uint8)
    assert s.put(chain.metas(), data).stored == 4
    yield s
    s.close()


@pytest.fixture
def server(store: TieredStore, monkeypatch: pytest.MonkeyPatch) -> Iterator[AdminServer]:
    for k in [k for k in os.environ if k.startswith("KVSTORE_")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("KVSTORE_ADMIN__TOKEN", TOKEN)
    srv = serve_admin(store, "127.0.0.1", 0, TOKEN, namespace=NamespaceDefaults("m", "a"))
    yield srv
    srv.stop()


def kvstore(server: AdminServer, *args: str, stdin: str | None = None) -> tuple[int, str, str]:
    """``kvstore COMMAND --url <the server> ARGS`` in process: exit code, stdout, stderr."""
    r = CliRunner().invoke(app, [args[0], "--url", server.url, *args[1:]], input=stdin)
    return r.exit_code, r.stdout, r.stderr


def test_pin_by_tokens_or_keys_then_unpin(server: AdminServer, store: TieredStore,
                                          tmp_path: Path) -> None:
    keys = list(A.chain(PROMPT).keys)
    tokens = tmp_path / "prompt.json"
    tokens.write_text(json.dumps(PROMPT + [7]))  # a partial last block: not pinned
    code, out, err = kvstore(server, "pin", "--namespace", A.id.hex(), "--tokens-file",
                             str(tokens), "--ttl", "600")
    assert code == 0, err
    (p,) = store.retention(A.id).pins
    assert p.keys == tuple(keys)
    assert (f"pinned 4 pages of namespace {A.id.hex()} for 600s: pin {p.id} "
            f"(`kvstore unpin --namespace {A.id.hex()} {p.id}` removes it)") in out

    # block keys, one per line, upper case too; --json prints the API's answer
    listed = tmp_path / "keys.txt"
    listed.write_text(f"{keys[0].hex().upper()}\n{keys[1].hex()}\n")
    code, out, err = kvstore(server, "pin", "--namespace", A.id.hex(), "--keys-file",
                             str(listed), "--ttl", "30", "--json")
    assert code == 0, err
    second = json.loads(out)
    assert second["pages"] == 2 and 29 < second["expires_in_s"] <= 30
    assert {q.id: q.keys for q in store.retention(A.id).pins} == {
        p.id: tuple(keys), second["pin_id"]: tuple(keys[:2])}

    # token ids from stdin, whitespace-separated, checked against the model and tenant
    code, out, err = kvstore(server, "pin", "--namespace", A.id.hex(), "--tokens-file", "-",
                             "--model-id", "m", "--tenant-salt", "a", "--ttl", "5",
                             stdin=" ".join(map(str, PROMPT[:4])))
    assert code == 0 and "pinned 1 pages" in out, err
    assert len(store.retention(A.id).pins) == 3

    code, out, err = kvstore(server, "unpin", "--namespace", A.id.hex(), str(p.id))
    assert code == 0 and f"removed pin {p.id} of namespace {A.id.hex()}" in out, err
    assert p.id not in {q.id for q in store.retention(A.id).pins}
    code, out, err = kvstore(server, "unpin", "--namespace", A.id.hex(), str(p.id))
    assert code == 0 and f"has no pin {p.id}: it lapsed, was removed already" in out, err


def test_budget_set_and_clear(server: AdminServer, store: TieredStore) -> None:
    def budget() -> int | None:
        return next(t.budget_bytes for t in store.retention(A.id).tiers if t.tier == "host")

    code, out, err = kvstore(server, "budget", "--namespace", A.id.hex(), "--tier", "host",
                             "1KiB")
    assert code == 0, err
    assert budget() == 1024
    assert (f"namespace {A.id.hex()} in host: budget 1KiB (1024 bytes); holds 512B, 0B of it "
            "pinned") in out
    code, out, err = kvstore(server, "budget", "--namespace", A.id.hex(), "--tier", "host",
                             "300", "--json")  # whole pages: 2 of 128 bytes
    assert code == 0 and json.loads(out)["budget_bytes"] == 2 * PAGE == budget(), err
    code, out, err = kvstore(server, "budget", "--namespace", A.id.hex(), "--tier", "host",
                             "--clear")
    assert code == 0 and "in host: no budget" in out, err
    assert budget() is None


def test_retention_table_and_json(server: AdminServer, store: TieredStore) -> None:
    keys = list(A.chain(PROMPT).keys)
    p = store.pin(A.id, keys[:3], ttl_s=120)
    store.set_budget(A.id, "slow", 4 << 10)
    code, out, err = kvstore(server, "retention", "--namespace", A.id.hex())
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == f"namespace {A.id.hex()}" and "per tier" in out and "pins (1)" in out
    host = next(ln for ln in lines if "│ host" in ln)
    assert [c.strip() for c in host.split("│")[1:-1]] == ["host", "512B", "384B", "-"]
    slow = next(ln for ln in lines if "│ slow" in ln)
    assert [c.strip() for c in slow.split("│")[1:-1]] == ["slow", "0B", "0B", "4KiB"]
    row = next(ln for ln in lines if ln.startswith("│") and ln.split("│")[1].strip() == str(p.id))
    assert [c.strip() for c in row.split("│")[2:-1]][0] == "3"

    code, out, err = kvstore(server, "retention", "--namespace", A.id.hex(), "--json")
    assert code == 0, err
    got = json.loads(out)
    assert got["pins"][0]["pin_id"] == p.id and got["pins"][0]["pages"] == 3
    assert got["tiers"][1] == {"tier": "slow", "used_bytes": 0, "pinned_bytes": 0,
                               "budget_bytes": 4 << 10}


def unboxed(text: str) -> str:
    """The text of typer's error box, its borders and line breaks gone."""
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", text).split())


def test_usage_mistakes_are_exit_2_naming_the_option(server: AdminServer, store: TieredStore,
                                                     tmp_path: Path) -> None:
    ns = A.id.hex()
    keys = tmp_path / "keys.txt"
    keys.write_text("00" * 16 + "\n" + "zz" * 16 + "\n")
    tokens = tmp_path / "tokens.json"
    tokens.write_text("[1, 2, -3]")
    empty = tmp_path / "empty.txt"
    empty.write_text("\n")
    cases = [
        (["pin", "--namespace", "xyz", "--keys-file", str(keys), "--ttl", "60"],
         "'xyz' is not a namespace id"),
        (["pin", "--namespace", ns, "--ttl", "60"], "exactly one of --keys-file and --tokens-file"),
        (["pin", "--namespace", ns, "--keys-file", str(keys), "--tokens-file", str(tokens),
          "--ttl", "60"], "exactly one of --keys-file and --tokens-file"),
        (["pin", "--namespace", ns, "--keys-file", str(keys), "--ttl", "60"],
         "'zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz', is not a block key"),
        (["pin", "--namespace", ns, "--tokens-file", str(tokens), "--ttl", "60"],
         "'-3', is not a token id"),
        (["pin", "--namespace", ns, "--tokens-file", str(empty), "--ttl", "60"],
         "holds no token ids"),
        (["pin", "--namespace", ns, "--tokens-file", str(tmp_path / "nope"), "--ttl", "60"],
         "cannot read"),
        (["pin", "--namespace", ns, "--tokens-file", str(tokens), "--ttl", "0"],
         "is not in (0, 2592000] seconds"),
        (["pin", "--namespace", ns, "--tokens-file", str(tokens)], "--ttl"),
        (["unpin", "--namespace", ns, "0"], "Invalid value for 'pin_id'"),
        (["budget", "--namespace", ns, "--tier", "host"], "give a SIZE"),
        (["budget", "--namespace", ns, "--tier", "host", "1KiB", "--clear"], "give a SIZE"),
        (["budget", "--namespace", ns, "--tier", "host", "4GB"], "decimal (SI) unit"),
        (["budget", "--namespace", ns, "--tier", "host", "--", "-1"],
         "'-1': negative sizes are not allowed"),
        (["budget", "--namespace", ns, "--tier", "host", "1.5B"], "not a whole number of bytes"),
        (["retention", "--namespace", "00" * 15], "is not a namespace id"),
    ]
    for args, problem in cases:
        code, out, err = kvstore(server, *args)
        assert code == 2, (args, code, out, err)
        assert problem in unboxed(err), (args, err)
    assert store.retention(A.id).pins == ()
    assert all(t.budget_bytes is None for t in store.retention(A.id).tiers)


def test_refusals_of_the_api_are_exit_1_with_its_message(server: AdminServer,
                                                         store: TieredStore,
                                                         tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.txt"
    tokens.write_text(" ".join(map(str, PROMPT)))
    cases = [
        (["budget", "--namespace", A.id.hex(), "--tier", "nvme", "1MiB"],
         "HTTP 404: no tier named 'nvme'; the tiers are host, slow"),
        (["pin", "--namespace", B.id.hex(), "--keys-file", "-", "--ttl", "60"],
         "is held under another namespace; nothing was pinned"),
        (["pin", "--namespace", A.id.hex(), "--tokens-file", str(tokens), "--ttl", "60",
          "--tenant-salt", "b"], f"is {B.id.hex()}, not the path's {A.id.hex()}"),
    ]
    stdin = A.chain(PROMPT).keys[0].hex()
    for args, problem in cases:
        code, out, err = kvstore(server, *args, stdin=stdin)
        assert code == 1, (args, code, out, err)
        assert problem in err, (args, err)
    assert store.retention(A.id).pins == () and store.retention(B.id).pins == ()
    assert all(t.budget_bytes is None for t in store.retention(A.id).tiers)


def test_as_a_person_runs_it(server: AdminServer, store: TieredStore, tmp_path: Path) -> None:
    """A real process, the token from the environment (never printed); a wrong one is exit 2."""
    tokens = tmp_path / "prompt.txt"
    tokens.write_text("\n".join(map(str, PROMPT)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVSTORE_")}
    env.update(KVSTORE_ADMIN__TOKEN=TOKEN, COLUMNS="200")
    cmd = [sys.executable, "-m", "server.cli", "pin", "--namespace", A.id.hex(),
           "--tokens-file", str(tokens), "--ttl", "90", "--url", server.url]
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    (p,) = store.retention(A.id).pins
    assert f"pin {p.id}" in r.stdout and TOKEN not in r.stdout + r.stderr
    env["KVSTORE_ADMIN__TOKEN"] = "not-the-token"
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "refused the token" in r.stderr
    assert len(store.retention(A.id).pins) == 1
