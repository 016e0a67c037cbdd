"""An engine process over a daemon, driven by JSON lines on stdin (one reply line each):

    {"op": "gen", "prompt": [...], "max_tokens": n}  -> {"tokens", "computed", "reused",
                                                        "load_failed", "failures"}
    {"op": "connected"}                             -> true once reconnected (waits up to 60 s)
    {"op": "quit"}

``argv[1]``: the daemon's address. ``KV_PAUSE=load|save``: the first copy out of the shared
slab (load) or into the session's staging area (save) prints ``PAUSED`` and waits for a line on stdin before it runs -- so a
test can kill this process, or the daemon, while a handle is open.
"""

from __future__ import annotations

import json
import os
import sys
import threading

from kvstore.ops import copy_spans
from runtime.engine import Engine
from runtime.sampling import SamplingParams

NUM_BLOCKS = 64


def pausing_copy(remote, which: str):  # noqa: ANN001, ANN201
    seg = remote._memory.slab if which == "load" else remote._memory.stage
    lo = seg.address
    hi = lo + seg.nbytes
    paused = threading.Event()

    def copy(spans):  # noqa: ANN001, ANN202
        if spans and not paused.is_set():
            dst, src = spans[0]
            addr = (src if which == "load" else dst).ctypes.data
            if lo <= addr < hi:
                paused.set()
                print("PAUSED", flush=True)
                sys.stdin.readline()
        copy_spans(spans)

    return copy


def build(target: str) -> Engine:
    pause = os.environ.get("KV_PAUSE")
    if not pause:
        return Engine.from_config("tiny", num_blocks=NUM_BLOCKS, daemon=target)
    from connector.daemon import DaemonStore
    from connector.inprocess import InProcessScheduler, InProcessWorker
    from kvstore.keys import Namespace
    from runtime.config import get_model_config

    ns = Namespace("random/tiny/0", get_model_config("tiny").kv_layout(16))
    remote = DaemonStore(target, ns.id)
    conn = (InProcessScheduler(remote, ns, num_blocks=NUM_BLOCKS),  # type: ignore[arg-type]
            InProcessWorker(remote, copy_fn=pausing_copy(remote, pause)))  # type: ignore[arg-type]
    engine = Engine.from_config("tiny", num_blocks=NUM_BLOCKS, connector=conn)
    engine.daemon = remote
    return engine


def main() -> None:
    engine = build(sys.argv[1])
    print("READY", flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "quit":
            break
        if cmd["op"] == "connected":  # wait for the client to reconnect (after an outage)
            print(json.dumps(engine.daemon.wait_connected(60.0)), flush=True)
            continue
        out = engine.generate([cmd["prompt"]], SamplingParams(max_tokens=cmd["max_tokens"]))[0]
        engine.drain()
        m = out.metrics
        print(json.dumps({
            "tokens": out.output_token_ids, "computed": m.num_tokens_computed,
            "reused": m.num_tokens_reused, "load_failed": m.num_tokens_load_failed,
            "failures": dict(engine.daemon.failures),
        }), flush=True)
    engine.close()


if __name__ == "__main__":
    main()
