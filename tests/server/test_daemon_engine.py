"""Engines in their own processes share prefixes through a real ``kvstore serve``; the daemon
going down costs recomputation, never wrong tokens; its restart is warm from disk."""

from __future__ import annotations

import json
import random
import signal

from tests.server.conftest import reference_tokens
from tests.server.daemon_proc import DaemonProc

BLOCK = 16


def _nonzero(reused: dict[str, int]) -> dict[str, int]:
    return {tier: n for tier, n in reused.items() if n}


def _prompt(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1, 250) for _ in range(n)]


def test_two_engine_processes_share_a_prefix(daemon: DaemonProc, engine_child) -> None:
    prefix = _prompt(0, 4 * BLOCK)
    first, second = prefix + _prompt(1, 21), prefix + _prompt(2, 19)
    a = engine_child(daemon.target)
    out_a = a.gen(first)
    assert out_a["computed"] == len(first)  # nothing cached yet
    b = engine_child(daemon.target)
    out_b = b.gen(second)
    # the second engine computes only its suffix: the prefix's 4 blocks came from the daemon
    assert _nonzero(out_b["reused"]) == {"host": len(prefix)}
    assert out_b["computed"] == len(second) - len(prefix)
    assert out_b["tokens"] == reference_tokens(second)
    assert out_a["tokens"] == reference_tokens(first)
    a.close()
    b.close()


def test_sigterm_mid_load_then_warm_restart(daemon: DaemonProc, engine_child) -> None:
    prefix, other = _prompt(10, 3 * BLOCK), _prompt(20, 2 * BLOCK)
    saver = engine_child(daemon.target)
    saver.gen(prefix + _prompt(11, 9))
    saver.gen(other + _prompt(21, 9))
    saver.close()

    # an engine whose load out of the shared slab is held open while the daemon stops
    loader = engine_child(daemon.target, pause="load")
    second = prefix + _prompt(12, 10)
    loader.send({"op": "gen", "prompt": second, "max_tokens": 6})
    assert loader.readline() == "PAUSED"
    assert daemon.stop(signal.SIGTERM) == 0  # drains: the open load handle is completed
    assert "stopped" in daemon.log()
    loader.send("go")
    res = json.loads(loader.readline())
    assert res["tokens"] == reference_tokens(second)

    # daemon down: the engine keeps serving by recomputing, and counts the failures
    third = other + _prompt(13, 11)  # saved in the daemon, not in this engine
    res = loader.gen(third)
    assert res["computed"] == len(third) and res["tokens"] == reference_tokens(third)
    assert sum(res["failures"].values()) > 0

    # restarted on the same config: the client reconnects and saves again ...
    daemon.start()
    loader.send({"op": "connected"})
    assert loader.readline() == "true"
    fresh = _prompt(14, 2 * BLOCK + 5)
    again = loader.gen(fresh)
    assert again["tokens"] == reference_tokens(fresh)
    loader.close()
    # ... and a new engine finds the old prefix warm on disk and the new one in host
    c = engine_child(daemon.target)
    res = c.gen(prefix + _prompt(15, 7))
    assert _nonzero(res["reused"]) == {"disk": len(prefix)}
    res = c.gen(fresh[: 2 * BLOCK] + _prompt(16, 3))
    assert _nonzero(res["reused"]) == {"host": 2 * BLOCK}
    c.close()
