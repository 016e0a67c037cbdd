"""TTFT of the bundled runtime: cold prefill vs a prefix hit in the HBM page pool, with Hugging
Face transformers' prefill of the same model timed in the same run as the peer baseline.

    python -m bench.ttft [--quick] [--json] [--record] [--backend sdpa|torch_ref]

GPU (full run): the ``llama3-8b`` shape in bf16 with random weights, prompts of 1K, 4K, 16K and
32K tokens. CPU (``--quick``, or no GPU): the ``small`` shape, 256 and 1K tokens.

What is timed (median of several runs after a warm-up, CUDA-synchronised):

* **cold prefill** — the whole prompt computed in one forward pass of our model, K/V written
  into the paged pool, logits of the last token;
* **hbm prefix hit** — the same prompt when every full block but the last is already in the
  pool: only the last block's tokens are computed (what an engine does on a full prefix hit);
* **HF prefill** — ``LlamaForCausalLM`` (SDPA attention, same weights, ``logits_to_keep=1``,
  no cache) on the same prompt: the peer a user would otherwise run.

Ratios: cold prefill against HF (HF time / ours: ≥ 1/1.1 is the issue's target), and the hit
against our own cold prefill (the speed-up of the prefix cache).
This is the model-level part of the TTFT bench; the connector issue adds the engine and the
lower tiers (host, disk, redis) to it.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from collections.abc import Callable

import torch
from tqdm import tqdm

from bench.common import (
    add_standard_args,
    command_line,
    emit_json,
    measurement,
    print_table,
    record,
)
from runtime import (
    LlamaForPagedLM,
    SeqInput,
    allocate_kv_pool,
    build_batch,
    get_model_config,
)
from runtime.hf import to_hf_config

BLOCK = 16


def _time(fn: Callable[[], object], device: torch.device, runs: int) -> float:
    fn()  # warm-up (kernels, allocator)
    times = []
    for _ in range(runs):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> None:
    parser = add_standard_args(argparse.ArgumentParser(prog="python -m bench.ttft"))
    parser.add_argument("--backend", default="sdpa")
    args = parser.parse_args(argv)
    gpu = torch.cuda.is_available() and not args.quick
    device = torch.device("cuda" if gpu else "cpu")
    name = "llama3-8b" if gpu else "small"
    lengths = [1024, 4096, 16384, 32768] if gpu else [256, 1024]
    runs = 5 if gpu else 3
    cfg = get_model_config(name)
    if not gpu:
        cfg = cfg.with_dtype("float32")
    cfg = dataclasses.replace(
        cfg, max_position_embeddings=max(cfg.max_position_embeddings, max(lengths))
    )

    import transformers

    torch.manual_seed(0)
    with torch.device(device):
        hf = transformers.LlamaForCausalLM(to_hf_config(cfg, attn_implementation="sdpa"))
    hf = hf.to(dtype=cfg.torch_dtype).eval()
    ours = LlamaForPagedLM(cfg, backend=args.backend, device=device)
    ours.load_weights({k: v for k, v in hf.state_dict().items() if k in dict(ours.named_parameters())})

    lines = []
    gen = torch.Generator().manual_seed(1)
    for n in tqdm(lengths, desc="bench.ttft", leave=False):
        tokens = torch.randint(0, cfg.vocab_size, (n,), generator=gen).tolist()
        num_blocks = -(-n // BLOCK)
        pool = allocate_kv_pool(cfg, num_blocks, BLOCK, device=device)
        table = list(range(num_blocks))
        cold = build_batch([SeqInput(tokens, table, 0)], cfg, block_size=BLOCK,
                           num_blocks=num_blocks, device=device)
        cached = (n // BLOCK - 1) * BLOCK
        hit = build_batch([SeqInput(tokens[cached:], table, cached)], cfg, block_size=BLOCK,
                          num_blocks=num_blocks, device=device)
        ids = torch.tensor([tokens], device=device)
        with torch.inference_mode():
            t_cold = _time(lambda: ours(cold, pool), device, runs)
            t_hit = _time(lambda: ours(hit, pool), device, runs)
            t_hf = _time(lambda: hf(input_ids=ids, use_cache=False, logits_to_keep=1), device, runs)
        case = f"{name}/{n}-tokens"
        lines += [
            measurement("ttft", case, "cold prefill", "ttft", t_cold * 1e3, "ms",
                        baseline="HF transformers prefill", baseline_value=t_hf * 1e3,
                        higher_is_better=False),
            measurement("ttft", case, "hbm prefix hit", "ttft", t_hit * 1e3, "ms",
                        baseline="cold prefill (same runtime)", baseline_value=t_cold * 1e3,
                        higher_is_better=False),
        ]
        if gpu:
            pool = None  # free this length's pool before the next one is allocated
            torch.cuda.empty_cache()
    if args.json:
        emit_json(lines)
    else:
        worst = min(m.ratio for m in lines if m.variant == "cold prefill")
        print_table(
            ("case", "variant", "ms", "baseline", "baseline ms", "ratio"),
            [(m.case, m.variant, m.value, m.baseline, m.baseline_value, m.ratio) for m in lines],
            title=f"bench.ttft ({name}, {cfg.dtype}, backend {args.backend}, {device.type})",
            headline=f"headline: cold prefill vs HF, worst ratio {worst:.3f} (target >= 0.909)",
        )
    if args.record:
        print(f"recorded {record('ttft', lines, command_line())}")


if __name__ == "__main__":
    main()
