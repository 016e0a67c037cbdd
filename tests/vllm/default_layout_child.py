"""vLLM in its default process layout (no ``VLLM_ENABLE_V1_MULTIPROCESSING`` override: the
scheduler in an EngineCore process, each worker in a process of its own) with kvstore's
connector: a prompt, ``reset_prefix_cache``, the same prompt again. Prints one ``RESULT
{json}`` line: each run's greedy tokens and ``num_cached_tokens``.

``argv``: the model directory; the connector: the daemon's address, ``in-process`` (a host tier
of its own, which this layout refuses) or ``none`` (vLLM without the plug-in); optionally
``--tp N`` (``tensor_parallel_size``); ``--pin-ttl S --pin-tokens N``: the first request asks
its prefix be pinned (``kv_transfer_params``)."""

from __future__ import annotations

import argparse
import json
import os

os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

from bench import vllm_engines as ve  # noqa: E402
from tests.vllm.prompts import PROMPTS  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("connector")
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--pin-ttl", type=float, default=None)
    parser.add_argument("--pin-tokens", type=int, default=None)
    args = parser.parse_args()
    transfer = None
    if args.connector == "in-process":
        transfer = ve.kvstore_transfer_config({"tiers": [{"kind": "host", "capacity": "64MiB"}]})
    elif args.connector != "none":
        transfer = ve.kvstore_transfer_config({"daemon": args.connector})
    llm = ve.make_llm(args.model, transfer, tensor_parallel_size=args.tp)
    try:
        pin = None if args.pin_ttl is None else {"kvstore_pin_ttl_s": args.pin_ttl,
                                                  "kvstore_pin_tokens": args.pin_tokens}
        first = ve.generate(llm, [PROMPTS[0]], kv_transfer_params=pin)[0]
        ve.reset_prefix_cache(llm)
        second = ve.generate(llm, [PROMPTS[0]])[0]
    finally:
        llm.llm_engine.engine_core.shutdown()
    print("RESULT " + json.dumps({"first": first, "second": second}), flush=True)


if __name__ == "__main__":  # vLLM starts its processes by spawning: they import this module
    main()
