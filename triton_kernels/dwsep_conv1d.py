"""Triton kernels of the fused depthwise-separable conv1d: y = act(pw(dw(x) + dw_b) + pw_b) + residual.

Shapes: x [B, L, C_in]; dw_weight [C_in, 1, K]; dw_bias [C_in]?; pw_weight [C_out, C_in, 1];
pw_bias [C_out]?; residual [B, L, C_out]?; zero padding of ``pad_left`` on the left and
``K - 1 - pad_left`` on the right; act is ReLU or the identity.

Importing this module registers the custom ops (CUDA tensors; CPU tensors under TRITON_INTERPRET=1)::

    fastqa_triton::dwsep_conv1d_fwd(x, dw_weight, dw_bias?, pw_weight, pw_bias?, residual?,
                                    pad_left, relu) -> (y, aux)
    fastqa_triton::dwsep_conv1d_bwd(grad_y, x, dw_weight, dw_bias?, pw_weight, pw_bias?, aux,
                                    pad_left, relu)
        -> (grad_x, grad_dw_weight, grad_dw_bias, grad_pw_weight, grad_pw_bias)

and, Triton-only (no C++ counterpart yet), the variant with the pre-LayerNorm over C_in fused in
front, y = act(pw(dw(LN(x)) + dw_b) + pw_b) + residual (LN with weight and bias, zero padding
applied after the LN, as in a QANet conv sublayer)::

    fastqa_triton::ln_dwsep_conv1d_fwd(x, ln_weight, ln_bias, eps, dw_weight, dw_bias?, pw_weight,
                                       pw_bias?, residual?, pad_left, relu) -> (y, aux, ln_stats)
    fastqa_triton::ln_dwsep_conv1d_bwd(grad_y, x, ln_weight, ln_bias, dw_weight, dw_bias?, pw_weight,
                                       pw_bias?, aux, ln_stats, pad_left, relu)
        -> (grad_x, grad_ln_weight, grad_ln_bias, grad_dw_weight, grad_dw_bias, grad_pw_weight,
            grad_pw_bias)

Forward tiling (``_fwd_kernel``, grid (L tiles, C_out blocks, B)): a program owns a
[BLOCK_L, BLOCK_N] output tile and loops over the input channels in chunks of BLOCK_C. For each chunk
it computes the depthwise conv in fp32 registers -- K shifted, masked loads of the x tile (the K - 1
halo rows come through the cache; out-of-range rows read as the zero padding) times the taps, plus
dw_bias -- rounds it to the input dtype and feeds it to ``tl.dot`` with the [BLOCK_C, BLOCK_N] slice
of the pointwise weight, accumulating in fp32. The epilogue adds pw_bias, applies ReLU, adds the
residual and stores y once, in the input dtype. The depthwise output [B, L, C_in] never reaches
memory.

Saved (``aux``): with ``relu`` the ReLU mask (NOT pre-activation <= 0: a NaN passes its gradient, as
torch's threshold_backward does) bit-packed, uint8
[B, L, ceil(C_out / 8)], bit ``o % 8`` of byte ``o // 8`` for output channel o (1/8 of a byte per
output element, instead of re-running the whole forward GEMM in backward). Without ``relu`` aux is
an empty uint8 tensor. Nothing else is saved.

LayerNorm variant: ``_ln_stats_kernel`` first writes the row statistics ``ln_stats`` [B, 2, L]
(mean, 1/std; fp32, fp64 for fp64 inputs; whole rows in registers, two-pass); every kernel that
reads x then normalises it on load (``_load_rows``), so LN(x) is never stored either. ln_stats is
the only extra saved tensor.

Backward, with g = grad_y * relu_mask and h = dw(x) + dw_b recomputed from x (never saved):
  * ``_bwd_dh_kernel`` (grid (row splits, C_in blocks)): grad_h = g @ pw_weight for a
    [BLOCK_L, BLOCK_C] tile, looping over C_out in BLOCK_N chunks; grad_h is stored (fp32,
    [B, L, C_in] scratch) for the transposed conv, and each program accumulates its fp32 partials of
    grad_dw_bias = sum_rows grad_h and grad_dw_weight[c, k] = sum_rows grad_h * x shifted by k.
  * ``_bwd_dx_kernel`` (grid (L tiles, C_in blocks, B)): grad_x = the transposed depthwise conv of
    grad_h (taps flipped, same shifted-load helper as the forward).
  * ``_bwd_dpw_kernel`` (grid (row splits, C_out blocks, C_in blocks)): per-program fp32 partials of
    grad_pw_weight = g^T @ h (h recomputed per row tile) and grad_pw_bias = sum_rows g.
  * LayerNorm variant: grad_x comes from ``_bwd_dx_ln_kernel`` instead (grid (row splits,)): whole
    rows (BLOCK_C = next_pow2(C_in)) so the LN backward's row reductions stay in registers; it also
    writes the per-program partials of grad_ln_weight / grad_ln_bias.
"Row splits" are a fixed number of contiguous groups of (batch, L-tile) tiles per program, chosen
from the shapes and the device only (never from the autotuned block sizes), so every program writes
exactly one partial slot and the partials are summed afterwards by torch: no atomics, bitwise
reproducible backward (as long as the autotuner's choice, cached per key, stays the same).

Strides: activations (x, residual, grad_y) are read through their strides, so channels-first and
other non-contiguous views need no copy; the small parameters (weights, biases) are made contiguous
in the launcher. Inputs and the incoming gradient are never written. Outputs and gradients are
contiguous; outputs and grad_x in the input dtype (fp32 / fp16 / bf16; fp64 also runs, e.g. in the
interpreter), each parameter's gradient in that parameter's dtype, straight from the fp32 partial sums.

Parameters in float32 (``ACCEPTS_FP32_WEIGHTS``, the contract in ``_common``): dw_weight, dw_bias,
pw_weight, pw_bias, ln_weight and ln_bias may each be float32 with fp16 / bf16 activations; the kernels
round them to the activations' dtype as they load them (``round_to``), so the results are bit for bit
those of the same call with the parameters cast first, and their gradients come back in fp32.

Precision: fp32 accumulation everywhere (fp64 for fp64 inputs, so gradcheck can run in the
interpreter). fp16 / bf16 operands go to tensor cores; fp32 dots follow the package-wide
policy of ``_common.dot_precision`` (TF32x3 unless torch's float32 matmul precision allows TF32).

Autotuning: block sizes and num_warps, keyed on the channel counts, K and a power-of-two bucket of
the length (forward / grad_x) or of B * L (the split reductions). Under TRITON_INTERPRET=1 each
kernel has a single small config (32 rows x 16 channels; 16 whole rows for the LayerNorm kernels)
so the interpreter stays fast.
"""
from typing import Dict, Optional, Tuple

import torch
import triton
import triton.language as tl

from fastqa._checks import check_optional, check_tensor

from ._common import (accumulator_dtype, bucket, check_param, configs, dtype_constants, launch, register, round_to,
                      sm_count, tile_range)

#: Parameters (dw/pw weights and biases, LayerNorm weight and bias) in float32 with fp16 / bf16 activations:
#: see ``_common``'s docstring.
ACCEPTS_FP32_WEIGHTS = True

_NAMES_LNC = ("BLOCK_L", "BLOCK_N", "BLOCK_C")
_INTERPRET_LNC = {"BLOCK_L": 32, "BLOCK_N": 16, "BLOCK_C": 16}

_FWD_CONFIGS = configs(_NAMES_LNC, [
    (32, 64, 32, 8, 3), (32, 64, 16, 4, 3), (16, 64, 32, 4, 3), (64, 64, 16, 8, 3), (32, 128, 16, 8, 3),
    (32, 64, 16, 4, 2)], _INTERPRET_LNC)
_DH_CONFIGS = configs(_NAMES_LNC, [
    (32, 64, 64, 8, 2), (32, 32, 32, 8, 3), (32, 64, 64, 8, 1)], _INTERPRET_LNC)
_DX_CONFIGS = configs(("BLOCK_L", "BLOCK_C"), [
    (32, 64, 4, 2), (64, 64, 4, 2), (32, 128, 4, 2), (128, 64, 8, 2)],
    {"BLOCK_L": 32, "BLOCK_C": 16})
_DPW_CONFIGS = configs(_NAMES_LNC, [
    (16, 64, 32, 4, 3), (32, 64, 16, 4, 3), (16, 128, 64, 8, 3), (32, 128, 32, 8, 3)], _INTERPRET_LNC)

# Whole-row kernels of the LayerNorm variant: only the row count and warps are tuned.
_STATS_CONFIGS = configs(("BLOCK_R",), [(4, 4, 1), (8, 4, 1), (16, 8, 1)])
_DXLN_CONFIGS = configs(("BLOCK_L",), [(16, 4, 2), (32, 8, 2)])


def _prune(configs: list, named_args: dict, **kwargs) -> list:
    """Drop configs whose channel blocks exceed the (power-of-two rounded) channel counts: they only
    add masked lanes. Falls back to the first config if none is left."""
    limits = {"BLOCK_N": named_args.get("C_out"), "BLOCK_C": named_args.get("C_in")}
    kept = [c for c in configs
            if all(c.kwargs.get(k, 0) <= max(16, triton.next_power_of_2(v)) for k, v in limits.items() if v)]
    return kept or configs[:1]


_PRUNE = {"early_config_prune": _prune}


# ----------------------------------------------------------------------------------------------------
# Device helpers
# ----------------------------------------------------------------------------------------------------
@triton.jit
def _load_rows(src, rows, offs_c, c_ok, L, s_l, s_c, stats_b, lnw_ptr, lnb_ptr, mask_b,
               HAS_LN: tl.constexpr, HAS_MASK: tl.constexpr, ACC: tl.constexpr):
    """src[rows, offs_c] as ACC, zero for rows outside [0, L) (the conv's zero padding).

    HAS_LN: the pre-LayerNorm is applied on the fly, (v - mean) * rstd * ln_w + ln_b, with the row
    statistics read from stats_b ([2, L]: mean, rstd of this batch row); the padding stays zero.
    HAS_MASK: rows whose mask (mask_b, [L] uint8 of this batch row) is 0 read as zero too.
    """
    r_ok = (rows >= 0) & (rows < L)
    if HAS_MASK:
        r_ok = r_ok & (tl.load(mask_b + rows, mask=r_ok, other=0) != 0)
    ok = r_ok[:, None] & c_ok[None, :]
    v = tl.load(src + rows[:, None] * s_l + offs_c[None, :] * s_c, mask=ok, other=0.0).to(ACC)
    if HAS_LN:
        mean = tl.load(stats_b + rows, mask=r_ok, other=0.0)
        rstd = tl.load(stats_b + L + rows, mask=r_ok, other=0.0)
        gamma = round_to(tl.load(lnw_ptr + offs_c, mask=c_ok, other=0.0), src.dtype.element_ty).to(ACC)
        beta = round_to(tl.load(lnb_ptr + offs_c, mask=c_ok, other=0.0), src.dtype.element_ty).to(ACC)
        v = tl.where(ok, (v - mean[:, None]) * rstd[:, None] * gamma[None, :] + beta[None, :], 0.0)
    return v


@triton.jit
def _depthwise_taps(src, w_ptr, offs_l, offs_c, c_ok, L, s_l, s_c, pad_left, stats_b, lnw_ptr, lnb_ptr, mask_b,
                    K: tl.constexpr, FLIP: tl.constexpr, HAS_LN: tl.constexpr, HAS_MASK: tl.constexpr,
                    BLOCK_L: tl.constexpr, BLOCK_C: tl.constexpr, ACC: tl.constexpr, W_DTYPE: tl.constexpr):
    """[BLOCK_L, BLOCK_C] in ACC: sum_k src[l + s_k, c] * w[c, k] (src LayerNorm-ed if HAS_LN), rows
    outside [0, L) reading as zero.

    s_k = k - pad_left is the forward depthwise conv; FLIP (s_k = pad_left - k) its transpose.
    w is the contiguous [C_in, K] depthwise weight, rounded to W_DTYPE (the activations' dtype) as loaded.
    """
    acc = tl.zeros((BLOCK_L, BLOCK_C), dtype=ACC)
    for k in tl.static_range(K):
        if FLIP:
            rows = offs_l + (pad_left - k)
        else:
            rows = offs_l + (k - pad_left)
        v = _load_rows(src, rows, offs_c, c_ok, L, s_l, s_c, stats_b, lnw_ptr, lnb_ptr, mask_b, HAS_LN, HAS_MASK, ACC)
        w = round_to(tl.load(w_ptr + offs_c * K + k, mask=c_ok, other=0.0), W_DTYPE)
        acc += v * w.to(ACC)[None, :]
    return acc


@triton.jit
def _depthwise_out(x_b, dww_ptr, dwb_ptr, offs_l, offs_c, c_ok, L, s_xl, s_xc, pad_left, stats_b, lnw_ptr, lnb_ptr,
                   mask_b, K: tl.constexpr, HAS_DW_BIAS: tl.constexpr, HAS_LN: tl.constexpr, HAS_MASK: tl.constexpr,
                   BLOCK_L: tl.constexpr, BLOCK_C: tl.constexpr, ACC: tl.constexpr):
    """h = dw(LN?(x), masked rows zero) + dw_bias for one [BLOCK_L, BLOCK_C] tile of batch row x_b, in ACC."""
    h = _depthwise_taps(x_b, dww_ptr, offs_l, offs_c, c_ok, L, s_xl, s_xc, pad_left, stats_b, lnw_ptr, lnb_ptr,
                        mask_b, K, False, HAS_LN, HAS_MASK, BLOCK_L, BLOCK_C, ACC, x_b.dtype.element_ty)
    if HAS_DW_BIAS:
        h += round_to(tl.load(dwb_ptr + offs_c, mask=c_ok, other=0.0), x_b.dtype.element_ty).to(ACC)[None, :]
    return h


@triton.jit
def _masked_grad(gy_ptr, bits_ptr, b, offs_l, offs_n, L, C_out, s_gb, s_gl, s_gn, RELU: tl.constexpr):
    """g = grad_y * relu_mask for a [BLOCK_L, BLOCK_N] tile (input dtype); zero outside the tensor."""
    ok = (offs_l < L)[:, None] & (offs_n < C_out)[None, :]
    g = tl.load(gy_ptr + b * s_gb + offs_l[:, None] * s_gl + offs_n[None, :] * s_gn, mask=ok, other=0.0)
    if RELU:
        n_bytes = (C_out + 7) // 8
        byte = tl.load(bits_ptr + (b * L + offs_l)[:, None] * n_bytes + (offs_n // 8)[None, :], mask=ok, other=0)
        on = ((byte.to(tl.int32) >> (offs_n % 8)[None, :]) & 1) != 0
        g = tl.where(on, g, tl.zeros_like(g))
    return g


@triton.jit
def _dot(a, b, acc, DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """acc + a @ b with the operands in DOT_DTYPE (see ``_common.dot_operand_dtype``), fp32 accumulation."""
    return tl.dot(a.to(DOT_DTYPE), b.to(DOT_DTYPE), acc, input_precision=DOT_PRECISION)


@triton.jit
def _row_split(B, L, BLOCK_L: tl.constexpr):
    """This row-split program's share (grid axis 0) of the B * cdiv(L, BLOCK_L) (batch, L-tile) tiles:
    (its split index, L-tiles per batch row, first tile, end tile), a contiguous range of tile indices."""
    pid_s = tl.program_id(0)
    n_lt = tl.cdiv(L, BLOCK_L)
    n_tiles = B * n_lt
    per = tl.cdiv(n_tiles, tl.num_programs(0))
    return pid_s, n_lt, pid_s * per, tl.minimum(n_tiles, (pid_s + 1) * per)


@triton.jit
def _split_tile(t, n_lt, BLOCK_L: tl.constexpr):
    """Tile t of a row split: its batch element (int64) and row offsets."""
    return (t // n_lt).to(tl.int64), (t % n_lt) * BLOCK_L + tl.arange(0, BLOCK_L)


# ----------------------------------------------------------------------------------------------------
# Kernels
# ----------------------------------------------------------------------------------------------------
@triton.autotune(configs=_FWD_CONFIGS, key=["C_in", "C_out", "K", "L_BUCKET"], prune_configs_by=_PRUNE)
@triton.jit(do_not_specialize=["L_BUCKET"])  # a tuning key only, never read
def _fwd_kernel(x_ptr, stats_ptr, lnw_ptr, lnb_ptr, dww_ptr, dwb_ptr, pww_ptr, pwb_ptr, res_ptr, y_ptr, bits_ptr,
                mask_ptr, L, C_in, C_out, L_BUCKET, pad_left,
                s_xb, s_xl, s_xc, s_rb, s_rl, s_rc,
                K: tl.constexpr, HAS_LN: tl.constexpr, HAS_DW_BIAS: tl.constexpr, HAS_PW_BIAS: tl.constexpr,
                HAS_RES: tl.constexpr, RELU: tl.constexpr, HAS_MASK: tl.constexpr,
                DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr, ACC: tl.constexpr,
                BLOCK_L: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr):
    pid_n = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    offs_l, l_ok = tile_range(tl.program_id(0) * BLOCK_L, BLOCK_L, L)
    offs_n, n_ok = tile_range(pid_n * BLOCK_N, BLOCK_N, C_out)
    x_b = x_ptr + b * s_xb
    stats_b = stats_ptr + b * 2 * L
    dtype = x_ptr.dtype.element_ty

    acc = tl.zeros((BLOCK_L, BLOCK_N), dtype=ACC)
    for c0 in range(0, C_in, BLOCK_C):
        offs_c, c_ok = tile_range(c0, BLOCK_C, C_in)
        h = _depthwise_out(x_b, dww_ptr, dwb_ptr, offs_l, offs_c, c_ok, L, s_xl, s_xc, pad_left,
                           stats_b, lnw_ptr, lnb_ptr, mask_ptr + b * L, K, HAS_DW_BIAS, HAS_LN, HAS_MASK,
                           BLOCK_L, BLOCK_C, ACC)
        w = tl.load(pww_ptr + offs_n[None, :] * C_in + offs_c[:, None], mask=c_ok[:, None] & n_ok[None, :],
                    other=0.0)  # [BLOCK_C, BLOCK_N] = pw_weight^T slice
        acc = _dot(h.to(dtype), round_to(w, dtype), acc, DOT_DTYPE, DOT_PRECISION)

    if HAS_PW_BIAS:
        acc += round_to(tl.load(pwb_ptr + offs_n, mask=n_ok, other=0.0), dtype).to(ACC)[None, :]
    if RELU:
        # Pack the mask 8 channels per byte: bits are distinct, so the sum is an OR.
        bits = tl.where(acc <= 0, 0, 1) << (tl.arange(0, BLOCK_N) % 8)[None, :]
        packed = tl.sum(tl.reshape(bits, (BLOCK_L, BLOCK_N // 8, 8)), axis=2).to(tl.uint8)
        n_bytes = (C_out + 7) // 8
        offs_byte = pid_n * (BLOCK_N // 8) + tl.arange(0, BLOCK_N // 8)
        tl.store(bits_ptr + (b * L + offs_l)[:, None] * n_bytes + offs_byte[None, :], packed,
                 mask=l_ok[:, None] & (offs_byte < n_bytes)[None, :])
        acc = tl.where(acc < 0, 0.0, acc)  # not tl.maximum: a NaN stays NaN, as in torch.relu
    out_ok = l_ok[:, None] & n_ok[None, :]
    if HAS_RES:
        res = tl.load(res_ptr + b * s_rb + offs_l[:, None] * s_rl + offs_n[None, :] * s_rc, mask=out_ok, other=0.0)
        acc += res.to(ACC)
    tl.store(y_ptr + (b * L + offs_l)[:, None] * C_out + offs_n[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=out_ok)


@triton.autotune(configs=_DH_CONFIGS, key=["C_in", "C_out", "K", "ROWS_BUCKET"], prune_configs_by=_PRUNE)
@triton.jit(do_not_specialize=["ROWS_BUCKET"])  # a tuning key only, never read
def _bwd_dh_kernel(gy_ptr, bits_ptr, x_ptr, stats_ptr, lnw_ptr, lnb_ptr, pww_ptr, gh_ptr, pdwb_ptr, pdww_ptr,
                   mask_ptr, B, L, C_in, C_out, ROWS_BUCKET, pad_left,
                   s_gb, s_gl, s_gn, s_xb, s_xl, s_xc,
                   K: tl.constexpr, K_P2: tl.constexpr, HAS_LN: tl.constexpr, HAS_DW_BIAS: tl.constexpr,
                   RELU: tl.constexpr, HAS_MASK: tl.constexpr,
                   DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr, ACC: tl.constexpr,
                   BLOCK_L: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr):
    pid_s, n_lt, start, stop = _row_split(B, L, BLOCK_L)
    offs_c, c_ok = tile_range(tl.program_id(1) * BLOCK_C, BLOCK_C, C_in)
    taps = tl.arange(0, K_P2)

    acc_db = tl.zeros((BLOCK_C,), dtype=ACC)
    acc_dw = tl.zeros((K_P2, BLOCK_C), dtype=ACC)
    for t in range(start, stop):
        b, offs_l = _split_tile(t, n_lt, BLOCK_L)
        gh = tl.zeros((BLOCK_L, BLOCK_C), dtype=ACC)
        for n0 in range(0, C_out, BLOCK_N):
            offs_n = n0 + tl.arange(0, BLOCK_N)
            g = _masked_grad(gy_ptr, bits_ptr, b, offs_l, offs_n, L, C_out, s_gb, s_gl, s_gn, RELU)
            w = tl.load(pww_ptr + offs_n[:, None] * C_in + offs_c[None, :],
                        mask=(offs_n < C_out)[:, None] & c_ok[None, :], other=0.0)  # [BLOCK_N, BLOCK_C]
            gh = _dot(g, round_to(w, x_ptr.dtype.element_ty), gh, DOT_DTYPE, DOT_PRECISION)
        # Rows past L have g = 0, hence gh = 0: they add nothing to the partials below.
        tl.store(gh_ptr + (b * L + offs_l)[:, None] * C_in + offs_c[None, :], gh,
                 mask=(offs_l < L)[:, None] & c_ok[None, :])
        acc_db += tl.sum(gh, axis=0)
        for k in tl.static_range(K):
            xs = _load_rows(x_ptr + b * s_xb, offs_l + (k - pad_left), offs_c, c_ok, L, s_xl, s_xc,
                            stats_ptr + b * 2 * L, lnw_ptr, lnb_ptr, mask_ptr + b * L, HAS_LN, HAS_MASK, ACC)
            acc_dw += tl.where(taps[:, None] == k, tl.sum(gh * xs, axis=0)[None, :], 0.0)

    tl.store(pdww_ptr + pid_s * C_in * K + offs_c[None, :] * K + taps[:, None], acc_dw,
             mask=(taps < K)[:, None] & c_ok[None, :])
    if HAS_DW_BIAS:
        tl.store(pdwb_ptr + pid_s * C_in + offs_c, acc_db, mask=c_ok)


@triton.autotune(configs=_DX_CONFIGS, key=["C_in", "K", "L_BUCKET"], prune_configs_by=_PRUNE)
@triton.jit(do_not_specialize=["L_BUCKET"])  # a tuning key only, never read
def _bwd_dx_kernel(gh_ptr, dww_ptr, gx_ptr, L, C_in, L_BUCKET, pad_left,
                   K: tl.constexpr, ACC: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_C: tl.constexpr):
    b = tl.program_id(2).to(tl.int64)
    offs_l, l_ok = tile_range(tl.program_id(0) * BLOCK_L, BLOCK_L, L)
    offs_c, c_ok = tile_range(tl.program_id(1) * BLOCK_C, BLOCK_C, C_in)
    gx = _depthwise_taps(gh_ptr + b * L * C_in, dww_ptr, offs_l, offs_c, c_ok, L, C_in, 1, pad_left,
                         gh_ptr, gh_ptr, gh_ptr, gh_ptr, K, True, False, False, BLOCK_L, BLOCK_C, ACC,
                         gx_ptr.dtype.element_ty)
    tl.store(gx_ptr + (b * L + offs_l)[:, None] * C_in + offs_c[None, :], gx.to(gx_ptr.dtype.element_ty),
             mask=l_ok[:, None] & c_ok[None, :])


@triton.autotune(configs=_DPW_CONFIGS, key=["C_in", "C_out", "K", "ROWS_BUCKET"], prune_configs_by=_PRUNE)
@triton.jit(do_not_specialize=["ROWS_BUCKET"])  # a tuning key only, never read
def _bwd_dpw_kernel(gy_ptr, bits_ptr, x_ptr, stats_ptr, lnw_ptr, lnb_ptr, dww_ptr, dwb_ptr, ppw_ptr, ppwb_ptr,
                    mask_ptr, B, L, C_in, C_out, ROWS_BUCKET, pad_left,
                    s_gb, s_gl, s_gn, s_xb, s_xl, s_xc,
                    K: tl.constexpr, HAS_LN: tl.constexpr, HAS_DW_BIAS: tl.constexpr, HAS_PW_BIAS: tl.constexpr,
                    RELU: tl.constexpr, HAS_MASK: tl.constexpr,
                    DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr, ACC: tl.constexpr,
                    BLOCK_L: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr):
    pid_s, n_lt, start, stop = _row_split(B, L, BLOCK_L)
    pid_c = tl.program_id(2)
    offs_n, n_ok = tile_range(tl.program_id(1) * BLOCK_N, BLOCK_N, C_out)
    offs_c, c_ok = tile_range(pid_c * BLOCK_C, BLOCK_C, C_in)

    acc = tl.zeros((BLOCK_N, BLOCK_C), dtype=ACC)
    acc_b = tl.zeros((BLOCK_N,), dtype=ACC)
    for t in range(start, stop):
        b, offs_l = _split_tile(t, n_lt, BLOCK_L)
        g = _masked_grad(gy_ptr, bits_ptr, b, offs_l, offs_n, L, C_out, s_gb, s_gl, s_gn, RELU)
        # Rows past L hold h = dw_bias but g = 0 there, so they add nothing.
        h = _depthwise_out(x_ptr + b * s_xb, dww_ptr, dwb_ptr, offs_l, offs_c, c_ok, L, s_xl, s_xc, pad_left,
                           stats_ptr + b * 2 * L, lnw_ptr, lnb_ptr, mask_ptr + b * L, K, HAS_DW_BIAS, HAS_LN, HAS_MASK,
                           BLOCK_L, BLOCK_C, ACC)
        acc = _dot(tl.trans(g), h.to(g.dtype), acc, DOT_DTYPE, DOT_PRECISION)
        acc_b += tl.sum(g.to(ACC), axis=0)

    tl.store(ppw_ptr + pid_s * C_out * C_in + offs_n[:, None] * C_in + offs_c[None, :], acc,
             mask=n_ok[:, None] & c_ok[None, :])
    if HAS_PW_BIAS:
        if pid_c == 0:  # one C_in block writes the bias partial
            tl.store(ppwb_ptr + pid_s * C_out + offs_n, acc_b, mask=n_ok)


@triton.autotune(configs=_STATS_CONFIGS, key=["C_in"])
@triton.jit
def _ln_stats_kernel(x_ptr, stats_ptr, R, L, C_in, eps, s_xb, s_xl, s_xc,
                     ACC: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """Mean and 1/std over C_in of BLOCK_R rows (of the B * L), whole rows in registers (two-pass).

    Both passes run on the row shifted by its first value: a constant row then has a mean equal to its value
    exactly and a variance of exactly 0 (so LN(x) is exactly ln_bias and 1/std exactly 1/sqrt(eps), the
    scale of its gradient), where an accumulated sum / C_in would round (by one ulp of the row's value,
    which with a tiny eps outweighs eps and rescales the gradient, and turns the zeros of x - mean into
    +-1 after normalisation). The shift also keeps the sums small for rows far from zero."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    r_ok = rows < R
    b = (rows // L).to(tl.int64)
    l = rows % L
    offs_c = tl.arange(0, BLOCK_C)
    ok = r_ok[:, None] & (offs_c < C_in)[None, :]
    row_ptr = x_ptr + b * s_xb + l * s_xl
    v = tl.load(row_ptr[:, None] + offs_c[None, :] * s_xc, mask=ok, other=0.0).to(ACC)
    first = tl.load(row_ptr, mask=r_ok, other=0.0).to(ACC)
    shifted = tl.where(ok, v - first[:, None], 0.0)
    mean_shifted = tl.sum(shifted, axis=1) / C_in
    mean = first + mean_shifted
    d = tl.where(ok, shifted - mean_shifted[:, None], 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(d * d, axis=1) / C_in + eps)
    tl.store(stats_ptr + b * 2 * L + l, mean, mask=r_ok)
    tl.store(stats_ptr + b * 2 * L + L + l, rstd, mask=r_ok)


@triton.autotune(configs=_DXLN_CONFIGS, key=["C_in", "K", "ROWS_BUCKET"])
@triton.jit(do_not_specialize=["ROWS_BUCKET"])  # a tuning key only, never read
def _bwd_dx_ln_kernel(gh_ptr, dww_ptr, x_ptr, stats_ptr, lnw_ptr, gx_ptr, plnw_ptr, plnb_ptr, mask_ptr,
                      B, L, C_in, ROWS_BUCKET, pad_left, s_xb, s_xl, s_xc,
                      K: tl.constexpr, HAS_MASK: tl.constexpr, ACC: tl.constexpr, BLOCK_L: tl.constexpr,
                      BLOCK_C: tl.constexpr):
    """grad_x through the transposed depthwise conv and the LayerNorm, whole rows per tile
    (BLOCK_C >= C_in), plus this row split's partials of the LayerNorm weight / bias gradients.
    HAS_MASK: masked rows (their LN output was replaced by 0) pass no gradient on."""
    pid_s, n_lt, start, stop = _row_split(B, L, BLOCK_L)
    offs_c, c_ok = tile_range(0, BLOCK_C, C_in)
    gamma = round_to(tl.load(lnw_ptr + offs_c, mask=c_ok, other=0.0), gx_ptr.dtype.element_ty).to(ACC)

    acc_w = tl.zeros((BLOCK_C,), dtype=ACC)
    acc_b = tl.zeros((BLOCK_C,), dtype=ACC)
    for t in range(start, stop):
        b, offs_l = _split_tile(t, n_lt, BLOCK_L)
        l_ok = offs_l < L
        ok = l_ok[:, None] & c_ok[None, :]
        stats_b = stats_ptr + b * 2 * L
        g_xn = _depthwise_taps(gh_ptr + b * L * C_in, dww_ptr, offs_l, offs_c, c_ok, L, C_in, 1, pad_left,
                               gh_ptr, gh_ptr, gh_ptr, gh_ptr, K, True, False, False, BLOCK_L, BLOCK_C, ACC,
                               gx_ptr.dtype.element_ty)
        if HAS_MASK:
            l_ok = l_ok & (tl.load(mask_ptr + b * L + offs_l, mask=l_ok, other=0) != 0)
        g_xn = tl.where(l_ok[:, None] & c_ok[None, :], g_xn, 0.0)  # rows past L (and masked rows): none
        mean = tl.load(stats_b + offs_l, mask=l_ok, other=0.0)
        rstd = tl.load(stats_b + L + offs_l, mask=l_ok, other=0.0)
        x = tl.load(x_ptr + b * s_xb + offs_l[:, None] * s_xl + offs_c[None, :] * s_xc, mask=ok, other=0.0)
        xhat = tl.where(ok, (x.to(ACC) - mean[:, None]) * rstd[:, None], 0.0)
        g_xhat = g_xn * gamma[None, :]
        m1 = tl.sum(g_xhat, axis=1) / C_in
        m2 = tl.sum(g_xhat * xhat, axis=1) / C_in
        gx = rstd[:, None] * (g_xhat - m1[:, None] - xhat * m2[:, None])
        tl.store(gx_ptr + (b * L + offs_l)[:, None] * C_in + offs_c[None, :], gx.to(gx_ptr.dtype.element_ty),
                 mask=ok)
        acc_w += tl.sum(g_xn * xhat, axis=0)
        acc_b += tl.sum(g_xn, axis=0)

    tl.store(plnw_ptr + pid_s * C_in + offs_c, acc_w, mask=c_ok)
    tl.store(plnb_ptr + pid_s * C_in + offs_c, acc_b, mask=c_ok)


# ----------------------------------------------------------------------------------------------------
# Launchers
# ----------------------------------------------------------------------------------------------------
def _num_splits(device: torch.device, B: int, L: int, programs_per_split: int) -> int:
    """Row groups of the split-reduction kernels: about two waves of programs on the GPU, at most one
    group per 16-row tile. Depends only on shapes and device, so the reduction order (and the bits of
    the weight gradients) is the same on every call."""
    # Interpreter: a few groups, enough to exercise the reduction.
    target = 2 * sm_count(device) if device.type == "cuda" else 3
    return max(1, min(B * triton.cdiv(L, 16), triton.cdiv(target, programs_per_split)))


def _check_args(x: torch.Tensor, dw_weight: torch.Tensor, dw_bias: Optional[torch.Tensor],
                pw_weight: torch.Tensor, pw_bias: Optional[torch.Tensor], pad_left: int) -> None:
    """Shapes, dtypes and devices the kernels rely on (they read by these sizes, unchecked)."""
    check_tensor("x", x, ndim=3)
    C_in = x.shape[2]
    check_param("dw_weight", dw_weight, x, shape=(C_in, 1, None))
    check_param("pw_weight", pw_weight, x, shape=(None, C_in, 1))
    check_param("dw_bias", dw_bias, x, shape=(C_in,))
    check_param("pw_bias", pw_bias, x, shape=(pw_weight.shape[0],))
    if C_in == 0 or pw_weight.shape[0] == 0:
        raise ValueError(f"x and pw_weight need at least one channel, got C_in={C_in}, C_out={pw_weight.shape[0]}")
    K = dw_weight.shape[2]
    if K < 1 or not 0 <= pad_left <= K - 1:
        raise ValueError(f"pad_left must be in [0, K - 1] = [0, {K - 1}], got {pad_left}")


def _check_ln(x: torch.Tensor, ln_weight: torch.Tensor, ln_bias: torch.Tensor) -> None:
    check_param("ln_weight", ln_weight, x, shape=(x.shape[2],))
    check_param("ln_bias", ln_bias, x, shape=(x.shape[2],))


def _row_mask(mask: Optional[torch.Tensor], x: torch.Tensor) -> Optional[torch.Tensor]:
    """The optional [B, L] bool row mask, checked, as contiguous uint8 (what the kernels read)."""
    if mask is None:
        return None
    check_tensor("mask", mask, shape=x.shape[:2], dtype=torch.bool, floating=False, like=x)
    return mask.contiguous().view(torch.uint8)


def _forward(x: torch.Tensor, ln: Optional[Tuple[torch.Tensor, torch.Tensor, float]], dw_weight: torch.Tensor,
             dw_bias: Optional[torch.Tensor], pw_weight: torch.Tensor, pw_bias: Optional[torch.Tensor],
             residual: Optional[torch.Tensor], pad_left: int, relu: bool, mask: Optional[torch.Tensor] = None
             ) -> Tuple[torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor]]:
    """y, aux (packed ReLU mask; None without ReLU) and the LayerNorm row statistics ([B, 2, L]: mean, rstd,
    in the accumulation dtype; None without ``ln`` = (ln_weight, ln_bias, eps)). mask: [B, L] bool,
    rows where it is False enter the depthwise conv as zeros (after the LayerNorm)."""
    _check_args(x, dw_weight, dw_bias, pw_weight, pw_bias, pad_left)
    B, L, C_in = x.shape
    mask_u8 = _row_mask(mask, x)
    C_out, K = pw_weight.shape[0], dw_weight.shape[-1]
    check_optional("residual", residual, shape=(B, L, C_out), like=x)
    y = torch.empty((B, L, C_out), dtype=x.dtype, device=x.device)
    aux = torch.empty((B, L, triton.cdiv(C_out, 8)), dtype=torch.uint8, device=x.device) if relu else None
    stats = torch.empty((B, 2, L), dtype=accumulator_dtype(x.dtype), device=x.device) if ln is not None else None
    if B * L == 0:
        return y, aux, stats
    dtype_args = dtype_constants(x.dtype)
    lnw = lnb = x  # dummy pointers when there is no LayerNorm (never read)
    if ln is not None:
        _check_ln(x, ln[0], ln[1])
        lnw, lnb = ln[0].contiguous(), ln[1].contiguous()
        launch(_ln_stats_kernel, lambda meta: (triton.cdiv(B * L, meta["BLOCK_R"]),),
               x, stats, B * L, L, C_in, ln[2], x.stride(0), x.stride(1), x.stride(2),
               ACC=dtype_args["ACC"], BLOCK_C=triton.next_power_of_2(C_in))
    res = residual if residual is not None else y  # dummy pointer when absent (never read)
    grid = lambda meta: (triton.cdiv(L, meta["BLOCK_L"]), triton.cdiv(C_out, meta["BLOCK_N"]), B)  # noqa: E731
    # Dummy pointers (never read or written) for what is absent.
    launch(
        _fwd_kernel, grid, x, x if stats is None else stats, lnw, lnb, dw_weight.contiguous(),
        x if dw_bias is None else dw_bias.contiguous(), pw_weight.contiguous(),
        x if pw_bias is None else pw_bias.contiguous(), res, y, y if aux is None else aux,
        x if mask_u8 is None else mask_u8, L, C_in, C_out, bucket(L, 1024), pad_left,
        x.stride(0), x.stride(1), x.stride(2), res.stride(0), res.stride(1), res.stride(2),
        K=K, HAS_LN=ln is not None, HAS_DW_BIAS=dw_bias is not None, HAS_PW_BIAS=pw_bias is not None,
        HAS_RES=residual is not None, RELU=relu, HAS_MASK=mask_u8 is not None, **dtype_args)
    return y, aux, stats


def _check_backward_args(grad_y: torch.Tensor, x: torch.Tensor,
                         ln: Optional[Tuple[torch.Tensor, torch.Tensor, torch.Tensor]], dw_weight: torch.Tensor,
                         dw_bias: Optional[torch.Tensor], pw_weight: torch.Tensor, pw_bias: Optional[torch.Tensor],
                         aux: Optional[torch.Tensor], pad_left: int, relu: bool) -> None:
    """The forward's checks, and grad_y: [B, L, C_out], aux as the forward left it, ln_stats: [B, 2, L]."""
    _check_args(x, dw_weight, dw_bias, pw_weight, pw_bias, pad_left)
    B, L, _ = x.shape
    C_out = pw_weight.shape[0]
    check_tensor("grad_y", grad_y, shape=(B, L, C_out), like=x)
    if relu:
        check_tensor("aux", aux, shape=(B, L, triton.cdiv(C_out, 8)), dtype=torch.uint8, floating=False, like=x)
    elif aux is not None:
        raise ValueError("aux must be None without relu (the forward's), got a tensor")
    if ln is not None:
        _check_ln(x, ln[0], ln[1])
        check_tensor("ln_stats", ln[2], shape=(B, 2, L), dtype=accumulator_dtype(x.dtype))
        if ln[2].device != x.device:
            raise ValueError(f"ln_stats must be on {x.device} like the input, got {ln[2].device}")


def _backward(grad_y: torch.Tensor, x: torch.Tensor, ln: Optional[Tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
              dw_weight: torch.Tensor, dw_bias: Optional[torch.Tensor], pw_weight: torch.Tensor,
              pw_bias: Optional[torch.Tensor], aux: Optional[torch.Tensor], pad_left: int, relu: bool,
              mask: Optional[torch.Tensor] = None) -> Dict[str, Optional[torch.Tensor]]:
    """Gradients by input name: x, dw_weight, dw_bias, pw_weight, pw_bias, and with
    ``ln`` = (ln_weight, ln_bias, ln_stats) also ln_weight, ln_bias; an absent bias's is None.
    aux: the forward's (None without ReLU); mask: the forward's row mask."""
    _check_backward_args(grad_y, x, ln, dw_weight, dw_bias, pw_weight, pw_bias, aux, pad_left, relu)
    B, L, C_in = x.shape
    mask_u8 = _row_mask(mask, x)
    mask_ptr = x if mask_u8 is None else mask_u8  # a dummy pointer when absent (never read)
    C_out, K = pw_weight.shape[0], dw_weight.shape[-1]
    dev, acc = x.device, accumulator_dtype(x.dtype)
    if B * L == 0:  # no rows: zero gradients, and no empty grid to launch
        inputs = {"x": x, "dw_weight": dw_weight, "dw_bias": dw_bias, "pw_weight": pw_weight, "pw_bias": pw_bias,
                  **({} if ln is None else {"ln_weight": ln[0], "ln_bias": ln[1]})}
        return {name: None if t is None else torch.zeros_like(t, memory_format=torch.contiguous_format)
                for name, t in inputs.items()}
    grad_x = torch.empty_like(x, memory_format=torch.contiguous_format)
    dww, pww = dw_weight.contiguous(), pw_weight.contiguous()
    dwb = x if dw_bias is None else dw_bias.contiguous()
    stats, lnw, lnb = (ln[2], ln[0].contiguous(), ln[1].contiguous()) if ln is not None else (x, x, x)
    dtype_args = dtype_constants(x.dtype)
    aux = grad_y if aux is None else aux  # a dummy pointer without ReLU (never read)
    rows_bucket = bucket(B * L, 1 << 16)
    strides = (grad_y.stride(0), grad_y.stride(1), grad_y.stride(2), x.stride(0), x.stride(1), x.stride(2))

    # grad_h (fp32 scratch) and the depthwise weight / bias partials.
    gh = torch.empty((B, L, C_in), dtype=acc, device=dev)
    s_dh = _num_splits(dev, B, L, triton.cdiv(C_in, 64))
    p_dww = torch.empty((s_dh, C_in, K), dtype=acc, device=dev)
    p_dwb = torch.empty((s_dh, C_in), dtype=acc, device=dev) if dw_bias is not None else None
    launch(
        _bwd_dh_kernel, lambda meta: (s_dh, triton.cdiv(C_in, meta["BLOCK_C"])), grad_y, aux, x, stats, lnw, lnb, pww, gh,
        p_dww if p_dwb is None else p_dwb, p_dww, mask_ptr, B, L, C_in, C_out, rows_bucket, pad_left, *strides,
        K=K, K_P2=triton.next_power_of_2(K), HAS_LN=ln is not None, HAS_DW_BIAS=dw_bias is not None, RELU=relu,
        HAS_MASK=mask_u8 is not None, **dtype_args)

    # grad_x: the transposed depthwise conv of grad_h (then back through the LayerNorm).
    if ln is None:
        launch(
            _bwd_dx_kernel, lambda meta: (triton.cdiv(L, meta["BLOCK_L"]), triton.cdiv(C_in, meta["BLOCK_C"]), B),
            gh, dww, grad_x, L, C_in, bucket(L, 1024), pad_left, K=K, ACC=dtype_args["ACC"])
    else:
        s_ln = _num_splits(dev, B, L, 1)
        p_lnw = torch.empty((s_ln, C_in), dtype=acc, device=dev)
        p_lnb = torch.empty((s_ln, C_in), dtype=acc, device=dev)
        launch(
            _bwd_dx_ln_kernel, (s_ln,), gh, dww, x, stats, lnw, grad_x, p_lnw, p_lnb, mask_ptr, B, L, C_in, rows_bucket,
            pad_left, x.stride(0), x.stride(1), x.stride(2), K=K, HAS_MASK=mask_u8 is not None, ACC=dtype_args["ACC"],
            BLOCK_C=triton.next_power_of_2(C_in))

    # Pointwise weight / bias partials, h recomputed from x.
    s_pw = _num_splits(dev, B, L, triton.cdiv(C_out, 64) * triton.cdiv(C_in, 64))
    p_pw = torch.empty((s_pw, C_out, C_in), dtype=acc, device=dev)
    p_pwb = torch.empty((s_pw, C_out), dtype=acc, device=dev) if pw_bias is not None else None
    launch(
        _bwd_dpw_kernel, lambda meta: (s_pw, triton.cdiv(C_out, meta["BLOCK_N"]), triton.cdiv(C_in, meta["BLOCK_C"])),
        grad_y, aux, x, stats, lnw, lnb, dww, dwb, p_pw, p_pw if p_pwb is None else p_pwb, mask_ptr, B, L, C_in, C_out, rows_bucket, pad_left,
        *strides, K=K, HAS_LN=ln is not None, HAS_DW_BIAS=dw_bias is not None, HAS_PW_BIAS=pw_bias is not None,
        RELU=relu, HAS_MASK=mask_u8 is not None, **dtype_args)

    # Each parameter's gradient in its own dtype, straight from the fp32 sums (no rounding for fp32 ones).
    grads = {"x": grad_x, "dw_weight": p_dww.sum(0).to(dw_weight.dtype).view(dw_weight.shape),
             "dw_bias": p_dwb.sum(0).to(dw_bias.dtype) if dw_bias is not None else None,
             "pw_weight": p_pw.sum(0).to(pw_weight.dtype).view(pw_weight.shape),
             "pw_bias": p_pwb.sum(0).to(pw_bias.dtype) if pw_bias is not None else None}
    if ln is not None:
        grads.update(ln_weight=p_lnw.sum(0).to(ln[0].dtype), ln_bias=p_lnb.sum(0).to(ln[1].dtype))
    return grads


# ----------------------------------------------------------------------------------------------------
# Custom ops. dwsep_conv1d_fwd / _bwd share their schemas with the C++ backend's fastqa:: ops; the
# ln_ variant (pre-LayerNorm fused in front: y = act(pw(dw(LN(x)))) + residual) is Triton-only.
# ----------------------------------------------------------------------------------------------------
FWD_SCHEMA = ("(Tensor x, Tensor dw_weight, Tensor? dw_bias, Tensor pw_weight, Tensor? pw_bias, "
              "Tensor? residual, int pad_left, bool relu) -> (Tensor y, Tensor? aux)")
BWD_SCHEMA = ("(Tensor grad_y, Tensor x, Tensor dw_weight, Tensor? dw_bias, Tensor pw_weight, Tensor? pw_bias, "
              "Tensor? aux, int pad_left, bool relu) -> (Tensor grad_x, Tensor grad_dw_weight, "
              "Tensor? grad_dw_bias, Tensor grad_pw_weight, Tensor? grad_pw_bias)")
LN_FWD_SCHEMA = ("(Tensor x, Tensor ln_weight, Tensor ln_bias, float eps, Tensor dw_weight, Tensor? dw_bias, "
                 "Tensor pw_weight, Tensor? pw_bias, Tensor? residual, Tensor? mask, int pad_left, bool relu) "
                 "-> (Tensor y, Tensor? aux, Tensor ln_stats)")
LN_BWD_SCHEMA = ("(Tensor grad_y, Tensor x, Tensor ln_weight, Tensor ln_bias, Tensor dw_weight, Tensor? dw_bias, "
                 "Tensor pw_weight, Tensor? pw_bias, Tensor? aux, Tensor ln_stats, Tensor? mask, int pad_left, bool relu) "
                 "-> (Tensor grad_x, Tensor grad_ln_weight, Tensor grad_ln_bias, Tensor grad_dw_weight, "
                 "Tensor? grad_dw_bias, Tensor grad_pw_weight, Tensor? grad_pw_bias)")


# Gradient outputs of the _bwd ops, in schema order.
_GRADS = ("x", "dw_weight", "dw_bias", "pw_weight", "pw_bias")
_LN_GRADS = ("x", "ln_weight", "ln_bias", "dw_weight", "dw_bias", "pw_weight", "pw_bias")


def _dwsep_fwd(x, dw_weight, dw_bias, pw_weight, pw_bias, residual, pad_left, relu):
    y, aux, _ = _forward(x, None, dw_weight, dw_bias, pw_weight, pw_bias, residual, pad_left, relu)
    return y, aux


def _dwsep_bwd(grad_y, x, dw_weight, dw_bias, pw_weight, pw_bias, aux, pad_left, relu):
    grads = _backward(grad_y, x, None, dw_weight, dw_bias, pw_weight, pw_bias, aux, pad_left, relu)
    return tuple(grads[name] for name in _GRADS)


def _ln_dwsep_fwd(x, ln_weight, ln_bias, eps, dw_weight, dw_bias, pw_weight, pw_bias, residual, mask, pad_left,
                  relu):
    return _forward(x, (ln_weight, ln_bias, eps), dw_weight, dw_bias, pw_weight, pw_bias, residual, pad_left, relu,
                    mask)


def _ln_dwsep_bwd(grad_y, x, ln_weight, ln_bias, dw_weight, dw_bias, pw_weight, pw_bias, aux, ln_stats, mask,
                  pad_left, relu):
    grads = _backward(grad_y, x, (ln_weight, ln_bias, ln_stats), dw_weight, dw_bias, pw_weight, pw_bias, aux,
                      pad_left, relu, mask)
    return tuple(grads[name] for name in _LN_GRADS)


def _fwd_outputs_fake(x, pw_weight, relu):
    B, L, _ = x.shape
    C_out = pw_weight.shape[0]
    return x.new_empty((B, L, C_out)), x.new_empty((B, L, (C_out + 7) // 8), dtype=torch.uint8) if relu else None


def _param_grads_fake(x, dw_weight, dw_bias, pw_weight, pw_bias):
    """Fake (grad_dw_weight, grad_dw_bias, grad_pw_weight, grad_pw_bias); absent biases: None."""
    return (dw_weight.new_empty(dw_weight.shape),
            None if dw_bias is None else dw_bias.new_empty(dw_bias.shape),
            pw_weight.new_empty(pw_weight.shape),
            None if pw_bias is None else pw_bias.new_empty(pw_bias.shape))


def _dwsep_fwd_fake(x, dw_weight, dw_bias, pw_weight, pw_bias, residual, pad_left, relu):
    return _fwd_outputs_fake(x, pw_weight, relu)


def _dwsep_bwd_fake(grad_y, x, dw_weight, dw_bias, pw_weight, pw_bias, aux, pad_left, relu):
    return (x.new_empty(x.shape),) + _param_grads_fake(x, dw_weight, dw_bias, pw_weight, pw_bias)


def _ln_dwsep_fwd_fake(x, ln_weight, ln_bias, eps, dw_weight, dw_bias, pw_weight, pw_bias, residual, mask, pad_left,
                       relu):
    B, L, _ = x.shape
    stats = x.new_empty((B, 2, L), dtype=accumulator_dtype(x.dtype))
    return _fwd_outputs_fake(x, pw_weight, relu) + (stats,)


def _ln_dwsep_bwd_fake(grad_y, x, ln_weight, ln_bias, dw_weight, dw_bias, pw_weight, pw_bias, aux, ln_stats, mask,
                       pad_left, relu):
    return ((x.new_empty(x.shape), ln_weight.new_empty(ln_weight.shape), ln_bias.new_empty(ln_bias.shape))
            + _param_grads_fake(x, dw_weight, dw_bias, pw_weight, pw_bias))


dwsep_conv1d_fwd = register("dwsep_conv1d_fwd", _dwsep_fwd, FWD_SCHEMA, _dwsep_fwd_fake)
dwsep_conv1d_bwd = register("dwsep_conv1d_bwd", _dwsep_bwd, BWD_SCHEMA, _dwsep_bwd_fake)
ln_dwsep_conv1d_fwd = register("ln_dwsep_conv1d_fwd", _ln_dwsep_fwd, LN_FWD_SCHEMA, _ln_dwsep_fwd_fake)
ln_dwsep_conv1d_bwd = register("ln_dwsep_conv1d_bwd", _ln_dwsep_bwd, LN_BWD_SCHEMA, _ln_dwsep_bwd_fake)
