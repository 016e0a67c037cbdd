"""``kvstore store-demo``: fill a store with the KV pages of a few multi-turn chats, read them
back, verify every byte, and print the stats. Runs on the embedded default configuration, or on
the tiers of a config file — a real cache, possibly persistent and shared: so the demo writes
under a namespace of its own (a tenant salt unique to the run, which no other run or user
shares) and deletes every page it wrote before it returns."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
from rich.console import Console
from rich.table import Table

from kvstore import KVStoreConfig, Namespace, TieredStore, build_store


@dataclass(frozen=True)
class DemoReport:
    prompts: int
    blocks_put: int
    lookup_hit_blocks: int
    lookup_total_blocks: int
    bytes_verified: int
    put_gbps: float
    get_gbps: float


def run_demo(cfg: KVStoreConfig, *, conversations: int = 4, turns: int = 4, seed: int = 0,
             console: Console | None = None) -> DemoReport:
    console = console or Console()
    rng = np.random.default_rng(seed)
    store = build_store(cfg)
    layout = store.layout
    ns = Namespace(cfg.model_id, layout, f"kvstore-store-demo/{uuid.uuid4().hex}")
    page_bytes = layout.page_bytes
    system = rng.integers(0, 32000, 4 * layout.block_size).tolist()
    written: dict[bytes, np.ndarray] = {}
    hit_blocks = total_blocks = blocks_put = 0
    put_s = get_s = 0.0
    bytes_verified = 0
    with store, _deleted_at_exit(store, written):
        for _turn in range(turns):
            for conv in range(conversations):
                history = _history(system, conv, _turn, layout.block_size, seed)
                chain = ns.chain(history)
                found = store.lookup(chain.keys, lease=True)
                hit_blocks += found.num_blocks
                total_blocks += len(chain)
                if found.num_blocks:
                    out = np.empty((found.num_blocks, page_bytes), dtype=np.uint8)
                    t0 = time.perf_counter()
                    got = store.get(ns.id, chain.keys[: found.num_blocks], out, lease=found.lease)
                    get_s += time.perf_counter() - t0
                    for i in range(found.num_blocks):
                        if got.found[i]:
                            assert np.array_equal(out[i], written[chain.keys[i]]), "wrong KV bytes"
                            bytes_verified += page_bytes
                new = len(chain) - found.num_blocks
                if new:
                    pages = rng.integers(0, 256, (new, page_bytes), dtype=np.uint8)
                    metas = chain.metas(found.num_blocks)
                    t0 = time.perf_counter()
                    store.put(metas, pages)
                    put_s += time.perf_counter() - t0
                    for m, p in zip(metas, pages):
                        written[m.key] = p
                    blocks_put += new
        store.check_integrity()
        stats = store.stats()
    table = Table(title=f"kvstore demo — {cfg.model_id}, pages of {page_bytes / 2**20:.2f} MiB")
    for col in ("tier", "kind", "used / capacity", "hits", "misses", "writes", "evictions",
                "corrupt"):
        table.add_column(col, justify="right")
    for t in stats.tiers:
        table.add_row(t.name, t.kind, f"{t.used_pages} / {t.capacity_pages}", str(t.hits),
                      str(t.misses), str(t.writes), str(t.evictions), str(t.corrupt))
    console.print(table)
    if stats.copies:
        console.print("copies between tiers: " + ", ".join(f"{k} {v}" for k, v in stats.copies.items()))
    report = DemoReport(
        prompts=conversations * turns,
        blocks_put=blocks_put,
        lookup_hit_blocks=hit_blocks,
        lookup_total_blocks=total_blocks,
        bytes_verified=bytes_verified,
        put_gbps=blocks_put * page_bytes / put_s / 1e9 if put_s else 0.0,
        get_gbps=bytes_verified / get_s / 1e9 if get_s else 0.0,
    )
    console.print(
        f"{report.prompts} prompts: {hit_blocks}/{total_blocks} blocks found by prefix lookup "
        f"({hit_blocks / max(total_blocks, 1):.0%}), {report.bytes_verified / 2**20:.1f} MiB read "
        f"back and verified byte for byte; put {report.put_gbps:.2f} GB/s, "
        f"get {report.get_gbps:.2f} GB/s."
    )
    return report


@contextmanager
def _deleted_at_exit(store: TieredStore, written: dict[bytes, np.ndarray]) -> Iterator[None]:
    """Delete the keys of ``written`` (as it is at exit) from every tier, also on an error."""
    try:
        yield
    finally:
        store.delete(list(written))


def demo_overrides(disk_dir: str) -> dict:
    """The embedded default: Llama-3-8B pages (2 MiB), a 48 MiB host tier over a 1 GiB disk
    tier, write-back, leaf-first ARC eviction."""
    return {
        "model_id": "demo/llama-3-8b-shape",
        "store": {"write_policy": "write_back", "promote_on_hit": True},
        "tiers": [
            {"kind": "host", "capacity": "48MiB", "policy": "lineage_arc"},
            {"kind": "disk", "path": f"{disk_dir}/disk", "capacity": "1GiB", "policy": "lru"},
        ],
    }


def _history(system: list[int], conv: int, turn: int, block_size: int, seed: int) -> list[int]:
    """System prompt + every turn so far of conversation ``conv`` (deterministic)."""
    tokens = list(system)
    for t in range(turn + 1):
        r = np.random.default_rng((seed, conv, t))
        tokens += r.integers(0, 32000, int(r.integers(2, 6)) * block_size + 3).tolist()
    return tokens


__all__ = ["DemoReport", "TieredStore", "run_demo"]
