"""Hash + longest-prefix lookup of a 32K-token prompt against a store with 1M pages indexed.

    python -m bench.lookup [--quick] [--json] [--record]

What is timed (best of N, warm): ``Namespace.chain(tokens)`` (chained xxh3-128 over int32le
blocks of 16 tokens) and ``TieredStore.lookup(keys)`` on a host tier that indexes 1M pages
(quick: 100K) of which the prompt's 2,048 blocks are all present — the worst case: every key is
probed. Token ids come as an int32 numpy array (what an engine holds) and as a Python list.

Baseline, measured in the same run: the prefix hashing a vLLM user gets by default — chained
SHA-256 over ``pickle((parent_hash, tuple(block_tokens)))`` — plus the same lookup.
Target (BENCHMARKS.md): hash + lookup <= 1 ms on the 2-core CPU machine.
"""

from __future__ import annotations

import argparse
import hashlib
import pickle
import time

import numpy as np
from tqdm import tqdm

from bench.common import (
    add_standard_args,
    command_line,
    emit_json,
    measurement,
    print_table,
    record,
)
from kvstore import KVLayout, Namespace, TieredStore, build_tier

PROMPT_TOKENS = 32 * 1024
BLOCK = 16
# A tiny page: the index, not the bytes, is what this bench measures.
LAYOUT = KVLayout(1, 1, 8, BLOCK, "uint8")


def _best_ms(fn, rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


def _sha256_chain(tokens: list[int]) -> list[bytes]:
    parent = b"\0" * 32
    out = []
    for i in range(0, len(tokens) - len(tokens) % BLOCK, BLOCK):
        parent = hashlib.sha256(pickle.dumps((parent, tuple(tokens[i : i + BLOCK])))).digest()
        out.append(parent)
    return out


def build_store(n_pages: int, ns: Namespace, prompt_keys_from,  # noqa: ANN001
                event_log_events: int | None = None) -> TieredStore:
    tier = build_tier({"kind": "host", "capacity": n_pages * LAYOUT.page_bytes,
                       "pin_memory": False}, LAYOUT)
    kw = {} if event_log_events is None else {"event_log_events": event_log_events}
    store = TieredStore(LAYOUT, [tier], ["lru"], **kw)
    pages = np.zeros((4096, LAYOUT.page_bytes), dtype=np.uint8)
    rng = np.random.default_rng(0)
    chains = [prompt_keys_from]
    filled = len(prompt_keys_from)
    while filled < n_pages:
        n = min(PROMPT_TOKENS // BLOCK, n_pages - filled)
        chains.append(ns.chain(rng.integers(0, 128_000, n * BLOCK, dtype=np.int32)))
        filled += n
    bar = tqdm(total=n_pages, desc="indexing pages", unit="page", leave=False)
    for chain in chains:
        metas = chain.metas()
        for i in range(0, len(metas), 4096):
            part = metas[i : i + 4096]
            store.put(part, pages[: len(part)])
            bar.update(len(part))
    bar.close()
    return store


def _leased_p99_ms(stores: tuple[TieredStore, ...], keys: list[bytes], runs: int
                   ) -> list[float]:
    """p99 ms of a leased lookup of ``keys`` on each store (its release not timed), the stores
    taking turns run by run."""
    times: list[list[float]] = [[] for _ in stores]
    for _ in range(runs):
        for i, store in enumerate(stores):
            t0 = time.perf_counter()
            r = store.lookup(keys, lease=True)
            times[i].append(time.perf_counter() - t0)
            assert r.lease is not None
            store.release(r.lease)
    return [float(np.percentile(t, 99)) * 1e3 for t in times]


def main(argv: list[str] | None = None) -> None:
    args = add_standard_args(argparse.ArgumentParser(prog="python -m bench.lookup")).parse_args(argv)
    n_pages = 100_000 if args.quick else 1_000_000
    rounds = 20 if args.quick else 100
    ns = Namespace("bench-lookup", LAYOUT)
    tokens_np = np.random.default_rng(1).integers(0, 128_000, PROMPT_TOKENS, dtype=np.int32)
    tokens_list = tokens_np.tolist()
    prompt = ns.chain(tokens_np)
    store = build_store(n_pages, ns, prompt)
    assert store.lookup(prompt.keys).num_blocks == len(prompt.keys)
    keys = prompt.keys

    hash_np = _best_ms(lambda: ns.chain(tokens_np), rounds)
    hash_list = _best_ms(lambda: ns.chain(tokens_list), rounds)
    look = _best_ms(lambda: store.lookup(keys), rounds)
    both_np = _best_ms(lambda: store.lookup(ns.chain(tokens_np).keys), rounds)
    both_list = _best_ms(lambda: store.lookup(ns.chain(tokens_list).keys), rounds)
    sha = _best_ms(lambda: _sha256_chain(tokens_list), max(5, rounds // 10))
    # the connector's leased lookup, p99, on this store (event log on: the default) against a
    # store of the same pages with the log off, interleaved
    off = build_store(n_pages, ns, prompt, event_log_events=0)
    p99_on, p99_off = _leased_p99_ms((store, off), keys, 10 * rounds)
    off.close()
    base = "sha256(pickle) chain + same lookup"
    case = f"32k-prompt/{n_pages // 1000}k-pages"
    lines = [
        measurement("lookup", case, "hash+lookup numpy-tokens", "latency", both_np, "ms",
                    baseline=base, baseline_value=sha + look, higher_is_better=False),
        measurement("lookup", case, "hash+lookup list-tokens", "latency", both_list, "ms",
                    baseline=base, baseline_value=sha + look, higher_is_better=False),
        measurement("lookup", case, "hash numpy-tokens", "latency", hash_np, "ms"),
        measurement("lookup", case, "hash list-tokens", "latency", hash_list, "ms"),
        measurement("lookup", case, "lookup 2048 keys", "latency", look, "ms"),
        measurement("lookup", case, "leased lookup 2048 keys p99, event log on", "latency",
                    p99_on, "ms", baseline="the same, event log off", baseline_value=p99_off,
                    higher_is_better=False),
    ]
    if args.json:
        emit_json(lines)
    else:
        print_table(
            ("case", "variant", "ms", "baseline ms", "speed-up"),
            [(m.case, m.variant, m.value, m.baseline_value, m.ratio) for m in lines],
            title=f"bench.lookup: {PROMPT_TOKENS} tokens, {n_pages:,} pages indexed",
            headline=f"headline: hash + lookup = {both_np:.3f} ms (numpy tokens), "
            f"{both_list:.3f} ms (list tokens); target <= 1 ms",
        )
    if args.record:
        print(f"recorded {record('lookup', lines, command_line())}")


if __name__ == "__main__":
    main()
