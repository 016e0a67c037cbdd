"""Multi-turn chat demo: the prefix cache turns each new turn's prefill into a short suffix.

Each turn's prompt is the whole conversation so far (system prompt, earlier user turns and the
model's replies, as token ids) plus the new user text, byte-tokenized. The conversation runs
twice over the same random-weight model: with prefix caching (earlier turns' blocks are committed
and hit) and without (every turn recomputes the whole conversation).

A third run shows the lower tiers: two conversations take turns on an hbm pool that holds only
about one of them, over a host tier with the KV connector. Each turn evicts the other
conversation's cached blocks from hbm (the connector saved them to host as they filled), so
every turn after the first of each conversation loads its history back from host instead of
recomputing it. Run it with ``python -m runtime.demo``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from rich.console import Console
from rich.table import Table

from connector.inprocess import InProcessScheduler, InProcessWorker
from kvstore.keys import Namespace
from kvstore.layout import KVLayout
from kvstore.metrics import Metrics
from kvstore.store import TieredStore
from kvstore.tiers.hbm import HBMTier
from kvstore.tiers.host import HostTier
from runtime.config import get_model_config
from runtime.engine import Engine
from runtime.model import LlamaForPagedLM
from runtime.sampling import SamplingParams
from runtime.tokenizer import ByteTokenizer

SYSTEM_PROMPT = (
    "You are a helpful assistant for an inference team. Answer briefly and precisely; "
    "cite the component you are talking about (scheduler, block pool, store, tiers)."
)
USER_TURNS = (
    "What does the hbm tier hold, and who decides which of its blocks are evicted?",
    "Why does a second chat turn not recompute the first one's tokens?",
    "What happens when the pool runs out of blocks while several requests decode?",
    "Summarize the write-back policy and when evicted pages reach the host tier.",
    "How would a disk tier change the time to first token after a restart?",
    "Give one reason to keep the block size small, and one to keep it large.",
)


@dataclass(frozen=True, slots=True)
class TurnStats:
    turn: int
    prompt_tokens: int
    ttft_s: float
    tokens_computed: int
    tokens_reused: int
    tokens_from_host: int = 0
    conversation: str = "A"


@dataclass(frozen=True, slots=True)
class DemoResult:
    with_cache: list[TurnStats]
    without_cache: list[TurnStats]
    #: two conversations taking turns on a small pool over a host tier
    with_host: list[TurnStats]


def run_chat_demo(
    config_name: str = "small",
    turns: int = 4,
    *,
    seed: int = 0,
    block_size: int = 16,
    max_tokens: int = 16,
    num_blocks: int = 256,
    num_threads: int | None = 1,
    console: Console | None = None,
) -> DemoResult:
    """Run the conversation with and without prefix caching; print a table; return the
    numbers. ``num_threads``: torch intra-op threads while it runs (restored afterwards; None
    leaves torch's setting) — one thread keeps TTFTs steady on a small, shared CPU machine."""
    if not 1 <= turns <= len(USER_TURNS):
        raise ValueError(f"turns must be in [1, {len(USER_TURNS)}], got {turns}")
    before = torch.get_num_threads()
    if num_threads is not None:
        torch.set_num_threads(num_threads)
    try:
        result = _run(config_name, turns, seed, block_size, max_tokens, num_blocks)
    finally:
        torch.set_num_threads(before)
    _print(result, config_name, console or Console())
    return result


def _run(config_name: str, turns: int, seed: int, block_size: int, max_tokens: int,
         num_blocks: int) -> DemoResult:
    cfg = get_model_config(config_name)
    tok = ByteTokenizer()
    tok.check_fits(cfg.vocab_size)
    model = LlamaForPagedLM.from_random(cfg, seed)
    layout = cfg.kv_layout(block_size)
    results: dict[bool, list[TurnStats]] = {}
    for caching in (True, False):
        pool = HBMTier("hbm", layout, num_blocks, Metrics(), device="cpu")
        TieredStore(layout, [pool])  # the store owns eviction of the pool's cached blocks
        engine = Engine(model, pool, Namespace(f"demo/{config_name}/{seed}", layout),
                        enable_prefix_caching=caching)
        engine.generate([tok.encode("warm-up", add_bos=True)], SamplingParams(max_tokens=2))
        history = tok.encode(SYSTEM_PROMPT, add_bos=True)
        stats: list[TurnStats] = []
        for k in range(turns):
            history = history + tok.encode(f"\nUser: {USER_TURNS[k]}\nAssistant: ")
            (out,) = engine.generate([history], SamplingParams(max_tokens=max_tokens))
            m = out.metrics
            assert m.ttft_s is not None
            stats.append(TurnStats(k + 1, len(history), m.ttft_s, m.num_tokens_computed,
                                   sum(m.num_tokens_reused.values())))
            history = history + out.output_token_ids
        results[caching] = stats
    return DemoResult(results[True], results[False],
                      _run_with_host(model, tok, layout, turns, max_tokens, config_name, seed))


def _run_with_host(model: LlamaForPagedLM, tok: ByteTokenizer, layout: KVLayout, turns: int,
                   max_tokens: int, config_name: str, seed: int) -> list[TurnStats]:
    """Conversations A and B alternate on a pool sized for the longest single request."""
    longest = len(tok.encode(f"{SYSTEM_PROMPT} [A]", add_bos=True)) + sum(
        len(tok.encode(f"\nUser: {USER_TURNS[k]}\nAssistant: ")) + max_tokens
        for k in range(turns))  # the last turn's prompt and its own output
    blocks = -(-longest // layout.block_size) + 2
    m = Metrics()
    pool = HBMTier("hbm", layout, blocks, m, device="cpu")
    host = HostTier("host", layout, 4 * blocks, m)
    store = TieredStore(layout, [pool, host], ["lineage", "lru"])  # see Engine.from_config
    ns = Namespace(f"demo/{config_name}/{seed}", layout)
    engine = Engine(model, pool, ns, connector=(
        InProcessScheduler(store, ns, num_blocks=blocks), InProcessWorker(store)))
    histories = {c: tok.encode(f"{SYSTEM_PROMPT} [{c}]", add_bos=True) for c in "AB"}
    stats: list[TurnStats] = []
    try:
        for k in range(turns):
            for conv in "AB":
                history = histories[conv] + tok.encode(f"\nUser: {USER_TURNS[k]}\nAssistant: ")
                (out,) = engine.generate([history], SamplingParams(max_tokens=max_tokens))
                engine.drain()  # this turn's blocks are in host before the other one evicts
                mt = out.metrics
                assert mt.ttft_s is not None, out.error
                stats.append(TurnStats(k + 1, len(history), mt.ttft_s, mt.num_tokens_computed,
                                       mt.num_tokens_reused.get("hbm", 0),
                                       mt.num_tokens_reused.get("host", 0), conv))
                histories[conv] = history + out.output_token_ids
    finally:
        engine.close()
        store.close()
    return stats


def _print(result: DemoResult, config_name: str, console: Console) -> None:
    table = Table(title=f"multi-turn chat, config {config_name!r}: prefix cache on vs off "
                        "(tokens computed / reused from hbm)")
    for col in ("turn", "prompt", "on: TTFT ms", "on: comp", "on: reused", "off: TTFT ms",
                "off: comp", "speedup"):
        table.add_column(col, justify="right")
    for a, b in zip(result.with_cache, result.without_cache):
        table.add_row(str(a.turn), str(a.prompt_tokens), f"{a.ttft_s * 1e3:.1f}",
                      str(a.tokens_computed), str(a.tokens_reused), f"{b.ttft_s * 1e3:.1f}",
                      str(b.tokens_computed), f"{b.ttft_s / a.ttft_s:.1f}x")
    console.print(table)
    table = Table(title="two conversations taking turns on an hbm pool that holds one, over a "
                        "host tier (tokens computed / reused from hbm / loaded from host)")
    for col in ("turn", "conv", "prompt", "TTFT ms", "computed", "hbm", "host"):
        table.add_column(col, justify="right")
    for t in result.with_host:
        table.add_row(str(t.turn), t.conversation, str(t.prompt_tokens), f"{t.ttft_s * 1e3:.1f}",
                      str(t.tokens_computed), str(t.tokens_reused), str(t.tokens_from_host))
    console.print(table)


if __name__ == "__main__":
    run_chat_demo()
