"""Engine cache <-> host pages, all layers, layer by layer, through the connector's own transfer
(:mod:`kvstore.transfer`), against one contiguous copy of the same bytes.

    python -m bench.transfer [--quick] [--json] [--record]

GPU (full run): Llama-3-8B pages (32 layers, 2 MiB each), 2048 pages (a 32K-token prefix, 4 GiB)
scattered over a page-first pool on the GPU and the host tier's pinned slab in shuffled order.

* **load** -- host slab -> GPU pool: one scatter kernel per layer (``csrc/copy_rows.cu``) on the
  connector's load stream, what a host hit does;
* **save** -- GPU pool -> the host slots a save reserved (``store.prepare_store``), as the
  worker saves after a step's last layer: whole pages on the save stream, one DMA per run of
  adjacent blocks and slots (here the blocks are shuffled: one DMA per page); into one run of
  adjacent slots (a fresh slab) and into slots shuffled over the slab (an aged one);
* **per-slice copies** -- the same load as one ``copy_`` per (page, layer) slice (the torch
  reference, what an engine without a gather kernel does), on a slice of the pages;
* **baseline** -- one contiguous pinned ``copy_`` of the same bytes in the same direction: the
  PCIe link's limit (target: >= 0.9 of it).

CPU (``--quick``, or no GPU): the same over a CPU pool with the CPU transfer (memcpy per slice
through the native streaming copy), baseline one ``np.copyto`` of the same bytes.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
from tqdm import tqdm

from bench.common import add_standard_args, command_line, emit_json, measurement, print_measurements, record
from kvstore.transfer import make_transfer
from kvstore import KVLayout
from kvstore.ops import (copy_rows, copy_rows_blocks, copy_rows_native_active, copy_rows_reference,
                        copy_spans)

LLAMA3_8B = KVLayout(32, 8, 128, 16, "bfloat16")


def _best(fn: Callable[[], object], sync: Callable[[], None], rounds: int) -> float:
    fn()
    sync()
    best = float("inf")
    for _ in range(rounds):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - t0)
    return best


def main(argv: list[str] | None = None) -> None:
    args = add_standard_args(argparse.ArgumentParser(prog="python -m bench.transfer")).parse_args(argv)
    gpu = torch.cuda.is_available() and not args.quick
    layout = LLAMA3_8B if gpu else KVLayout(8, 8, 128, 16, "bfloat16")
    n = 2048 if gpu else 64
    rounds = 5 if gpu else 3
    L, P = layout.num_layers, layout.page_bytes
    S = P // L
    device = torch.device("cuda" if gpu else "cpu")
    sync = torch.cuda.synchronize if gpu else (lambda: None)
    g = torch.Generator().manual_seed(0)
    pool = torch.empty((n + 64, P), dtype=torch.uint8, device=device)
    slab = torch.randint(0, 256, (n + 64, P), dtype=torch.uint8, generator=g)
    slab = slab.pin_memory() if gpu else slab
    block_ids = torch.randperm(n + 64, generator=g)[:n].tolist()
    slots = torch.randperm(n + 64, generator=g)[:n].tolist()
    layers = [pool.view(-1, L, S)[:, lyr] for lyr in range(L)]
    saver = ThreadPoolExecutor(1)
    xfer = make_transfer(layers, slab, L, P, copy_spans, saver)
    nbytes = n * P

    def load() -> None:
        ctx = xfer.load_context(xfer.gate(), block_ids, slots)
        for lyr in range(L):
            xfer.load_layer(ctx, lyr)
        xfer.finish_load(ctx)

    run_slots = list(range(n))  # a fresh slab reserves ascending slots: one run
    scattered = torch.randperm(n + 64, generator=g)[:n].tolist()

    def saver_into(save_slots: list[int]) -> Callable[[], None]:
        buf = xfer.new_save(block_ids, save_slots)

        def save() -> None:
            if xfer.saves_whole_pages:  # as the worker does: whole pages after the last layer
                xfer.save_pages(buf)
            else:
                for lyr in range(L):
                    xfer.begin_save_layer(lyr)
                    xfer.save_layer(buf, lyr)
            xfer.mark_saved(buf)
            xfer.wait_saved(buf)
        return save

    def saved_right(save_slots: list[int]) -> bool:
        return torch.equal(slab[torch.tensor(save_slots)], pool[torch.tensor(block_ids)].cpu())

    progress = tqdm(total=5, desc="bench.transfer", leave=False, disable=args.quick)
    t_load = _best(load, sync, rounds)
    progress.update()
    want = slab[torch.tensor(slots)]
    assert torch.equal(pool[torch.tensor(block_ids)].cpu(), want), "load moved the wrong bytes"
    t_save = _best(saver_into(run_slots), sync, rounds)
    progress.update()
    assert saved_right(run_slots), "save moved the wrong bytes"
    t_scatter = _best(saver_into(scattered), sync, rounds)
    progress.update()
    assert saved_right(scattered), "scattered save moved the wrong bytes"
    if gpu:
        flat_h = slab[:n].reshape(-1)
        flat_d = pool[:n].reshape(-1)
        t_h2d = _best(lambda: flat_d.copy_(flat_h, non_blocking=True), sync, rounds)
        t_d2h = _best(lambda: flat_h.copy_(flat_d, non_blocking=True), sync, rounds)
        base_name = "one contiguous pinned copy"
        # per-slice copies on a slice of the pages (they are slow), scaled to the same bytes
        k = 128
        ids = torch.tensor(block_ids[:k]), torch.tensor(slots[:k])
        t_ref = _best(lambda: [copy_rows_reference(layers[lyr], slab.view(-1, L, S)[:, lyr], *ids)
                               for lyr in range(L)], sync, 2) * n / k
        # thread blocks per launch: few fill PCIe; many would hold every SM (no overlap)
        dst_i = torch.tensor(block_ids, dtype=torch.int64).pin_memory()
        src_i = torch.tensor(slots, dtype=torch.int64).pin_memory()
        slab_layers = [slab.view(-1, L, S)[:, lyr] for lyr in range(L)]
        sweep, save_sweep = {}, {}
        for blocks in (8, 16, 32, 64, 132, n):
            sweep[blocks] = _best(lambda: [copy_rows(layers[lyr], slab_layers[lyr], dst_i, src_i,
                                                     max_blocks=blocks) for lyr in range(L)],
                                  sync, rounds)
        for blocks in (2, 4, 8, 16, 33):  # saves overlap a prefill: how few blocks keep up
            save_sweep[blocks] = _best(lambda: [copy_rows(slab_layers[lyr], layers[lyr], src_i,
                                                          dst_i, max_blocks=blocks)
                                                for lyr in range(L)], sync, rounds)
    else:
        a, b = np.empty(nbytes, np.uint8), slab.numpy().reshape(-1)[:nbytes].copy()
        t_h2d = t_d2h = _best(lambda: np.copyto(a, b), sync, rounds)
        base_name = "np.copyto of the same bytes"
        t_ref = None
    progress.update(2)
    progress.close()
    saver.shutdown()
    gbs = lambda t: nbytes / t / 1e9  # noqa: E731
    case = f"{'llama3-8b' if gpu else 'cpu'}/{n}-pages"
    kernel = (f"copy_rows kernel, {copy_rows_blocks(device)} blocks" if copy_rows_native_active()
              else "reference") if gpu else "memcpy per slice"
    save_how = ("whole pages, one DMA per run" if xfer.saves_whole_pages
                else f"copy_rows kernel, {xfer.save_blocks} blocks") if gpu else kernel
    lines = [
        measurement("transfer", case, f"load ({kernel})", "throughput", gbs(t_load), "GB/s",
                    baseline=f"{base_name} (host->{device.type})", baseline_value=gbs(t_h2d)),
        measurement("transfer", case,
                    f"save into reserved slots ({save_how})",
                    "throughput", gbs(t_save), "GB/s",
                    baseline=f"{base_name} ({device.type}->host)", baseline_value=gbs(t_d2h)),
        measurement("transfer", case,
                    f"save into scattered slots ({save_how})",
                    "throughput", gbs(t_scatter), "GB/s",
                    baseline=f"{base_name} ({device.type}->host)", baseline_value=gbs(t_d2h)),
    ]
    if t_ref is not None:
        for blocks, t in sweep.items():
            lines.append(measurement("transfer", case, f"load, kernel with {blocks} blocks",
                                     "throughput", gbs(t), "GB/s",
                                     baseline=f"{base_name} (host->cuda)", baseline_value=gbs(t_h2d)))
        for blocks, t in save_sweep.items():
            lines.append(measurement("transfer", case, f"save, kernel with {blocks} blocks",
                                     "throughput", gbs(t), "GB/s",
                                     baseline=f"{base_name} (cuda->host)", baseline_value=gbs(t_d2h)))
        lines.append(measurement("transfer", case, "load, one copy_ per slice", "throughput",
                                 gbs(t_ref), "GB/s", baseline=f"{base_name} (host->cuda)",
                                 baseline_value=gbs(t_h2d)))
    if args.json:
        emit_json(lines)
    else:
        print_measurements(lines, "GB/s",
                           title=f"bench.transfer ({device.type}, {nbytes / 2**30:.2f} GiB)",
                           headline=f"headline: load {lines[0].ratio:.2f}x, save {lines[1].ratio:.2f}x "
                                    "of one contiguous copy (target >= 0.9)")
    if args.record:
        print(f"recorded {record('transfer', lines, command_line())}")


if __name__ == "__main__":
    main()
