"""Triton kernel of the seeded dropout + residual add (``fastqa.dropout_add``).

Registers, on import, ``fastqa_triton::dropout_add`` with the schema of the C++ ``fastqa::dropout_add``:

    dropout_add(branch [B, ...], residual [B, ...]?, example_scale [B]?, p, seed [1] int64) -> out [B, ...]
    out = residual + branch * (keep(seed, i) * keep_scale * example_scale[b])     (i: row-major element index)

keep(seed, i) is the counter-based hash that ``csrc/cpu/dropout_add.cpp`` states and
``fastqa/reference/dropout_add.py`` computes with torch integer ops: element pair j = i // 2 hashes to
h = mix(mix(lo32(j) ^ s0) ^ s1 ^ hi32(j)) (s0, s1 the seed's low and high 32 bits, mix the "lowbias32"
hash), element 2j reads h's low 16 bits and 2j + 1 its high 16 bits, and an element is kept when those
bits are >= drop = round(p * 65536). All of it is uint32 arithmetic here: Triton's uint32 multiply wraps
modulo 2^32 and its shifts of unsigned values are logical, which is what the reference's ``& 0xFFFFFFFF``
after each product and its shifts of non-negative int64 values give. So a seed gives the same mask on
every backend, and the backward is this kernel on the gradient (no residual): nothing is stored.

Rounding matches the reference bit for bit as well: the factor keep * keep_scale is rounded to the
input dtype, then multiplied by example_scale (rounded), then by the branch (rounded), then added to the
residual (rounded) -- each step an fp32 operation rounded to the dtype, as torch's elementwise ops on
16-bit tensors compute in fp32. Launches disable multiply-add contraction (``enable_fp_fusion=False``):
an fma of branch * factor + residual would round once where the reference rounds twice.

One program per BLOCK elements (int64 offsets: tensors past 2^31 elements work); every element hashes its
own pair (the hash is a few integer operations, cheaper than pairing lanes up). The seed is a one-element
int64 tensor on the device, loaded by each program: a model draws it there (no host read per call), a new
seed never recompiles, and a captured CUDA graph reads each replay's fresh seed.
"""
from __future__ import annotations

import struct
from typing import Optional

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._common import INTERPRET, launch, register, tl_dtype

_SCHEMA = "(Tensor branch, Tensor? residual, Tensor? example_scale, float p, Tensor seed) -> Tensor"
_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

# Elements per program (the interpreter: small, so tests cover several programs and a ragged end).
_BLOCK = 64 if INTERPRET else 1024
_NUM_WARPS = 4


@triton.jit
def _mix32(x):
    """lowbias32 on uint32 values: products wrap modulo 2^32, shifts are logical."""
    x = x ^ (x >> 16)
    x = x * 0x21F0AAAD
    x = x ^ (x >> 15)
    x = x * 0x735A2D97
    return x ^ (x >> 15)


@triton.jit
def _keep(offs, seed, drop):
    """Bool [BLOCK]: element offs (int64) is kept under the int64 ``seed`` at threshold ``drop``."""
    s0 = (seed & 0xFFFFFFFF).to(tl.uint32)         # the low word's bits
    s1 = ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32)  # arithmetic shift, then the mask: the high word's bits
    j = offs >> 1                               # the element pair
    h = _mix32(_mix32(j.to(tl.uint32) ^ s0) ^ s1 ^ (j >> 32).to(tl.uint32))
    bits = tl.where((offs & 1) == 0, h & 0xFFFF, h >> 16)
    return bits >= tl.cast(drop, tl.uint32)


@triton.jit
def _widen(v, BF16: tl.constexpr):
    """v as fp32, exactly. bf16 (BF16) by a shift of its bits (the interpreter's own conversion loses
    subnormals)."""
    if BF16:
        return (v.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    else:
        return v.to(tl.float32)


@triton.jit
def _round(v, dtype: tl.constexpr, BF16: tl.constexpr):
    """fp32 v rounded to ``dtype`` to nearest, ties to even, as torch rounds. bf16 (BF16) is rounded with
    integer operations: the interpreter's fp32 -> bf16 cast truncates, and this way the interpreter runs (and
    the tests check) the very arithmetic a GPU runs. NaN stays NaN."""
    if BF16:
        bits = v.to(tl.uint32, bitcast=True)
        top = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        return tl.where(v != v, v.to(tl.bfloat16), top.to(tl.uint16).to(tl.bfloat16, bitcast=True))
    else:
        return v.to(dtype)


@triton.jit(do_not_specialize=["drop"])
def _dropout_add_kernel(branch_ptr, residual_ptr, scale_ptr, out_ptr, numel, inner, drop, keep_scale, seed_ptr,
                        HAS_RESIDUAL: tl.constexpr, HAS_SCALE: tl.constexpr, DTYPE: tl.constexpr,
                        BF16: tl.constexpr, BLOCK: tl.constexpr):
    """out[i] = residual[i] + branch[i] * ((keep(i) * keep_scale) * example_scale[i // inner]), contiguous."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < numel
    x = tl.load(branch_ptr + offs, mask=ok, other=0.0)
    # fp32 arithmetic rounded back to the dtype after each operation, as torch's elementwise ops do.
    seed = tl.load(seed_ptr).to(tl.int64)
    factor = _round(tl.where(_keep(offs, seed, drop), tl.cast(keep_scale, tl.float32), 0.0), DTYPE, BF16)
    if HAS_SCALE:
        s = tl.load(scale_ptr + offs // inner, mask=ok, other=0.0)
        factor = _round(_widen(factor, BF16) * _widen(s, BF16), DTYPE, BF16)
    y = _round(_widen(x, BF16) * _widen(factor, BF16), DTYPE, BF16)
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + offs, mask=ok, other=0.0)
        y = _round(_widen(r, BF16) + _widen(y, BF16), DTYPE, BF16)
    tl.store(out_ptr + offs, y, mask=ok)


def _keep_scale(drop: int) -> float:
    """1 / P(keep) as the reference's ``keep_mask(...).to(dtype) * keep_scale`` rounds it: the Python float
    rounded to fp32, the opmath type of torch's scalar multiply for every dtype the kernel takes (the
    kernel argument is fp32 either way); 0 when p = 1."""
    if drop >= 65536:
        return 0.0
    return struct.unpack("f", struct.pack("f", 65536.0 / (65536 - drop)))[0]


def _check(branch: Tensor, residual: Optional[Tensor], example_scale: Optional[Tensor], p: float,
           seed: Tensor) -> None:
    """Cheap checks of a direct call (``fastqa.dropout_add`` validates thoroughly)."""
    if branch.dim() < 1:
        raise ValueError("branch must have a batch dimension, got a 0-d tensor")
    if branch.dtype not in _DTYPES:
        raise TypeError(f"branch must be float32, float16 or bfloat16, got {branch.dtype}")
    if residual is not None and (residual.shape != branch.shape or residual.dtype != branch.dtype):
        raise ValueError(f"residual must have branch's shape {tuple(branch.shape)} and dtype {branch.dtype}, "
                         f"got {tuple(residual.shape)} {residual.dtype}")
    if example_scale is not None and (tuple(example_scale.shape) != (branch.shape[0],)
                                      or example_scale.dtype != branch.dtype):
        raise ValueError(f"example_scale must be [{branch.shape[0]}] of dtype {branch.dtype}, got "
                         f"{tuple(example_scale.shape)} {example_scale.dtype}")
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"p must be in [0, 1], got {p}")
    if seed.dtype != torch.int64 or seed.numel() != 1 or seed.device != branch.device:
        raise ValueError(f"seed must be a one-element int64 tensor on {branch.device}, got {seed.dtype} "
                         f"{tuple(seed.shape)} on {seed.device}")


def dropout_add(branch: Tensor, residual: Optional[Tensor], example_scale: Optional[Tensor], p: float,
                seed: Tensor) -> Tensor:
    """branch, residual: [B, ...]; example_scale: [B]; seed: [1] int64 -> out [B, ...] (contiguous, branch's
    dtype)."""
    _check(branch, residual, example_scale, p, seed)
    out = torch.empty(branch.shape, dtype=branch.dtype, device=branch.device)
    numel = out.numel()
    if numel == 0:
        return out
    drop = round(p * 65536)
    x = branch.contiguous()
    res = x if residual is None else residual.contiguous()
    scale = x if example_scale is None else example_scale.contiguous()
    launch(_dropout_add_kernel, (triton.cdiv(numel, _BLOCK),), x, res, scale, out, numel, numel // branch.shape[0],
           drop, _keep_scale(drop), seed,
           HAS_RESIDUAL=residual is not None, HAS_SCALE=example_scale is not None,
           DTYPE=tl_dtype(branch.dtype), BF16=branch.dtype == torch.bfloat16, BLOCK=_BLOCK,
           num_warps=_NUM_WARPS, enable_fp_fusion=False)
    return out


def _fake(branch, residual, example_scale, p, seed):
    return branch.new_empty(branch.shape)


register("dropout_add", dropout_add, _SCHEMA, _fake)
