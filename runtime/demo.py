"""Multi-turn chat demo: the prefix cache turns each new turn's prefill into a short suffix.

Each turn's prompt is the whole conversation so far (system prompt, earlier user turns and the
model's replies, as token ids) plus the new user text. The model is a named config with random
weights and byte-level tokens (:data:`DEMO_MODELS`), or a Hugging Face checkpoint directory with
its ``tokenizer.json`` (else byte ids). The conversation runs twice over the same model: with
prefix caching (earlier turns' blocks are committed and hit) and without (every turn recomputes
the whole conversation). Each phase is announced as it starts (a progress bar on a terminal).

A third run shows the lower tiers: two conversations take turns on an hbm pool that holds only
about one of them, over a host tier with the KV connector. Each turn evicts the other
conversation's cached blocks from hbm (the connector saved them to host as they filled), so
every turn after the first of each conversation loads its history back from host instead of
recomputing it. Given a sidecar daemon (``kvstore serve``; ``kvstore demo`` starts one), a
fourth run shows two workers sharing it: worker 1 computes the conversation's last prompt, and
worker 2, an engine with a pool of its own, loads that prefix from the daemon's shared memory.
Run it with ``kvstore demo [--model small|DIR]`` or ``python -m runtime.demo``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from connector.inprocess import InProcessScheduler, InProcessWorker
from kvstore import build_tier
from kvstore.keys import Namespace
from kvstore.layout import KVLayout
from kvstore.metrics import Metrics
from kvstore.pool import HBMTier
from kvstore.store import TieredStore
from kvstore.errors import InvalidArgument
from runtime.config import MODEL_CONFIGS, ModelConfig, get_model_config
from runtime.engine import Engine
from runtime.model import LlamaForPagedLM
from runtime.sampling import SamplingParams
from runtime.tokenizer import ByteTokenizer, Tokenizer
from runtime.tokenizer_hf import TOKENIZER_FILE, HFTokenizer, load_tokenizer
from runtime.weights import checkpoint_tensor_shapes, load_checkpoint_config

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


#: Named configs the demo runs (on the CPU, random weights); any other model is a checkpoint
#: directory. ``tiny``'s context cannot hold a chat turn, ``llama3-8b`` is too large for a CPU.
DEMO_MODELS = ("small",)
_MODEL_HINT = "use 'small', or a Hugging Face checkpoint directory (config.json + *.safetensors)"


@dataclass(frozen=True, slots=True)
class TurnStats:
    turn: int
    prompt_tokens: int
    ttft_s: float
    tokens_computed: int
    tokens_reused: int
    tokens_from_host: int = 0
    conversation: str = "A"
    reply_token_ids: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class DemoResult:
    with_cache: list[TurnStats]
    without_cache: list[TurnStats]
    #: two conversations taking turns on a small pool over a host tier
    with_host: list[TurnStats]
    #: two workers sharing a sidecar daemon (empty without one)
    through_daemon: tuple[TurnStats, ...] = ()


@dataclass(frozen=True, slots=True)
class DemoModel:
    """The model a demo runs, its tokenizer, and how to describe them."""

    model: LlamaForPagedLM
    tokenizer: Tokenizer
    #: a preset's name, or the checkpoint directory
    label: str
    #: a checkpoint's tokenizer, printed under the tables with its last reply (a preset's random
    #: weights reply with noise, so neither is printed for a preset); None for a preset
    tokenizer_note: str | None = None


def run_chat_demo(
    model: str = "small",
    turns: int = 4,
    *,
    seed: int = 0,
    block_size: int = 16,
    max_tokens: int = 16,
    num_blocks: int = 256,
    num_threads: int | None = 1,
    console: Console | None = None,
    progress: Console | None = None,
    daemon: str | None = None,
) -> DemoResult:
    """Run the conversation with and without prefix caching, then two conversations over a host
    tier; print the tables; return the numbers.

    ``model``: a name in :data:`DEMO_MODELS` (random weights, byte tokenizer) or a Hugging Face
    checkpoint directory (config.json + *.safetensors, with its tokenizer.json when present, else
    UTF-8 byte ids). ``progress``: where each phase is announced while it runs (default stderr).
    ``num_threads``: torch intra-op threads while it runs (restored afterwards; None leaves
    torch's setting) — one thread keeps TTFTs steady on a small, shared CPU machine. Raises
    InvalidArgument for ``turns`` outside ``[1, len(USER_TURNS)]``, a model that is neither a demo
    model nor a directory, or a chat longer than the model's context; CheckpointError for a bad
    checkpoint directory."""
    if not 1 <= turns <= len(USER_TURNS):
        raise InvalidArgument(f"turns must be in [1, {len(USER_TURNS)}], got {turns}",
                              hint=f"the scripted chat has {len(USER_TURNS)} user turns")
    cfg = _model_config(model)
    # phases: loading, 2 runs x (warm-up + turns), 2 conversations x turns over host, then
    # 2 workers through the daemon
    steps = _Steps(progress or Console(stderr=True),
                   1 + 2 * (1 + turns) + 2 * turns + (2 if daemon else 0))
    before = torch.get_num_threads()
    if num_threads is not None:
        torch.set_num_threads(num_threads)
    try:
        with steps:
            demo = _load(model, cfg, seed, turns, max_tokens, steps)
            result = _run(demo, turns, seed, block_size, max_tokens, num_blocks, steps)
            if daemon is not None:
                result = replace(result, through_daemon=_run_through_daemon(
                    demo, turns, seed, block_size, max_tokens, daemon, steps))
    finally:
        torch.set_num_threads(before)
    _print(result, demo, console or Console())
    return result


def demo_layout(model: str, block_size: int = 16) -> KVLayout:
    """The page layout of ``model``'s KV (what a daemon the demo uses must store)."""
    return _model_config(model).kv_layout(block_size)


def _model_config(model: str) -> ModelConfig:
    """The config of a demo model or checkpoint directory (no weights read); InvalidArgument
    with the reason for anything else."""
    if Path(model).is_dir():
        return load_checkpoint_config(model)
    if model in DEMO_MODELS:
        return get_model_config(model)
    if model in MODEL_CONFIGS:
        cfg = MODEL_CONFIGS[model]
        tok = ByteTokenizer()
        if _positions_needed(tok, 1, 1) > cfg.max_position_embeddings:
            why = f"its context of {cfg.max_position_embeddings} tokens cannot hold one chat turn"
        else:
            n = sum(math.prod(s) for s in checkpoint_tensor_shapes(cfg).values())
            why = (f"random weights for {n / 1e9:.1f}B parameters take "
                   f"{n * cfg.torch_dtype.itemsize / 1e9:.1f} GB and minutes per turn on a CPU")
        raise InvalidArgument(f"model {model!r} cannot run the chat demo: {why}", hint=_MODEL_HINT)
    raise InvalidArgument(
        f"model {model!r} is neither a demo model ({', '.join(map(repr, DEMO_MODELS))}) nor a "
        "directory", hint=_MODEL_HINT)


def _load(model: str, cfg: ModelConfig, seed: int, turns: int, max_tokens: int,
          steps: _Steps) -> DemoModel:
    """The demo model with its tokenizer; the chat is checked against the model's context
    before any weight is read."""
    if model in DEMO_MODELS and not Path(model).is_dir():
        steps.next(f"loading model {model!r} (random weights)")
        _check_fits(cfg, ByteTokenizer(), turns, max_tokens)
        return DemoModel(LlamaForPagedLM.from_random(cfg, seed), ByteTokenizer(), model)
    steps.next(f"loading checkpoint {model}")
    tok: Tokenizer | None = load_tokenizer(model, cfg.vocab_size)
    if tok is not None:
        note = f"tokenizer: {Path(model) / TOKENIZER_FILE} ({tok.vocab_size} tokens)"
    else:
        tok = ByteTokenizer()
        tok.check_fits(cfg.vocab_size)
        note = (f"no {TOKENIZER_FILE} in {model}: prompts are UTF-8 byte ids, replies are shown "
                "as token ids")
    _check_fits(cfg, tok, turns, max_tokens)
    return DemoModel(LlamaForPagedLM.from_checkpoint(model), tok, model, note)


def _positions_needed(tok: Tokenizer, turns: int, max_tokens: int) -> int:
    """Positions the longest request of the demo takes: the last turn's prompt (system prompt,
    every user turn, every earlier reply at ``max_tokens``) plus its own reply. The host run's
    system prompts end in " [A]" / " [B]"."""
    users = sum(len(tok.encode(_user_text(k))) for k in range(turns))
    system = max(len(tok.encode(f"{SYSTEM_PROMPT}{tag}", add_bos=True))
                 for tag in ("", " [A]", " [B]"))
    return system + users + turns * max_tokens


def _check_fits(cfg: ModelConfig, tok: Tokenizer, turns: int, max_tokens: int) -> None:
    need = _positions_needed(tok, turns, max_tokens)
    held = cfg.max_position_embeddings
    if need > held:
        raise InvalidArgument(
            f"the chat needs up to {need} positions ({turns} turns, up to {max_tokens} new "
            f"tokens each) but the model holds {held} (max_position_embeddings)",
            hint="run fewer turns or fewer new tokens per turn, or a model with a longer context")


def _user_text(k: int) -> str:
    return f"\nUser: {USER_TURNS[k]}\nAssistant: "


class _Steps:
    """Announces each phase of the demo as it starts: a progress bar on a terminal, else one
    line ``[i/total] what`` per phase (logs and pipes see progress too)."""

    def __init__(self, console: Console, total: int) -> None:
        self.console = console
        self.total = total
        self.started = 0
        self._bar: Progress | None = None
        self._task: TaskID | None = None

    def __enter__(self) -> _Steps:
        if self.console.is_terminal:
            self._bar = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                                 MofNCompleteColumn(), TimeElapsedColumn(),
                                 console=self.console, transient=True)
            self._bar.start()
            self._task = self._bar.add_task("starting", total=self.total)
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if self._bar is not None and self._task is not None:
            if exc_type is None:  # the last phase ended too
                self._bar.update(self._task, completed=self.started)
            self._bar.stop()

    def next(self, what: str) -> None:
        """Phase ``what`` starts (the previous one ended)."""
        self.started += 1
        if self._bar is not None and self._task is not None:
            self._bar.update(self._task, description=escape(what), completed=self.started - 1)
        else:
            self.console.print(f"[{self.started}/{self.total}] {what}", markup=False,
                               highlight=False, soft_wrap=True)


def _run(demo: DemoModel, turns: int, seed: int, block_size: int, max_tokens: int,
         num_blocks: int, steps: _Steps) -> DemoResult:
    tok, model = demo.tokenizer, demo.model
    layout = model.config.kv_layout(block_size)
    ns = Namespace(f"demo/{demo.label}/{seed}", layout)
    results: dict[bool, list[TurnStats]] = {}
    for caching in (True, False):
        mode = "with cache" if caching else "without cache"
        steps.next(f"{mode}: warm-up")
        pool = HBMTier.build("hbm", layout, num_blocks, Metrics(), device="cpu")
        TieredStore(layout, [pool])  # the store owns eviction of the pool's cached blocks
        engine = Engine(model, pool, ns, enable_prefix_caching=caching)
        history = tok.encode(SYSTEM_PROMPT, add_bos=True)
        # The warm-up is as long as turn 1's prompt (tokens no turn shares): both engines have
        # run that shape before turn 1 is timed, so turn 1 costs the same with and without the
        # cache (with a 2-token warm-up, the first engine paid the first run of the bigger shape
        # and turn 1 "with cache" read 73 ms against 34 ms without).
        engine.generate([_warm_up(tok, len(history) + len(tok.encode(_user_text(0))))],
                        SamplingParams(max_tokens=2))
        stats: list[TurnStats] = []
        for k in range(turns):
            steps.next(f"{mode}: turn {k + 1} of {turns}")
            history = history + tok.encode(_user_text(k))
            (out,) = engine.generate([history], SamplingParams(max_tokens=max_tokens))
            m = out.metrics
            assert m.ttft_s is not None
            stats.append(TurnStats(k + 1, len(history), m.ttft_s, m.num_tokens_computed,
                                   sum(m.num_tokens_reused.values()),
                                   reply_token_ids=tuple(out.output_token_ids)))
            history = history + out.output_token_ids
        results[caching] = stats
    return DemoResult(results[True], results[False],
                      _run_with_host(model, tok, layout, turns, max_tokens, ns, steps))


def _warm_up(tok: Tokenizer, n: int) -> list[int]:
    """``n`` prompt tokens that no chat turn starts with."""
    ids = tok.encode("warm up " * n, add_bos=True)
    return ids[:n] if len(ids) >= n else ids + [ids[-1]] * (n - len(ids))


def _run_with_host(model: LlamaForPagedLM, tok: Tokenizer, layout: KVLayout, turns: int,
                   max_tokens: int, ns: Namespace, steps: _Steps) -> list[TurnStats]:
    """Conversations A and B alternate on a pool sized for the longest single request."""
    blocks = -(-_positions_needed(tok, turns, max_tokens) // layout.block_size) + 2
    m = Metrics()
    pool = HBMTier.build("hbm", layout, blocks, m, device="cpu")
    host = build_tier({"kind": "host", "capacity": 4 * blocks * layout.page_bytes}, layout, m)
    store = TieredStore(layout, [pool, host], ["lineage", "lru"])  # see Engine.from_config
    engine = Engine(model, pool, ns, connector=(
        InProcessScheduler(store, ns, num_blocks=blocks), InProcessWorker(store)))
    histories = {c: tok.encode(f"{SYSTEM_PROMPT} [{c}]", add_bos=True) for c in "AB"}
    stats: list[TurnStats] = []
    try:
        for k in range(turns):
            for conv in "AB":
                steps.next(f"two conversations over a host tier: turn {k + 1}, conversation {conv}")
                history = histories[conv] + tok.encode(_user_text(k))
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


def _run_through_daemon(demo: DemoModel, turns: int, seed: int, block_size: int,
                        max_tokens: int, daemon: str, steps: _Steps) -> tuple[TurnStats, ...]:
    """Two workers, each an engine with its own pool and its own connection to the daemon, run
    the same prompt (the whole chat): worker 1 computes it and saves its pages to the daemon;
    worker 2 finds them there and loads them from the daemon's shared memory."""
    tok = demo.tokenizer
    history = tok.encode(f"{SYSTEM_PROMPT} [daemon]", add_bos=True)
    for k in range(turns):
        history = history + tok.encode(_user_text(k))
    blocks = -(-(len(history) + max_tokens) // block_size) + 2
    stats = []
    for worker in (1, 2):
        steps.next(f"two workers sharing the daemon: worker {worker}")
        engine = Engine._over_store(demo.model, f"demo/{demo.label}/{seed}/daemon", "cpu",
                                    num_blocks=blocks, block_size=block_size, daemon=daemon)
        try:
            (out,) = engine.generate([history], SamplingParams(max_tokens=max_tokens))
            engine.drain()  # worker 1's pages are in the daemon before worker 2 asks
        finally:
            engine.close()
        m = out.metrics
        assert m.ttft_s is not None, out.error
        stats.append(TurnStats(turns, len(history), m.ttft_s, m.num_tokens_computed,
                               m.num_tokens_reused.get("hbm", 0),
                               sum(n for t, n in m.num_tokens_reused.items() if t != "hbm"),
                               f"worker {worker}", tuple(out.output_token_ids)))
    return tuple(stats)


#: Under the first table: what the speedup column means, and why turn 1 has none.
SPEEDUP_NOTE = ("speedup = TTFT with no cache / with cache; — where nothing was reused (turn 1 "
                "computes the same tokens either way); each engine ran a warm-up prompt as "
                "long as turn 1's before it, so turn 1 costs the same on both sides")


def _add_column(table: Table, header: str) -> None:
    """A right-aligned column never narrower than its header's longest word (narrow consoles
    wrap a header between words, never cut one)."""
    table.add_column(header, justify="right", min_width=max(map(len, header.split())))


def _print(result: DemoResult, demo: DemoModel, console: Console) -> None:
    table = Table(title=f"multi-turn chat on {escape(demo.label)}: with the prefix cache and "
                        "with none (with none, every prompt token is computed)")
    for col in ("turn", "prompt\ntokens", "TTFT ms\nwith cache", "computed\nwith cache",
                "reused\nwith cache", "TTFT ms\nno cache", "speedup"):
        _add_column(table, col)
    for a, b in zip(result.with_cache, result.without_cache):
        speedup = f"{b.ttft_s / a.ttft_s:.1f}x" if a.tokens_reused else "—"
        table.add_row(str(a.turn), str(a.prompt_tokens), f"{a.ttft_s * 1e3:.1f}",
                      str(a.tokens_computed), str(a.tokens_reused), f"{b.ttft_s * 1e3:.1f}",
                      speedup)
    console.print(table)
    console.print(SPEEDUP_NOTE, highlight=False, soft_wrap=True)
    table = Table(title="two conversations taking turns on an hbm pool that holds one, over a "
                        "host tier (tokens computed, reused from hbm, loaded from host)")
    for col in ("turn", "conversation", "prompt\ntokens", "TTFT ms", "computed",
                "reused\nfrom hbm", "loaded\nfrom host"):
        _add_column(table, col)
    for t in result.with_host:
        table.add_row(str(t.turn), t.conversation, str(t.prompt_tokens), f"{t.ttft_s * 1e3:.1f}",
                      str(t.tokens_computed), str(t.tokens_reused), str(t.tokens_from_host))
    console.print(table)
    if result.through_daemon:
        _print_daemon(result.through_daemon, console)
    if demo.tokenizer_note is None:
        return
    last = result.with_cache[-1]
    reply = (f"reply to turn {last.turn} (with cache): "
             f"{demo.tokenizer.decode(last.reply_token_ids)!r}"
             if isinstance(demo.tokenizer, HFTokenizer) else
             f"reply to turn {last.turn} (with cache), token ids: {list(last.reply_token_ids)}")
    for line in (demo.tokenizer_note, reply):
        console.print(line, markup=False, highlight=False, soft_wrap=True)


def _print_daemon(stats: tuple[TurnStats, ...], console: Console) -> None:
    table = Table(title="two workers sharing the sidecar daemon (kvstore serve): worker 2 loads "
                        "worker 1's pages from the daemon's shared memory")
    for col in ("worker", "prompt\ntokens", "TTFT ms", "computed", "loaded\nfrom daemon",
                "same reply\nas worker 1"):
        _add_column(table, col)
    first = stats[0]
    for t in stats:
        table.add_row(t.conversation, str(t.prompt_tokens), f"{t.ttft_s * 1e3:.1f}",
                      str(t.tokens_computed), str(t.tokens_from_host),
                      "yes" if t.reply_token_ids == first.reply_token_ids else "NO")
    console.print(table)


if __name__ == "__main__":
    run_chat_demo()
