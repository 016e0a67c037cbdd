"""Decode speed of the bundled runtime: generated tokens per second at batch 1, 8 and 32, against
Hugging Face transformers' ``generate`` on the same weights, in the same run.

    python -m bench.decode [--quick] [--json] [--record] [--backend sdpa|torch_ref]

GPU (full run): the ``llama3-8b`` shape in bf16 with random weights (transformers' initialiser,
loaded into our model too), 1K- and 8K-token contexts. CPU (``--quick``, or no GPU): the
``small`` shape in float32, 256- and 1K-token contexts, batch 1 and 8 (batch 32 of a 1K context
takes minutes on 2 cores).

Decode speed is measured by difference, the same way for every variant: the time to generate
``1 + N`` tokens for a batch of distinct random prompts minus the time to generate 1 (the
prefill and first token), over the ``batch x N`` tokens decoded in between; greedy, every
request runs to its length (no stop tokens). Median of several runs after a warm-up,
CUDA-synchronised. Variants:

* ``ours`` -- ``Engine.generate`` over a paged pool sized for the batch (no store connector),
  the batch's prompts prefilled in one step as HF prefills them (up to ``PREFILL_TOKENS``;
  beyond, in chunks of a context);
* ``HF generate (static cache)`` -- ``LlamaForCausalLM.generate(cache_implementation="static")``,
  the baseline a user would otherwise run;
* ``HF generate (static cache, torch.compile)`` -- the same with transformers' compiled forward
  (GPU only: on the CPU a compile costs minutes).

The ratio is ours / the baseline (higher is better). On the GPU every case also gets ``ours vs
memory-bandwidth floor``: the tokens/s a step would reach if it only read the weights (all but
the input embedding, of which a step reads a few rows) and the batch's K/V once, at the
device-to-device copy bandwidth measured in the same run.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch

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
from bench.ttft import hf_and_ours
from kvstore import Metrics, Namespace
from kvstore.pool import HBMTier
from runtime import LlamaForPagedLM
from runtime.config import ModelConfig
from runtime.engine import Engine
from runtime.sampling import SamplingParams

BLOCK = 16
#: The most prompt tokens ours prefills in one step (see ``_ours``).
PREFILL_TOKENS = 65536


def _prompts(cfg: ModelConfig, batch: int, context: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(1, cfg.vocab_size, (batch, context), generator=gen).tolist()


def _ours(model: LlamaForPagedLM, cfg: ModelConfig, device: torch.device, batch: int,
          context: int, new: int, runs: int) -> float:
    """Decode tokens/s of our engine: (t(1 + new) - t(1)) over batch x new tokens."""
    blocks = batch * (-(-(context + new + 1) // BLOCK)) + 8
    layout = cfg.kv_layout(BLOCK)
    pool = HBMTier.build("hbm", layout, blocks, Metrics(), device=device)
    # The whole batch's prompts in one prefill step, as HF's generate runs them, so that every
    # request decodes from the same step on. Chunked, the first requests decode beside the last
    # ones' prefill and finish first, and the last steps decode a few requests: on the H200 that
    # read 2,471 tokens/s at batch 32 x 1K where a step of 32 decodes ran at 3,394. Up to
    # PREFILL_TOKENS; beyond, chunks of a context (batch 32 x 8K would need activations for
    # 256K tokens: out of memory beside HF's cache).
    whole = batch * context <= PREFILL_TOKENS
    engine = Engine(model, pool, Namespace("bench/decode", layout), enable_prefix_caching=False,
                    max_num_seqs=batch,
                    max_num_batched_tokens=batch * context if whole else max(context, 2048))
    try:
        prompts = _prompts(cfg, batch, context, 7)

        def run(n: int) -> Callable[[], object]:
            return lambda: engine.generate(prompts, SamplingParams(max_tokens=n))

        t_long, t_short = median_time(run(1 + new), device, runs), median_time(run(1), device, runs)
    finally:
        engine.close()
    return _rate(batch * new, t_long, t_short)


def _hf(hf: torch.nn.Module, cfg: ModelConfig, device: torch.device, batch: int, context: int,
        new: int, runs: int, *, compile: bool = False) -> float:
    """Decode tokens/s of ``hf.generate`` with a static cache (its decode step compiled by
    transformers with ``compile``), measured the same way."""
    ids = torch.tensor(_prompts(cfg, batch, context, 7), device=device)
    mask = torch.ones_like(ids)

    def run(n: int) -> Callable[[], object]:
        return lambda: hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n,
                                   min_new_tokens=n, do_sample=False,
                                   cache_implementation="static", pad_token_id=0,
                                   disable_compile=not compile)

    with torch.inference_mode():
        t_long, t_short = median_time(run(1 + new), device, runs), median_time(run(1), device, runs)
    return _rate(batch * new, t_long, t_short)


def _copy_bandwidth(device: torch.device) -> float:
    """Device memory bandwidth in bytes/s: a 2 GiB device-to-device copy (bytes read + written)."""
    src = torch.empty(1 << 31, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    t = median_time(lambda: dst.copy_(src), device, 5)
    del src, dst
    return 2 * (1 << 31) / t


def _floor_tps(model: LlamaForPagedLM, cfg: ModelConfig, batch: int, context: int, new: int,
               bandwidth: float) -> float:
    """Tokens/s if each step only read the weights and the batch's K/V (mean context) once."""
    weights = sum(p.numel() * p.element_size() for name, p in model.named_parameters()
                  if not (name.endswith("embed_tokens.weight") and model.lm_head is not None))
    kv_per_token = cfg.kv_layout(BLOCK).page_bytes // BLOCK
    step_bytes = weights + batch * (context + new / 2) * kv_per_token
    return batch * bandwidth / step_bytes


class TooNoisy(RuntimeError):
    pass


def _rate(tokens: int, t_long: float, t_short: float) -> float:
    """Tokens per second of the decode between the two timings; TooNoisy when the prefill's
    noise swamps the difference (a loaded machine)."""
    if t_long - t_short < 0.1 * t_long:
        raise TooNoisy(f"decode {t_long - t_short:.4f}s of {t_long:.4f}s: too noisy to measure")
    return tokens / (t_long - t_short)


def main(argv: list[str] | None = None) -> None:
    parser = add_standard_args(argparse.ArgumentParser(prog="python -m bench.decode"))
    parser.add_argument("--backend", default="sdpa")
    args = parser.parse_args(argv)
    gpu = torch.cuda.is_available() and not args.quick
    device = torch.device("cuda" if gpu else "cpu")
    name = "llama3-8b" if gpu else "small"
    contexts = (1024, 8192) if gpu else (256, 1024)
    batches = (1, 8, 32) if gpu else (1, 8)
    new, runs = (64, 3) if gpu else (48, 3)
    cfg = bench_model_config(name, gpu=gpu, positions=max(contexts) + new + 1)

    hf, ours = hf_and_ours(cfg, device, args.backend)
    hf.generation_config.eos_token_id = None  # every request runs to its length, as ours do

    lines: list[Measurement] = []
    notes: list[str] = []
    bandwidth = _copy_bandwidth(device) if gpu else None
    if bandwidth is not None:
        notes.append(f"device-to-device copy: {bandwidth / 1e12:.2f} TB/s (the floor's bandwidth)")
    for context in contexts:
        for batch in batches:
            case = f"{name}/{context}-context/batch-{batch}"
            try:
                tps = _ours(ours, cfg, device, batch, context, new, runs)
                base = _hf(hf, cfg, device, batch, context, new, runs)
            except torch.OutOfMemoryError:
                notes.append(f"{case}: out of GPU memory, skipped")
                torch.cuda.empty_cache()
                continue
            except TooNoisy as exc:
                notes.append(f"{case}: {exc}, skipped")
                continue
            lines.append(measurement("decode", case, "ours", "throughput", tps, "tokens/s",
                                     baseline="HF generate (static cache)", baseline_value=base))
            if gpu:
                comp = _hf(hf, cfg, device, batch, context, new, runs, compile=True)
                lines.append(measurement("decode", case, "ours vs compiled", "throughput", tps,
                                         "tokens/s", baseline="HF generate (static cache, "
                                         "torch.compile)", baseline_value=comp))
            if bandwidth is not None:
                lines.append(measurement(
                    "decode", case, "ours vs memory-bandwidth floor", "throughput", tps,
                    "tokens/s", baseline="weights + K/V read once a step",
                    baseline_value=_floor_tps(ours, cfg, batch, context, new, bandwidth)))
            if gpu:
                torch.cuda.empty_cache()
    if args.json:
        emit_json(lines)
    else:
        print_table(
            ("case", "variant", "value", "unit", "baseline", "baseline value", "ratio"),
            [(m.case, m.variant, m.value, m.unit, m.baseline, m.baseline_value, m.ratio)
             for m in lines],
            title=f"bench.decode ({name}, {cfg.dtype}, backend {args.backend}, {device.type}; "
                  f"{new} tokens decoded per request)",
            footer=notes)
    if args.record:
        extra = {"notes": notes} if notes else None
        print(f"recorded {record('decode', lines, command_line(), extra=extra)}")


if __name__ == "__main__":
    main()
