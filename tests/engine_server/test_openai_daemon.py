"""``kvstore engine serve --daemon``: two engine servers over one ``kvstore serve`` daemon share
its tiers -- a prompt the first computed is served to the second (its own hbm pool empty)
from the daemon's host tier, with the same greedy tokens; the daemon counts the load."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from connector.daemon import DaemonStore
from runtime.config import get_model_config
from server.engine_server.build import build_served
from tests.engine_server.serving import serving
from tests.server.daemon_proc import DaemonProc, write_config

BLOCK = 16


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[DaemonProc]:
    layout = get_model_config("tiny").kv_layout(BLOCK)
    fields = {"num_layers": layout.num_layers, "num_kv_heads": layout.num_kv_heads,
              "head_dim": layout.head_dim, "block_size": layout.block_size,
              "dtype": layout.dtype}
    with DaemonProc(write_config(tmp_path, host="16MiB", disk=None, layout=fields)) as d:
        yield d


def test_two_servers_share_a_prefix_through_the_daemon(daemon: DaemonProc) -> None:
    prompt = list(range(30, 30 + 4 * BLOCK + 5))  # four whole blocks and a tail
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 6, "temperature": 0,
            "return_token_ids": True}
    answers = []
    for _ in range(2):  # each a fresh engine (its hbm pool empty) over the same daemon
        served = build_served("tiny", seed=0, num_blocks=64, block_size=BLOCK, device="cpu",
                              daemon=daemon.target)
        with serving(served) as (url, loop):
            with httpx.Client(base_url=url, timeout=60) as c:
                r = c.post("/v1/completions", json=body)
                assert r.status_code == 200, r.text
                answers.append(r.json())
            deadline = time.monotonic() + 30
            while loop.engine.num_pending_frees or loop.engine.has_unfinished():
                assert time.monotonic() < deadline
                time.sleep(0.02)
    first, second = answers
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == 4 * BLOCK
    assert second["usage"]["kvstore"]["tokens_reused"] == {"hbm": 0, "host": 4 * BLOCK}
    assert second["choices"][0]["token_ids"] == first["choices"][0]["token_ids"]
    with DaemonStore(daemon.target) as store:
        assert store.stats().tier("host").hits >= 4


def test_a_host_cache_and_a_daemon_together_are_refused(daemon: DaemonProc) -> None:
    from kvstore.errors import InvalidArgument

    with pytest.raises(InvalidArgument, match="not both"):
        build_served("tiny", host_cache="4MiB", daemon=daemon.target, device="cpu")
