"""vLLM in its default process layout (no ``VLLM_ENABLE_V1_MULTIPROCESSING`` override: the
scheduler in an EngineCore process, the worker in a process of its own) with kvstore's
connector over a daemon: a prompt, ``reset_prefix_cache``, the same prompt again. Prints one
``RESULT {json}`` line: each run's greedy tokens and ``num_cached_tokens``.

``argv``: the model directory, the daemon's address (or ``in-process``: a host tier of its own,
which this layout refuses)."""

from __future__ import annotations

import json
import os
import sys

os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

from bench import vllm_engines as ve  # noqa: E402
from tests.vllm.prompts import PROMPTS  # noqa: E402


def main() -> None:
    model, target = sys.argv[1], sys.argv[2]
    extra = {"daemon": target} if target != "in-process" else {
        "tiers": [{"kind": "host", "capacity": "64MiB"}]}
    llm = ve.make_llm(model, ve.kvstore_transfer_config(extra))
    try:
        first = ve.generate(llm, [PROMPTS[0]])[0]
        ve.reset_prefix_cache(llm)
        second = ve.generate(llm, [PROMPTS[0]])[0]
    finally:
        llm.llm_engine.engine_core.shutdown()
    print("RESULT " + json.dumps({"first": first, "second": second}), flush=True)


if __name__ == "__main__":
    main()
