"""Triton kernels for the GLU convolution (ConvS2S), causal and centred, and its one-step decode.

Registers, on import, the custom ops ``fastqa_triton::glu_conv1d_fwd``, ``glu_conv1d_bwd`` and
``glu_conv1d_step`` (schemas in ``_SCHEMAS``, identical to the C++ ``fastqa::`` ops) with fake
implementations, so ``torch.compile(fullgraph=True)`` keeps them in the graph.

Shapes: x [B, T, H]; weight [2H, H, K] (nn.Conv1d layout); bias [2H]; mask [B, T] bool;
pre = conv(pad(x·mask)) [B, T, 2H] with ``pad_left`` zeros on the left and K-1-pad_left on the right,
so pre[t, o] = bias[o] + sum_{k, c} weight[o, c, k] · h[t + k - pad_left, c] with h = x·mask (zero
outside [0, T)); [a; b] = pre split along channels; y = (a·sigmoid(b) + x)·scale, or a·sigmoid(b)·scale
without the residual.

Tiling
  forward   one program per (t-tile, output-channel tile n of H, batch row). The conv is K shifted
            ``tl.dot``s: for each tap k and input-channel block, the input tile at rows t + k - pad_left
            ([BLOCK_T, BLOCK_C], rows outside [0, T) and masked positions read as zero, so there is no
            padded copy and no im2col tensor) is multiplied by the weight slices of the ``a`` and ``b``
            halves ([BLOCK_C, BLOCK_N] each) into two fp32 accumulators. Epilogue: bias, GLU, residual
            (unmasked x) and scale, one store of y and one of the pre-activation.
  backward  (1) element-wise: d_pre = [dy·s; dy·a·s·(1-s)] (dy = grad_y·scale, s = sigmoid(b)) from
            the saved pre-activation, stored in the input dtype like the reference autograd does;
            the bias gradient as per-program fp32 column sums. (2) grad_x: a conv of d_pre with the
            transposed weight, again K shifted ``tl.dot``s (rows t - k + pad_left), times the mask,
            plus scale·grad_y for the residual. (3) grad_weight: one program per (2H tile, H tile,
            tap k, split s); split s reduces the row tiles s, s + S, s + 2S, ... of all B·T rows
            with ``tl.dot(d_pre^T, h_shifted)`` into an fp32 partial buffer [S, 2H, H, K] that is
            summed afterwards: no atomics, so backward is deterministic (bitwise repeatable for a
            fixed autotuning choice).
  step      a small GEMM per decoding step, [B, K·H] window x [K·H, 2H] weight: one program per
            (output-channel tile, batch tile), tiles as narrow as 8 channels and 16 rows, so that B 64,
            H 512 runs 256 programs (more than the SMs of any GPU) with a short reduction each. K is a
            constexpr; one pipelined loop runs over (tap, input-channel block) pairs, the tap a scalar
            of the iteration: the newest tap is read from x_t, the older ones from the state (no index
            arithmetic per element). The packed weight puts a program's a and b
            columns side by side, so one ``tl.dot`` per (tap, input-channel block) gives both halves,
            split in registers. The same program writes its slice of the rolled state (new_state =
            window[1:]): one launch per step.

Saved / recomputed
  aux = the pre-activation [B, T, 2H] = [a; b] (bias included), contiguous, in the input dtype (the
  backward op gets no bias, so it could not recompute it). Backward recomputes h = x·mask on the
  fly from x and mask; nothing else is saved.

Layouts: x, x_t, grad_y, mask and state are read through their strides (non-contiguous input,
e.g. a channels-first [B, H, T] tensor transposed, is not copied). Every kernel reads the weight
packed (``packed_weight``): [K, H (input), H (output), 2 (half)] in the activations' dtype, so that
the tiles the dots read are contiguous along output channels with the two GLU halves side by side.
The packed copy is cached on the weight tensor and made again only when the weight changes (its
version counter): once per model for decoding, once per optimizer step (shared by forward and
backward) in training. bias is made contiguous. Outputs (and aux) are contiguous.

Parameters: weight and bias may be float32 with fp16 / bf16 activations (``ACCEPTS_FP32_WEIGHTS``,
the contract in ``_common``): the packed copy is made in the activations' dtype (rounded as
``Tensor.to`` rounds) and the bias is rounded in registers, so the results are those of the same call
with the parameters cast first. bias must have the weight's dtype.

Precision: fp32 accumulation for fp32/fp16/bf16 inputs (fp64 in, fp64 accumulation, for gradcheck
in the interpreter); outputs in the input dtype, grad_weight/grad_bias in the weight's dtype (summed
from fp32 partials: an fp32 weight gets its gradient without a round trip through the input dtype). fp32 dots
follow the package-wide policy of ``_common.dot_precision`` (TF32x3 unless torch's float32 matmul
precision allows TF32). Under ``TRITON_INTERPRET=1`` each kernel has a single small configuration
(16-wide tiles), since the interpreter would otherwise benchmark every configuration, and bf16 dot
operands are upcast to fp32 (``_common.dot_operand_dtype``). GPU speed has not been measured.
"""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl
from torch import Tensor

from torch.utils.weak import WeakIdKeyDictionary

from ._common import (INTERPRET, accumulator_dtype, check_param, configs, dtype_constants, launch, register, round_to,
                      sm_count, tile_range)

#: Parameters (weight, bias) in float32 with fp16 / bf16 activations: see ``_common``'s docstring.
ACCEPTS_FP32_WEIGHTS = True

_SCHEMAS = {
    "glu_conv1d_fwd": "(Tensor x, Tensor weight, Tensor? bias, Tensor? mask, int pad_left, bool residual, "
                      "float scale) -> (Tensor y, Tensor aux)",
    "glu_conv1d_bwd": "(Tensor grad_y, Tensor x, Tensor weight, Tensor? mask, Tensor aux, int pad_left, "
                      "bool residual, float scale, bool has_bias) -> (Tensor grad_x, Tensor grad_weight, "
                      "Tensor? grad_bias)",
    "glu_conv1d_step": "(Tensor x_t, Tensor state, Tensor weight, Tensor? bias, bool residual, float scale) "
                       "-> (Tensor y_t, Tensor new_state)",
}


# (BLOCK_T, BLOCK_N, BLOCK_C, warps, stages); two accumulators of [BLOCK_T, BLOCK_N] per program.
_FWD_CONFIGS = configs(("BLOCK_T", "BLOCK_N", "BLOCK_C"), [
    (32, 64, 32, 8, 3), (64, 32, 32, 8, 3), (32, 64, 32, 4, 3), (64, 64, 16, 4, 3)])
# (BLOCK_T, BLOCK_C, BLOCK_O, warps, stages)
_DX_CONFIGS = configs(("BLOCK_T", "BLOCK_C", "BLOCK_O"), [
    (64, 64, 32, 8, 3), (32, 64, 32, 4, 3), (64, 32, 32, 4, 3), (128, 64, 32, 8, 3),
    (64, 64, 16, 4, 3), (32, 64, 32, 8, 3), (64, 128, 32, 8, 3)])
# (BLOCK_O, BLOCK_C, BLOCK_T, warps, stages)
_DW_CONFIGS = configs(("BLOCK_O", "BLOCK_C", "BLOCK_T"), [
    (64, 64, 32, 4, 3), (128, 64, 32, 8, 3), (64, 128, 32, 8, 3), (32, 64, 64, 4, 4)])
# (BLOCK_N, warps, stages); BLOCK_T of this kernel is fixed (it sizes the bias partial buffer).
_DPRE_CONFIGS = configs(("BLOCK_N",), [(64, 2, 1), (128, 4, 1), (256, 8, 1)])
_DPRE_BLOCK_T = 16 if INTERPRET else 32
# (BLOCK_B, BLOCK_N, BLOCK_C, warps, stages). Decoding steps are small GEMMs ([B, K·H] x [K·H, 2H]): narrow
# channel tiles (BLOCK_N = 8: one 16-wide dot covers both halves) give hundreds of programs at B 64, H 512.
_STEP_CONFIGS = configs(("BLOCK_B", "BLOCK_N", "BLOCK_C"), [
    (16, 8, 64, 4, 3), (16, 8, 128, 4, 3), (16, 16, 64, 4, 3), (32, 16, 64, 4, 3), (32, 32, 64, 8, 3),
    (64, 32, 64, 8, 3)], {"BLOCK_B": 16, "BLOCK_N": 8, "BLOCK_C": 16})
# Smallest row tile of the grad_weight kernel: bounds the number of splits worth launching.
_DW_MIN_BLOCK_T = min(c.kwargs["BLOCK_T"] for c in _DW_CONFIGS)


@triton.jit
def _sigmoid(v):
    # Written out (not tl.sigmoid) so fp64 accumulators work too; exp overflow gives exactly 0.
    return 1.0 / (1.0 + tl.exp(-v))


@triton.jit
def _program_tile(T, H, BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr):
    """Where a (row tile, channel block, batch element) program starts: b (int64), its row offsets and
    channel offsets, and which of each are in range."""
    b = tl.program_id(2).to(tl.int64)
    offs_t, t_ok = tile_range(tl.program_id(0) * BLOCK_T, BLOCK_T, T)
    offs_h, h_ok = tile_range(tl.program_id(1) * BLOCK_H, BLOCK_H, H)
    return b, offs_t, t_ok, offs_h, h_ok


@triton.jit
def _dot_halves(acc_a, acc_b, h, w_tile, b_offset, w_ok, DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """(acc_a + h @ w_a, acc_b + h @ w_b) for the two GLU halves of a weight tile: w_a at w_tile, w_b
    ``b_offset`` elements further (masked by w_ok; operands in DOT_DTYPE)."""
    w_a = tl.load(w_tile, mask=w_ok, other=0.0).to(DOT_DTYPE)
    w_b = tl.load(w_tile + b_offset, mask=w_ok, other=0.0).to(DOT_DTYPE)
    acc_a += tl.dot(h, w_a, input_precision=DOT_PRECISION)
    acc_b += tl.dot(h, w_b, input_precision=DOT_PRECISION)
    return acc_a, acc_b


@triton.jit
def _add_bias_halves(acc_a, acc_b, bias_ptr, offs_n, n_ok, H, HAS_BIAS: tl.constexpr, ACC: tl.constexpr,
                     DTYPE: tl.constexpr):
    """The bias [2H] of both GLU halves (rounded to the activations' DTYPE: it may be fp32) added to their
    pre-activations (unchanged without a bias)."""
    if HAS_BIAS:
        acc_a += round_to(tl.load(bias_ptr + offs_n, mask=n_ok, other=0.0), DTYPE).to(ACC)[None, :]
        acc_b += round_to(tl.load(bias_ptr + H + offs_n, mask=n_ok, other=0.0), DTYPE).to(ACC)[None, :]
    return acc_a, acc_b


@triton.jit
def _row_keep(mask_ptr, b, rows, T, sm_b, sm_t, HAS_MASK: tl.constexpr):
    """Rows of h = x·mask that are real: inside [0, T) and, with a mask, not padding."""
    keep = (rows >= 0) & (rows < T)
    if HAS_MASK:
        keep = keep & (tl.load(mask_ptr + b * sm_b + rows * sm_t, mask=keep, other=0) != 0)
    return keep


@triton.jit
def _glu_conv1d_fwd_kernel(
    x_ptr, w_ptr, bias_ptr, mask_ptr, y_ptr, pre_ptr,
    T, H, K, pad_left, scale, ROWS_BUCKET,
    sx_b, sx_t, sx_h, sw_k, sw_c, sw_n, sw_half, sm_b, sm_t,
    HAS_BIAS: tl.constexpr, HAS_MASK: tl.constexpr, RESIDUAL: tl.constexpr,
    ACC: tl.constexpr, DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """x: [B, T, H] strided; w: [K, H (in), H (out), 2 (half)] (any strides: the packed weight); y: [B, T, H]
    and pre: [B, T, 2H] contiguous."""
    b, offs_t, t_ok, offs_n, n_ok = _program_tile(T, H, BLOCK_T, BLOCK_N)
    dtype = x_ptr.dtype.element_ty
    acc_a = tl.zeros([BLOCK_T, BLOCK_N], dtype=ACC)
    acc_b = tl.zeros([BLOCK_T, BLOCK_N], dtype=ACC)
    for k in range(K):
        rows = offs_t + k - pad_left
        keep = _row_keep(mask_ptr, b, rows, T, sm_b, sm_t, HAS_MASK)
        for c0 in range(0, H, BLOCK_C):
            offs_c, c_ok = tile_range(c0, BLOCK_C, H)
            h = tl.load(x_ptr + b * sx_b + rows[:, None] * sx_t + offs_c[None, :] * sx_h,
                        mask=keep[:, None] & c_ok[None, :], other=0.0).to(DOT_DTYPE)
            w_tile = w_ptr + k * sw_k + offs_c[:, None] * sw_c + offs_n[None, :] * sw_n
            acc_a, acc_b = _dot_halves(acc_a, acc_b, h, w_tile, sw_half, c_ok[:, None] & n_ok[None, :],
                                       DOT_DTYPE, DOT_PRECISION)
    acc_a, acc_b = _add_bias_halves(acc_a, acc_b, bias_ptr, offs_n, n_ok, H, HAS_BIAS, ACC, dtype)
    out_ok = t_ok[:, None] & n_ok[None, :]
    row = b * T + offs_t
    pre_tile = pre_ptr + row[:, None] * (2 * H) + offs_n[None, :]
    tl.store(pre_tile, acc_a.to(dtype), mask=out_ok)
    tl.store(pre_tile + H, acc_b.to(dtype), mask=out_ok)
    g = acc_a * _sigmoid(acc_b)
    if RESIDUAL:  # the residual is the unmasked x
        g += tl.load(x_ptr + b * sx_b + offs_t[:, None] * sx_t + offs_n[None, :] * sx_h,
                     mask=out_ok, other=0.0).to(ACC)
    tl.store(y_ptr + row[:, None] * H + offs_n[None, :], (g * scale).to(dtype), mask=out_ok)


@triton.jit
def _glu_dpre_kernel(
    gy_ptr, pre_ptr, dpre_ptr, dbias_ptr,
    T, H, scale,
    sg_b, sg_t, sg_h,
    HAS_BIAS: tl.constexpr, ACC: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """d_pre [B, T, 2H] (contiguous, input dtype) from grad_y (strided) and pre; with a bias, the
    accumulator-precision column sums of d_pre of this row tile go to dbias[b·n_t_tiles + t_tile, :2H]."""
    b, offs_t, t_ok, offs_n, n_ok = _program_tile(T, H, BLOCK_T, BLOCK_N)
    ok = t_ok[:, None] & n_ok[None, :]
    dy = tl.load(gy_ptr + b * sg_b + offs_t[:, None] * sg_t + offs_n[None, :] * sg_h, mask=ok, other=0.0)
    dy = dy.to(ACC) * scale
    pre_tile = pre_ptr + (b * T + offs_t)[:, None] * (2 * H) + offs_n[None, :]
    a = tl.load(pre_tile, mask=ok, other=0.0).to(ACC)
    s = _sigmoid(tl.load(pre_tile + H, mask=ok, other=0.0).to(ACC))
    d_a = dy * s
    d_b = dy * a * s * (1.0 - s)
    dpre_tile = dpre_ptr + (b * T + offs_t)[:, None] * (2 * H) + offs_n[None, :]
    tl.store(dpre_tile, d_a.to(dpre_ptr.dtype.element_ty), mask=ok)
    tl.store(dpre_tile + H, d_b.to(dpre_ptr.dtype.element_ty), mask=ok)
    if HAS_BIAS:
        part = dbias_ptr + (b * tl.num_programs(0) + tl.program_id(0)) * (2 * H) + offs_n
        tl.store(part, tl.sum(d_a, axis=0), mask=n_ok)
        tl.store(part + H, tl.sum(d_b, axis=0), mask=n_ok)


@triton.jit
def _glu_conv1d_dx_kernel(
    dpre_ptr, w_ptr, gy_ptr, mask_ptr, dx_ptr,
    T, H, K, pad_left, scale, ROWS_BUCKET,
    sw_k, sw_c, sw_n, sw_half, sg_b, sg_t, sg_h, sm_b, sm_t,
    HAS_MASK: tl.constexpr, RESIDUAL: tl.constexpr,
    ACC: tl.constexpr, DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_O: tl.constexpr,
):
    """grad_x[t, c] = mask[t]·sum_{k, o} d_pre[t - k + pad_left, o]·weight[o, c, k] (+ scale·grad_y[t, c]),
    the weight read packed (o = half·H + n at w[k, c, n, half])."""
    b, offs_t, t_ok, offs_c, c_ok = _program_tile(T, H, BLOCK_T, BLOCK_C)
    acc = tl.zeros([BLOCK_T, BLOCK_C], dtype=ACC)
    for k in range(K):
        rows = offs_t - k + pad_left
        r_ok = (rows >= 0) & (rows < T)
        for o0 in range(0, 2 * H, BLOCK_O):
            offs_o, o_ok = tile_range(o0, BLOCK_O, 2 * H)
            d = tl.load(dpre_ptr + (b * T + rows)[:, None] * (2 * H) + offs_o[None, :],
                        mask=r_ok[:, None] & o_ok[None, :], other=0.0).to(DOT_DTYPE)
            w_o = (offs_o % H) * sw_n + (offs_o // H) * sw_half  # output channel o of the packed weight
            w = tl.load(w_ptr + k * sw_k + w_o[:, None] + offs_c[None, :] * sw_c,
                        mask=o_ok[:, None] & c_ok[None, :], other=0.0).to(DOT_DTYPE)
            acc += tl.dot(d, w, input_precision=DOT_PRECISION)
    if HAS_MASK:  # h = x·mask, so d/dx of the conv path vanishes at padded positions
        keep = tl.load(mask_ptr + b * sm_b + offs_t * sm_t, mask=t_ok, other=0) != 0
        acc = tl.where(keep[:, None], acc, 0.0)
    out_ok = t_ok[:, None] & c_ok[None, :]
    if RESIDUAL:
        acc += scale * tl.load(gy_ptr + b * sg_b + offs_t[:, None] * sg_t + offs_c[None, :] * sg_h,
                               mask=out_ok, other=0.0).to(ACC)
    tl.store(dx_ptr + (b * T + offs_t)[:, None] * H + offs_c[None, :], acc.to(dx_ptr.dtype.element_ty),
             mask=out_ok)


@triton.jit
def _glu_conv1d_dw_kernel(
    dpre_ptr, x_ptr, mask_ptr, part_ptr,
    B, T, H, K, pad_left, SPLITS, ROWS_BUCKET,
    sx_b, sx_t, sx_h, sm_b, sm_t,
    HAS_MASK: tl.constexpr, ACC: tl.constexpr, DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr,
    BLOCK_O: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_T: tl.constexpr,
):
    """part[s, o, c, k] = sum over the row tiles r ≡ s (mod SPLITS) of d_pre[r, o]·h[r + k - pad_left, c]."""
    offs_o, o_ok = tile_range(tl.program_id(0) * BLOCK_O, BLOCK_O, 2 * H)
    k = tl.program_id(1) % K
    offs_c, c_ok = tile_range((tl.program_id(1) // K) * BLOCK_C, BLOCK_C, H)
    split = tl.program_id(2)
    n_t_tiles = tl.cdiv(T, BLOCK_T)
    acc = tl.zeros([BLOCK_O, BLOCK_C], dtype=ACC)
    for tile in range(split, B * n_t_tiles, SPLITS):
        b = (tile // n_t_tiles).to(tl.int64)
        offs_t = (tile % n_t_tiles) * BLOCK_T + tl.arange(0, BLOCK_T)
        d_t = tl.load(dpre_ptr + (b * T + offs_t)[None, :] * (2 * H) + offs_o[:, None],
                      mask=o_ok[:, None] & (offs_t < T)[None, :], other=0.0).to(DOT_DTYPE)
        rows = offs_t + k - pad_left
        keep = _row_keep(mask_ptr, b, rows, T, sm_b, sm_t, HAS_MASK)
        h = tl.load(x_ptr + b * sx_b + rows[:, None] * sx_t + offs_c[None, :] * sx_h,
                    mask=keep[:, None] & c_ok[None, :], other=0.0).to(DOT_DTYPE)
        acc += tl.dot(d_t, h, input_precision=DOT_PRECISION)
    part = part_ptr + split.to(tl.int64) * (2 * H * H * K) + offs_o[:, None] * (H * K) + offs_c[None, :] * K + k
    tl.store(part, acc.to(part_ptr.dtype.element_ty), mask=o_ok[:, None] & c_ok[None, :])


@triton.jit
def _glu_conv1d_step_kernel(
    x_ptr, state_ptr, w_ptr, bias_ptr, y_ptr, new_state_ptr,
    B, H, scale, B_BUCKET,
    sx_b, sx_h, ss_b, ss_k, ss_h,
    K: tl.constexpr, HAS_BIAS: tl.constexpr, RESIDUAL: tl.constexpr,
    ACC: tl.constexpr, DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr,
    BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """y_t = GLU(window · W + bias) (+ x_t)·scale for the window (state, x_t) [B, K, H] and this program's
    BLOCK_N output channels of BLOCK_B batch rows; w is the packed [K, H, H, 2] weight (``packed_weight``), so
    the channels' a and b columns are 2·BLOCK_N contiguous elements of each (tap, input channel) row and one
    dot gives both halves, interleaved. new_state[:, j] = window[:, j + 1] for the program's channels."""
    offs_n, n_ok = tile_range(tl.program_id(0) * BLOCK_N, BLOCK_N, H)
    offs_p, p_ok = tile_range(tl.program_id(0) * (2 * BLOCK_N), 2 * BLOCK_N, 2 * H)
    offs_b, b_ok = tile_range(tl.program_id(1) * BLOCK_B, BLOCK_B, B)
    row_x = offs_b.to(tl.int64) * sx_b
    row_s = offs_b.to(tl.int64) * ss_b
    dtype = x_ptr.dtype.element_ty
    # One loop over (tap, input-channel block) pairs, the tap a scalar of the iteration: the pointer tiles
    # below are made once, and the loop is pipelined as a whole (an unrolled loop per tap held each tap's
    # tiles in registers at once).
    rel_c = tl.arange(0, BLOCK_C)
    x_tile = x_ptr + row_x[:, None] + rel_c[None, :] * sx_h
    s_tile = state_ptr + row_s[:, None] + rel_c[None, :] * ss_h
    w_tile = w_ptr + rel_c[:, None] * (2 * H) + offs_p[None, :]
    n_c = tl.cdiv(H, BLOCK_C)
    acc = tl.zeros([BLOCK_B, 2 * BLOCK_N], dtype=ACC)
    for it in range(K * n_c):
        k = it // n_c
        c0 = (it - k * n_c) * BLOCK_C
        c_ok = (c0 + rel_c) < H
        ok = b_ok[:, None] & c_ok[None, :]
        if K == 1:
            win = tl.load(x_tile + c0 * sx_h, mask=ok, other=0.0)
        else:  # the newest tap is x_t, the older ones the state (a tile of k: a mask per element)
            newest = (tl.zeros([BLOCK_B, BLOCK_C], dtype=tl.int32) + k) == K - 1
            old = tl.load(s_tile + k * ss_k + c0 * ss_h, mask=ok & ~newest, other=0.0)
            win = tl.where(newest, tl.load(x_tile + c0 * sx_h, mask=ok & newest, other=0.0), old)
        w = tl.load(w_tile + (k * H + c0).to(tl.int64) * (2 * H), mask=c_ok[:, None] & p_ok[None, :], other=0.0)
        acc += tl.dot(win.to(DOT_DTYPE), w.to(DOT_DTYPE), input_precision=DOT_PRECISION)
    acc_a, acc_b = tl.split(tl.reshape(acc, [BLOCK_B, BLOCK_N, 2]))
    acc_a, acc_b = _add_bias_halves(acc_a, acc_b, bias_ptr, offs_n, n_ok, H, HAS_BIAS, ACC, dtype)
    ok = b_ok[:, None] & n_ok[None, :]
    x_t = tl.load(x_ptr + row_x[:, None] + offs_n[None, :] * sx_h, mask=ok, other=0.0)
    g = acc_a * _sigmoid(acc_b)
    if RESIDUAL:
        g += x_t.to(ACC)
    tl.store(y_ptr + offs_b[:, None] * H + offs_n[None, :], (g * scale).to(dtype), mask=ok)
    # Rolling state, this program's slice: new_state[:, j] = state[:, j + 1], the last one x_t.
    new_rows = new_state_ptr + offs_b.to(tl.int64)[:, None] * ((K - 1) * H) + offs_n[None, :]
    for j in tl.static_range(K - 2):
        old = tl.load(state_ptr + row_s[:, None] + (j + 1) * ss_k + offs_n[None, :] * ss_h, mask=ok, other=0.0)
        tl.store(new_rows + j * H, old, mask=ok)
    if K > 1:
        tl.store(new_rows + (K - 2) * H, x_t, mask=ok)


# ---------------------------------------------------------------------------------------------
# Launchers
# ---------------------------------------------------------------------------------------------

def _weight_grad_splits(device: torch.device, rows: int, H: int, K: int) -> int:
    """Row splits of the grad_weight reduction: on a GPU, enough programs to fill it about four times
    (counted with nominal 64-wide tiles), at most one per smallest row tile, at most 64. One split
    elsewhere: the interpreter runs programs one after another, so splitting only adds work."""
    if device.type != "cuda":
        return 1
    sms = sm_count(device)
    tile_programs = triton.cdiv(2 * H, 64) * triton.cdiv(H, 64) * K
    return max(1, min(triton.cdiv(4 * sms, tile_programs), triton.cdiv(rows, _DW_MIN_BLOCK_T), 64))


def _check_conv_args(x: Tensor, weight: Tensor, mask: Optional[Tensor], pad_left: int) -> tuple[int, int, int, int]:
    """Cheap shape checks of a direct call (the ops layer validates thoroughly); returns B, T, H, K."""
    if x.dim() != 3:
        raise ValueError(f"x must be [B, T, H], got shape {tuple(x.shape)}")
    B, T, H = x.shape
    if weight.dim() != 3 or weight.shape[0] != 2 * H or weight.shape[1] != H:
        raise ValueError(f"weight must be [2H, H, K] = [{2 * H}, {H}, K], got {tuple(weight.shape)}")
    K = weight.shape[2]
    if K < 1:
        raise ValueError(f"weight must have a kernel size K >= 1, got shape {tuple(weight.shape)}")
    if not 0 <= pad_left < K:
        raise ValueError(f"pad_left must be in [0, K-1] = [0, {K - 1}], got {pad_left}")
    if mask is not None and (mask.dtype != torch.bool or tuple(mask.shape) != (B, T)):
        raise ValueError(f"mask must be a bool [B, T] = [{B}, {T}] tensor, got {mask.dtype} {tuple(mask.shape)}")
    return B, T, H, K


def _mask_args(mask: Optional[Tensor], x: Tensor) -> tuple[Tensor, int, int]:
    """The mask as bytes (bool pointers are awkward in Triton) and its strides; x stands in when absent."""
    if mask is None:
        return x, 0, 0
    m = mask.view(torch.uint8)
    return m, m.stride(0), m.stride(1)


def _contiguous_or(t: Optional[Tensor], stand_in: Tensor) -> Tensor:
    """An optional vector read with unit stride; ``stand_in`` fills the unused pointer when absent."""
    return stand_in if t is None else t.contiguous()


# Packed weights by weight tensor (weakly: an entry goes with its tensor), then by dtype: (stamp, packed).
_PACKED: WeakIdKeyDictionary = WeakIdKeyDictionary()


def _stamp(weight: Tensor) -> tuple:
    """What identifies the values of a weight tensor: its version counter (bumped by every in-place
    change torch sees), storage, shape and strides."""
    return weight._version, weight.data_ptr(), tuple(weight.shape), weight.stride()


def packed_weight(weight: Tensor, dtype: torch.dtype) -> Tensor:
    """weight [2H, H, K] (nn.Conv1d layout, any dtype) as every kernel of this module reads it: a contiguous
    [K, H, H, 2] tensor in ``dtype`` (the activations'), packed[k, c, n, half] = weight[half·H + n, c, k].

    Laid out once per weight tensor and dtype, not per call: the result is cached on the tensor (weakly) and
    re-laid only when its version counter, storage, shape or strides change, i.e. after an optimizer step or
    any in-place change torch records (not after one made through ``weight.data``, which torch does not
    count). Decoding with a parametrized weight (weight norm recomputes it on every access) reuses one
    packed copy when run inside ``torch.nn.utils.parametrize.cached()``. Inference tensors (created under
    ``torch.inference_mode``) have no version counter: they are packed on every call."""
    if weight.is_inference():
        return _pack(weight, dtype)
    per_dtype = _PACKED.get(weight)
    if per_dtype is None:
        per_dtype = _PACKED[weight] = {}
    stamp = _stamp(weight)
    hit = per_dtype.get(dtype)
    if hit is not None and hit[0] == stamp:
        return hit[1]
    packed = _pack(weight, dtype)
    per_dtype[dtype] = (stamp, packed)
    return packed


def _pack(weight: Tensor, dtype: torch.dtype) -> Tensor:
    two_h, H, K = weight.shape
    packed = torch.empty((K, H, H, 2), dtype=dtype, device=weight.device)
    packed.copy_(weight.detach().view(2, H, H, K).permute(3, 2, 1, 0))  # the copy rounds as Tensor.to does
    return packed


def _packed_strides(w: Tensor) -> tuple[int, int, int, int]:
    """(tap, input channel, output channel, half) strides of a packed weight."""
    return w.stride(0), w.stride(1), w.stride(2), w.stride(3)


def _check_params(x: Tensor, weight: Tensor, bias: Optional[Tensor]) -> None:
    """weight (and bias) in x's dtype or float32, on x's device; the bias in the weight's dtype (the
    backward returns grad_bias in it)."""
    check_param("weight", weight, x)
    check_param("bias", bias, x)
    if bias is not None and bias.dtype != weight.dtype:
        raise TypeError(f"bias must have the weight's dtype {weight.dtype}, got {bias.dtype}")


def glu_conv1d_fwd(x: Tensor, weight: Tensor, bias: Optional[Tensor], mask: Optional[Tensor], pad_left: int,
                   residual: bool, scale: float) -> tuple[Tensor, Tensor]:
    """x [B, T, H] -> (y [B, T, H], aux = pre-activation [B, T, 2H]), both contiguous, x's dtype."""
    B, T, H, K = _check_conv_args(x, weight, mask, pad_left)
    _check_params(x, weight, bias)
    y = torch.empty((B, T, H), dtype=x.dtype, device=x.device)
    pre = torch.empty((B, T, 2 * H), dtype=x.dtype, device=x.device)
    if y.numel() == 0:
        return y, pre
    w = packed_weight(weight, x.dtype)
    m, sm_b, sm_t = _mask_args(mask, x)
    grid = lambda meta: (triton.cdiv(T, meta["BLOCK_T"]), triton.cdiv(H, meta["BLOCK_N"]), B)  # noqa: E731
    launch(
        _glu_conv1d_fwd, grid, x, w, _contiguous_or(bias, x), m, y, pre,
        T, H, K, pad_left, float(scale), triton.next_power_of_2(B * T),
        *x.stride(), *_packed_strides(w), sm_b, sm_t,
        HAS_BIAS=bias is not None, HAS_MASK=mask is not None, RESIDUAL=bool(residual),
        **dtype_constants(x.dtype))
    return y, pre


def glu_conv1d_bwd(grad_y: Tensor, x: Tensor, weight: Tensor, mask: Optional[Tensor], aux: Tensor, pad_left: int,
                   residual: bool, scale: float, has_bias: bool) -> tuple[Tensor, Tensor, Optional[Tensor]]:
    """-> (grad_x [B, T, H] in x's dtype, grad_weight [2H, H, K] and grad_bias [2H] (None without a bias)
    in weight's dtype). aux is the forward's pre-activation."""
    B, T, H, K = _check_conv_args(x, weight, mask, pad_left)
    _check_params(x, weight, None)
    if tuple(aux.shape) != (B, T, 2 * H) or tuple(grad_y.shape) != (B, T, H):
        raise ValueError(f"grad_y must be [B, T, H] and aux [B, T, 2H]; got {tuple(grad_y.shape)}, {tuple(aux.shape)}")
    dev = x.device
    grad_x = torch.empty((B, T, H), dtype=x.dtype, device=dev)
    if grad_x.numel() == 0:
        grad_bias = torch.zeros((2 * H,), dtype=weight.dtype, device=dev) if has_bias else None
        return grad_x.zero_(), torch.zeros_like(weight, memory_format=torch.contiguous_format), grad_bias
    aux = aux.contiguous()
    m, sm_b, sm_t = _mask_args(mask, x)
    consts = dtype_constants(x.dtype)
    rows_bucket = triton.next_power_of_2(B * T)
    part_dtype = accumulator_dtype(x.dtype)

    # (1) d_pre and the bias partials.
    dpre = torch.empty((B, T, 2 * H), dtype=x.dtype, device=dev)
    n_t = triton.cdiv(T, _DPRE_BLOCK_T)
    dbias_part = torch.empty((B * n_t, 2 * H), dtype=part_dtype, device=dev) if has_bias else None
    launch(
        _glu_dpre, lambda meta: (n_t, triton.cdiv(H, meta["BLOCK_N"]), B), grad_y, aux, dpre, dbias_part if has_bias else dpre, T, H, float(scale), *grad_y.stride(),
        HAS_BIAS=bool(has_bias), ACC=consts["ACC"], BLOCK_T=_DPRE_BLOCK_T)
    grad_bias = dbias_part.sum(0).to(weight.dtype) if has_bias else None

    # (2) grad_x.
    w = packed_weight(weight, x.dtype)
    launch(
        _glu_conv1d_dx, lambda meta: (triton.cdiv(T, meta["BLOCK_T"]), triton.cdiv(H, meta["BLOCK_C"]), B), dpre, w, grad_y, m, grad_x, T, H, K, pad_left, float(scale), rows_bucket,
        *_packed_strides(w), *grad_y.stride(), sm_b, sm_t,
        HAS_MASK=mask is not None, RESIDUAL=bool(residual), **consts)

    # (3) grad_weight: per-split fp32 partials, summed in a fixed order.
    splits = _weight_grad_splits(dev, B * T, H, K)
    part = torch.empty((splits, 2 * H, H, K), dtype=part_dtype, device=dev)
    launch(
        _glu_conv1d_dw, lambda meta: (triton.cdiv(2 * H, meta["BLOCK_O"]), triton.cdiv(H, meta["BLOCK_C"]) * K, splits),
        dpre, x, m, part, B, T, H, K, pad_left, splits, rows_bucket,
        *x.stride(), sm_b, sm_t,
        HAS_MASK=mask is not None, **consts)
    return grad_x, part.sum(0).to(weight.dtype), grad_bias


def glu_conv1d_step(x_t: Tensor, state: Tensor, weight: Tensor, bias: Optional[Tensor], residual: bool,
                    scale: float) -> tuple[Tensor, Tensor]:
    """x_t [B, H], state [B, K-1, H] (oldest first) -> (y_t [B, H], new_state [B, K-1, H]), contiguous.
    weight [2H, H, K] and bias [2H] in x_t's dtype or float32 (read through ``packed_weight``)."""
    if x_t.dim() != 2 or weight.dim() != 3:
        raise ValueError(f"x_t must be [B, H] and weight [2H, H, K]; got {tuple(x_t.shape)}, {tuple(weight.shape)}")
    B, H = x_t.shape
    K = weight.shape[2]
    if tuple(weight.shape[:2]) != (2 * H, H) or K < 1 or tuple(state.shape) != (B, K - 1, H):
        raise ValueError(f"weight must be [{2 * H}, {H}, K >= 1] and state [{B}, K-1, {H}]; got "
                         f"{tuple(weight.shape)}, {tuple(state.shape)}")
    if state.dtype != x_t.dtype or state.device != x_t.device:
        raise TypeError(f"state must have x_t's dtype {x_t.dtype} and device {x_t.device}, got {state.dtype} on "
                        f"{state.device}")
    _check_params(x_t, weight, bias)
    y = torch.empty((B, H), dtype=x_t.dtype, device=x_t.device)
    new_state = torch.empty((B, K - 1, H), dtype=state.dtype, device=state.device)
    if y.numel() == 0:
        return y, new_state
    w = packed_weight(weight, x_t.dtype)
    launch(
        _glu_conv1d_step, lambda meta: (triton.cdiv(H, meta["BLOCK_N"]), triton.cdiv(B, meta["BLOCK_B"])),
        x_t, state, w, _contiguous_or(bias, x_t), y, new_state,
        B, H, float(scale), triton.next_power_of_2(B),
        *x_t.stride(), *state.stride(),
        K=K, HAS_BIAS=bias is not None, RESIDUAL=bool(residual),
        **dtype_constants(x_t.dtype))
    return y, new_state


# Configurations that spill registers with TF32x3 fp32 dots (three passes, every operand split in two), found by
# ``make gpu-compile`` (docs/gpu-compile.md): the autotuner skips them there.
_TF32X3_SPILLS = {(32, 64, 32, 4, 3), (64, 64, 16, 4, 3), (64, 128, 32, 8, 3), (64, 32, 64, 8, 3)}


def _prune_tf32x3(configs: list, named_args: dict, **kwargs) -> list:
    if kwargs.get("DOT_PRECISION") != "tf32x3":
        return configs
    kept = [c for c in configs if tuple(c.kwargs.values()) + (c.num_warps, c.num_stages) not in _TF32X3_SPILLS]
    return kept or configs[:1]


_PRUNE = {"early_config_prune": _prune_tf32x3}
_glu_conv1d_fwd = triton.autotune(_FWD_CONFIGS, key=["H", "K", "ROWS_BUCKET"], prune_configs_by=_PRUNE)(
    _glu_conv1d_fwd_kernel)
_glu_dpre = triton.autotune(_DPRE_CONFIGS, key=["H"])(_glu_dpre_kernel)
_glu_conv1d_dx = triton.autotune(_DX_CONFIGS, key=["H", "K", "ROWS_BUCKET"], prune_configs_by=_PRUNE)(
    _glu_conv1d_dx_kernel)
_glu_conv1d_dw = triton.autotune(_DW_CONFIGS, key=["H", "K", "ROWS_BUCKET"])(_glu_conv1d_dw_kernel)
_glu_conv1d_step = triton.autotune(_STEP_CONFIGS, key=["H", "K", "B_BUCKET"], prune_configs_by=_PRUNE)(
    _glu_conv1d_step_kernel)


# ---------------------------------------------------------------------------------------------
# Custom ops (device types unrestricted: CPU tensors run under TRITON_INTERPRET=1)
# ---------------------------------------------------------------------------------------------

def _fwd_fake(x, weight, bias, mask, pad_left, residual, scale):
    B, T, H = x.shape
    return x.new_empty((B, T, H)), x.new_empty((B, T, 2 * H))


def _bwd_fake(grad_y, x, weight, mask, aux, pad_left, residual, scale, has_bias):
    return (x.new_empty(x.shape), weight.new_empty(weight.shape),
            weight.new_empty((weight.shape[0],)) if has_bias else None)


def _step_fake(x_t, state, weight, bias, residual, scale):
    return x_t.new_empty(x_t.shape), state.new_empty(state.shape)


register("glu_conv1d_fwd", glu_conv1d_fwd, _SCHEMAS["glu_conv1d_fwd"], _fwd_fake)
register("glu_conv1d_bwd", glu_conv1d_bwd, _SCHEMAS["glu_conv1d_bwd"], _bwd_fake)
register("glu_conv1d_step", glu_conv1d_step, _SCHEMAS["glu_conv1d_step"], _step_fake)
