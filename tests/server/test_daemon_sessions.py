"""A client killed with SIGKILL while it holds a load or a save open: the daemon frees what its
session held -- pins, reservations, leases -- and no slot leaks."""

from __future__ import annotations

import random
import time

import pytest

from connector.daemon import DaemonStore
from kvstore import Namespace
from runtime.config import get_model_config
from tests.server.daemon_proc import DaemonProc

NS = Namespace("random/tiny/0", get_model_config("tiny").kv_layout(16))


def _wait_until(cond, what: str, timeout_s: float = 60.0) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s}s: {what}")
        time.sleep(0.05)


@pytest.mark.parametrize("pause", ["load", "save"])
def test_sigkill_mid_transfer_releases_the_clients_slots(daemon: DaemonProc, engine_child,
                                                         pause: str) -> None:
    rng = random.Random(pause)
    prompt = [rng.randrange(1, 250) for _ in range(5 * 16 + 3)]
    with DaemonStore(daemon.target, NS.id) as admin:
        if pause == "load":  # the prefix is in the daemon before the victim asks for it
            saver = engine_child(daemon.target)
            saver.gen(prompt)
            saver.close()
        before = admin.stats(check_integrity=True)
        assert before.integrity_error == "" and before.open_load_handles == 0
        victim = engine_child(daemon.target, pause=pause)
        victim.send({"op": "gen", "prompt": prompt + [7, 8, 9], "max_tokens": 4})
        assert victim.readline() == "PAUSED"
        held = admin.stats()
        if pause == "load":
            assert held.open_load_handles == 1
        else:
            assert held.open_store_handles == 1
            assert held.tier("host").free_pages < before.tier("host").free_pages
        victim.kill()
        _wait_until(lambda: admin.stats().sessions == 1, "the victim's session ended")
        after = admin.stats(check_integrity=True)
        assert after.integrity_error == ""
        assert (after.open_load_handles, after.open_store_handles, after.active_leases) == (0, 0, 0)
        host_before, host_after = before.tier("host"), after.tier("host")
        assert host_after.free_pages == host_before.free_pages  # no slot leaked
        assert host_after.used_pages == host_before.used_pages
        # the pages the victim was loading are intact and loadable
        if pause == "load":
            keys = NS.chain(prompt).keys
            h = admin.prepare_load(NS.id, keys)
            assert h.num_blocks == len(keys)
            admin.complete_load(h)
