"""bench.serve: the workloads are deterministic and sized to the pool, and ``--quick --json``
against real ``kvstore engine serve`` subprocesses prints one line per configuration, workload
and metric with sane values."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

from bench.serve_workloads import SHAPES, WORKLOADS, build, prompt_of

REPO = Path(__file__).resolve().parent.parent


def test_workloads_deterministic_and_sized() -> None:
    shape = SHAPES["tiny"]
    for name in WORKLOADS:
        a, b = build(name, shape, 2048, 512, seed=3), build(name, shape, 2048, 512, seed=3)
        assert a == b
        assert a != build(name, shape, 2048, 512, seed=4)
        assert a.unique_tokens >= 2048
        for s in a.sessions:
            answers = {k: [7] * r.max_tokens for k, r in enumerate(s.requests)}
            for k, r in enumerate(s.requests):
                assert len(prompt_of(s, k, answers)) + r.max_tokens <= shape.max_len
    chat = build("chat", shape, 2048, 512)
    s = next(s for s in chat.sessions if len(s.requests) > 1)
    answers = {0: [1, 2, 3]}
    assert prompt_of(s, 1, answers) == [*s.requests[0].new, 1, 2, 3, *s.requests[1].new]
    agent = build("agentic", shape, 4096, 512)
    firsts = {s.requests[0].new[:shape.tool_prompt] for s in agent.sessions}
    assert len(firsts) == 1  # one shared tool prompt


def test_quick_json() -> None:
    out = subprocess.run([sys.executable, "-m", "bench.serve", "--quick", "--json"], cwd=REPO,
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [json.loads(x) for x in out.stdout.splitlines() if x.strip()]
    got: dict[tuple[str, str], dict[str, dict]] = defaultdict(dict)
    for x in lines:
        assert x["bench"] == "serve"
        got[(x["case"].split("/")[0], x["variant"])][x["metric"]] = x
    assert set(got) == {(w, c) for w in WORKLOADS for c in ("recompute", "hbm only", "hbm + host")}
    for (workload, config), m in got.items():
        for metric in ("ttft_p50", "ttft_p90", "ttft_p99", "itl_p50", "req_per_s",
                       "output_tok_per_s"):
            assert m[metric]["value"] > 0, (workload, config, metric)
        assert m["ttft_p50"]["value"] <= m["ttft_p99"]["value"]
        assert (m["prompt_tokens_computed"]["value"] + m["prompt_tokens_cached"]["value"]
                == m["prompt_tokens"]["value"])
        if config != "hbm only":
            assert m["ttft_p50"]["baseline"] == "hbm only"
            assert m["ttft_p50"]["ratio"] is not None and m["ttft_p50"]["ratio"] > 0
        else:
            assert m["ttft_p50"]["baseline"] is None
    assert got[("chat", "hbm + host")]["prompt_tokens_cached"]["value"] > 0
    assert got[("chat", "hbm + host")]["cached_host"]["value"] > 0
    assert got[("docqa", "hbm + host")]["cached_host"]["value"] > 0
    for config in ("recompute", "hbm only", "hbm + host"):
        assert got[("noreuse", config)]["prompt_tokens_cached"]["value"] == 0
    for workload in WORKLOADS:  # no prefix cache: nothing reused, whatever the workload
        assert got[(workload, "recompute")]["prompt_tokens_cached"]["value"] == 0
