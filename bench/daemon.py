"""bench.daemon: N worker processes through a real ``kvstore serve`` (1, 2, 4 clients).

Per client count:
* lookup p50/p99 of a 4K-token prompt (256 keys) over the Unix socket, against the same lookup
  on an in-process store;
* save and load GB/s through the shared-memory slab (prepare_store / copy into the slab rows /
  complete_store; lookup / prepare_load / copy out / complete_load), all clients together,
  against the same calls and copies on an in-process store (one process) in the same run;
* the cross-node path -- pages as bytes over gRPC streams (WritePages / ReadPages) -- against the
  shared-memory path.

``python -m bench.daemon [--quick] [--json] [--record]``
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import add_standard_args, command_line, emit_json, measurement, print_table, record

LOOKUP_KEYS = 256


def _layout_cfg(quick: bool) -> dict[str, Any]:
    # quick: 256 KiB pages (4 layers of Llama-3-8B's shape); full: Llama-3-8B's 2 MiB pages
    return {"num_layers": 4 if quick else 32, "num_kv_heads": 8, "head_dim": 128,
            "block_size": 16, "dtype": "bfloat16"}


def start_daemon(tmp: Path, layout: dict[str, Any], host: str) -> tuple[subprocess.Popen, str]:
    """A ``kvstore serve`` in ``tmp`` with one host tier of ``host`` bytes and ``layout``'s
    ``[layout]``; returns the process and its target once a client can connect."""
    cfg = tmp / "kvstore.toml"
    lines = ['model_id = "bench"', "[layout]"]
    lines += [f'{k} = "{v}"' if isinstance(v, str) else f"{k} = {v}" for k, v in layout.items()]
    lines += ["[daemon]", f'data_dir = "{tmp}"', f'socket = "{tmp}/kvstore.sock"',
              "[[tiers]]", 'kind = "host"', f'capacity = "{host}"']
    cfg.write_text("\n".join(lines) + "\n")
    proc = subprocess.Popen([sys.executable, "-m", "server.cli", "serve", "--config", str(cfg)],
                            stdout=subprocess.DEVNULL, stderr=open(tmp / "daemon.log", "wb"))
    target = f"unix://{tmp}/kvstore.sock"
    from connector.daemon import DaemonStore, DaemonUnavailable

    deadline = time.monotonic() + 60
    while True:
        try:
            DaemonStore(target, b"\0" * 16, connect_timeout_s=1).close()
            return proc, target
        except DaemonUnavailable:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError((tmp / "daemon.log").read_text()) from None
            time.sleep(0.1)


def _workload(store: Any, ns: Any, pages: int, rounds: int, seed: int) -> dict[str, Any]:
    """Save ``pages`` pages and load them back, ``rounds`` times (fresh keys each round), then
    time lookups. Works on a TieredStore and a DaemonStore alike."""
    page_bytes = store.layout.page_bytes
    src = np.random.default_rng(seed).integers(0, 255, (pages, page_bytes), np.uint8)
    dst = np.empty_like(src)
    save_s = load_s = 0.0
    for r in range(rounds):
        tokens = (np.arange(pages * 16) + (seed * 1000 + r) * pages * 16) % 30000
        chain = ns.chain(tokens.tolist())
        t0 = time.perf_counter()
        h = store.prepare_store(chain.metas())
        row = {m.key: i for i, m in enumerate(chain.metas())}
        for slot, m in zip(h.slots, h.metas):
            np.copyto(h.slab[slot], src[row[m.key]])
        store.complete_store(h)
        t1 = time.perf_counter()
        found = store.lookup(chain.keys, lease=True)
        lh = store.prepare_load(ns.id, chain.keys[: found.num_blocks], lease=found.lease)
        for i, slot in enumerate(lh.slots):
            np.copyto(dst[i], lh.slab[slot])
        store.complete_load(lh)
        t2 = time.perf_counter()
        assert lh.num_blocks == pages and np.array_equal(dst, src), "pages came back wrong"
        save_s += t1 - t0
        load_s += t2 - t1
    keys = ns.chain(list(range(LOOKUP_KEYS * 16))).keys
    lat = []
    for _ in range(200 if rounds > 2 else 60):
        t0 = time.perf_counter()
        store.lookup(keys)
        lat.append(time.perf_counter() - t0)
    return {"bytes": pages * page_bytes * rounds, "save_s": save_s, "load_s": load_s, "lat": lat}


def _bytes_path(store: Any, ns: Any, pages: int, seed: int) -> dict[str, float]:
    page_bytes = store.layout.page_bytes
    src = np.random.default_rng(seed).integers(0, 255, (pages, page_bytes), np.uint8)
    chain = ns.chain(((np.arange(pages * 16) + 7_000_000) % 30000).tolist())
    t0 = time.perf_counter()
    store.write_pages(chain.metas(), src)
    t1 = time.perf_counter()
    out = np.empty_like(src)
    n = store.read_pages(chain.keys, out)
    t2 = time.perf_counter()
    assert n == pages and np.array_equal(out, src)
    return {"write_gbps": src.nbytes / (t1 - t0) / 1e9, "read_gbps": src.nbytes / (t2 - t1) / 1e9}


def _prefault(slab: np.ndarray) -> None:
    """Touch every 4 KiB page of a slab mapping, so the timed copies take no page faults."""
    flat = slab.reshape(-1)
    int(flat[::4096].sum())


def _client(target: str, pages: int, rounds: int, seed: int, barrier: Any, q: Any) -> None:
    from connector.daemon import DaemonStore
    from kvstore import Namespace

    store = DaemonStore(target, b"\0" * 16)
    ns = Namespace("bench", store.layout, f"client-{seed}")
    store.namespace_id = ns.id
    _prefault(store.staging_tier().slab)  # a long-lived engine maps once; so does the baseline
    barrier.wait()
    t0 = time.perf_counter()
    res = _workload(store, ns, pages, rounds, seed)
    res["wall_s"] = time.perf_counter() - t0
    q.put(res)
    store.close()


def main(argv: list[str] | None = None) -> None:
    parser = add_standard_args(argparse.ArgumentParser(description=__doc__.split("\n")[0]))
    args = parser.parse_args(argv)
    from kvstore import KVLayout, Namespace, TieredStore
    from kvstore.tiers.host import HostTier

    layout_cfg = _layout_cfg(args.quick)
    layout = KVLayout(**layout_cfg)
    pages = 32 if args.quick else 64  # per client and round: 8 MiB quick, 128 MiB full
    rounds = 3 if args.quick else 8
    clients = (1, 2, 4)
    host_pages = pages * max(clients) * 2 + 64
    lines = []
    # baseline: the same calls and copies on an in-process store
    inproc = TieredStore(layout, [HostTier("host", layout, host_pages)])
    inproc.tier("host").slab.fill(0)  # fault the slab in before timing  # type: ignore[attr-defined]
    base = _workload(inproc, Namespace("bench", layout, "inproc"), pages, rounds, 99)
    inproc.close()
    base_save, base_load = base["bytes"] / base["save_s"] / 1e9, base["bytes"] / base["load_s"] / 1e9
    base_p50, base_p99 = (float(np.percentile(base["lat"], p)) * 1e3 for p in (50, 99))
    with tempfile.TemporaryDirectory(prefix="kvstore-bench-daemon-") as tmp:
        proc, target = start_daemon(Path(tmp), layout_cfg, f"{host_pages * layout.page_bytes}B")
        try:
            ctx = mp.get_context("spawn")
            for n in clients:
                barrier, q = ctx.Barrier(n), ctx.Queue()
                procs = [ctx.Process(target=_client, args=(target, pages, rounds, i, barrier, q))
                         for i in range(n)]
                for p in procs:
                    p.start()
                results = [q.get(timeout=600) for _ in procs]
                for p in procs:
                    p.join()
                total = sum(r["bytes"] for r in results)
                save = total / max(r["save_s"] for r in results) / 1e9
                load = total / max(r["load_s"] for r in results) / 1e9
                lat = np.concatenate([r["lat"] for r in results]) * 1e3
                p50, p99 = float(np.percentile(lat, 50)), float(np.percentile(lat, 99))
                case = f"{n}-client"
                lines += [
                    measurement("daemon", case, "shm save", "throughput", save, "GB/s",
                                baseline="in-process store, 1 process", baseline_value=base_save),
                    measurement("daemon", case, "shm load", "throughput", load, "GB/s",
                                baseline="in-process store, 1 process", baseline_value=base_load),
                    measurement("daemon", case, f"lookup {LOOKUP_KEYS} keys p50", "latency", p50,
                                "ms", baseline="in-process lookup p50", baseline_value=base_p50,
                                higher_is_better=False),
                    measurement("daemon", case, f"lookup {LOOKUP_KEYS} keys p99", "latency", p99,
                                "ms", baseline="in-process lookup p99", baseline_value=base_p99,
                                higher_is_better=False),
                ]
            # the cross-node path against the shared-memory path, one client
            from connector.daemon import DaemonStore

            with DaemonStore(target, b"\0" * 16) as store:
                ns = Namespace("bench", layout, "bytes")
                store.namespace_id = ns.id
                shm = _workload(store, ns, pages, 2, 1234)
                grpc_bytes = _bytes_path(store, ns, pages, 1234)
            shm_save, shm_load = shm["bytes"] / shm["save_s"] / 1e9, shm["bytes"] / shm["load_s"] / 1e9
            lines += [
                measurement("daemon", "1-client", "grpc-bytes save", "throughput",
                            grpc_bytes["write_gbps"], "GB/s", baseline="shm save",
                            baseline_value=shm_save),
                measurement("daemon", "1-client", "grpc-bytes load", "throughput",
                            grpc_bytes["read_gbps"], "GB/s", baseline="shm load",
                            baseline_value=shm_load),
            ]
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
    if args.json:
        emit_json(lines)
    else:
        one = [m for m in lines if m.case == "1-client" and m.variant == "shm load"][0]
        p99 = [m for m in lines if m.case == "1-client" and m.variant.endswith("p99")][0]
        print_table(
            ("case", "variant", "value", "unit", "baseline", "ratio"),
            [(m.case, m.variant, m.value, m.unit, m.baseline_value, m.ratio) for m in lines],
            title=f"bench.daemon: pages of {layout.page_bytes // 1024} KiB, {pages} per client "
                  f"and round, {rounds} rounds; {os.cpu_count()} cores",
            headline=f"headline: 1 client loads at {one.ratio:.2f} x the in-process store "
                     f"(target >= 0.9); lookup p99 {p99.value:.3f} ms (target <= 1 ms)")
    if args.record:
        print(f"recorded {record('daemon', lines, command_line())}")


if __name__ == "__main__":
    main()
