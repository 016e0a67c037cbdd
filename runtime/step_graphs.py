"""Small steps (decode, a prefix hit's suffix, short chunks) through the paged kernels, padded to
a few shapes and, on CUDA, captured once per shape as CUDA graphs and replayed.

Why: an eager forward of a few tokens through an 8B model launches about fifty kernels a layer
from Python, and that launch overhead, not the GPU, sets its time (an hbm prefix hit took 25 ms
on the H200 where reading the weights takes 3.4). Replaying graphs launches a step with a few
dozen calls.

How: a step of ``T`` tokens from ``S`` sequences with ``R`` logits rows runs as the shape
``(T, S, R)`` rounded up to powers of two. The step's inputs are copied into static buffers;
padding tokens write no K/V (slot block -1), padding sequences are empty, padding logits rows
read row 0. Attention is the paged backend (``runtime.attention.paged``), which reads all its
sizes from those buffers. Each shape has ``num_layers + 2`` graphs -- embedding and RoPE, one per
decoder layer, the final norm and LM head -- so a KV connector's layer hooks still run between
layers (its load waits and save starts), as in the eager forward. Graphs are captured on the
first step of a shape (after one eager warm-up with empty metadata, which writes nothing) into
one memory pool, and dropped when the KV pool changes.

Off the request's path: :func:`reachable_shapes` lists every shape an engine's steps can take
given its scheduler limits, and :meth:`StepGraphs.prepare` captures them before the first
request (the engine does at start, ``Engine(capture_graphs_at_start=True)``). A shape first met
on a step anyway is recorded in :attr:`StepGraphs.late_shapes` (in mode ``"cuda"`` each one was
a capture on that request's path), so tests can prove the enumeration complete. Graphs belong
to one pool at a time: a model that steps over another pool (a second engine sharing it) drops
them, and the shapes are captured again -- off the path only if that engine prepares them
again (an engine prepares at its start, so engines sharing a model and taking turns capture on
every switch: give each engine its own model). Longer steps run eagerly through the model's
backend; :func:`eager_warm_steps` lists one step per first launch they can pay (a Triton
compile per specialisation; cuBLAS and SDPA kernels) and :func:`warm_eager` runs them over a
scratch block, so the engine pays those at start too.

Mode ``"eager"`` runs the same padded steps without graphs: the CPU path (the kernels run under
Triton's interpreter there) and the reference that graph replay must match token for token.
"""

from __future__ import annotations

import functools
import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, cast

import torch
import torch.nn.functional as F

from runtime.attention.paged import PagedStep, attention, block_q_for, num_splits_for
from runtime.batch import Batch, BatchMeta
from runtime.fused_kernels import add_rmsnorm, rope_write_kv, silu_mul

if TYPE_CHECKING:
    from runtime.config import ModelConfig
    from runtime.model import DecoderLayer, LayerHooks, LlamaForPagedLM

#: Steps of at most this many tokens (and logits rows) run here; longer ones run eagerly
#: through the model's backend (a long prefill is compute-bound: launches do not matter).
MAX_TOKENS = 512

StepMode = Literal["cuda", "eager"]


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


@dataclass(frozen=True, slots=True)
class StepShape:
    """A padded step's launch shape: ``tokens`` rows (a power of two), ``seqs`` sequences (a
    power of two, at most ``tokens``), ``logits`` rows (a power of two, at most ``seqs``), and
    the attention kernel's ``block_q`` and ``num_splits`` (``runtime.attention.paged``). One
    set of graphs per shape."""

    tokens: int
    seqs: int
    logits: int
    block_q: int
    num_splits: int


@dataclass(frozen=True, slots=True)
class PrepareReport:
    """What :meth:`StepGraphs.prepare` did: ``num_shapes`` asked for, ``num_captured`` of them
    captured now (the others were ready already; always 0 in mode ``"eager"``, which has
    nothing to capture), in ``seconds`` (device work included)."""

    num_shapes: int
    num_captured: int
    seconds: float


@functools.lru_cache(maxsize=16)
def reachable_shapes(config: ModelConfig, device: torch.device, *, max_num_batched_tokens: int,
                     max_num_seqs: int, max_chunk_tokens: int) -> tuple[StepShape, ...]:
    """Every shape that a step of a model of ``config`` on ``device`` can run as here, under a
    scheduler with these limits (``runtime.scheduler.SchedulerConfig``; ``max_chunk_tokens``
    is its ``max_chunk_tokens``). A superset where exactness would cost more than a few shapes;
    ordered smallest first.

    A step of ``t <= min(max_num_batched_tokens, MAX_TOKENS)`` tokens from ``s <= min(t,
    max_num_seqs)`` sequences pads to ``tokens = pow2(t)``, ``seqs = pow2(s)``. Its logits rows
    ``r`` are its chunks that end their request; a chunk that does not was cut by the chunk
    size (at most ``t // max_chunk_tokens`` of those) or by the step's budget (the last chunk),
    so ``r >= s - (t // max_chunk_tokens + 1)``, and ``logits = pow2(max(1, r))``. ``block_q``
    is the short-query one when every sequence brings at most ``k = 16 // groups`` tokens
    (``t <= s * k``; then each sequence is one query block) and the long one when one brings
    more (``t >= s + k``); ``num_splits`` (``num_splits_for``) falls with the query blocks
    ``q`` (``max(s, ceil(t / block_q)) <= q <= (t + s * (block_q - 1)) // block_q``) and rises
    with the longest sequence ``L`` (``ceil(t / s) <= L <= max_position_embeddings``), so it
    takes every power of two between its values at (most blocks, shortest L) and (fewest
    blocks, longest L).

    Count: 403 shapes for Llama-3-8B on an H200 (132 multiprocessors) with the engine's
    defaults (512 tokens, 64 sequences a step); 129 for ``tiny`` on a CPU."""
    groups, kv_heads = config.num_heads // config.num_kv_heads, config.num_kv_heads
    max_pos = config.max_position_embeddings
    k = 16 // groups
    shapes: set[StepShape] = set()
    for t in range(1, min(max_num_batched_tokens, MAX_TOKENS) + 1):
        tokens = _pow2(t)
        for s in range(1, min(t, max_num_seqs) + 1):
            seqs = _pow2(s)
            rmin = max(0, s - (t // max_chunk_tokens + 1))
            logits = [1 << i for i in range(_pow2(max(1, rmin)).bit_length() - 1,
                                            seqs.bit_length())]
            classes: list[tuple[int, int, int, int]] = []  # (block_q, q min, q max, L min)
            if t <= s * k:
                block_q = block_q_for(1, groups)
                assert block_q >= k, "a short query is one block"
                classes.append((block_q, s, s, -(-t // s)))
            if t >= s + k:
                block_q = block_q_for(k + 1, groups)
                classes.append((block_q, max(s, -(-t // block_q)),
                                (t + s * (block_q - 1)) // block_q, max(k + 1, -(-t // s))))
            for block_q, q_min, q_max, len_min in classes:
                lo = num_splits_for(q_max, kv_heads, len_min, device)
                hi = num_splits_for(q_min, kv_heads, max_pos, device)
                splits = [1 << i for i in range(lo.bit_length() - 1, hi.bit_length())]
                shapes.update(StepShape(tokens, seqs, r, block_q, n)
                              for r in logits for n in splits)
    return tuple(sorted(shapes, key=lambda sh: (sh.tokens, sh.seqs, sh.logits, sh.block_q,
                                                sh.num_splits)))


@dataclass(frozen=True, slots=True)
class EagerStep:
    """A step too long for the step graphs (over :data:`MAX_TOKENS` tokens), run eagerly through
    the model's backend: ``seqs`` are each sequence's ``(cached, new)`` tokens, in batch order,
    and ``table_width`` the width of the step's block tables (``BatchMeta.block_tables``)."""

    seqs: tuple[tuple[int, int], ...]
    table_width: int

    @property
    def num_tokens(self) -> int:
        return sum(n for _, n in self.seqs)


def _int_class(v: int) -> int:
    """How Triton specialises an int argument: 1 is a constant, a multiple of 16 is marked
    divisible (a pointer likewise by its 16-byte alignment); each class is its own compile."""
    return 1 if v == 1 else 16 if v % 16 == 0 else 0


@functools.lru_cache(maxsize=16)
def eager_warm_steps(config: ModelConfig, device: torch.device, *, block_size: int,
                     max_num_batched_tokens: int, max_num_seqs: int, max_chunk_tokens: int,
                     paged: bool) -> tuple[EagerStep, ...]:
    """Steps that together meet every first launch a long step (``MAX_TOKENS < t <=
    max_num_batched_tokens`` tokens, at most ``max_num_seqs`` sequences of at most
    ``max_chunk_tokens`` new tokens each) of a model of ``config`` on ``device`` can pay; empty
    when no step is that long. Longest first; the first has the most tokens in the fewest
    sequences, cold (a long prompt's first chunk).

    ``paged`` (the model's backend is ``runtime.attention.paged``): one step per compile of its
    Triton kernels. They are compiled per ``block_q`` and ``num_splits`` (constexprs, derived
    as ``step_from_meta`` does) and per class (:func:`_int_class`) of their int arguments and
    pointers that a long step varies: ``num_seqs`` and the alignment of ``query_start_loc``
    (``s == 1``, ``s % 16 == 0``, ``s % 4 == 0``, other), the block tables' row stride (the
    table width) and, with splits, the partial results' row stride ``t * num_heads``. Steps
    of ``t`` in ``{max, max - 1, MAX_TOKENS + 1, MAX_TOKENS + 2}`` tokens, a few sequence
    counts of each class, one long chunk or short queries only, the longest sequence at a
    few lengths up to ``max_position_embeddings`` and a few table widths are tried; the first
    of each class is kept (at most 4 x 3 x 2 per (block_q, num_splits)). Other backends
    (cuBLAS and SDPA; nothing compiles) get steps of the longest and the shortest long size,
    from one and from several sequences, cold and over a cached prefix."""
    lo, hi = MAX_TOKENS, max_num_batched_tokens
    if hi <= lo:
        return ()
    groups, heads, kv_heads = (config.num_heads // config.num_kv_heads, config.num_heads,
                               config.num_kv_heads)
    max_pos = config.max_position_embeddings
    cap = min(max_chunk_tokens, max_pos)
    width_max = -(-max_pos // block_size)
    k = max(1, 16 // groups)  # the longest query of a short block_q
    per_class: dict[int, int] = {}
    for s in range(1, max_num_seqs + 1):  # the smallest and largest count of each class
        c = _int_class(s) * 4 + (s % 4 == 0)
        per_class.setdefault(c, s)
        per_class[-c - 1] = s
    counts = sorted(set(per_class.values()))
    steps: dict[tuple[object, ...], EagerStep] = {}
    sizes = {hi, hi - 1, lo + 1, lo + 2} if paged else {hi, lo + 1}
    for t in sorted(sizes & set(range(lo + 1, hi + 1)), reverse=True):
        for s in counts:
            for short in (False, True):
                if short:
                    if t > s * k:
                        continue
                    new = [t // s + (i < t % s) for i in range(s)]
                else:
                    first = min(cap, t - (s - 1))
                    rest = t - first
                    new = [first] + [rest // (s - 1) + (i < rest % (s - 1)) for i in range(s - 1)] \
                        if s > 1 else [first]
                    if first < 1 or sum(new) != t or min(new) < 1 or max(new) > cap:
                        continue
                lens = sorted({new[0], *(64 << i for i in range(max_pos.bit_length())), max_pos})
                for length in (n for n in lens if new[0] <= n <= max_pos):
                    seqs = ((length - new[0], new[0]),
                            *((min(1, max_pos - n), n) for n in new[1:]))
                    need = -(-max(c + n for c, n in seqs) // block_size)
                    for width in sorted({need, need + 1, need + 2, -(-need // 16) * 16}):
                        if width > width_max:
                            continue
                        step = EagerStep(seqs, width)
                        if paged:
                            block_q = block_q_for(max(new), groups)
                            splits = num_splits_for(
                                sum(-(-n // block_q) for n in new), kv_heads,
                                max(c + n for c, n in seqs), device)
                            key: tuple[object, ...] = (
                                block_q, splits, _int_class(s), s % 4 == 0, _int_class(width),
                                _int_class(t * heads) if splits > 1 else None)
                        else:
                            key = (t == hi, s == 1, seqs[0][0] > 0)
                        steps.setdefault(key, step)
    return tuple(steps.values())


def warm_eager(model: LlamaForPagedLM, steps: Sequence[EagerStep], block_size: int) -> float:
    """Run ``model``'s eager forward once for each of ``steps`` (JIT compiles, autotuning,
    library handles and lazily loaded kernels are paid here, not on a request's path), over a
    scratch pool of one block (every slot and table entry is block 0 of it): the model's pool
    is not read or written, nothing is cached or committed. Seconds, device work included."""
    t0 = time.perf_counter()
    device = model.inv_freq.device
    cfg = model.config
    scratch = torch.zeros((1, *cfg.kv_layout(block_size).page_shape), dtype=cfg.torch_dtype,
                          device=device)
    for step in steps:
        meta = _scratch_meta(step, block_size, device)
        model(Batch(torch.zeros(step.num_tokens, dtype=torch.int64, device=device), meta),
              scratch)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0


def _scratch_meta(step: EagerStep, block_size: int, device: torch.device) -> BatchMeta:
    """The step's metadata over a one-block pool: token ``p`` of a sequence at slot ``(0, p %
    block_size)``, every table entry block 0, one logits row per sequence (its last token)."""
    positions = [p for c, n in step.seqs for p in range(c, c + n)]
    qsl = [0, *itertools.accumulate(n for _, n in step.seqs)]

    def tensor(values: Sequence[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int64, device=device)

    return BatchMeta(
        block_size=block_size,
        positions=tensor(positions),
        slot_blocks=torch.zeros(len(positions), dtype=torch.int64, device=device),
        slot_offsets=tensor([p % block_size for p in positions]),
        block_tables=torch.zeros((len(step.seqs), step.table_width), dtype=torch.int64,
                                 device=device),
        logits_indices=tensor([end - 1 for end in qsl[1:]]),
        num_cached_tokens=tuple(c for c, _ in step.seqs),
        num_new_tokens=tuple(n for _, n in step.seqs),
        num_blocks_used=tuple(-(-(c + n) // block_size) for c, n in step.seqs),
        query_start_loc=tuple(qsl),
        num_logits=(1,) * len(step.seqs),
        max_block_id=0,
    )


@dataclass(slots=True)
class _Graphs:
    """One shape's captured graphs and the tensor their last graph leaves the logits in."""

    graphs: list[torch.cuda.CUDAGraph]
    logits: torch.Tensor


class StepGraphs:
    """Runs a model's small steps padded (``mode="eager"``) or as replayed CUDA graphs
    (``mode="cuda"``). Not thread-safe: one per model, driven by its forward."""

    def __init__(self, model: LlamaForPagedLM, mode: StepMode) -> None:
        self.model = model
        self.mode = mode
        self._pool_key: tuple[int, tuple[int, ...]] | None = None
        self._captured: dict[StepShape, _Graphs] = {}
        self._mempool: Any = None  # torch.cuda.graph_pool_handle()
        self._bufs: dict[str, torch.Tensor] = {}
        self._ready: set[StepShape] = set()  # prepared or met, for the current pool
        #: Captures so far (prepared, or a shape's first step), for tests and benches.
        self.num_captures = 0
        #: Shapes first met on a step rather than prepared ahead (:meth:`prepare`), in order;
        #: in mode ``"cuda"`` each was captured on that step's path.
        self.late_shapes: list[StepShape] = []

    def fits(self, batch: Batch, kv_pool: torch.Tensor) -> bool:
        """Whether this step runs here: short enough, and its block tables fit the buffers."""
        meta = batch.meta
        width = -(-self.model.config.max_position_embeddings // meta.block_size)
        return (meta.num_tokens <= MAX_TOKENS and len(meta.logits_indices) <= MAX_TOKENS
                and meta.block_tables.shape[1] <= width)

    def run(self, batch: Batch, kv_pool: torch.Tensor, hooks: LayerHooks | None) -> torch.Tensor:
        """Logits of ``batch`` (validated by the model), float32 ``[num_logits, vocab]``."""
        meta = batch.meta
        self._check_pool(kv_pool)
        cfg = self.model.config
        groups = cfg.num_heads // cfg.num_kv_heads
        block_q = block_q_for(max(meta.num_new_tokens), groups)
        q_blocks = sum(-(-n // block_q) for n in meta.num_new_tokens)
        tokens = _pow2(meta.num_tokens)
        shape = StepShape(
            tokens=tokens, seqs=min(_pow2(meta.num_seqs), tokens),
            logits=_pow2(max(1, len(meta.logits_indices))), block_q=block_q,
            num_splits=num_splits_for(q_blocks, cfg.num_kv_heads, max(meta.seq_lens),
                                      kv_pool.device),
        )
        num_logits = len(meta.logits_indices)
        if shape not in self._ready:
            self._ready.add(shape)
            self.late_shapes.append(shape)
        if self.mode == "eager":
            self._fill(batch, shape)
            logits = self._walk(self._bodies(shape, meta.block_size, kv_pool), hooks)
            assert logits is not None
            return logits[:num_logits].clone()
        graphs = self._captured.get(shape)
        if graphs is None:  # the step's pieces are built only to be captured
            graphs = self._capture(shape, self._bodies(shape, meta.block_size, kv_pool))
        self._fill(batch, shape)
        self._walk([g.replay for g in graphs.graphs], hooks)
        return graphs.logits[:num_logits].clone()

    def prepare(self, shapes: Sequence[StepShape], kv_pool: torch.Tensor,
                progress: Callable[[int], None] | None = None) -> PrepareReport:
        """Make ``shapes`` ready for steps over ``kv_pool`` before any step needs them: mode
        ``"cuda"`` captures those not captured yet (their warm-ups compile Triton's kernels
        and let cuBLAS pick its own), mode ``"eager"`` only records them (nothing is compiled
        or captured there). Steps of these shapes then add nothing to :attr:`late_shapes`.
        Writes nothing into the pool (warm-ups and captures run with empty metadata); a pool
        other than the last one's drops what was captured for that one first.
        ``progress(done)`` is called after each shape. Raises InvalidArgument for a pool that
        does not fit the model."""
        self.model.check_kv_pool(kv_pool)
        t0 = time.perf_counter()
        self._check_pool(kv_pool)
        captured = 0
        with torch.inference_mode():
            for done, shape in enumerate(shapes, 1):
                if shape not in self._ready:
                    if self.mode == "cuda":
                        self._capture(shape, self._bodies(shape, kv_pool.shape[3], kv_pool))
                        captured += 1
                    self._ready.add(shape)
                if progress is not None:
                    progress(done)
        if self.mode == "cuda":
            torch.cuda.synchronize(kv_pool.device)
        return PrepareReport(len(shapes), captured, time.perf_counter() - t0)

    # -- buffers -----------------------------------------------------------------------------

    def _check_pool(self, kv_pool: torch.Tensor) -> None:
        """Graphs hold the pool's address: a new pool drops them (and the buffers follow its
        device)."""
        key = (kv_pool.data_ptr(), tuple(kv_pool.shape))
        if key == self._pool_key:
            return
        self._captured.clear()
        self._ready.clear()
        self._mempool = None
        self._pool_key = key
        width = -(-self.model.config.max_position_embeddings // kv_pool.shape[3])
        dev, i64, i32 = kv_pool.device, torch.int64, torch.int32
        self._bufs = {
            "input_ids": torch.zeros(MAX_TOKENS, dtype=i64, device=dev),
            "positions": torch.zeros(MAX_TOKENS, dtype=i64, device=dev),
            "slot_blocks": torch.full((MAX_TOKENS,), -1, dtype=i64, device=dev),
            "slot_offsets": torch.zeros(MAX_TOKENS, dtype=i64, device=dev),
            "logits_indices": torch.zeros(MAX_TOKENS, dtype=i64, device=dev),
            "block_tables": torch.zeros((MAX_TOKENS, width), dtype=i32, device=dev),
            # a step's seq_lens [S] then its query_start_loc [S + 1]
            "lens": torch.zeros(2 * MAX_TOKENS + 1, dtype=i32, device=dev),
        }

    def _step(self, shape: StepShape, block_size: int) -> PagedStep:
        b = self._bufs
        return PagedStep(
            block_size=block_size,
            slot_blocks=b["slot_blocks"][: shape.tokens],
            slot_offsets=b["slot_offsets"][: shape.tokens],
            block_tables=b["block_tables"][: shape.seqs],
            seq_lens=b["lens"][: shape.seqs],
            query_start_loc=b["lens"][shape.seqs: 2 * shape.seqs + 1],
            block_q=shape.block_q,
            num_splits=shape.num_splits,
        )

    def _fill(self, batch: Batch, shape: StepShape) -> None:
        """Copy the step into the buffers; padding writes nothing and reads row 0."""
        meta, b = batch.meta, self._bufs
        t, s, r = meta.num_tokens, meta.num_seqs, len(meta.logits_indices)
        b["input_ids"][:t].copy_(batch.input_ids, non_blocking=True)
        b["positions"][:t].copy_(meta.positions, non_blocking=True)
        b["slot_blocks"][:t].copy_(meta.slot_blocks, non_blocking=True)
        b["slot_blocks"][t: shape.tokens].fill_(-1)
        b["slot_offsets"][:t].copy_(meta.slot_offsets, non_blocking=True)
        b["logits_indices"][:r].copy_(meta.logits_indices, non_blocking=True)
        b["logits_indices"][r: shape.logits].zero_()
        b["block_tables"][:s, : meta.block_tables.shape[1]].copy_(meta.block_tables,
                                                                  non_blocking=True)
        pad = shape.seqs - s
        lens = torch.tensor([*meta.seq_lens, *([0] * pad), *meta.query_start_loc, *([t] * pad)],
                            dtype=torch.int32)
        b["lens"][: 2 * shape.seqs + 1].copy_(lens)

    def _empty(self, shape: StepShape) -> None:
        """Metadata of a step that touches nothing: for warm-up and capture."""
        b = self._bufs
        b["slot_blocks"][: shape.tokens].fill_(-1)
        b["lens"].zero_()
        b["logits_indices"].zero_()

    # -- the step's pieces -------------------------------------------------------------------

    def _bodies(self, shape: StepShape, block_size: int, kv_pool: torch.Tensor
                ) -> list[Callable[[], torch.Tensor | None]]:
        """The step as ``num_layers + 2`` closures over the buffers; each returns its output
        tensor, which the next reads (captured: the graph's own output). A layer is the
        model's decoder layer with its element-wise steps fused (``runtime.fused_kernels``)
        and the residual stream carried unnormalised, as vLLM does."""
        model, b = self.model, self._bufs
        cfg = model.config
        step = self._step(shape, block_size)
        layers = cast("list[DecoderLayer]", list(model.model.layers))
        heads, kv_heads, dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        eps, scale = cfg.rms_norm_eps, cfg.head_dim ** -0.5
        state: dict[str, torch.Tensor] = {}

        def pre() -> torch.Tensor:
            pos = b["positions"][: shape.tokens]
            freqs = pos.float()[:, None] * model.inv_freq[None, :]
            emb = torch.cat((freqs, freqs), dim=-1)
            state["cos"], state["sin"] = emb.cos().to(cfg.torch_dtype), emb.sin().to(cfg.torch_dtype)
            state["h"] = model.model.embed_tokens(b["input_ids"][: shape.tokens])
            state.pop("res", None)
            return state["h"]

        def layer_body(i: int) -> Callable[[], torch.Tensor]:
            layer = layers[i]
            attn, mlp = layer.self_attn, layer.mlp

            def body() -> torch.Tensor:
                x, res = add_rmsnorm(state["h"], layer.input_layernorm.weight, eps,
                                     state.get("res"))
                q = rope_write_kv(F.linear(x, attn.qkv_weight), state["cos"], state["sin"],
                                  kv_pool, i, step.slot_blocks, step.slot_offsets, heads,
                                  kv_heads)
                o = attention(q, kv_pool, i, step, scale).view(shape.tokens, heads * dim)
                x, res = add_rmsnorm(F.linear(o, attn.o_proj.weight),
                                     layer.post_attention_layernorm.weight, eps, res)
                state["h"] = F.linear(silu_mul(F.linear(x, mlp.gate_up_weight)),
                                      mlp.down_proj.weight)
                state["res"] = res
                return state["h"]
            return body

        def post() -> torch.Tensor:
            x, _ = add_rmsnorm(state["h"], model.model.norm.weight, eps, state["res"])
            head = (model.model.embed_tokens.weight if model.lm_head is None
                    else model.lm_head.weight)
            return F.linear(x[b["logits_indices"][: shape.logits]], head).float()

        return [pre, *(layer_body(i) for i in range(len(layers))), post]

    def _capture(self, shape: StepShape, bodies: list[Callable[[], torch.Tensor | None]]
                 ) -> _Graphs:
        self._empty(shape)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up: Triton compiles, cuBLAS picks its kernels
            for body in bodies:
                body()
        torch.cuda.current_stream().wait_stream(side)
        if self._mempool is None:
            self._mempool = torch.cuda.graph_pool_handle()
        graphs = []
        out: torch.Tensor | None = None
        for body in bodies:
            g = torch.cuda.CUDAGraph()
            # thread_local: the store's threads keep copying on their own streams meanwhile
            # (a pool's write-back ahead of need, a connector's transfers); in the default
            # global mode their pinned allocations and syncs would invalidate this capture
            with torch.cuda.graph(g, pool=self._mempool, capture_error_mode="thread_local"):
                out = body()
            graphs.append(g)
        assert out is not None
        captured = _Graphs(graphs, out)
        self._captured[shape] = captured
        self.num_captures += 1
        return captured

    @staticmethod
    def _walk(pieces: list[Callable[[], torch.Tensor | None]], hooks: LayerHooks | None
              ) -> torch.Tensor | None:
        """Run the pieces in order with the layer hooks around each layer; the last's result."""
        pieces[0]()
        for i, piece in enumerate(pieces[1:-1]):
            if hooks is not None:
                hooks.before(i)
            piece()
            if hooks is not None:
                hooks.after(i)
        return pieces[-1]()
