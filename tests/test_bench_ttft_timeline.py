"""bench.ttft_timeline on the CPU: every phase of a host hit is stamped, in the order the engine
runs them, and the hit really came from host (the tool raises otherwise)."""

from __future__ import annotations

import re

import pytest

from bench import ttft_timeline


def test_the_timeline_names_each_phase_of_a_host_hit_in_order(
        capsys: pytest.CaptureFixture[str]) -> None:
    ttft_timeline.main(["--lengths", "256", "--runs", "2"])
    out = capsys.readouterr().out
    assert "== 256 tokens (15 blocks from host), medians of 2 hits, cpu" in out
    starts = {m[1].strip(): float(m[2]) for m in re.finditer(
        r"^  (.{36}) +(\d+\.\d+) +\d+\.\d+ +\d+\.\d+", out, re.M)}
    order = ["add_request", "schedule", "start_load_kv", "forward (queued)", "commit", "sample",
             "scheduler.update", "reap"]
    assert [starts[k] for k in order] == sorted(starts[k] for k in order)
    for inner in ("connector match", "store.lookup", "store.prepare_load"):
        assert inner in starts
    assert re.search(r"max\(load, hbm\) / hit = \d+\.\d{3}", out)
