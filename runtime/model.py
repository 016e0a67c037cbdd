"""A Llama-family decoder whose attention reads and writes a paged KV pool.

Architecture (Hugging Face ``LlamaForCausalLM``-compatible, no biases)::

    x = embed(ids)
    per layer:  x += o_proj(attn(rope(q_proj(norm1(x))), rope(k_proj(..)), v_proj(..)))
                x += down_proj(silu(gate_proj(norm2(x))) * up_proj(norm2(x)))
    logits = lm_head(norm(x))          (lm_head = embed_tokens when tied)

Parameter names equal HF's (see :mod:`runtime.weights`), so a HF state dict loads as is.
The KV pool is ``[num_blocks, num_layers, 2, block_size, num_kv_heads, head_dim]`` (kvstore's page
layout, page-first); allocate it with :func:`allocate_kv_pool`. The model owns no cache state:
the caller owns the pool and the block tables (see :mod:`runtime.batch`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol, cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from kvstore.errors import InvalidArgument
from runtime.attention import DEFAULT_BACKEND, AttentionBackend, make_attention_backend
from runtime.batch import Batch, first_bad_id, id_array
from runtime.config import ModelConfig
from runtime.errors import CheckpointError
from runtime.weights import checkpoint_tensor_shapes, load_checkpoint, random_state_dict

if TYPE_CHECKING:
    from runtime.step_graphs import StepGraphs

#: How a model runs its small steps (``runtime.step_graphs``): ``"cuda"`` replays CUDA graphs,
#: ``"eager"`` runs the same padded paged-kernel steps without graphs, ``"off"`` runs every
#: step through the attention backend; ``"auto"`` is ``"cuda"`` on a GPU with Triton, else
#: ``"off"``.
StepGraphsMode = Literal["auto", "cuda", "eager", "off"]
STEP_GRAPHS_MODES = ("auto", "cuda", "eager", "off")


def _triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def _step_graphs_mode(mode: str, device: torch.device) -> str:
    if mode not in STEP_GRAPHS_MODES:
        raise InvalidArgument(f"step_graphs must be one of {', '.join(STEP_GRAPHS_MODES)}, got "
                              f"{mode!r}", hint="leave it 'auto'")
    if mode == "auto":
        return "cuda" if device.type == "cuda" and _triton_available() else "off"
    if mode == "cuda" and device.type != "cuda":
        raise InvalidArgument(f"step_graphs='cuda' needs a CUDA device, the model is on {device}",
                              hint="use 'eager' (Triton's interpreter on a CPU) or 'off'")
    if mode != "off" and not _triton_available():
        raise InvalidArgument(f"step_graphs={mode!r} needs Triton, which is not installed",
                              hint="pip install triton, or use step_graphs='off'")
    return mode


def allocate_kv_pool(
    config: ModelConfig, num_blocks: int, block_size: int, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """A zeroed KV pool ``[num_blocks, *config.kv_layout(block_size).page_shape]`` in the model
    dtype; block ``b`` is ``pool[b]``, one contiguous kvstore page."""
    layout = config.kv_layout(block_size)
    return torch.zeros((num_blocks, *layout.page_shape), dtype=config.torch_dtype, device=device)


def rope_inv_freq(config: ModelConfig) -> torch.Tensor:
    """RoPE inverse frequencies ``[head_dim // 2]`` float32, with Llama-3 scaling if configured.

    Llama-3 scaling by wavelength ``w = 2π / f`` with ``lo = orig / low_freq_factor``,
    ``hi = orig / high_freq_factor``: ``w < hi`` keeps ``f``; ``w > lo`` uses ``f / factor``;
    between, ``(1 - a) f / factor + a f`` with ``a = (orig / w - low) / (high - low)``.
    """
    d = config.head_dim
    inv = 1.0 / (config.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    sc = config.rope_scaling
    if sc is None:
        return inv
    orig = sc.original_max_position_embeddings
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > orig / sc.low_freq_factor, inv / sc.factor, inv)
    smooth = (orig / wavelen - sc.low_freq_factor) / (sc.high_freq_factor - sc.low_freq_factor)
    smoothed = (1 - smooth) * scaled / sc.factor + smooth * scaled
    medium = (wavelen >= orig / sc.high_freq_factor) & (wavelen <= orig / sc.low_freq_factor)
    return torch.where(medium, smoothed, scaled)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` ``[T, heads, head_dim]`` (HF's half-split convention); ``cos``/``sin`` are
    ``[T, head_dim]``."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


class RMSNorm(nn.Module):
    """``x / rms(x) * weight``, computed in float32; ``x`` is ``[..., hidden]``."""

    def __init__(self, hidden: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class Attention(nn.Module):
    #: ``q_proj``, ``k_proj`` and ``v_proj`` weights stacked; theirs are views of it (see
    #: :func:`fuse_weights`).
    qkv_weight: torch.Tensor

    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        h, d = config.hidden_size, config.head_dim
        self.layer, self.num_heads, self.num_kv_heads, self.head_dim = (
            layer, config.num_heads, config.num_kv_heads, d,
        )
        self.q_proj = nn.Linear(h, config.num_heads * d, bias=False)
        self.k_proj = nn.Linear(h, config.num_kv_heads * d, bias=False)
        self.v_proj = nn.Linear(h, config.num_kv_heads * d, bias=False)
        self.o_proj = nn.Linear(config.num_heads * d, h, bias=False)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv_pool: torch.Tensor,
        batch: Batch, backend: AttentionBackend,
    ) -> torch.Tensor:
        t = x.shape[0]
        # separate products: contiguous q/k/v for RoPE and SDPA (the step path uses qkv_weight)
        q = apply_rope(self.q_proj(x).view(t, self.num_heads, self.head_dim), cos, sin)
        k = apply_rope(self.k_proj(x).view(t, self.num_kv_heads, self.head_dim), cos, sin)
        v = self.v_proj(x).view(t, self.num_kv_heads, self.head_dim)
        backend.write_kv(kv_pool, self.layer, k, v, batch.meta)
        out = backend.attend(q, k, v, kv_pool, self.layer, batch.meta, self.head_dim**-0.5)
        return self.o_proj(out.reshape(t, self.num_heads * self.head_dim))


class MLP(nn.Module):
    #: ``gate_proj`` and ``up_proj`` weights stacked; theirs are views of it.
    gate_up_weight: torch.Tensor

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        h, i = config.hidden_size, config.intermediate_size
        self.gate_proj = nn.Linear(h, i, bias=False)
        self.up_proj = nn.Linear(h, i, bias=False)
        self.down_proj = nn.Linear(i, h, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def fuse_weights(*linears: nn.Linear) -> torch.Tensor:
    """One tensor holding the linears' weights stacked, each linear's weight a view of its rows:
    the step path (``runtime.step_graphs``) runs one matrix product instead of several (a small
    step is launch-bound), the eager path the separate ones (contiguous outputs for a long
    prefill), and the Hugging Face names and shapes stay for loading. Moving the model afterwards (``.to``)
    would split them again: build it on its device."""
    fused = torch.cat([lin.weight.detach() for lin in linears])
    start = 0
    for lin in linears:
        rows = lin.weight.shape[0]
        lin.weight = nn.Parameter(fused[start: start + rows], requires_grad=False)
        start += rows
    return fused


class DecoderLayer(nn.Module):
    self_attn: Attention
    mlp: MLP
    input_layernorm: RMSNorm
    post_attention_layernorm: RMSNorm

    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        self.self_attn = Attention(config, layer)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class _Backbone(nn.Module):
    embed_tokens: nn.Embedding
    layers: nn.ModuleList
    norm: RMSNorm

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class LayerHooks(Protocol):
    """Per-layer callbacks around each decoder layer's attention (see :meth:`LlamaForPagedLM.forward`)."""

    def before(self, layer: int) -> None: ...

    def after(self, layer: int) -> None: ...


class LlamaForPagedLM(nn.Module):
    """Llama decoder over a paged KV pool. Build with :meth:`from_random` or
    :meth:`from_checkpoint`; run with :meth:`forward`. Weights are frozen (inference only)."""

    inv_freq: torch.Tensor

    def __init__(
        self,
        config: ModelConfig,
        *,
        backend: str | AttentionBackend = DEFAULT_BACKEND,
        device: torch.device | str = "cpu",
        step_graphs: StepGraphsMode = "auto",
    ) -> None:
        """Uninitialized weights on ``device`` in ``config.dtype``; call :meth:`load_weights`.
        ``step_graphs``: how steps of at most ``runtime.step_graphs.MAX_TOKENS`` tokens run
        (:data:`StepGraphsMode`); longer ones always run eagerly through ``backend``."""
        super().__init__()
        mode = _step_graphs_mode(step_graphs, torch.device(device))
        self.config = config
        self.backend = make_attention_backend(backend) if isinstance(backend, str) else backend
        with torch.device("meta"):
            self.model = _Backbone(config)
            self.lm_head = (
                None if config.tie_word_embeddings
                else nn.Linear(config.hidden_size, config.vocab_size, bias=False)
            )
        self.to_empty(device=device)
        self.to(config.torch_dtype)
        self.requires_grad_(False)
        for layer in cast("list[DecoderLayer]", self.model.layers):
            attn, mlp = layer.self_attn, layer.mlp
            attn.qkv_weight = fuse_weights(attn.q_proj, attn.k_proj, attn.v_proj)
            mlp.gate_up_weight = fuse_weights(mlp.gate_proj, mlp.up_proj)
        self.register_buffer("inv_freq", rope_inv_freq(config).to(device), persistent=False)
        self.step_graphs: StepGraphs | None = None
        if mode != "off":
            from runtime.step_graphs import StepGraphs

            self.step_graphs = StepGraphs(self, mode)  # type: ignore[arg-type]

    @classmethod
    def from_random(
        cls, config: ModelConfig, seed: int, *, backend: str | AttentionBackend = DEFAULT_BACKEND,
        device: torch.device | str = "cpu", step_graphs: StepGraphsMode = "auto",
    ) -> LlamaForPagedLM:
        """Deterministic random weights (:func:`runtime.weights.random_state_dict`)."""
        model = cls(config, backend=backend, device=device, step_graphs=step_graphs)
        model.load_weights(random_state_dict(config, seed, device=device))
        return model

    @classmethod
    def from_checkpoint(
        cls, path: str | Path, *, backend: str | AttentionBackend = DEFAULT_BACKEND,
        device: torch.device | str = "cpu", dtype: torch.dtype | None = None,
        step_graphs: StepGraphsMode = "auto",
    ) -> LlamaForPagedLM:
        """Load a HF checkpoint directory (:func:`runtime.weights.load_checkpoint`); ``dtype``
        overrides the checkpoint's."""
        ckpt = load_checkpoint(path, dtype=dtype, device=device)
        config = ckpt.config if dtype is None else ckpt.config.with_dtype(str(dtype))
        model = cls(config, backend=backend, device=device, step_graphs=step_graphs)
        model.load_weights(ckpt.tensors)
        return model

    def load_weights(self, tensors: dict[str, torch.Tensor]) -> None:
        """Copy HF-named ``tensors`` into the parameters. Raises
        :class:`~runtime.errors.CheckpointError` for missing, extra or misshaped tensors before
        copying anything."""
        expected = checkpoint_tensor_shapes(self.config)
        missing, extra = sorted(set(expected) - set(tensors)), sorted(set(tensors) - set(expected))
        if missing or extra:
            raise CheckpointError(f"weights do not match the config: missing {missing[:5]}, "
                                  f"unexpected {extra[:5]}", hint="use HF Llama tensor names")
        for name, shape in expected.items():
            if tuple(tensors[name].shape) != shape:
                raise CheckpointError(
                    f"tensor {name!r} has shape {list(tensors[name].shape)}, expected "
                    f"{list(shape)}", hint="the weights do not match the config",
                )
        params = dict(self.named_parameters())
        with torch.no_grad():
            for name in expected:
                params[name].copy_(tensors[name])

    def check_kv_pool(self, kv_pool: torch.Tensor, block_size: int | None = None) -> None:
        """Raise :class:`~kvstore.errors.InvalidArgument` unless ``kv_pool`` is a pool of this
        model (shape, dtype, device)."""
        c = self.config
        ok = (
            isinstance(kv_pool, torch.Tensor) and kv_pool.dim() == 6
            and tuple(kv_pool.shape[1:]) == (
                c.num_layers, 2, block_size or kv_pool.shape[3], c.num_kv_heads, c.head_dim)
            and kv_pool.dtype == c.torch_dtype and kv_pool.device == self.inv_freq.device
        )
        if not ok:
            got = (tuple(kv_pool.shape), kv_pool.dtype, str(kv_pool.device)) if isinstance(
                kv_pool, torch.Tensor) else type(kv_pool).__name__
            raise InvalidArgument(
                f"kv_pool {got} does not fit the model: expected shape [num_blocks, "
                f"{c.num_layers}, 2, {block_size or 'block_size'}, {c.num_kv_heads}, "
                f"{c.head_dim}], dtype {c.torch_dtype}, device {self.inv_freq.device}",
                hint="allocate it with runtime.model.allocate_kv_pool",
            )

    @torch.inference_mode()
    def forward(  # type: ignore[override]
        self, batch: Batch, kv_pool: torch.Tensor, layer_hooks: LayerHooks | None = None
    ) -> torch.Tensor:
        """Run ``batch`` (from :func:`runtime.batch.build_batch`) through the model.

        Writes the new tokens' K/V of every layer into ``kv_pool`` at their slots (and nothing
        else), attends causally over each sequence's cached + new tokens, and returns float32
        logits ``[len(batch.meta.logits_indices), vocab_size]``, rows in sequence order. The pool
        is validated before anything is written.

        ``layer_hooks`` (optional): ``before(l)`` is called right before layer ``l``'s attention
        (reads/writes the pool), ``after(l)`` right after it — the seam a KV connector uses to
        wait for a layer's loads and start a layer's saves.
        """
        meta = batch.meta
        self.check_kv_pool(kv_pool, meta.block_size)
        if meta.max_block_id >= kv_pool.shape[0]:
            raise InvalidArgument(
                f"batch uses block {meta.max_block_id}, but kv_pool has {kv_pool.shape[0]} blocks",
                hint="build the batch with num_blocks=kv_pool.shape[0]",
            )
        if batch.input_ids.shape != (meta.num_tokens,):
            raise InvalidArgument(f"input_ids has shape {tuple(batch.input_ids.shape)}, expected "
                                  f"({meta.num_tokens},)", hint="build batches with build_batch")
        if self.step_graphs is not None and self.step_graphs.fits(batch, kv_pool):
            return self.step_graphs.run(batch, kv_pool, layer_hooks)
        cos, sin = self._rope_tables(meta.positions)
        x = self.model.embed_tokens(batch.input_ids)
        for i, layer in enumerate(cast("list[DecoderLayer]", self.model.layers)):
            if layer_hooks is not None:
                layer_hooks.before(i)
            x = x + layer.self_attn(layer.input_layernorm(x), cos, sin, kv_pool, batch,
                                    self.backend)
            if layer_hooks is not None:
                layer_hooks.after(i)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        x = self.model.norm(x[meta.logits_indices])
        head = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return F.linear(x, head).float()

    def _rope_tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``cos``, ``sin`` ``[T, head_dim]`` in the model dtype for int64 ``positions``."""
        freqs = positions.float()[:, None] * self.inv_freq[None, :]  # [T, head_dim // 2]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(self.config.torch_dtype), emb.sin().to(self.config.torch_dtype)

    #: Tokens per pass of :meth:`write_first_layer_kv` (bounds its scratch: a 32K-token load's
    #: float32 norm of the whole prefix at once would take ~1.5 GB on Llama-3-8B).
    FIRST_LAYER_CHUNK = 8192

    @torch.inference_mode()
    def write_first_layer_kv(self, kv_pool: torch.Tensor, token_ids: Sequence[int],
                             first_position: int, block_ids: Sequence[int], *,
                             upload: Callable[[np.ndarray], torch.Tensor] | None = None) -> None:
        """Write layer 0's K/V of ``token_ids`` -- whole blocks at positions ``first_position``
        on, block ``i`` of them into pool block ``block_ids[i]`` -- as a forward over them
        would, and nothing else; queued on the current stream (a later forward reading the
        blocks is ordered after it). Layer 0's K/V depend on the token ids and positions
        alone (an embedding, a norm, two projections and RoPE), so an engine loading cached
        blocks can write that layer itself rather than copy it in: on Llama-3-8B a 16-token
        block's layer is 64 KiB, a microsecond of the host link, against a few hundred
        nanoseconds of matrix products on the GPU beside the copies of the other layers.
        ``upload``: moves the ids to the pool's device (default ``Tensor.to``, which from
        pageable memory queues more than 64 KiB behind a load's queued copies; the engine's
        reads them with a kernel: ``runtime.readout.HostUpload``). Raises
        InvalidArgument for a pool that does not fit the model, ids outside the vocabulary, a
        count that is not whole blocks, a position that does not start a block or runs past
        ``max_position_embeddings``, and block ids outside the pool or repeated, writing
        nothing."""
        cfg = self.config
        self.check_kv_pool(kv_pool)
        B = kv_pool.shape[3]
        n, nb = len(token_ids), len(block_ids)
        if n != nb * B:
            raise InvalidArgument(f"{n} token ids are not the {nb} blocks of {B} tokens given",
                                  hint="pass whole blocks: len(token_ids) == len(block_ids) * block_size")
        if (not isinstance(first_position, int) or isinstance(first_position, bool)
                or first_position < 0 or first_position % B
                or first_position + n > cfg.max_position_embeddings):
            raise InvalidArgument(
                f"first_position {first_position!r} must be a multiple of {B} >= 0 with "
                f"{n} tokens after it within max_position_embeddings={cfg.max_position_embeddings}")
        if not n:
            return
        ids = id_array(token_ids, cfg.vocab_size)
        if ids is None:
            raise InvalidArgument(f"token id {first_bad_id(list(token_ids), cfg.vocab_size)!r} is "
                                  f"outside [0, {cfg.vocab_size})")
        blocks = id_array(block_ids, kv_pool.shape[0])
        if blocks is None or len(set(blocks)) != nb:
            raise InvalidArgument(f"block ids must be distinct and in [0, {kv_pool.shape[0]})",
                                  hint="pass blocks of this pool, each once")
        # one upload: ids then blocks (positions are made on the device)
        host = np.empty(n + nb, dtype=np.int64)
        host[:n] = np.frombuffer(ids, dtype=np.uint32)
        host[n:] = np.frombuffer(blocks, dtype=np.uint32)
        dev = (upload(host) if upload is not None
               else torch.from_numpy(host).to(kv_pool.device))
        layer = cast("DecoderLayer", self.model.layers[0])
        attn = layer.self_attn
        hk, d = attn.num_kv_heads, attn.head_dim
        step = max(B, self.FIRST_LAYER_CHUNK // B * B)
        for a in range(0, n, step):
            t = min(step, n - a)
            pos = torch.arange(first_position + a, first_position + a + t, device=kv_pool.device)
            cos, sin = self._rope_tables(pos)
            x = layer.input_layernorm(self.model.embed_tokens(dev[a: a + t]))
            k = apply_rope(attn.k_proj(x).view(t, hk, d), cos, sin)
            v = attn.v_proj(x).view(t, hk, d)
            where = dev[n + a // B: n + (a + t) // B]
            kv_pool[where, 0, 0] = k.view(t // B, B, hk, d)
            kv_pool[where, 0, 1] = v.view(t // B, B, hk, d)
