"""The default-layout stage of ``bench.vllm``: vLLM as it runs by default (no
``VLLM_ENABLE_V1_MULTIPROCESSING`` override: EngineCore, the connector's scheduler side, in a
process of its own, the worker in another) -- recompute and vLLM's own prefix-cache hit without
a connector, then no reuse and a host hit over a ``kvstore serve`` sidecar with docs/vllm.md's
sample daemon config (one host tier).

:func:`run_split` runs the stage in a fresh Python process (``python -m bench.vllm_split``):
one that ran a vLLM engine in itself has OpenMP threads bound to every core, which take CPU
from the engines started later."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

RESULT = "RESULT "


def run_split(model: str, tmp: Path, n_tokens: int, runs: int, fresh: list[list[int]],
              same: list[int]) -> dict[str, float]:
    """TTFT in seconds of ``split recompute``, ``split prefix cache``, ``split daemon no
    reuse`` and ``split daemon host hit``, measured in a child process; ``fresh``: at least
    ``2 * (runs + 1)`` new prompts, ``same``: the reused one."""
    spec = tmp / "split.json"
    spec.write_text(json.dumps({"model": model, "n_tokens": n_tokens, "runs": runs,
                                "fresh": fresh, "same": same, "tmp": str(tmp)}))
    env = {k: v for k, v in os.environ.items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"}
    proc = subprocess.run([sys.executable, "-m", "bench.vllm_split", str(spec)], env=env,
                          stdout=subprocess.PIPE, text=True, timeout=1800)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT)]
    if proc.returncode or not lines:
        raise RuntimeError(f"bench.vllm_split exited {proc.returncode} (its log is above)")
    return {k: float(v) for k, v in json.loads(lines[-1][len(RESULT):]).items()}


def _measure(model: str, tmp: Path, n_tokens: int, runs: int, fresh: list[list[int]],
             same: list[int]) -> dict[str, float]:
    from bench.vllm_engines import BLOCK_SIZE, close_llm, daemon_ttfts, make_llm, ttft_s

    hit = (n_tokens - 1) // BLOCK_SIZE * BLOCK_SIZE
    max_len = n_tokens + 64
    k = runs + 1
    ttft: dict[str, float] = {}
    llm = make_llm(model, max_model_len=max_len)
    try:
        ttft["split recompute"] = ttft_s(llm, lambda i: fresh[i], runs, want_cached=0)
        ttft["split prefix cache"] = ttft_s(llm, lambda i: same, runs, want_cached=hit,
                                            reset=False)
    finally:
        close_llm(llm)
    ttft["split daemon no reuse"], ttft["split daemon host hit"] = daemon_ttfts(
        model, Path(tempfile.mkdtemp(dir=tmp, prefix="daemon-split-")), max_len=max_len,
        runs=runs, fresh=lambda i: fresh[k + i], same=same, hit=hit)
    return ttft


def main() -> None:
    os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # stdout: the result
    spec = json.loads(Path(sys.argv[1]).read_text())
    ttft = _measure(spec["model"], Path(spec["tmp"]), spec["n_tokens"], spec["runs"],
                    spec["fresh"], spec["same"])
    print(RESULT + json.dumps(ttft), flush=True)


if __name__ == "__main__":  # vLLM spawns its processes: they import this module
    main()
