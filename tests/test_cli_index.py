"""``kvstore index``: two real daemons, a prompt's prefix stored into each (one holds more of
it); ``kvstore index route`` names the one with the longer prefix, and in which tier, and
``kvstore index watch`` counts each one's pages per tier."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from connector.daemon import DaemonStore
from kvstore import KVLayout, Namespace
from kvstore.indexer import Indexer
from server.cli import app
from server.cli_index import parse_tokens, target_of
from tests.server.daemon_proc import TINY_LAYOUT, DaemonProc, write_config

LAYOUT = KVLayout(**TINY_LAYOUT)  # type: ignore[arg-type]
SECRET = "index-cli-test-secret-0123456789"
NS = Namespace("routing", LAYOUT, "tenant-x", secret=SECRET.encode())
PROMPT = list(range(40, 40 + 8 * LAYOUT.block_size + 5))  # 8 full blocks and a partial one


def _save(target: str, n: int) -> None:
    with DaemonStore(target, namespace_id=NS.id) as client:
        h = client.prepare_store(NS.chain(PROMPT).metas()[:n])
        for slot in h.slots:
            h.slab[slot] = np.full(LAYOUT.page_bytes, 1, np.uint8)
        assert client.complete_store(h).stored == n


@pytest.fixture(scope="module")
def daemons(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DaemonProc, DaemonProc]]:
    """``a`` (host over disk, written through) holds the first 3 pages of PROMPT, ``b`` (host
    only) the first 6."""
    tmp = tmp_path_factory.mktemp("index")
    (tmp / "a").mkdir()
    (tmp / "b").mkdir()
    with DaemonProc(write_config(tmp / "a", write_policy="write_through")) as a, \
            DaemonProc(write_config(tmp / "b", disk=None)) as b:
        _save(a.target, 3)
        _save(b.target, 6)
        yield a, b


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The CLI's config: the deployment secret the clients keyed their namespace with."""
    path = tmp_path_factory.mktemp("cli") / "kvstore.toml"
    path.write_text(f'[security]\nsecret = "{SECRET}"\n')
    return path


def _invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, ["index", *args])
    return result.exit_code, result.stdout, result.stderr


def _route(a: DaemonProc, b: DaemonProc, config: Path, *extra: str) -> tuple[int, str, str]:
    return _invoke("route", "--daemon", str(a.socket), "--daemon", b.target,
                   "--model", "routing", "--tenant", "tenant-x", "--config", str(config),
                   "--tokens", ",".join(map(str, PROMPT)), *extra)


def test_route_names_the_daemon_holding_the_longer_prefix(
        daemons: tuple[DaemonProc, DaemonProc], config: Path) -> None:
    a, b = daemons
    code, out, err = _route(a, b, config, "--json")
    assert code == 0, err
    got = json.loads(out)
    assert got["tokens"] == len(PROMPT)
    rows = [(r["daemon"], r["matched_blocks"], r["blocks"], r["tiers"]) for r in got["daemons"]]
    assert rows == [
        (b.target, 6, 8, [{"tier": "host", "blocks": 6}]),
        (a.target, 3, 8, [{"tier": "host", "blocks": 3}]),  # also on disk: host is faster
    ]
    assert got["daemons"][0]["namespace_id"] == NS.id.hex()
    assert got["daemons"][0]["matched_tokens"] == 6 * LAYOUT.block_size

    code, out, err = _route(a, b, config)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[1] == f"  1. {b.target}: 6 of 8 blocks (96 tokens) in host 6"
    assert lines[2] == f"  2. {a.target}: 3 of 8 blocks (48 tokens) in host 3"


def test_route_reads_the_events_after_the_snapshot_and_by_namespace(
        daemons: tuple[DaemonProc, DaemonProc], config: Path, tmp_path: Path) -> None:
    a, b = daemons
    # another tenant's namespace holds none of it; a token file gives the same prompt
    tokens = tmp_path / "prompt.json"
    tokens.write_text(json.dumps(PROMPT))
    code, out, err = _invoke("route", "-d", str(a.socket), "-d", str(b.socket), "-m", "routing",
                             "-t", "someone-else", "-c", str(config), "--tokens-file",
                             str(tokens), "--json")
    assert code == 0, err
    assert [r["matched_blocks"] for r in json.loads(out)["daemons"]] == [0, 0]
    # without the deployment secret the keys are not the engine's: no match either
    code, out, err = _invoke("route", "-d", str(b.socket), "-m", "routing", "-t", "tenant-x",
                             "--tokens-file", str(tokens), "--json")
    assert code == 0, err
    assert json.loads(out)["daemons"][0]["matched_blocks"] == 0
    # by namespace id, no secret needed
    code, out, err = _invoke("route", "-d", str(b.socket), "--namespace-id", NS.id.hex(),
                             "--tokens-file", str(tokens), "--json")
    assert code == 0, err
    assert json.loads(out)["daemons"][0]["matched_blocks"] == 6


def test_an_unreachable_daemon_is_listed_last_and_bad_prompts_are_refused(
        daemons: tuple[DaemonProc, DaemonProc], config: Path, tmp_path: Path) -> None:
    a, _ = daemons
    gone = tmp_path / "gone.sock"
    code, out, err = _invoke("route", "-d", str(gone), "-d", str(a.socket), "-m", "routing",
                             "-t", "tenant-x", "-c", str(config),
                             "--tokens", ",".join(map(str, PROMPT)), "--json")
    assert code == 0, err
    rows = json.loads(out)["daemons"]
    assert [r["daemon"] for r in rows] == [a.target, f"unix://{gone}"]
    assert rows[0]["matched_blocks"] == 3 and rows[1]["error"]
    code, _, err = _invoke("route", "-d", str(gone), "-m", "routing", "--tokens", "1,2")
    assert code == 1 and "no daemon answered" in err
    code, _, err = _invoke("route", "-d", str(a.socket), "-m", "routing")
    assert code == 1 and "exactly one of --tokens and --tokens-file" in err
    code, _, err = _invoke("route", "-d", str(a.socket), "-m", "routing", "--tokens", "1,x")
    assert code == 1 and "not integers" in err
    code, _, err = _invoke("route", "-d", str(a.socket), "--tokens", "1,2")
    assert code == 1 and "--namespace-id" in err


def test_watch_counts_each_daemon_s_pages_per_tier(
        daemons: tuple[DaemonProc, DaemonProc], config: Path) -> None:
    a, b = daemons
    args = ["watch", "-d", str(a.socket), "-d", str(b.socket), "-m", "routing",
            "-t", "tenant-x", "-c", str(config), "--json"]
    code, out, err = _invoke(*args, "--once")
    assert code == 0, err
    (line,) = out.splitlines()
    counts = {d["daemon"]: (d["pages"], d["tiers"]) for d in json.loads(line)["daemons"]}
    assert counts == {a.target: (3, {"host": 3, "disk": 3}), b.target: (6, {"host": 6})}

    code, out, err = _invoke(*args, "--seconds", "1", "--interval", "0.4")
    assert code == 0, err
    lines = [json.loads(x) for x in out.splitlines()]
    assert len(lines) >= 2
    assert {d["daemon"]: d["pages"] for d in lines[-1]["daemons"]} == {a.target: 3, b.target: 6}

    code, out, err = _invoke(*args[:-1], "--once")  # the text form
    assert code == 0, err
    assert f"  {a.target}: 3 pages (host 3, disk 3)" in out.splitlines()


def test_tokens_and_targets_parse() -> None:
    assert parse_tokens("1, 2,3\n4") == [1, 2, 3, 4] == parse_tokens("[1, 2, 3, 4]")
    assert target_of("/run/kvstore.sock") == "unix:///run/kvstore.sock"
    assert target_of("unix:///x.sock") == "unix:///x.sock"
    assert target_of("10.0.0.2:50051") == "10.0.0.2:50051"


def test_a_follower_waits_while_only_other_namespaces_change(tmp_path: Path) -> None:
    """Indexer.follow with a namespace moves its cursor past batches that held only other
    namespaces' events (empty once filtered): asking again from the old cursor would answer at
    once, in a loop (a hot loop of ReadEvents calls to a daemon)."""
    from tests.vllm_events_wire import LAYOUT as SMALL
    from tests.vllm_events_wire import pages, store_at

    store = store_at(tmp_path)
    mine, theirs = Namespace("mine", SMALL), Namespace("theirs", SMALL)
    reads = [0]

    class Counted:
        def read_events(self, *args, **kw):
            reads[0] += 1
            return store.read_events(*args, **kw)

        def event_snapshot(self, **kw):
            return store.event_snapshot(**kw)

    index, stop = Indexer(), threading.Event()
    follower = threading.Thread(target=index.follow, args=("n", Counted()),
                                kwargs={"stop": stop, "timeout_s": 0.2,
                                        "namespace_id": mine.id}, daemon=True)
    follower.start()
    try:
        for i in range(3):  # only another namespace's pages
            chain = theirs.chain(list(range(8 * i, 8 * i + 8)))
            store.put(chain.metas(), pages(2))
        time.sleep(0.2)
        reads[0] = 0
        time.sleep(1.0)
        assert reads[0] <= 10, f"{reads[0]} reads in a second: the follower spins"
        chain = mine.chain(list(range(8)))
        store.put(chain.metas(), pages(2))
        deadline = time.monotonic() + 10
        while index.contents("n").get("host") != set(chain.keys):
            assert time.monotonic() < deadline, index.contents("n")
            time.sleep(0.02)
        assert all(k in set(chain.keys) for keys in index.contents("n").values() for k in keys)
    finally:
        stop.set()
        follower.join(5)
        store.close()
