"""bench.daemon: N worker processes through a real ``kvstore serve`` (1, 2, 4 clients).

Per client count:
* lookup p50/p99 of a 32K-token prompt (2048 keys, every one held in host), with a lease as the
  connector's scheduler asks (the release is not timed), over the Unix socket, against the same
  lookup on an in-process store; on a daemon of its own with small pages (a lookup's cost does
  not depend on the page size, and 2048 Llama-sized pages per client would not fit in memory);
* save and load GB/s through shared memory, all clients together, two ways: ``shm`` -- the
  caller copies (prepare_store / copy into the session's staging rows / complete_store, where
  the daemon copies them into the slab -- clients map the slab read-only; lookup / prepare_load
  / copy out of the slab / complete_load), as the connector does for device pages; and
  ``peer-copy`` -- the caller names its pages (``complete_store(pages=)``,
  ``complete_load(into=)``) and the daemon copies them straight from and to the client's memory
  on its copy threads. Each against the same calls on an in-process store (one process) in the
  same run. The
  baseline runs in a process of its own, as a client does, and alternates with the one-client
  runs (``REPEATS`` of each, medians): a single-threaded copy's speed drifts by 10-20 % between
  runs on a VM, more than the difference measured;
* the cross-node path -- pages as bytes over gRPC streams (WritePages / ReadPages) -- against the
  shared-memory path.

``python -m bench.daemon [--quick] [--json] [--record]``
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bench.common import add_standard_args, command_line, emit_json, measurement, print_table, record

if TYPE_CHECKING:
    from kvstore import KVLayout, Tier

LOOKUP_KEYS = 2048  # a 32K-token prompt in 16-token blocks
LOOKUP_RUNS = 400
#: in-process and one-client runs, alternated (see the module docstring)
REPEATS = 3
#: how the caller's pages move (see the module docstring)
MODES = ("shm", "peer-copy")
#: a round's save, in this many parts completed while the next is written (as the connector does)
SAVE_CHUNKS = 4
#: the lookup daemon's pages: small, as many as the clients' prompts need
LOOKUP_LAYOUT = {"num_layers": 1, "num_kv_heads": 1, "head_dim": 16, "block_size": 16,
                 "dtype": "float16"}


def _layout_cfg(quick: bool) -> dict[str, Any]:
    # quick: 256 KiB pages (4 layers of Llama-3-8B's shape); full: Llama-3-8B's 2 MiB pages
    return {"num_layers": 4 if quick else 32, "num_kv_heads": 8, "head_dim": 128,
            "block_size": 16, "dtype": "bfloat16"}


def _daemon(tmp: Path, layout: Any, host_bytes: int) -> Any:
    """A started ``kvstore serve`` with one host tier of ``host_bytes`` for ``layout``."""
    from server.daemon.process import DaemonProcess, layout_env

    env = {**layout_env(layout), "KVSTORE_MODEL_ID": "bench",
           "KVSTORE_TIERS": f'[{{"kind": "host", "capacity": "{host_bytes}B"}}]'}
    return DaemonProcess(tmp, env).start()


def _spawn(target: Any, n: int, *args: Any) -> list[Any]:
    """Run ``target(*args, i, barrier, queue)`` in ``n`` processes (``i``: the client's
    number); their results, one per client."""
    ctx = mp.get_context("spawn")
    barrier, q = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args, i, barrier, q))
             for i in range(n)]
    for p in procs:
        p.start()
    results = [q.get(timeout=600) for _ in procs]
    for p in procs:
        p.join()
    return results


def _workload(store: Any, ns: Any, pages: int, rounds: int, seed: int,
              mode: str = "shm") -> dict[str, Any]:
    """Save ``pages`` pages and load them back, ``rounds`` times (fresh keys each round), then
    time lookups. Works on a TieredStore and a DaemonStore alike.

    A round's save runs as the connector's does: in ``SAVE_CHUNKS`` parts, each written into
    its reserved rows on this thread and completed on a save thread while the next part is
    written (over the daemon, ``complete_store`` copies the part from the session's staging
    area into the slab). ``mode``: ``shm`` -- this thread copies into the handle's rows and out
    of the slab; ``peer-copy`` -- the calls take the pages (``pages=`` / ``into=``)."""
    page_bytes = store.layout.page_bytes
    src = np.random.default_rng(seed).integers(0, 255, (pages, page_bytes), np.uint8)
    dst = src.copy()  # written: no page faults in the timed copies
    save_s = load_s = 0.0
    saver = ThreadPoolExecutor(1)
    for r in range(rounds):
        tokens = (np.arange(pages * 16) + (seed * 1000 + r) * pages * 16) % 30000
        chain = ns.chain(tokens.tolist())
        metas = chain.metas()
        row = {m.key: i for i, m in enumerate(metas)}
        step = -(-pages // SAVE_CHUNKS)
        t0 = time.perf_counter()
        done = []
        for part in range(0, pages, step):
            h = store.prepare_store(metas[part: part + step])
            if mode == "shm":
                for slot, m in zip(h.slots, h.metas):
                    np.copyto(h.slab[slot], src[row[m.key]])
                done.append(saver.submit(store.complete_store, h))
            else:
                done.append(saver.submit(store.complete_store, h,
                                         pages=[src[row[m.key]] for m in h.metas]))
        for f in done:
            f.result()
        t1 = time.perf_counter()
        found = store.lookup(chain.keys, lease=True)
        lh = store.prepare_load(ns.id, chain.keys[: found.num_blocks], lease=found.lease)
        if mode == "shm":
            for i, slot in enumerate(lh.slots):
                np.copyto(dst[i], lh.slab[slot])
            store.complete_load(lh)
        else:
            store.complete_load(lh, into=dst[: lh.num_blocks])
        t2 = time.perf_counter()
        assert lh.num_blocks == pages and np.array_equal(dst, src), "pages came back wrong"
        save_s += t1 - t0
        load_s += t2 - t1
    saver.shutdown()
    return {"bytes": pages * page_bytes * rounds, "save_s": save_s, "load_s": load_s}


def _lookups(store: Any, ns: Any, runs: int, barrier: Any = None) -> list[float]:
    """Store a 32K-token prompt's pages (their bytes do not matter here), then time ``runs``
    leased lookups of it, each lease released untimed."""
    chain = ns.chain(list(range(LOOKUP_KEYS * 16)))
    store.complete_store(store.prepare_store(chain.metas()))
    keys = list(chain.keys)
    if barrier is not None:
        barrier.wait()
    lat = []
    for _ in range(runs):
        t0 = time.perf_counter()
        found = store.lookup(keys, lease=True)
        lat.append(time.perf_counter() - t0)
        assert found.num_blocks == LOOKUP_KEYS, "the prompt's pages went missing"
        store.release(found.lease)
    return lat


def _lookup_client(target: str, runs: int, seed: int, barrier: Any, q: Any) -> None:
    from connector.daemon import DaemonStore
    from kvstore import Namespace

    with DaemonStore(target, b"\0" * 16) as store:
        ns = Namespace("bench", store.layout, f"lookup-{seed}")
        store.namespace_id = ns.id
        q.put(_lookups(store, ns, runs, barrier))


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


def _shm_medium(page_bytes: int, pages: int, rounds: int) -> tuple[float, float]:
    """GB/s of the same page copies into and out of a fresh shared-memory mapping (written
    once first, as a long-lived slab is): the medium the daemon's data path runs on. Shared
    memory gets no transparent huge pages unless the kernel's shmem setting allows them, so it
    copies slower than the in-process store's anonymous slab (madvised for huge pages)."""
    from connector.daemon.shm import SharedSlab

    slab = SharedSlab.create("kvstore-bench", pages * page_bytes)
    try:
        view = slab.array.reshape(pages, page_bytes)
        view.fill(1)
        src = np.random.default_rng(5).integers(0, 255, (pages, page_bytes), np.uint8)
        dst = src.copy()  # written: its pages are faulted in before timing
        put = get = 0.0
        for _ in range(rounds):
            t0 = time.perf_counter()
            for i in range(pages):
                np.copyto(view[i], src[i])
            t1 = time.perf_counter()
            for i in range(pages):
                np.copyto(dst[i], view[i])
            put, get = put + t1 - t0, get + time.perf_counter() - t1
        nbytes = src.nbytes * rounds
        return nbytes / put / 1e9, nbytes / get / 1e9
    finally:
        slab.close()


def _prefault(slab: np.ndarray) -> None:
    """Touch every 4 KiB page of a slab mapping, so the timed copies take no page faults."""
    flat = slab.reshape(-1)
    int(flat[::4096].sum())


def _host_tier(layout: KVLayout, num_pages: int) -> Tier:
    """A host tier of ``num_pages`` pages, built as a configuration's would be."""
    from kvstore import build_tier

    return build_tier({"kind": "host", "capacity": num_pages * layout.page_bytes}, layout)


def _inproc_client(layout_cfg: dict[str, Any], host_pages: int, pages: int, rounds: int,
                   mode: str, _i: int, _barrier: Any, q: Any) -> None:
    """The baseline: the client's workload on an in-process store, in a process of its own."""
    from kvstore import KVLayout, Namespace, TieredStore

    layout = KVLayout(**layout_cfg)
    store = TieredStore(layout, [_host_tier(layout, host_pages)])
    store.staging_tier("host").slab.fill(0)  # fault the slab in before timing
    q.put(_workload(store, Namespace("bench", layout, "inproc"), pages, rounds, 99, mode))
    store.close()


def _gbps(results: list[dict[str, Any]]) -> tuple[float, float]:
    """Save and load GB/s of clients that ran together (the slowest one's time)."""
    total = sum(r["bytes"] for r in results)
    return (total / max(r["save_s"] for r in results) / 1e9,
            total / max(r["load_s"] for r in results) / 1e9)


def _client(target: str, pages: int, rounds: int, first: int, mode: str, i: int, barrier: Any,
            q: Any) -> None:
    """Client ``i`` of a run whose clients are numbered from ``first`` (its namespace, so every
    run writes new pages)."""
    from connector.daemon import DaemonStore
    from kvstore import Namespace

    seed = first + i
    store = DaemonStore(target, b"\0" * 16)
    assert mode == "shm" or store.peer_copy, "the daemon cannot copy this client's memory"
    ns = Namespace("bench", store.layout, f"client-{seed}")
    store.namespace_id = ns.id
    # a long-lived engine maps once and has written its staging rows before; so does the baseline
    _prefault(store.staging_tier().slab)
    store.staging_tier().save_slab.fill(0)
    barrier.wait()
    t0 = time.perf_counter()
    res = _workload(store, ns, pages, rounds, seed, mode)
    res["wall_s"] = time.perf_counter() - t0
    q.put(res)
    store.close()


def main(argv: list[str] | None = None) -> None:
    parser = add_standard_args(argparse.ArgumentParser(description=__doc__.split("\n")[0]))
    args = parser.parse_args(argv)
    from kvstore import KVLayout, Namespace, TieredStore

    layout_cfg = _layout_cfg(args.quick)
    layout = KVLayout(**layout_cfg)
    pages = 32 if args.quick else 64  # per client and round: 8 MiB quick, 128 MiB full
    rounds = 3 if args.quick else 8
    clients = (1, 2, 4)
    host_pages = pages * max(clients) * 2 + 64
    lines = []
    # baseline: the same lookups on an in-process store
    small = KVLayout(**LOOKUP_LAYOUT)  # type: ignore[arg-type]
    inproc = TieredStore(small, [_host_tier(small, LOOKUP_KEYS + 64)])
    base_lat = _lookups(inproc, Namespace("bench", small, "inproc"), LOOKUP_RUNS)
    inproc.close()
    base_p50, base_p99 = (float(np.percentile(base_lat, p)) * 1e3 for p in (50, 99))
    medium_put, medium_get = _shm_medium(layout.page_bytes, pages, rounds)
    with tempfile.TemporaryDirectory(prefix="kvstore-bench-daemon-") as tmp:
        daemon = _daemon(Path(tmp) / "pages", layout, host_pages * layout.page_bytes)
        looks = _daemon(Path(tmp) / "lookups", small,
                        (LOOKUP_KEYS * max(clients) + 64) * small.page_bytes)
        try:
            # baseline: the same calls and copies on an in-process store, alternated with the
            # one-client runs
            base: dict[str, tuple[float, float]] = {}
            one: dict[str, tuple[float, float]] = {}
            for mi, mode in enumerate(MODES):
                base_runs, one_runs = [], []
                for k in range(REPEATS):
                    base_runs += [_gbps(_spawn(_inproc_client, 1, layout_cfg, host_pages, pages,
                                               rounds, mode))]
                    one_runs += [_gbps(_spawn(_client, 1, daemon.target, pages, rounds,
                                              100 * mi + k, mode))]
                base[mode] = tuple(float(np.median(x)) for x in zip(*base_runs))  # type: ignore[assignment]
                one[mode] = tuple(float(np.median(x)) for x in zip(*one_runs))  # type: ignore[assignment]
            for n in clients:
                for mi, mode in enumerate(MODES):
                    save, load = one[mode] if n == 1 else _gbps(_spawn(
                        _client, n, daemon.target, pages, rounds, 16 * n + 100 * mi, mode))
                    lines += [
                        measurement("daemon", f"{n}-client", f"{mode} save", "throughput", save,
                                    "GB/s", baseline="in-process store, 1 process",
                                    baseline_value=base[mode][0]),
                        measurement("daemon", f"{n}-client", f"{mode} load", "throughput", load,
                                    "GB/s", baseline="in-process store, 1 process",
                                    baseline_value=base[mode][1]),
                    ]
                lat = np.concatenate(_spawn(_lookup_client, n, looks.target, LOOKUP_RUNS)) * 1e3
                p50, p99 = float(np.percentile(lat, 50)), float(np.percentile(lat, 99))
                case = f"{n}-client"
                lines += [
                    measurement("daemon", case, f"lookup {LOOKUP_KEYS} keys p50", "latency", p50,
                                "ms", baseline="in-process lookup p50", baseline_value=base_p50,
                                higher_is_better=False),
                    measurement("daemon", case, f"lookup {LOOKUP_KEYS} keys p99", "latency", p99,
                                "ms", baseline="in-process lookup p99", baseline_value=base_p99,
                                higher_is_better=False),
                ]
                if n == 1:  # against the medium: the same copies into a shared mapping
                    save, load = one["shm"]
                    lines += [
                        measurement("daemon", case, "shm save vs medium", "throughput", save,
                                    "GB/s", baseline="page copies into shared memory",
                                    baseline_value=medium_put),
                        measurement("daemon", case, "shm load vs medium", "throughput", load,
                                    "GB/s", baseline="page copies out of shared memory",
                                    baseline_value=medium_get),
                    ]
            # the cross-node path against the shared-memory path, one client
            from connector.daemon import DaemonStore

            with DaemonStore(daemon.target, b"\0" * 16) as store:
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
            looks.stop()
            daemon.stop()
    if args.json:
        emit_json(lines)
    else:
        def first(variant: str) -> Any:
            return [m for m in lines if m.case == "1-client" and m.variant == variant][0]

        tail = [m for m in lines if m.case == "1-client" and m.variant.endswith("p99")][0]
        print_table(
            ("case", "variant", "value", "unit", "baseline", "ratio"),
            [(m.case, m.variant, m.value, m.unit, m.baseline_value, m.ratio) for m in lines],
            title=f"bench.daemon: pages of {layout.page_bytes // 1024} KiB, {pages} per client "
                  f"and round, {rounds} rounds; {os.cpu_count()} cores",
            headline=f"headline: 1 client saves at {first('peer-copy save').ratio:.2f} x and "
                     f"loads at {first('peer-copy load').ratio:.2f} x the in-process store by "
                     f"peer copy (caller copies: {first('shm save').ratio:.2f} x / "
                     f"{first('shm load').ratio:.2f} x; target >= 0.9); lookup p99 "
                     f"{tail.value:.3f} ms (target <= 1 ms)")
    if args.record:
        print(f"recorded {record('daemon', lines, command_line())}")


if __name__ == "__main__":
    main()
