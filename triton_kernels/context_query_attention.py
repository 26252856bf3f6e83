"""Triton kernels for trilinear similarity and QANet context-query attention.

Per batch b, with c [n, d], q [m, d], weight = (w_c, w_q, w_cq) and an optional scalar bias:

    S[i, j] = c_i·w_c + q_j·w_q + (c_i∘w_cq)·q_j + bias
    P  = row softmax of S over the real question words j   (S̄; a row with none is all zeros)
    Pc = column softmax of S over the real context words i (S̿; a column with none is all zeros)
    T  = Pcᵀ C [m, d],  A = P Q [n, d],  B = P T [n, d],  out = [c, A, c∘A, c∘B] [n, 4d]

Nothing of size [B, n, m] is ever materialised by the attention: every S tile is rebuilt in
registers from a c tile and a q tile (two length-d dot products plus one tl.dot), and the
[B, n, m, 3d] concatenation of the naive formulation never exists.

Tiling
------
The whole feature dimension sits in one tile (BLOCK_D = next power of two >= d, at least 16);
this suits QANet's d = 128 and still works, with register spilling, for d of several hundred.
"Row" programs own BLOCK_N context rows of one batch element and loop over the question in tiles
of BLOCK_M; "column" programs own BLOCK_M question words and loop over the context in tiles of
BLOCK_N. Block sizes and num_warps are autotuned (key: d and the power-of-two buckets of n and
m); for forward row programs BLOCK_M is set by the launcher to cover the whole question when
m <= 128 (at d <= 128), so the row softmax is a single tile for typical questions and an online
(running max / running sum) softmax beyond (backward row programs, which need no softmax, use
half as wide tiles). Under TRITON_INTERPRET=1 every kernel has one small configuration (16-wide
tiles) so the tests run quickly and still take the multi-tile paths. FASTQA_TRITON_AUTOTUNE=0
skips tuning on a GPU (as for every op): every kernel then runs the first configuration of its list.

Forward (context_query_attention_fwd), two kernels:
  1. column pass, per (m-tile, b): online softmax over the context of Sᵀ, accumulating T;
     writes T (fp32 workspace [B, m, d], freed after the call) and the column log-sum-exp.
  2. row pass, per (n-tile, b): online softmax over the question, accumulating A = P Q and
     B = P T in fp32; writes out = [c, A, c∘A, c∘B] once, and the row log-sum-exp.
Saved for backward (the aux outputs):
  aux_row: [B, n] fp32, log-sum-exp of each masked row of S (+inf for a row with no real
           question word, so that exp(S - lse) is exactly 0 there);
  aux_col: [B, m] fp32, log-sum-exp of each masked column of S (+inf likewise).
  The output itself is handed back too: A = out[..., d:2d] and c∘B = out[..., 3d:4d].

Backward (context_query_attention_bwd), by recomputation of S, P and Pc from c, q and the two
log-sum-exps. With g = grad_out = [g0, g1, g2, g3]: dA = g1 + g2∘c, dB = g3∘c,
dP = dA Qᵀ + dB Tᵀ, dT = Pᵀ dB, dPc = C dTᵀ, and with D_i = dA_i·A_i + g3_i·(c∘B)_i and
E_j = T_j·dT_j the softmax backward is dS = P∘(dP - D) + Pc∘(dPc - E). Three kernels:
  1. prep, per (n-tile, b): dA, dB (fp32 [B, n, d] workspaces) and D ([B, n]).
  2. column pass, per (m-tile, b): a first sweep over the context recomputes T and
     accumulates dT and Pᵀ dA; a second sweep builds dS tiles and accumulates its column sums and
     dSᵀ C, giving grad_q and this program's fp32 partial of grad_weight / grad_bias; T, dT and E
     are written to fp32 workspaces ([B, m, d], [B, m, d], [B, m]).
  3. row pass, per (n-tile, b): one sweep over the question rebuilds dS tiles and accumulates
     its row sums, dS Q, Pc dT and B = P T, giving grad_c.
The weight gradient partials ([programs, 3d + 1] fp32, one row per column program) are summed
afterwards: no atomics, so the backward is deterministic. Extra memory is O(B·(n + m)·d).

Huge inputs (|S| up to ~1e30, where one ulp of S is ~1e23): the backward's exp(S - lse) only gives
the top word its probability 1 if S is rebuilt with the very bits the forward's max was taken over,
by the row kernels (lse_row) and the column kernels (lse_col) alike. So every kernel computes an S tile
by one expression, (c·w_c + bias) + q·w_q + (c∘w_cq)·qᵀ, and the column kernels transpose the result
(``_sim_t``) rather than building Sᵀ from q∘w_cq; exp's argument is clamped at 0 all the same. And
dS = P∘(dP - D) with D taken from the output cancels dP only to rounding (~1e23 when dP ~ 1e30), where
torch's softmax backward is exactly 0 for a one-hot row: ``_softmax_grad`` takes it as 0 where the
probability is exactly 1 (NaN and inf still pass). Verified in the interpreter; on a GPU the bit
equality also relies on tl.dot and the row sums giving an element the same bits for the row and
column kernels' tile shapes.

trilinear_similarity_fwd / _bwd expose S alone: a 2-D tiled kernel writes S [B, n, m]; its
backward is a row kernel (grad_c) and a column kernel (grad_q and the weight partials).

Inputs may have any strides (the kernels take strides; nothing is copied except the tiny
weight and bias, made contiguous). Masks are bool (any nonzero value counts as real). Outputs are
contiguous, in the input dtype (grad_weight and grad_bias in the parameters' dtype, summed from the
fp32 partials with no rounding in between for fp32 parameters). weight and bias may be float32 with
fp16 / bf16 activations (``ACCEPTS_FP32_WEIGHTS``, the contract in ``_common``): the kernels round them
to the activations' dtype as they load them, so the results are those of the call with them cast first. fp32, fp16
and bf16 are supported with fp32 accumulation: softmax statistics and accumulators are fp32,
tl.dot operands are in the input dtype (fp32 dots follow the package-wide policy of
``_common.dot_precision``: TF32x3, i.e. near-fp32 accuracy on tensor cores, unless torch's float32
matmul precision allows plain TF32). In 16-bit dtypes D is formed from the rounded output (as flash attention
does with its output), so the attention's bias gradient, mathematically zero, comes back as
rounding noise of that size. The Triton interpreter cannot multiply bf16 blocks, so under
TRITON_INTERPRET=1 bf16 dot operands are upcast to fp32; on a GPU they stay bf16.
Inputs are never modified. The backward's two attention kernels hold the most tiles at once: in fp32
the attention's dots run in IEEE fp32, forward and backward (tf32x3 splits every operand in two and
spilled registers; the backward must rebuild S as the forward built it), and the backward row kernel's
question tile is narrower; ``make gpu-compile`` (docs/gpu-compile.md) compiles every
configuration for sm_90 and sm_80 and records registers, spills and shared memory.
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from fastqa._checks import check_tensor

from ._common import (INTERPRET, check_param, configs, dot_operand_dtype, dot_precision, launch, register, round_to,
                      tile_range)

#: Parameters (weight, bias) in float32 with fp16 / bf16 activations: see ``_common``'s docstring.
ACCEPTS_FP32_WEIGHTS = True

# Autotuning spaces; the first entry of each list is the default configuration (``_common.launch``).
# What is left of them is what compiles without spilling at the models' shapes (``make gpu-compile``).
_ROW_CONFIGS = configs(("BLOCK_N",), [(16, 8, 1)])
_COL_CONFIGS = configs(("BLOCK_M", "BLOCK_N"), [(16, 16, 8, 2)])
# The attention backward's kernels hold the most tiles at once: spaces of their own (the compile check).
_BWD_ROW_CONFIGS = configs(("BLOCK_N",), [(16, 8, 1)])
_BWD_COL_CONFIGS = configs(("BLOCK_M", "BLOCK_N"), [(16, 16, 8, 2)])
_TILE_CONFIGS = configs(("BLOCK_N", "BLOCK_M"), [(bn, bm, w, 2) for bn, bm in ((64, 64), (32, 32), (64, 128), (128, 64))
                                                 for w in (4, 8)])
# Question tile of the row kernels: a whole typical question (the interpreter: 16, so that a small
# test question already needs the online row softmax).
_ROW_TILE_MAX = 16 if INTERPRET else 128
# Tuned per power-of-two bucket of the lengths (n_key, m_key: kernel arguments read by the autotuner
# only), not per exact length: batches padded to their longest context would retune constantly.
_KEY = ["n_key", "m_key", "d"]
# Column programs write one partial row each; the buffer is sized for the smallest BLOCK_M.
_MIN_COL_BLOCK_M = min(cfg.kwargs["BLOCK_M"] for cfg in (*_COL_CONFIGS, *_BWD_COL_CONFIGS))


# ----------------------------------------------------------------------------- jit helpers

@triton.jit
def _program_tile(length, d, BLOCK: tl.constexpr, BLOCK_D: tl.constexpr):
    """Where a row or column program starts (grid axis 0: its tile of ``length`` rows, axis 1: the batch
    element): (tile index, b as int64, row offsets, feature offsets, and which of each are in range)."""
    pid = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    offs, ok = tile_range(pid * BLOCK, BLOCK, length)
    offs_d, d_ok = tile_range(0, BLOCK_D, d)
    return pid, b, offs, offs_d, ok, d_ok


@triton.jit
def _query_program(q_ptr, w_ptr, bias_ptr, m, d, s_qb, s_qm, s_qd, HAS_BIAS: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    """What every column program starts from: its tile (as ``_program_tile``), the weights in the inputs'
    dtype (as ``_load_weights``), its query rows q and their linear term q·w_q."""
    pid_m, b, offs_m, offs_d, m_ok, d_ok = _program_tile(m, d, BLOCK_M, BLOCK_D)
    w_c, w_q, w_cq, bias = _load_weights(w_ptr, bias_ptr, offs_d, d_ok, d, HAS_BIAS, q_ptr.dtype.element_ty)
    q = _load_rows(q_ptr + b * s_qb, offs_m, offs_d, s_qm, s_qd, m_ok, d_ok)
    return pid_m, b, offs_m, offs_d, m_ok, d_ok, w_c, w_q, w_cq, bias, q, _lin(q, w_q)


@triton.jit
def _load_rows(ptr, offs_r, offs_d, stride_r, stride_d, r_ok, d_ok):
    """[R, D] tile of a row-major-ish matrix (zeros outside r_ok x d_ok), in its own dtype."""
    return tl.load(ptr + offs_r[:, None] * stride_r + offs_d[None, :] * stride_d,
                   mask=r_ok[:, None] & d_ok[None, :], other=0.0)


@triton.jit
def _store_rows(ptr, offs_r, offs_d, stride_r, r_ok, d_ok, value):
    """Store [R, D] into a matrix with unit feature stride, cast to the pointer's dtype."""
    tl.store(ptr + offs_r[:, None] * stride_r + offs_d[None, :], value.to(ptr.dtype.element_ty),
             mask=r_ok[:, None] & d_ok[None, :])


@triton.jit
def _load_real(mask_ptr, offs, stride, ok):
    """Bool [R]: True where the token is real (mask != 0) and in range."""
    return (tl.load(mask_ptr + offs * stride, mask=ok, other=0) != 0) & ok


@triton.jit
def _real_lse(mask_ptr, lse_ptr, offs, stride, ok):
    """What the backward recomputes probabilities from, for R rows of one side of S: which are real
    tokens (``_load_real``) and their saved log-sum-exps (+inf out of range, so exp(s - lse) is 0)."""
    return _load_real(mask_ptr, offs, stride, ok), tl.load(lse_ptr + offs, mask=ok, other=float("inf"))


@triton.jit
def _load_weights(w_ptr, bias_ptr, offs_d, d_ok, d, HAS_BIAS: tl.constexpr, DTYPE: tl.constexpr):
    """(w_c, w_q, w_cq) as fp32 [BLOCK_D] vectors, and the bias as an fp32 scalar (0 if absent), each first
    rounded to the activations' DTYPE (the parameters may be fp32 with 16-bit activations)."""
    w_c = round_to(tl.load(w_ptr + offs_d, mask=d_ok, other=0.0), DTYPE).to(tl.float32)
    w_q = round_to(tl.load(w_ptr + d + offs_d, mask=d_ok, other=0.0), DTYPE).to(tl.float32)
    w_cq = round_to(tl.load(w_ptr + 2 * d + offs_d, mask=d_ok, other=0.0), DTYPE).to(tl.float32)
    bias = 0.0
    if HAS_BIAS:
        bias = round_to(tl.load(bias_ptr), DTYPE).to(tl.float32)
    return w_c, w_q, w_cq, bias


@triton.jit
def _lin(x, w):
    """x [R, D] · w [D] -> [R] in fp32."""
    return tl.sum(x.to(tl.float32) * w[None, :], axis=1)


@triton.jit
def _operand_tile(ptr, offs_r, offs_d, s_r, s_d, r_ok, d_ok, w_lin, w_cq, bias):
    """One side's rows of S = (c·w_c) + (q·w_q)ᵀ + (c∘w_cq)·qᵀ + bias, as every kernel loads them:
    the rows x, their linear term x·w_lin + bias [R] and x∘w_cq [R, D] (both fp32)."""
    x = _load_rows(ptr, offs_r, offs_d, s_r, s_d, r_ok, d_ok)
    return x, _lin(x, w_lin) + bias, x.to(tl.float32) * w_cq[None, :]


@triton.jit
def _sim(xw, y, x_lin, y_lin, DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Similarity tile [X, Y] in fp32 from xw = x∘w_cq [X, D], y [Y, D] and the linear terms."""
    return x_lin[:, None] + y_lin[None, :] + _mm_nt(xw, y, DOT_DTYPE, DOT_PRECISION)


@triton.jit
def _sim_t(cw, q, c_lin, q_lin, DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Sᵀ tile [BM, BN] for the column kernels: S computed exactly as the row kernels compute it
    (c side on the left, the bias in c_lin), then transposed, so that every kernel rebuilds the same
    bits of S. The backward recomputes probabilities as exp(S - lse) with log-sum-exps saved by the
    other orientation's forward kernel: at S ~ 1e30 one ulp is ~1e23, and an Sᵀ built as q∘w_cq · c
    (the products and additions in another order) gave exp(±1e23), i.e. 0 or inf, for the top word."""
    return tl.trans(_sim(cw, q, c_lin, q_lin, DOT_DTYPE, DOT_PRECISION))


@triton.jit
def _mm(a, b, DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """a [X, K] @ b [K, Y] with operands in the MMA dtype and an fp32 result."""
    return tl.dot(a.to(DOT_DTYPE), b.to(DOT_DTYPE), input_precision=DOT_PRECISION)


@triton.jit
def _mm_nt(a, b, DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """a [X, K] @ b[Y, K]ᵀ."""
    return tl.dot(a.to(DOT_DTYPE), tl.trans(b.to(DOT_DTYPE)), input_precision=DOT_PRECISION)


@triton.jit
def _online_step(s, run_max, run_sum):
    """One step of a softmax along axis 1 over tiles; s holds -inf at masked entries.

    Returns the unnormalised probabilities, the rescale factor of what was accumulated so far,
    and the new running max and sum. A row masked so far keeps max -inf without producing NaN.
    """
    new_max = tl.maximum(run_max, tl.max(s, axis=1))
    safe_max = tl.where(new_max == float("-inf"), 0.0, new_max)
    alpha = tl.exp(run_max - safe_max)
    p = tl.exp(s - safe_max[:, None])
    return p, alpha, new_max, run_sum * alpha + tl.sum(p, axis=1)


@triton.jit
def _finish_softmax(run_max, run_sum):
    """(log-sum-exp, 1/sum) of a finished online softmax; (+inf, 0) for an all-masked row."""
    has_any = run_sum > 0.0
    lse = tl.where(has_any, run_max + tl.log(tl.where(has_any, run_sum, 1.0)), float("inf"))
    inv = tl.where(has_any, 1.0 / tl.where(has_any, run_sum, 1.0), 0.0)
    return lse, inv


@triton.jit
def _prob(s, lse, keep):
    """exp(s - lse) where keep, else exactly 0 (lse is +inf for empty rows/columns).

    s - lse <= 0 whenever s is the forward's bits (lse >= the row's max); it is clamped there all the
    same (NaN kept), so that an s rebuilt a rounding above the forward's can never give a probability
    above 1, let alone exp(1e23) = inf, for huge inputs."""
    x = s - lse
    return tl.where(keep, tl.exp(tl.where(x > 0.0, 0.0, x)), 0.0)


@triton.jit
def _softmax_grad(p, dp, dot):
    """p∘(dp - dot), one softmax's share of dS, for probabilities p of one row (or column) and
    dot = Σ p∘dp of that row.

    Where p is exactly 1 the slice is one-hot to fp32 precision (the other probabilities sum to below
    2^-24), so dp - dot = Σ_k p_k (dp - dp_k) is below 2^-23 max|dp|: less than the rounding of dot
    itself, which comes from the output (D, E) rather than from these dp bits. It is taken as 0 there
    (times (dp - dot), so NaN and inf still propagate), as torch's softmax backward gets it exactly for
    a one-hot row; otherwise dp ~ dot ~ 1e30 (inputs ~1e15) would leave a cancellation error ~1e23."""
    x = dp - dot
    return tl.where(p == 1.0, x * 0.0, p * x)


@triton.jit
def _col_epilogue(dq_ptr, partial_ptr, b, pid_m, offs_m, offs_d, m_ok, d_ok, m, d,
                  q, w_q, w_cq, dq_extra, colsum, dsc):
    """Finish a column program: grad_q of its question words and its weight-gradient partial.

    colsum [BM] = Σ_i dS_ij, dsc [BM, D] = (dSᵀ C)_j, dq_extra [BM, D] = gradient reaching q_j
    other than through S. The partial row holds (Σ_j dsc_j, Σ_j colsum_j q_j, Σ_j q_j∘dsc_j,
    Σ_j colsum_j), i.e. this program's share of (grad w_c, grad w_q, grad w_cq, grad bias).
    """
    qf = q.to(tl.float32)
    dq = dq_extra + colsum[:, None] * w_q[None, :] + w_cq[None, :] * dsc
    _store_rows(dq_ptr + b * m * d, offs_m, offs_d, d, m_ok, d_ok, dq)
    row = partial_ptr + (b * tl.num_programs(0) + pid_m) * (3 * d + 1)
    tl.store(row + offs_d, tl.sum(dsc, axis=0), mask=d_ok)
    tl.store(row + d + offs_d, tl.sum(colsum[:, None] * qf, axis=0), mask=d_ok)
    tl.store(row + 2 * d + offs_d, tl.sum(qf * dsc, axis=0), mask=d_ok)
    tl.store(row + 3 * d, tl.sum(colsum, axis=0))


# ----------------------------------------------------------------------------- trilinear S

@triton.autotune(configs=_TILE_CONFIGS, key=_KEY)
@triton.jit
def _tri_fwd_kernel(c_ptr, q_ptr, w_ptr, bias_ptr, s_ptr, n, m, d, n_key, m_key,
                    s_cb, s_cn, s_cd, s_qb, s_qm, s_qd,
                    HAS_BIAS: tl.constexpr, BLOCK_D: tl.constexpr, DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr):
    """S tile per (n-tile, m-tile, b) into contiguous s [B, n, m]."""
    b = tl.program_id(2).to(tl.int64)
    offs_n, n_ok = tile_range(tl.program_id(0) * BLOCK_N, BLOCK_N, n)
    offs_m, m_ok = tile_range(tl.program_id(1) * BLOCK_M, BLOCK_M, m)
    offs_d, d_ok = tile_range(0, BLOCK_D, d)
    w_c, w_q, w_cq, bias = _load_weights(w_ptr, bias_ptr, offs_d, d_ok, d, HAS_BIAS, c_ptr.dtype.element_ty)
    c = _load_rows(c_ptr + b * s_cb, offs_n, offs_d, s_cn, s_cd, n_ok, d_ok)
    q = _load_rows(q_ptr + b * s_qb, offs_m, offs_d, s_qm, s_qd, m_ok, d_ok)
    s = _sim(c.to(tl.float32) * w_cq[None, :], q, _lin(c, w_c) + bias, _lin(q, w_q), DOT_DTYPE, DOT_PRECISION)
    _store_rows(s_ptr + b * n * m, offs_n, offs_m, m, n_ok, m_ok, s)


@triton.autotune(configs=_ROW_CONFIGS, key=_KEY)
@triton.jit
def _tri_bwd_row_kernel(g_ptr, q_ptr, w_ptr, dc_ptr, n, m, d, n_key, m_key,
                        s_gb, s_gn, s_gm, s_qb, s_qm, s_qd,
                        BLOCK_D: tl.constexpr, DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """grad_c_i = (Σ_j g_ij) w_c + w_cq ∘ (g Q)_i, per (n-tile, b)."""
    _, b, offs_n, offs_d, n_ok, d_ok = _program_tile(n, d, BLOCK_N, BLOCK_D)
    w_c, w_q, w_cq, bias = _load_weights(w_ptr, w_ptr, offs_d, d_ok, d, False, q_ptr.dtype.element_ty)
    rowsum = tl.zeros([BLOCK_N], dtype=tl.float32)
    gq = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    for m0 in range(0, m, BLOCK_M):
        offs_m, m_ok = tile_range(m0, BLOCK_M, m)
        g = _load_rows(g_ptr + b * s_gb, offs_n, offs_m, s_gn, s_gm, n_ok, m_ok).to(tl.float32)
        q = _load_rows(q_ptr + b * s_qb, offs_m, offs_d, s_qm, s_qd, m_ok, d_ok)
        rowsum += tl.sum(g, axis=1)
        gq += _mm(g, q, DOT_DTYPE, DOT_PRECISION)
    dc = rowsum[:, None] * w_c[None, :] + w_cq[None, :] * gq
    _store_rows(dc_ptr + b * n * d, offs_n, offs_d, d, n_ok, d_ok, dc)


@triton.autotune(configs=_COL_CONFIGS, key=_KEY, reset_to_zero=["partial_ptr"])
@triton.jit
def _tri_bwd_col_kernel(g_ptr, c_ptr, q_ptr, w_ptr, dq_ptr, partial_ptr, n, m, d, n_key, m_key,
                        s_gb, s_gn, s_gm, s_cb, s_cn, s_cd, s_qb, s_qm, s_qd,
                        BLOCK_D: tl.constexpr, DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """grad_q and the weight partials of S, per (m-tile, b), sweeping the context."""
    pid_m, b, offs_m, offs_d, m_ok, d_ok, w_c, w_q, w_cq, bias, q, _ = _query_program(
        q_ptr, w_ptr, w_ptr, m, d, s_qb, s_qm, s_qd, False, BLOCK_M, BLOCK_D)
    # The column sums accumulate as a tile and are reduced once after the loop: Triton 3.6 fails to compile
    # (TritonGPUOptimizeThreadLocality, fp32 operands) a reduction inside this loop whose operand also
    # feeds the tf32x3 dot.
    colacc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    gc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    for n0 in range(0, n, BLOCK_N):
        offs_n, n_ok = tile_range(n0, BLOCK_N, n)
        gt = _load_rows(g_ptr + b * s_gb, offs_m, offs_n, s_gm, s_gn, m_ok, n_ok).to(tl.float32)  # gᵀ tile
        c = _load_rows(c_ptr + b * s_cb, offs_n, offs_d, s_cn, s_cd, n_ok, d_ok)
        colacc += gt
        gc += _mm(gt, c, DOT_DTYPE, DOT_PRECISION)
    colsum = tl.sum(colacc, axis=1)
    _col_epilogue(dq_ptr, partial_ptr, b, pid_m, offs_m, offs_d, m_ok, d_ok, m, d,
                  q, w_q, w_cq, tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32), colsum, gc)


# ----------------------------------------------------------------------------- attention forward

@triton.autotune(configs=_COL_CONFIGS, key=_KEY)
@triton.jit
def _cqa_fwd_col_kernel(c_ptr, q_ptr, cmask_ptr, w_ptr, bias_ptr, t_ptr, lse_col_ptr, n, m, d, n_key, m_key,
                        s_cb, s_cn, s_cd, s_qb, s_qm, s_qd, s_kb, s_kn,
                        HAS_BIAS: tl.constexpr, BLOCK_D: tl.constexpr, DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Column softmax over the context (online, flash-style) and T = Pcᵀ C, per (m-tile, b)."""
    pid_m, b, offs_m, offs_d, m_ok, d_ok, w_c, w_q, w_cq, bias, q, q_lin = _query_program(
        q_ptr, w_ptr, bias_ptr, m, d, s_qb, s_qm, s_qd, HAS_BIAS, BLOCK_M, BLOCK_D)
    run_max = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    run_sum = tl.zeros([BLOCK_M], dtype=tl.float32)
    t = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    for n0 in range(0, n, BLOCK_N):
        offs_n, n_ok = tile_range(n0, BLOCK_N, n)
        c, c_lin, cw = _operand_tile(c_ptr + b * s_cb, offs_n, offs_d, s_cn, s_cd, n_ok, d_ok, w_c, w_cq, bias)
        real_c = _load_real(cmask_ptr + b * s_kb, offs_n, s_kn, n_ok)
        st = _sim_t(cw, q, c_lin, q_lin, DOT_DTYPE, DOT_PRECISION)  # Sᵀ tile [BM, BN]
        st = tl.where(real_c[None, :], st, float("-inf"))
        p, alpha, run_max, run_sum = _online_step(st, run_max, run_sum)
        t = t * alpha[:, None] + _mm(p, c, DOT_DTYPE, DOT_PRECISION)
    lse, inv = _finish_softmax(run_max, run_sum)
    _store_rows(t_ptr + b * m * d, offs_m, offs_d, d, m_ok, d_ok, t * inv[:, None])
    tl.store(lse_col_ptr + b * m + offs_m, lse, mask=m_ok)


@triton.autotune(configs=_ROW_CONFIGS, key=_KEY)
@triton.jit
def _cqa_fwd_row_kernel(c_ptr, q_ptr, qmask_ptr, w_ptr, bias_ptr, t_ptr, out_ptr, lse_row_ptr,
                        n, m, d, n_key, m_key, s_cb, s_cn, s_cd, s_qb, s_qm, s_qd, s_kb, s_km,
                        HAS_BIAS: tl.constexpr, BLOCK_D: tl.constexpr, DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Row softmax over the question, A = P Q, B = P T and out = [c, A, c∘A, c∘B], per (n-tile, b)."""
    _, b, offs_n, offs_d, n_ok, d_ok = _program_tile(n, d, BLOCK_N, BLOCK_D)
    w_c, w_q, w_cq, bias = _load_weights(w_ptr, bias_ptr, offs_d, d_ok, d, HAS_BIAS, c_ptr.dtype.element_ty)
    c, c_lin, cw = _operand_tile(c_ptr + b * s_cb, offs_n, offs_d, s_cn, s_cd, n_ok, d_ok, w_c, w_cq, bias)
    cf = c.to(tl.float32)
    run_max = tl.full([BLOCK_N], float("-inf"), dtype=tl.float32)
    run_sum = tl.zeros([BLOCK_N], dtype=tl.float32)
    acc_a = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    acc_b = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    for m0 in range(0, m, BLOCK_M):  # a single iteration when the question fits one tile
        offs_m, m_ok = tile_range(m0, BLOCK_M, m)
        q = _load_rows(q_ptr + b * s_qb, offs_m, offs_d, s_qm, s_qd, m_ok, d_ok)
        t = _load_rows(t_ptr + b * m * d, offs_m, offs_d, d, 1, m_ok, d_ok)
        real_q = _load_real(qmask_ptr + b * s_kb, offs_m, s_km, m_ok)
        s = _sim(cw, q, c_lin, _lin(q, w_q), DOT_DTYPE, DOT_PRECISION)
        s = tl.where(real_q[None, :], s, float("-inf"))
        p, alpha, run_max, run_sum = _online_step(s, run_max, run_sum)
        acc_a = acc_a * alpha[:, None] + _mm(p, q, DOT_DTYPE, DOT_PRECISION)
        acc_b = acc_b * alpha[:, None] + _mm(p, t, DOT_DTYPE, DOT_PRECISION)
    lse, inv = _finish_softmax(run_max, run_sum)
    a = acc_a * inv[:, None]
    out = out_ptr + b * n * 4 * d
    _store_rows(out, offs_n, offs_d, 4 * d, n_ok, d_ok, cf)
    _store_rows(out + d, offs_n, offs_d, 4 * d, n_ok, d_ok, a)
    _store_rows(out + 2 * d, offs_n, offs_d, 4 * d, n_ok, d_ok, cf * a)
    _store_rows(out + 3 * d, offs_n, offs_d, 4 * d, n_ok, d_ok, cf * (acc_b * inv[:, None]))
    tl.store(lse_row_ptr + b * n + offs_n, lse, mask=n_ok)


# ----------------------------------------------------------------------------- attention backward

@triton.autotune(configs=_ROW_CONFIGS, key=_KEY)
@triton.jit
def _cqa_bwd_prep_kernel(g_ptr, c_ptr, out_ptr, da_ptr, db_ptr, dd_ptr, n, m, d, n_key, m_key,
                         s_gb, s_gn, s_gd, s_cb, s_cn, s_cd, s_ob, s_on, s_od,
                         BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr):
    """dA = g1 + g2∘c, dB = g3∘c and D = dA·A + g3·(c∘B), per (n-tile, b)."""
    _, b, offs_n, offs_d, n_ok, d_ok = _program_tile(n, d, BLOCK_N, BLOCK_D)
    g = g_ptr + b * s_gb
    o = out_ptr + b * s_ob
    c = _load_rows(c_ptr + b * s_cb, offs_n, offs_d, s_cn, s_cd, n_ok, d_ok).to(tl.float32)
    g1 = _load_rows(g + d * s_gd, offs_n, offs_d, s_gn, s_gd, n_ok, d_ok).to(tl.float32)
    g2 = _load_rows(g + 2 * d * s_gd, offs_n, offs_d, s_gn, s_gd, n_ok, d_ok).to(tl.float32)
    g3 = _load_rows(g + 3 * d * s_gd, offs_n, offs_d, s_gn, s_gd, n_ok, d_ok).to(tl.float32)
    a = _load_rows(o + d * s_od, offs_n, offs_d, s_on, s_od, n_ok, d_ok).to(tl.float32)
    cb = _load_rows(o + 3 * d * s_od, offs_n, offs_d, s_on, s_od, n_ok, d_ok).to(tl.float32)
    da = g1 + g2 * c
    _store_rows(da_ptr + b * n * d, offs_n, offs_d, d, n_ok, d_ok, da)
    _store_rows(db_ptr + b * n * d, offs_n, offs_d, d, n_ok, d_ok, g3 * c)
    tl.store(dd_ptr + b * n + offs_n, tl.sum(da * a + g3 * cb, axis=1), mask=n_ok)


@triton.jit
def _col_sweep_tile(n0, n, c_ptr, cmask_ptr, lse_row_ptr, da_ptr, db_ptr, offs_d, d_ok, m_ok, d,
                    s_cn, s_cd, s_kcn, q, q_lin, w_c, w_cq, bias, real_q, lse_c,
                    DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr, BLOCK_N: tl.constexpr):
    """The context tile at row n0 of the column backward, as both of its sweeps need it: its rows
    (offs_n, n_ok), c, the transposed row and column probabilities Pᵀ, Pcᵀ [BLOCK_M, BLOCK_N] recomputed
    from the saved log-sum-exps, and the tile's dA, dB rows. The pointers are the batch's own."""
    offs_n, n_ok = tile_range(n0, BLOCK_N, n)
    c, c_lin, cw = _operand_tile(c_ptr, offs_n, offs_d, s_cn, s_cd, n_ok, d_ok, w_c, w_cq, bias)
    real_c, lse_r = _real_lse(cmask_ptr, lse_row_ptr, offs_n, s_kcn, n_ok)
    st = _sim_t(cw, q, c_lin, q_lin, DOT_DTYPE, DOT_PRECISION)
    pt = _prob(st, lse_r[None, :], real_q[:, None] & n_ok[None, :])
    pct = _prob(st, lse_c[:, None], real_c[None, :] & m_ok[:, None])
    da = _load_rows(da_ptr, offs_n, offs_d, d, 1, n_ok, d_ok)
    db = _load_rows(db_ptr, offs_n, offs_d, d, 1, n_ok, d_ok)
    return offs_n, n_ok, c, pt, pct, da, db


@triton.autotune(configs=_BWD_COL_CONFIGS, key=_KEY, reset_to_zero=["partial_ptr"])
@triton.jit
def _cqa_bwd_col_kernel(c_ptr, q_ptr, cmask_ptr, qmask_ptr, w_ptr, bias_ptr, lse_row_ptr, lse_col_ptr,
                        da_ptr, db_ptr, dd_ptr, t_ptr, dt_ptr, e_ptr, dq_ptr, partial_ptr, n, m, d, n_key, m_key,
                        s_cb, s_cn, s_cd, s_qb, s_qm, s_qd, s_kcb, s_kcn, s_kqb, s_kqm,
                        HAS_BIAS: tl.constexpr, BLOCK_D: tl.constexpr, DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Per (m-tile, b): T, dT, E, grad_q and the weight partials (two sweeps over the context)."""
    pid_m, b, offs_m, offs_d, m_ok, d_ok, w_c, w_q, w_cq, bias, q, q_lin = _query_program(
        q_ptr, w_ptr, bias_ptr, m, d, s_qb, s_qm, s_qd, HAS_BIAS, BLOCK_M, BLOCK_D)
    real_q, lse_c = _real_lse(qmask_ptr + b * s_kqb, lse_col_ptr + b * m, offs_m, s_kqm, m_ok)
    t = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    dt = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    # The batch's context, its masks and saved row log-sum-exps, and dA, dB: read by both sweeps.
    c_b, cmask_b, lse_row_b = c_ptr + b * s_cb, cmask_ptr + b * s_kcb, lse_row_ptr + b * n
    da_b, db_b = da_ptr + b * n * d, db_ptr + b * n * d
    # Sweep 1: T = Pcᵀ C, dT = Pᵀ dB and the direct part of grad_q, Pᵀ dA.
    for n0 in range(0, n, BLOCK_N):
        offs_n, n_ok, c, pt, pct, da, db = _col_sweep_tile(
            n0, n, c_b, cmask_b, lse_row_b, da_b, db_b, offs_d, d_ok, m_ok, d, s_cn, s_cd, s_kcn,
            q, q_lin, w_c, w_cq, bias, real_q, lse_c, DOT_DTYPE, DOT_PRECISION, BLOCK_N)
        t += _mm(pct, c, DOT_DTYPE, DOT_PRECISION)
        dt += _mm(pt, db, DOT_DTYPE, DOT_PRECISION)
        dq += _mm(pt, da, DOT_DTYPE, DOT_PRECISION)
    e = tl.sum(t * dt, axis=1)
    _store_rows(t_ptr + b * m * d, offs_m, offs_d, d, m_ok, d_ok, t)
    _store_rows(dt_ptr + b * m * d, offs_m, offs_d, d, m_ok, d_ok, dt)
    tl.store(e_ptr + b * m + offs_m, e, mask=m_ok)
    # Sweep 2: dSᵀ tiles; their column sums and dSᵀ C.
    colsum = tl.zeros([BLOCK_M], dtype=tl.float32)
    dsc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    for n0 in range(0, n, BLOCK_N):
        offs_n, n_ok, c, pt, pct, da, db = _col_sweep_tile(
            n0, n, c_b, cmask_b, lse_row_b, da_b, db_b, offs_d, d_ok, m_ok, d, s_cn, s_cd, s_kcn,
            q, q_lin, w_c, w_cq, bias, real_q, lse_c, DOT_DTYPE, DOT_PRECISION, BLOCK_N)
        dd = tl.load(dd_ptr + b * n + offs_n, mask=n_ok, other=0.0)
        dpt = _mm_nt(q, da, DOT_DTYPE, DOT_PRECISION) + _mm_nt(t, db, DOT_DTYPE, DOT_PRECISION)  # dPᵀ
        dpct = _mm_nt(dt, c, DOT_DTYPE, DOT_PRECISION)  # dPcᵀ
        dst = _softmax_grad(pt, dpt, dd[None, :]) + _softmax_grad(pct, dpct, e[:, None])
        colsum += tl.sum(dst, axis=1)
        dsc += _mm(dst, c, DOT_DTYPE, DOT_PRECISION)
    _col_epilogue(dq_ptr, partial_ptr, b, pid_m, offs_m, offs_d, m_ok, d_ok, m, d,
                  q, w_q, w_cq, dq, colsum, dsc)


@triton.autotune(configs=_BWD_ROW_CONFIGS, key=_KEY)
@triton.jit
def _cqa_bwd_row_kernel(g_ptr, c_ptr, q_ptr, cmask_ptr, qmask_ptr, w_ptr, bias_ptr, out_ptr,
                        lse_row_ptr, lse_col_ptr, da_ptr, db_ptr, dd_ptr, t_ptr, dt_ptr, e_ptr, dc_ptr,
                        n, m, d, n_key, m_key, s_gb, s_gn, s_gd, s_cb, s_cn, s_cd, s_qb, s_qm, s_qd,
                        s_kcb, s_kcn, s_kqb, s_kqm, s_ob, s_on, s_od,
                        HAS_BIAS: tl.constexpr, BLOCK_D: tl.constexpr, DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """grad_c per (n-tile, b): g0 + g2∘A + g3∘B + (Σ_j dS_ij) w_c + w_cq∘(dS Q)_i + (Pc dT)_i."""
    _, b, offs_n, offs_d, n_ok, d_ok = _program_tile(n, d, BLOCK_N, BLOCK_D)
    w_c, w_q, w_cq, bias = _load_weights(w_ptr, bias_ptr, offs_d, d_ok, d, HAS_BIAS, c_ptr.dtype.element_ty)
    c, c_lin, cw = _operand_tile(c_ptr + b * s_cb, offs_n, offs_d, s_cn, s_cd, n_ok, d_ok, w_c, w_cq, bias)
    real_c, lse_r = _real_lse(cmask_ptr + b * s_kcb, lse_row_ptr + b * n, offs_n, s_kcn, n_ok)
    da = _load_rows(da_ptr + b * n * d, offs_n, offs_d, d, 1, n_ok, d_ok)
    db = _load_rows(db_ptr + b * n * d, offs_n, offs_d, d, 1, n_ok, d_ok)
    dd = tl.load(dd_ptr + b * n + offs_n, mask=n_ok, other=0.0)
    rowsum = tl.zeros([BLOCK_N], dtype=tl.float32)
    dsq = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    pc_dt = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    bb = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    for m0 in range(0, m, BLOCK_M):
        offs_m, m_ok = tile_range(m0, BLOCK_M, m)
        q = _load_rows(q_ptr + b * s_qb, offs_m, offs_d, s_qm, s_qd, m_ok, d_ok)
        real_q, lse_c = _real_lse(qmask_ptr + b * s_kqb, lse_col_ptr + b * m, offs_m, s_kqm, m_ok)
        t = _load_rows(t_ptr + b * m * d, offs_m, offs_d, d, 1, m_ok, d_ok)
        dt = _load_rows(dt_ptr + b * m * d, offs_m, offs_d, d, 1, m_ok, d_ok)
        e = tl.load(e_ptr + b * m + offs_m, mask=m_ok, other=0.0)
        s = _sim(cw, q, c_lin, _lin(q, w_q), DOT_DTYPE, DOT_PRECISION)
        p = _prob(s, lse_r[:, None], real_q[None, :] & n_ok[:, None])
        pc = _prob(s, lse_c[None, :], real_c[:, None] & m_ok[None, :])
        dp = _mm_nt(da, q, DOT_DTYPE, DOT_PRECISION) + _mm_nt(db, t, DOT_DTYPE, DOT_PRECISION)
        dpc = _mm_nt(c, dt, DOT_DTYPE, DOT_PRECISION)
        ds = _softmax_grad(p, dp, dd[:, None]) + _softmax_grad(pc, dpc, e[None, :])
        rowsum += tl.sum(ds, axis=1)
        dsq += _mm(ds, q, DOT_DTYPE, DOT_PRECISION)
        pc_dt += _mm(pc, dt, DOT_DTYPE, DOT_PRECISION)
        bb += _mm(p, t, DOT_DTYPE, DOT_PRECISION)
    g = g_ptr + b * s_gb
    g0 = _load_rows(g, offs_n, offs_d, s_gn, s_gd, n_ok, d_ok).to(tl.float32)
    g2 = _load_rows(g + 2 * d * s_gd, offs_n, offs_d, s_gn, s_gd, n_ok, d_ok).to(tl.float32)
    g3 = _load_rows(g + 3 * d * s_gd, offs_n, offs_d, s_gn, s_gd, n_ok, d_ok).to(tl.float32)
    a = _load_rows(out_ptr + b * s_ob + d * s_od, offs_n, offs_d, s_on, s_od, n_ok, d_ok).to(tl.float32)
    dc = g0 + g2 * a + g3 * bb + rowsum[:, None] * w_c[None, :] + w_cq[None, :] * dsq + pc_dt
    _store_rows(dc_ptr + b * n * d, offs_n, offs_d, d, n_ok, d_ok, dc)


# ----------------------------------------------------------------------------- launchers

def _consts(c: torch.Tensor, d: int) -> dict:
    """Compile-time constants shared by every kernel: feature tile, dot operand dtype and precision
    (fp32 accumulation always; ``_common`` states the precision policy)."""
    return {"BLOCK_D": max(16, triton.next_power_of_2(d)), "DOT_DTYPE": dot_operand_dtype(c.dtype),
            "DOT_PRECISION": dot_precision(c.dtype)}


def _cqa_consts(c: torch.Tensor, d: int) -> dict:
    """``_consts`` of the attention's kernels: IEEE fp32 dots where the policy says tf32x3. The backward's
    kernels hold several [rows, D] fp32 tiles at once, and tf32x3, which splits every dot operand in two,
    spilled registers there (``make gpu-compile``); IEEE is as accurate or more. Forward and backward alike:
    the backward rebuilds S bit for bit as the forward built it (module docstring)."""
    consts = _consts(c, d)
    if consts["DOT_PRECISION"] == "tf32x3":
        consts["DOT_PRECISION"] = "ieee"
    return consts


def _keys(n: int, m: int) -> tuple[int, int]:
    """Autotuning buckets of the context and question lengths."""
    return triton.next_power_of_2(max(n, 1)), triton.next_power_of_2(max(m, 1))


def _row_block_m(m: int, block_d: int, backward: bool = False, fp32: bool = False) -> int:
    """Question tile of the row kernels: the whole question up to a cap, then several tiles.

    The forward covers a typical question (m <= 128 at d <= 128) in one tile, i.e. one softmax
    pass; the backward rows need no softmax and take half as wide tiles. fp32 operands take a quarter
    (forward) or an eighth (backward) of that: the compile check found wider ones spilling registers
    with IEEE dots (``_cqa_consts``). The cap shrinks as
    d grows so that a [BLOCK_M, BLOCK_D] tile stays within registers and shared memory.
    """
    budget = (1024 if fp32 else 8192) if backward else (4096 if fp32 else 16384)
    cap = min(_ROW_TILE_MAX, budget // block_d)
    return max(16, min(triton.next_power_of_2(max(m, 1)), cap))


def _bias_args(bias: Optional[torch.Tensor], weight: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """(pointer argument, HAS_BIAS); the weight stands in as a never-read pointer when absent."""
    return (weight, False) if bias is None else (bias.reshape(1).contiguous(), True)


def _weight_grads(partial: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                  d: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum the per-program fp32 partial rows into (grad_weight, grad_bias or empty)."""
    total = partial.sum(dim=0)
    # copy=True: the two gradients must not be views of one buffer (custom ops may not alias outputs).
    grad_weight = total[: 3 * d].to(weight.dtype, copy=True)
    if bias is None:
        return grad_weight, weight.new_empty(0)
    return grad_weight, total[3 * d].reshape(bias.shape).to(bias.dtype, copy=True)


def _partial_buffer(c: torch.Tensor, batch: int, m: int, d: int) -> torch.Tensor:
    return torch.zeros(batch * triton.cdiv(m, _MIN_COL_BLOCK_M), 3 * d + 1, device=c.device, dtype=torch.float32)


def _row_grid(n: int, batch: int):
    return lambda meta: (triton.cdiv(n, meta["BLOCK_N"]), batch)


def _col_grid(m: int, batch: int):
    return lambda meta: (triton.cdiv(m, meta["BLOCK_M"]), batch)


def _trilinear_fwd(c: torch.Tensor, q: torch.Tensor, weight: torch.Tensor,
                   bias: Optional[torch.Tensor]) -> torch.Tensor:
    batch, n, d = c.shape
    m = q.shape[1]
    weight = weight.contiguous()
    bias_arg, has_bias = _bias_args(bias, weight)
    s = torch.empty(batch, n, m, device=c.device, dtype=c.dtype)
    grid = lambda meta: (triton.cdiv(n, meta["BLOCK_N"]), triton.cdiv(m, meta["BLOCK_M"]), batch)  # noqa: E731
    launch(_tri_fwd_kernel, grid, c, q, weight, bias_arg, s, n, m, d, *_keys(n, m), *c.stride(), *q.stride(),
            HAS_BIAS=has_bias, **_consts(c, d))
    return s


def _trilinear_bwd(grad_s: torch.Tensor, c: torch.Tensor, q: torch.Tensor, weight: torch.Tensor,
                   bias: Optional[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    batch, n, d = c.shape
    m = q.shape[1]
    weight = weight.contiguous()
    consts = _consts(c, d)
    sizes = (n, m, d, *_keys(n, m))
    grad_c = torch.empty_like(c, memory_format=torch.contiguous_format)
    grad_q = torch.empty_like(q, memory_format=torch.contiguous_format)
    partial = _partial_buffer(c, batch, m, d)
    launch(_tri_bwd_row_kernel, _row_grid(n, batch), grad_s, q, weight, grad_c, *sizes,
            *grad_s.stride(), *q.stride(), BLOCK_M=_row_block_m(m, consts["BLOCK_D"], backward=True), **consts)
    launch(_tri_bwd_col_kernel, _col_grid(m, batch), grad_s, c, q, weight, grad_q, partial, *sizes,
            *grad_s.stride(), *c.stride(), *q.stride(), **consts)
    return (grad_c, grad_q) + _weight_grads(partial, weight, bias, d)


def _cqa_fwd(c: torch.Tensor, q: torch.Tensor, c_mask: torch.Tensor, q_mask: torch.Tensor,
             weight: torch.Tensor, bias: Optional[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    batch, n, d = c.shape
    m = q.shape[1]
    weight = weight.contiguous()
    bias_arg, has_bias = _bias_args(bias, weight)
    consts = dict(_cqa_consts(c, d), HAS_BIAS=has_bias)
    sizes = (n, m, d, *_keys(n, m))
    f32 = dict(device=c.device, dtype=torch.float32)
    t = torch.empty(batch, m, d, **f32)
    lse_col = torch.empty(batch, m, **f32)
    lse_row = torch.empty(batch, n, **f32)
    out = torch.empty(batch, n, 4 * d, device=c.device, dtype=c.dtype)
    launch(_cqa_fwd_col_kernel, _col_grid(m, batch), c, q, c_mask, weight, bias_arg, t, lse_col, *sizes,
            *c.stride(), *q.stride(), *c_mask.stride(), **consts)
    launch(_cqa_fwd_row_kernel, _row_grid(n, batch), c, q, q_mask, weight, bias_arg, t, out, lse_row, *sizes,
            *c.stride(), *q.stride(), *q_mask.stride(),
            BLOCK_M=_row_block_m(m, consts["BLOCK_D"], fp32=c.dtype == torch.float32), **consts)
    return out, lse_row, lse_col


def _cqa_bwd(grad_out: torch.Tensor, c: torch.Tensor, q: torch.Tensor, c_mask: torch.Tensor,
             q_mask: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], out: torch.Tensor,
             lse_row: torch.Tensor, lse_col: torch.Tensor) -> tuple[torch.Tensor, ...]:
    batch, n, d = c.shape
    m = q.shape[1]
    weight = weight.contiguous()
    lse_row, lse_col = lse_row.contiguous(), lse_col.contiguous()
    bias_arg, has_bias = _bias_args(bias, weight)
    consts = dict(_cqa_consts(c, d), HAS_BIAS=has_bias)
    sizes = (n, m, d, *_keys(n, m))
    f32 = dict(device=c.device, dtype=torch.float32)
    da, db, dd = torch.empty(batch, n, d, **f32), torch.empty(batch, n, d, **f32), torch.empty(batch, n, **f32)
    t, dt, e = torch.empty(batch, m, d, **f32), torch.empty(batch, m, d, **f32), torch.empty(batch, m, **f32)
    grad_c = torch.empty_like(c, memory_format=torch.contiguous_format)
    grad_q = torch.empty_like(q, memory_format=torch.contiguous_format)
    partial = _partial_buffer(c, batch, m, d)
    launch(_cqa_bwd_prep_kernel, _row_grid(n, batch), grad_out, c, out, da, db, dd, *sizes,
            *grad_out.stride(), *c.stride(), *out.stride(), BLOCK_D=consts["BLOCK_D"])
    launch(_cqa_bwd_col_kernel, _col_grid(m, batch), c, q, c_mask, q_mask, weight, bias_arg, lse_row, lse_col,
            da, db, dd, t, dt, e, grad_q, partial, *sizes, *c.stride(), *q.stride(), *c_mask.stride(),
            *q_mask.stride(), **consts)
    launch(_cqa_bwd_row_kernel, _row_grid(n, batch), grad_out, c, q, c_mask, q_mask, weight, bias_arg, out,
            lse_row, lse_col, da, db, dd, t, dt, e, grad_c, *sizes, *grad_out.stride(), *c.stride(), *q.stride(),
            *c_mask.stride(), *q_mask.stride(), *out.stride(),
            BLOCK_M=_row_block_m(m, consts["BLOCK_D"], backward=True, fp32=c.dtype == torch.float32), **consts)
    return (grad_c, grad_q) + _weight_grads(partial, weight, bias, d)


# ----------------------------------------------------------------------------- custom ops

def _check_args(c: torch.Tensor, q: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                masks: tuple = ()) -> None:
    """Shapes, dtypes and devices the kernels rely on (they read by these sizes, unchecked)."""
    check_tensor("c", c, ndim=3)
    batch, n, d = c.shape
    check_tensor("q", q, shape=(batch, None, d), like=c)
    check_param("weight", weight, c, shape=(3 * d,))
    if bias is not None and (bias.numel() != 1 or bias.dim() > 1):
        raise ValueError(f"bias must have shape [1] or [], got {tuple(bias.shape)}")
    check_param("bias", bias, c)
    for name, mask, length in zip(("c_mask", "q_mask"), masks, (n, q.shape[1])):
        check_tensor(name, mask, shape=(batch, length), dtype=torch.bool, floating=False, like=c)


def trilinear_similarity_fwd(c: torch.Tensor, q: torch.Tensor, weight: torch.Tensor,
                             bias: Optional[torch.Tensor]) -> torch.Tensor:
    """S = w·[c; q; c∘q] (+ bias): c [B, n, d], q [B, m, d], weight [3d], bias [1] -> s [B, n, m]."""
    _check_args(c, q, weight, bias)
    return _trilinear_fwd(c, q, weight, bias)


def trilinear_similarity_bwd(grad_s: torch.Tensor, c: torch.Tensor, q: torch.Tensor, weight: torch.Tensor,
                             bias: Optional[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """Gradients of trilinear_similarity; grad_bias is empty (numel 0) when bias is None."""
    _check_args(c, q, weight, bias)
    check_tensor("grad_s", grad_s, shape=(c.shape[0], c.shape[1], q.shape[1]), like=c)
    return _trilinear_bwd(grad_s, c, q, weight, bias)


def context_query_attention_fwd(c: torch.Tensor, q: torch.Tensor, c_mask: torch.Tensor, q_mask: torch.Tensor,
                                weight: torch.Tensor, bias: Optional[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """out [B, n, 4d] = [c, A, c∘A, c∘B]; aux_row [B, n] and aux_col [B, m]: fp32 row / column
    log-sum-exps of the masked S (+inf where a row / column has no real token)."""
    _check_args(c, q, weight, bias, (c_mask, q_mask))
    return _cqa_fwd(c, q, c_mask, q_mask, weight, bias)


def context_query_attention_bwd(grad_out: torch.Tensor, c: torch.Tensor, q: torch.Tensor, c_mask: torch.Tensor,
                                q_mask: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                                out: torch.Tensor, aux_row: torch.Tensor,
                                aux_col: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Gradients of context_query_attention by recomputation from c, q and the forward's aux outputs;
    grad_bias is empty (numel 0) when bias is None."""
    _check_args(c, q, weight, bias, (c_mask, q_mask))
    batch, n, d = c.shape
    check_tensor("grad_out", grad_out, shape=(batch, n, 4 * d), like=c)
    check_tensor("out", out, shape=(batch, n, 4 * d), like=c)
    for name, aux, length in (("aux_row", aux_row, n), ("aux_col", aux_col, q.shape[1])):
        check_tensor(name, aux, shape=(batch, length), dtype=torch.float32)
    return _cqa_bwd(grad_out, c, q, c_mask, q_mask, weight, bias, out, aux_row, aux_col)


def _trilinear_fwd_fake(c, q, weight, bias):
    return c.new_empty(c.shape[0], c.shape[1], q.shape[1])


def _fake_grads(c, q, weight, bias):
    """Contiguous gradients whatever the inputs' strides, as the kernels write them."""
    contiguous = dict(memory_format=torch.contiguous_format)
    grad_bias = weight.new_empty(0) if bias is None else torch.empty_like(bias, **contiguous)
    return (torch.empty_like(c, **contiguous), torch.empty_like(q, **contiguous),
            torch.empty_like(weight, **contiguous), grad_bias)


def _trilinear_bwd_fake(grad_s, c, q, weight, bias):
    return _fake_grads(c, q, weight, bias)


def _cqa_fwd_fake(c, q, c_mask, q_mask, weight, bias):
    batch, n, d = c.shape
    return (c.new_empty(batch, n, 4 * d), c.new_empty(batch, n, dtype=torch.float32),
            c.new_empty(batch, q.shape[1], dtype=torch.float32))


def _cqa_bwd_fake(grad_out, c, q, c_mask, q_mask, weight, bias, out, aux_row, aux_col):
    return _fake_grads(c, q, weight, bias)


register("trilinear_similarity_fwd", trilinear_similarity_fwd,
         "(Tensor c, Tensor q, Tensor weight, Tensor? bias) -> Tensor s", _trilinear_fwd_fake)
register("trilinear_similarity_bwd", trilinear_similarity_bwd,
         "(Tensor grad_s, Tensor c, Tensor q, Tensor weight, Tensor? bias) "
         "-> (Tensor grad_c, Tensor grad_q, Tensor grad_weight, Tensor grad_bias)", _trilinear_bwd_fake)
register("context_query_attention_fwd", context_query_attention_fwd,
         "(Tensor c, Tensor q, Tensor c_mask, Tensor q_mask, Tensor weight, Tensor? bias) "
         "-> (Tensor out, Tensor aux_row, Tensor aux_col)", _cqa_fwd_fake)
register("context_query_attention_bwd", context_query_attention_bwd,
         "(Tensor grad_out, Tensor c, Tensor q, Tensor c_mask, Tensor q_mask, Tensor weight, Tensor? bias, "
         "Tensor out, Tensor aux_row, Tensor aux_col) "
         "-> (Tensor grad_c, Tensor grad_q, Tensor grad_weight, Tensor grad_bias)", _cqa_bwd_fake)
