"""TTFT of the bundled runtime, model-level and engine-level, each against a baseline measured in
the same run.

    python -m bench.ttft [--quick] [--json] [--record] [--backend sdpa|torch_ref]
                         [--part all|model|engine] [--disk-dir DIR]

GPU (full run): the ``llama3-8b`` shape in bf16 with random weights (Hugging Face's initialiser,
loaded into our model too). Model-level: prompts of 1K, 4K, 16K and 32K tokens; engine-level: 4K,
16K and 32K (disk hit at 4K and 16K only, Redis hit at 4K only: a 32K prefix is 4 GiB). CPU
(``--quick``, or no GPU): the ``small`` shape in float32, 256 and 1K tokens, every case; the
whole bench then takes well under a minute on 2 cores.

**Model-level** (this module; median of several runs after a warm-up, CUDA-synchronised):

* **cold prefill** — the whole prompt computed in one forward pass of our model, K/V written
  into the paged pool, logits of the last token; baseline: **HF prefill** —
  ``LlamaForCausalLM`` (SDPA attention, same weights, ``logits_to_keep=1``, no cache) on the same
  prompt, the peer a user would otherwise run (HF time / ours: >= 1/1.1 is the target);
* **hbm prefix hit** — the same prompt when every full block but the last is already in the
  pool: only the last block's tokens are computed; baseline: our own cold prefill.

**Engine-level** (``bench/ttft_engine.py``, whose docstring has the details): TTFT is the wall
time of ``Engine.generate([prompt], SamplingParams(max_tokens=1))`` (greedy), synchronised on
the engine's stream (background saves are not waited for),
median of 3 runs (GPU) or 5 (CPU) after one warm-up; every run verifies from its ``RequestOutput``
(``num_tokens_reused`` per tier, no failed loads) and from the store that the prefix came from
the intended tier, and raises otherwise.

1. ``engine cold`` — no store, no connector, a new prompt every run: recompute in the same
   runtime (baseline: the model-level cold prefill, i.e. the engine's own overhead).
2. ``engine hbm hit`` — the prefix in the hbm pool (baseline: engine cold).
3. ``host hit`` — the prefix's full blocks only in the host tier (hbm emptied before each run),
   loaded layer by layer while earlier layers compute (``InProcessWorker(layerwise=True)``);
   baselines: engine cold (target >= 12x at 32K on the GPU), ``PCIe floor + engine hbm hit``
   (GPU; target ratio >= 1/1.25) and ``max(load only, engine hbm hit)`` (target >= 1/1.1).
4. ``host hit, load-then-compute`` — the same with ``layerwise=False``: the whole load before
   layer 0 (the overlap ablation), against the same ``max(load, compute)``.
5. ``load only`` — the same pages host -> engine blocks by the connector's own transfer
   (``kvstore.transfer.make_transfer``: per-layer copies, every layer), no model; ``load
   only, layers 1..`` the copies a hit makes (its engine writes layer 0's K/V from the tokens:
   ``Engine(first_layer_from_tokens=True)``), with ``host hit, layer-wise (vs its copies)``
   against ``max(that, engine hbm hit)``.
6. ``PCIe floor`` (GPU only) — one contiguous pinned host->GPU copy of the same KV bytes, timed
   in the same run; its bandwidth is printed too (``PCIe H2D pinned copy``).
7. ``disk hit`` — store ``[hbm, host, disk]``, the prefix only on disk (hbm and host emptied
   before each run), ``prefetch_policy="wait_complete"`` (baseline: engine cold).
8. ``redis hit`` — store ``[hbm, host, redis]`` on a redis-server the bench starts on a free
   loopback port (``redis-server`` on the PATH, else ``.redis/redis-server``; none: skipped
   with a note) and always stops; the prefix only in Redis (baseline: engine cold).
9. ``no reuse, with store`` — unique prompts through the engine with the store and connector
   attached (every full block saved to host, nothing ever found; saves run in the background
   and are not waited for between prompts, as on a server), against ``no store (same
   runtime)``: the bare engine, prompts interleaved. Target >= 0.98 (<= 2 % overhead).
10. ``engine start (graph capture)`` — a fresh engine over the model, every step shape captured
    at start (seconds; measured first in the process, before any other case compiled a kernel;
    1K tokens' limits on the GPU, 256 on the CPU), then ``first request after start`` (a new
    prompt, computed) against ``engine cold (steady)`` and ``first hbm hit after start`` (the
    same prompt again) against ``engine hbm hit (steady, same prompt)``: target <= 1.5x.

Ratios are higher-is-better (baseline time / time). The table ends with the headlines: cold
prefill vs HF, then the engine targets (met / MISSED).
"""

from __future__ import annotations

import argparse
import gc

import torch
from tqdm import tqdm

from bench import ttft_engine
from bench.common import (
    Measurement,
    add_standard_args,
    bench_model_config,
    command_line,
    emit_json,
    measurement,
    median_time,
    print_table,
    record,
)
from runtime import (
    LlamaForPagedLM,
    SeqInput,
    allocate_kv_pool,
    build_batch,
)
from runtime.config import ModelConfig
from runtime.hf import to_hf_config

BLOCK = 16


def hf_and_ours(cfg: ModelConfig, device: torch.device, backend: str
                ) -> tuple[torch.nn.Module, LlamaForPagedLM]:
    """transformers' ``LlamaForCausalLM`` of ``cfg`` with its random initialisation (seed 0),
    and our model with the same weights: the peer and ours, in the same run."""
    import transformers

    torch.manual_seed(0)
    with torch.device(device):
        hf = transformers.LlamaForCausalLM(to_hf_config(cfg, attn_implementation="sdpa"))
    hf = hf.to(dtype=cfg.torch_dtype).eval()
    ours = LlamaForPagedLM(cfg, backend=backend, device=device)
    ours.load_weights({k: v for k, v in hf.state_dict().items()
                       if k in dict(ours.named_parameters())})
    return hf, ours


def _model_cases(hf: torch.nn.Module, ours: LlamaForPagedLM, cfg: ModelConfig, name: str,
                 device: torch.device, lengths: list[int], runs: int
                 ) -> tuple[list[Measurement], dict[int, float]]:
    """The model-level lines, and the cold prefill (ms) per length."""
    gpu = device.type == "cuda"
    lines: list[Measurement] = []
    cold_ms: dict[int, float] = {}
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
            t_cold = median_time(lambda: ours(cold, pool), device, runs)
            t_hit = median_time(lambda: ours(hit, pool), device, runs)
            t_hf = median_time(lambda: hf(input_ids=ids, use_cache=False, logits_to_keep=1), device, runs)
        case = f"{name}/{n}-tokens"
        cold_ms[n] = t_cold * 1e3
        lines += [
            measurement("ttft", case, "cold prefill", "ttft", t_cold * 1e3, "ms",
                        baseline="HF transformers prefill", baseline_value=t_hf * 1e3,
                        higher_is_better=False),
            measurement("ttft", case, "hbm prefix hit", "ttft", t_hit * 1e3, "ms",
                        baseline="cold prefill (same runtime)", baseline_value=t_cold * 1e3,
                        higher_is_better=False),
        ]
        if gpu:
            del pool  # free this length's pool before the next one is allocated
            torch.cuda.empty_cache()
    return lines, cold_ms


def main(argv: list[str] | None = None) -> None:
    parser = add_standard_args(argparse.ArgumentParser(prog="python -m bench.ttft"))
    parser.add_argument("--backend", default="sdpa")
    parser.add_argument("--part", choices=("all", "model", "engine"), default="all",
                        help="model-level cases, engine-level cases, or both (default)")
    parser.add_argument("--disk-dir", default=None,
                        help="parent directory of the disk tier's temporary directory")
    args = parser.parse_args(argv)
    gpu = torch.cuda.is_available() and not args.quick
    device = torch.device("cuda" if gpu else "cpu")
    name = "llama3-8b" if gpu else "small"
    lengths = [1024, 4096, 16384, 32768] if gpu else [256, 1024]
    runs = 5 if gpu else 3
    plan = ttft_engine.Plan.for_device(gpu)
    cfg = bench_model_config(name, gpu=gpu, positions=max(max(lengths), max(plan.lengths) + 16))

    hf, ours = hf_and_ours(cfg, device, args.backend)

    lines: list[Measurement] = []
    model_cold: dict[int, float] = {}
    startup = ttft_engine.EngineResults()
    if args.part != "model":  # first: before anything compiled a kernel in this process
        startup = ttft_engine.measure_startup(ours, cfg, name, device, plan)
    if args.part != "engine":
        lines, model_cold = _model_cases(hf, ours, cfg, name, device, lengths, runs)
    # The engine part needs the GPU memory HF's copy of the weights holds.
    del hf
    gc.collect()
    if gpu:
        torch.cuda.empty_cache()
    engine = ttft_engine.EngineResults()
    if args.part != "model":
        engine = ttft_engine.measure(ours, cfg, name, device, plan, model_cold_ms=model_cold,
                                     disk_dir=args.disk_dir)
        engine.lines[:0] = startup.lines
        engine.notes[:0] = startup.notes
        engine.headline += startup.headline
        lines += engine.lines
    if args.json:
        emit_json(lines)
    else:
        heads = []
        model_ratios = [m.ratio for m in lines if m.variant == "cold prefill" and m.ratio]
        if model_ratios:
            heads.append(f"cold prefill vs HF, worst ratio {min(model_ratios):.3f} "
                         "(target >= 0.909)")
        heads += engine.headline
        print_table(
            ("case", "variant", "value", "unit", "baseline", "baseline value", "ratio"),
            [(m.case, m.variant, m.value, m.unit, m.baseline, m.baseline_value, m.ratio)
             for m in lines],
            title=f"bench.ttft ({name}, {cfg.dtype}, backend {args.backend}, {device.type})",
            footer=engine.notes,
            headline="\n".join(f"headline: {h}" for h in heads),
        )
    if args.record:
        notes = {"engine": engine.notes, "headline": engine.headline} if engine.notes else None
        print(f"recorded {record('ttft', lines, command_line(), extra=notes)}")


if __name__ == "__main__":
    main()
