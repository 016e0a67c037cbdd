"""Triton kernels that read and write the paged KV pool in place: the K/V write of a step's new
tokens, and causal attention of those tokens over their sequences' cached + new K/V.

Every size the kernels depend on at run time (token slots, block tables, sequence and query
lengths) comes from device tensors, and every launch grid from the caller's static sizes, so a
step of any shape that fits those sizes can be captured once in a CUDA graph and replayed
(``runtime.step_graphs``). Nothing is gathered: K/V are read from their pages through the block
table, as vLLM's paged kernels do, where the SDPA backend copies each sequence's K/V out first.

Attention is split-KV ("flash decoding"): program ``(qb, kv_head, split)`` takes one block of up
to ``BLOCK_Q`` new tokens of one sequence, the ``G`` query heads that share ``kv_head`` (rows of
the tile are ``token * G + head``), and one slice of the key range, with an online softmax in
float32. With one split it writes the output; with several it writes each slice's output and
log-sum-exp, and :func:`_combine_kernel` merges them. A short query against a long prefix (a
decode step, a prefix hit's suffix) so uses the whole GPU, not one multiprocessor a head. Float32 products are exact
(``PRECISION="ieee"``, not TF32): a float32 model keeps its parity with transformers.

Program ``qb`` finds its sequence by binary search of ``query_start_loc[s] // BLOCK_Q + s``
(each sequence's first q-block index; the index space has room for every sequence's partial
block), so the grid needs only ``T // BLOCK_Q + S`` programs, not the sequences' lengths.

On a machine without a GPU the kernels run under Triton's interpreter (``TRITON_INTERPRET=1``),
which is how CI checks them against the reference backend.
"""

from __future__ import annotations

import triton
import triton.language as tl

#: log2(e): the kernels use exp2, with the softmax scale folded into the scores.
LOG2E = 1.4426950408889634


@triton.jit
def _write_kv_kernel(
    k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, blocks_ptr, offsets_ptr,
    stride_k_tok, stride_v_tok, stride_cache_block, stride_cache_tok,
    ROW: tl.constexpr, ROW_P2: tl.constexpr,
):
    """One program per new token: its K and V rows (``num_kv_heads * head_dim`` values) into
    their page slot; a slot block < 0 (a padding token of a graph step) writes nothing."""
    t = tl.program_id(0)
    blk = tl.load(blocks_ptr + t)
    off = tl.load(offsets_ptr + t)
    cols = tl.arange(0, ROW_P2)
    mask = cols < tl.where(blk >= 0, ROW, 0)
    dst = blk.to(tl.int64) * stride_cache_block + off.to(tl.int64) * stride_cache_tok + cols
    k = tl.load(k_ptr + t.to(tl.int64) * stride_k_tok + cols, mask=mask)
    v = tl.load(v_ptr + t.to(tl.int64) * stride_v_tok + cols, mask=mask)
    tl.store(k_cache_ptr + dst, k, mask=mask)
    tl.store(v_cache_ptr + dst, v, mask=mask)


@triton.jit
def _attention_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, part_out_ptr, part_lse_ptr,
    block_tables_ptr, seq_lens_ptr, query_start_ptr,
    qk_scale, num_seqs,
    stride_q_tok, stride_q_head, stride_o_tok, stride_o_head,
    stride_cache_block, stride_cache_tok, stride_cache_head, stride_bt,
    stride_po_split, stride_po_tok, stride_po_head, stride_pl_split, stride_pl_tok,
    G: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr, D_P2: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    NUM_SPLITS: tl.constexpr, PRECISION: tl.constexpr,
):
    pid = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    # the sequence of q-block `pid`: the last s with query_start[s] // BLOCK_Q + s <= pid
    lo = tl.full([], 0, tl.int32)
    hi = tl.full([], 0, tl.int32) + num_seqs - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if tl.load(query_start_ptr + mid) // BLOCK_Q + mid <= pid:
            lo = mid
        else:
            hi = mid - 1
    seq = lo
    q_start = tl.load(query_start_ptr + seq)
    q_end = tl.load(query_start_ptr + seq + 1)
    tok0 = q_start + (pid - (q_start // BLOCK_Q + seq)) * BLOCK_Q
    if tok0 < q_end:
        context = tl.load(seq_lens_ptr + seq) - (q_end - q_start)  # cached tokens
        rows = tl.arange(0, BLOCK_M)
        tok = tok0 + rows // G
        head = kv_head * G + rows % G
        row_ok = (tok < q_end) & (rows < BLOCK_Q * G)
        pos = context + (tok - q_start)  # each row's absolute position
        d = tl.arange(0, D_P2)
        d_ok = d < HEAD_DIM
        q = tl.load(q_ptr + tok[:, None].to(tl.int64) * stride_q_tok
                    + head[:, None] * stride_q_head + d[None, :],
                    mask=row_ok[:, None] & d_ok[None, :], other=0.0)
        # keys [0, kv_end): up to the last valid row's position
        kv_end = context + tl.minimum(tok0 + BLOCK_Q, q_end) - q_start
        num_tiles = tl.cdiv(kv_end, BLOCK_N)
        per_split = tl.cdiv(num_tiles, NUM_SPLITS)
        t_lo = split * per_split
        t_hi = tl.minimum(t_lo + per_split, num_tiles)
        m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)  # finite: a row may see no key here
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, D_P2], tl.float32)
        table = block_tables_ptr + seq.to(tl.int64) * stride_bt
        for tile in range(t_lo, t_hi):
            n = tile * BLOCK_N + tl.arange(0, BLOCK_N)
            n_ok = n < kv_end
            blk = tl.load(table + n // BLOCK_SIZE, mask=n_ok, other=0).to(tl.int64)
            base = (blk * stride_cache_block + (n % BLOCK_SIZE).to(tl.int64) * stride_cache_tok
                    + kv_head * stride_cache_head)
            kv_mask = n_ok[:, None] & d_ok[None, :]
            k = tl.load(k_cache_ptr + base[:, None] + d[None, :], mask=kv_mask, other=0.0)
            v = tl.load(v_cache_ptr + base[:, None] + d[None, :], mask=kv_mask, other=0.0)
            s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale
            s = tl.where((n[None, :] <= pos[:, None]) & n_ok[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            p = tl.exp2(s - m_new[:, None])
            alpha = tl.exp2(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
            m_i = m_new
        if NUM_SPLITS == 1:
            o_ptrs = (out_ptr + tok[:, None].to(tl.int64) * stride_o_tok
                      + head[:, None] * stride_o_head + d[None, :])
            o = acc / tl.maximum(l_i, 1.0e-30)[:, None]
            tl.store(o_ptrs, o.to(out_ptr.dtype.element_ty),
                     mask=row_ok[:, None] & d_ok[None, :])
        else:
            seen = l_i > 0.0
            o = tl.where(seen[:, None], acc / tl.maximum(l_i, 1.0e-30)[:, None], 0.0)
            lse = tl.where(seen, m_i + tl.log2(tl.maximum(l_i, 1.0e-30)), float("-inf"))
            po = (part_out_ptr + split * stride_po_split + tok[:, None].to(tl.int64) * stride_po_tok
                  + head[:, None] * stride_po_head + d[None, :])
            tl.store(po, o, mask=row_ok[:, None] & d_ok[None, :])
            pl = part_lse_ptr + split * stride_pl_split + tok.to(tl.int64) * stride_pl_tok + head
            tl.store(pl, lse, mask=row_ok)


@triton.jit
def _combine_kernel(
    part_out_ptr, part_lse_ptr, out_ptr, query_start_ptr, num_seqs,
    stride_po_split, stride_po_tok, stride_po_head, stride_pl_split, stride_pl_tok,
    stride_o_tok, stride_o_head,
    HEAD_DIM: tl.constexpr, D_P2: tl.constexpr, NUM_SPLITS: tl.constexpr,
    SPLITS_P2: tl.constexpr,
):
    """One program per (token, query head): merge the splits' outputs by their log-sum-exp.
    Tokens past the step's last (``query_start_loc[num_seqs]``: padding of a graph step) are
    skipped: no split wrote them."""
    t = tl.program_id(0)
    h = tl.program_id(1)
    if t < tl.load(query_start_ptr + num_seqs):
        sp = tl.arange(0, SPLITS_P2)
        sp_ok = sp < NUM_SPLITS
        lse = tl.load(part_lse_ptr + sp * stride_pl_split + t.to(tl.int64) * stride_pl_tok + h,
                      mask=sp_ok, other=float("-inf"))
        top = tl.max(lse, 0)
        w = tl.where(lse > float("-inf"), tl.exp2(lse - top), 0.0)
        d = tl.arange(0, D_P2)
        d_ok = d < HEAD_DIM
        o = tl.load(part_out_ptr + sp[:, None] * stride_po_split + t.to(tl.int64) * stride_po_tok
                    + h * stride_po_head + d[None, :],
                    mask=sp_ok[:, None] & d_ok[None, :], other=0.0)
        res = tl.sum(o * w[:, None], 0) / tl.maximum(tl.sum(w, 0), 1.0e-30)
        tl.store(out_ptr + t.to(tl.int64) * stride_o_tok + h * stride_o_head + d,
                 res.to(out_ptr.dtype.element_ty), mask=d_ok)
