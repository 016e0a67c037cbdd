"""Triton kernels that fuse a decoder layer's small element-wise steps for the step path
(``runtime.step_graphs``): residual add + RMSNorm, RoPE of q and k + the K/V write into the pool,
and SiLU(gate) * up. Each replaces four to eleven torch kernels; in a step of a few tokens the
launches, not the bytes, are what these steps cost.

Rounding follows transformers' bfloat16 Llama where it is cheap to: the residual sum is rounded
to the model dtype before it is normalised, the normalised value is rounded before the weight
multiplies it, SiLU is rounded before the product. RoPE is computed in float32 and rounded once.
Under Triton's interpreter (``TRITON_INTERPRET=1``) they run on a CPU, which is how CI checks
them against the model's eager path.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


@triton.jit
def _add_rmsnorm_kernel(
    x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr, eps,
    N: tl.constexpr, BLOCK: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(x_ptr + row * N + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        x = (x.to(tl.float32) + tl.load(res_ptr + row * N + cols, mask=mask, other=0.0)
             .to(tl.float32)).to(x_ptr.dtype.element_ty)
        tl.store(res_out_ptr + row * N + cols, x, mask=mask)
    xf = x.to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(xf * xf, 0) / N + eps)
    y = (xf * inv).to(x_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * N + cols, (w * y).to(out_ptr.dtype.element_ty), mask=mask)


def add_rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float,
                residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rmsnorm(x + residual) * weight, x + residual)`` for ``x`` ``[T, N]`` contiguous; without
    ``residual``, ``(rmsnorm(x) * weight, x)``."""
    t, n = x.shape
    out = torch.empty_like(x)
    res_out = torch.empty_like(x) if residual is not None else x
    _add_rmsnorm_kernel[(t,)](x, residual if residual is not None else x, weight, out, res_out,
                              eps, N=n, BLOCK=_pow2(n), HAS_RESIDUAL=residual is not None)
    return out, res_out


@triton.jit
def _rope_write_kernel(
    qkv_ptr, cos_ptr, sin_ptr, q_out_ptr, k_cache_ptr, v_cache_ptr, blocks_ptr, offsets_ptr,
    stride_qkv, stride_cs, stride_cache_block, stride_cache_tok,
    NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, D: tl.constexpr,
):
    """Program ``(t, h)``: query head ``h`` (rotated into ``q_out``), key head ``h - H``
    (rotated into its pool slot) or value head ``h - H - KVH`` (copied into its slot)."""
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    d = tl.arange(0, D)
    half: tl.constexpr = D // 2
    row = qkv_ptr + t * stride_qkv + h * D
    x = tl.load(row + d)
    if h < NUM_HEADS + NUM_KV_HEADS:
        other = tl.load(row + (d + half) % D).to(tl.float32)
        rotated = tl.where(d < half, -other, other)
        c = tl.load(cos_ptr + t * stride_cs + d).to(tl.float32)
        s = tl.load(sin_ptr + t * stride_cs + d).to(tl.float32)
        x = (x.to(tl.float32) * c + rotated * s).to(qkv_ptr.dtype.element_ty)
    if h < NUM_HEADS:
        tl.store(q_out_ptr + t * (NUM_HEADS * D) + h * D + d, x)
    else:
        blk = tl.load(blocks_ptr + t)
        off = tl.load(offsets_ptr + t)
        mask = d < tl.where(blk >= 0, D, 0)  # padding tokens write nothing
        slot = blk.to(tl.int64) * stride_cache_block + off.to(tl.int64) * stride_cache_tok
        if h < NUM_HEADS + NUM_KV_HEADS:
            tl.store(k_cache_ptr + slot + (h - NUM_HEADS) * D + d, x, mask=mask)
        else:
            tl.store(v_cache_ptr + slot + (h - NUM_HEADS - NUM_KV_HEADS) * D + d, x, mask=mask)


def rope_write_kv(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv_pool: torch.Tensor,
                  layer: int, slot_blocks: torch.Tensor, slot_offsets: torch.Tensor,
                  num_heads: int, num_kv_heads: int) -> torch.Tensor:
    """RoPE on the q and k parts of ``qkv`` ``[T, (H + 2 KVH) * D]``; k and v go to their pool
    slots of ``layer`` (block < 0: padding, not written); returns q ``[T, H, D]``."""
    t = qkv.shape[0]
    d = kv_pool.shape[-1]
    q = torch.empty((t, num_heads, d), dtype=qkv.dtype, device=qkv.device)
    k_cache, v_cache = kv_pool[:, layer, 0], kv_pool[:, layer, 1]
    _rope_write_kernel[(t, num_heads + 2 * num_kv_heads)](
        qkv, cos, sin, q, k_cache, v_cache, slot_blocks, slot_offsets,
        qkv.stride(0), cos.stride(0), k_cache.stride(0), k_cache.stride(1),
        NUM_HEADS=num_heads, NUM_KV_HEADS=num_kv_heads, D=d,
    )
    return q


@triton.jit
def _silu_mul_kernel(gu_ptr, out_ptr, N: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < N
    g = tl.load(gu_ptr + row * 2 * N + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + row * 2 * N + N + cols, mask=mask, other=0.0).to(tl.float32)
    act = (g / (1.0 + tl.exp(-g))).to(gu_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + row * N + cols, (act * u).to(out_ptr.dtype.element_ty), mask=mask)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` of ``gate_up`` ``[T, 2 I]`` (gate first), ``[T, I]``."""
    t, n2 = gate_up.shape
    n = n2 // 2
    out = torch.empty((t, n), dtype=gate_up.dtype, device=gate_up.device)
    block = min(1024, _pow2(n))
    _silu_mul_kernel[(t, triton.cdiv(n, block))](gate_up, out, N=n, BLOCK=block)
    return out
