"""Triton trilinear similarity / context-query attention kernels against the pure-PyTorch reference.

Without a GPU the kernels run in the Triton interpreter on CPU tensors (tests/conftest.py sets
TRITON_INTERPRET=1 first; the kernels then use 16-wide tiles, so the small shapes below cover
several context tiles, n not a multiple of the tile, and questions longer than one tile, i.e. the
online row softmax). The custom ops are called directly: forward against the reference, and every
output of the `_bwd` op against torch.autograd.grad of the reference, always in float32 (inputs
rounded to the tested dtype first). Low-precision results are compared at the scale of the
gradient they belong to (the bias gradient of the attention is mathematically zero, so it is held
to the scale of the weight gradient).
"""
from __future__ import annotations

import importlib
import math

import pytest
import torch

from helpers import device_of, TOLERANCES, assert_close

pytest.importorskip("triton")
importlib.import_module("fastqa.triton_kernels.context_query_attention")  # registers fastqa_triton::*
ref = importlib.import_module("fastqa.reference.context_query_attention")

DEVICE = device_of("triton")
ops = torch.ops.fastqa_triton


@pytest.fixture(autouse=True)
def default_configs(monkeypatch):
    """Small shapes run each kernel's default configuration: on a GPU, autotuning every new shape
    bucket and dtype would spend minutes compiling (TestGPU turns tuning back on)."""
    monkeypatch.setenv("FASTQA_TRITON_AUTOTUNE", "0")




def make_inputs(batch: int, n: int, m: int, d: int, *, dtype: torch.dtype = torch.float32, bias: bool = True,
                masks: str = "random", strided: bool = False, seed: int = 0, device: str = DEVICE) -> dict:
    """c, q, masks, weight, bias. masks: "random" (holes anywhere), "full", or "edge" (batch 0 random,
    batch 1 no real context word = all-masked columns, batch 2 no real question word = all-masked
    rows). strided: c, q and the masks are non-contiguous views."""
    gen = torch.Generator().manual_seed(seed)
    if strided:
        c = torch.randn(batch, d, n, generator=gen).transpose(1, 2)
        q = torch.randn(batch, 2 * m, d, generator=gen)[:, ::2]
    else:
        c = torch.randn(batch, n, d, generator=gen)
        q = torch.randn(batch, m, d, generator=gen)
    # Three times nn.Linear's init range, so that the softmaxes are far from uniform.
    weight = (torch.rand(3 * d, generator=gen) * 2 - 1) * 3 / math.sqrt(3 * d)
    b = torch.randn(1, generator=gen) if bias else None
    c_mask = torch.rand(batch, 2 * n, generator=gen) > 0.3
    q_mask = torch.rand(batch, 2 * m, generator=gen) > 0.3
    c_mask, q_mask = (c_mask[:, ::2], q_mask[:, ::2]) if strided else (c_mask[:, :n], q_mask[:, :m])
    if masks == "full":
        c_mask, q_mask = torch.ones_like(c_mask), torch.ones_like(q_mask)
    elif masks == "edge":
        assert batch >= 3
        c_mask[1], q_mask[2] = False, False
    out = dict(c=c.to(dtype), q=q.to(dtype), c_mask=c_mask, q_mask=q_mask, weight=weight.to(dtype),
               bias=None if b is None else b.to(dtype))
    return {k: None if v is None else v.to(device) for k, v in out.items()}


def fp32_leaves(inp: dict, names: tuple[str, ...]) -> dict:
    """float32 leaf copies (requiring grad) of the floating inputs, for the reference."""
    return {k: (v.detach().float().requires_grad_() if k in names and v is not None else v) for k, v in inp.items()}


def noncontiguous_like(shape: tuple[int, ...], dtype: torch.dtype, seed: int = 1) -> torch.Tensor:
    """A random upstream gradient laid out transposed: catches kernels that assume strides."""
    gen = torch.Generator().manual_seed(seed)
    g = torch.randn(tuple(reversed(shape)), generator=gen).to(dtype).to(DEVICE)
    return g.permute(*reversed(range(len(shape))))


def check(got: torch.Tensor, want: torch.Tensor, name: str, dtype: torch.dtype, scale: float | None = None) -> None:
    tol = TOLERANCES["scaled"][dtype][0]
    scale = max(want.abs().max().item() if scale is None else scale, 1.0)
    assert got.dtype == want.dtype or got.dtype == dtype, f"{name}: dtype {got.dtype}"
    assert_close(got.float(), want.float(), name=name, atol=tol * scale, rtol=tol)


def check_grads(got: tuple, want: dict, bias_given: bool, dtype: torch.dtype) -> None:
    grad_c, grad_q, grad_weight, grad_bias = got
    check(grad_c, want["c"], "grad_c", dtype)
    check(grad_q, want["q"], "grad_q", dtype)
    check(grad_weight, want["weight"], "grad_weight", dtype)
    if bias_given:
        assert grad_bias.shape == (1,)
        check(grad_bias, want["bias"], "grad_bias", dtype, scale=want["weight"].abs().max().item())
    else:
        assert grad_bias.numel() == 0, "gradient of an absent bias must be an empty tensor"


GRAD_NAMES = ("c", "q", "weight", "bias")

# (batch, n, m, d, bias, masks, strided): n = 37 is three context tiles with a ragged end; m = 20 is
# two question tiles (online row softmax); 9 x 7 fits one tile each way; 32 x 16 is exactly tiled.
CQA_CASES = {
    "multi_tile_edge_masks": (3, 37, 20, 12, True, "edge", False),
    "batch1_one_tile_no_bias_strided": (1, 9, 7, 20, False, "full", True),
    "exact_tiles_no_bias": (2, 32, 16, 16, False, "random", False),
}


@pytest.mark.parametrize("case", list(CQA_CASES))
def test_cqa_fp32(case):
    batch, n, m, d, bias, masks, strided = CQA_CASES[case]
    inp = make_inputs(batch, n, m, d, bias=bias, masks=masks, strided=strided)
    before = {k: v.clone() for k, v in inp.items() if v is not None}
    out, aux_row, aux_col = ops.context_query_attention_fwd(**inp)
    leaves = fp32_leaves(inp, GRAD_NAMES)
    want = ref.context_query_attention(**leaves)
    check(out, want, "out", torch.float32)
    assert out.is_contiguous() and aux_row.shape == (batch, n) and aux_col.shape == (batch, m)

    grad_out = noncontiguous_like(tuple(out.shape), torch.float32)
    grad_out_before = grad_out.clone()
    got = ops.context_query_attention_bwd(grad_out, **inp, out=out, aux_row=aux_row, aux_col=aux_col)
    names = [k for k in GRAD_NAMES if leaves[k] is not None]
    want_grads = dict(zip(names, torch.autograd.grad(want, [leaves[k] for k in names], grad_out)))
    check_grads(got, want_grads, bias, torch.float32)

    assert torch.equal(grad_out, grad_out_before), "the incoming gradient was modified"
    for k, v in before.items():
        assert torch.equal(inp[k], v), f"input {k} was modified"


def test_cqa_aux_is_masked_logsumexp():
    """The documented aux outputs: fp32 row / column log-sum-exps of the masked S, +inf when empty."""
    inp = make_inputs(3, 21, 18, 12, masks="edge", seed=3)
    _, aux_row, aux_col = ops.context_query_attention_fwd(**inp)
    s = ref.trilinear_similarity(inp["c"], inp["q"], inp["weight"], inp["bias"])
    row = torch.logsumexp(s.masked_fill(~inp["q_mask"][:, None, :], -math.inf), dim=2)
    col = torch.logsumexp(s.masked_fill(~inp["c_mask"][:, :, None], -math.inf), dim=1)
    assert aux_row.dtype == aux_col.dtype == torch.float32
    assert torch.isinf(aux_row[2]).all() and (aux_row[2] > 0).all()
    assert torch.isinf(aux_col[1]).all() and (aux_col[1] > 0).all()
    assert_close(aux_row[:2], row[:2], name="aux_row")
    assert_close(aux_col[[0, 2]], col[[0, 2]], name="aux_col")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cqa_low_precision(dtype):
    inp = make_inputs(2, 19, 18, 12, dtype=dtype, seed=5)
    out, aux_row, aux_col = ops.context_query_attention_fwd(**inp)
    assert out.dtype == dtype
    leaves = fp32_leaves(inp, GRAD_NAMES)
    want = ref.context_query_attention(**leaves)
    check(out, want, "out", dtype)
    grad_out = noncontiguous_like(tuple(out.shape), dtype)
    got = ops.context_query_attention_bwd(grad_out, **inp, out=out, aux_row=aux_row, aux_col=aux_col)
    assert all(g.dtype == dtype for g in got)
    want_grads = dict(zip(GRAD_NAMES, torch.autograd.grad(want, [leaves[k] for k in GRAD_NAMES], grad_out.float())))
    check_grads(got, want_grads, True, dtype)


TRI_CASES = {
    "multi_tile_bias": (2, 37, 20, 12, True, False),
    "batch1_no_bias_strided": (1, 9, 7, 20, False, True),
}


def _check_trilinear(inp: dict, bias: bool, dtype: torch.dtype) -> None:
    args = {k: inp[k] for k in ("c", "q", "weight", "bias")}
    s = ops.trilinear_similarity_fwd(**args)
    leaves = fp32_leaves(args, GRAD_NAMES)
    want = ref.trilinear_similarity(**leaves)
    assert s.dtype == dtype
    check(s, want, "s", dtype)
    grad_s = noncontiguous_like(tuple(s.shape), dtype)
    got = ops.trilinear_similarity_bwd(grad_s, **args)
    names = [k for k in GRAD_NAMES if leaves[k] is not None]
    want_grads = dict(zip(names, torch.autograd.grad(want, [leaves[k] for k in names], grad_s.float())))
    check_grads(got, want_grads, bias, dtype)


@pytest.mark.parametrize("case", list(TRI_CASES))
def test_trilinear_fp32(case):
    batch, n, m, d, bias, strided = TRI_CASES[case]
    _check_trilinear(make_inputs(batch, n, m, d, bias=bias, strided=strided, seed=7), bias, torch.float32)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_trilinear_low_precision(dtype):
    _check_trilinear(make_inputs(2, 19, 18, 12, dtype=dtype, seed=9), True, dtype)


def test_opcheck():
    """Schemas, fake (meta) implementations and dispatch of all four custom ops (the second round
    with non-contiguous inputs, so the fakes' strides are checked too)."""
    for bias, strided in ((True, False), (False, True)):
        inp = make_inputs(2, 9, 7, 12, bias=bias, strided=strided, seed=11)
        tri = (inp["c"], inp["q"], inp["weight"], inp["bias"])
        torch.library.opcheck(ops.trilinear_similarity_fwd, tri)
        s = ops.trilinear_similarity_fwd(*tri)
        torch.library.opcheck(ops.trilinear_similarity_bwd, (torch.randn_like(s),) + tri)
        cqa = (inp["c"], inp["q"], inp["c_mask"], inp["q_mask"], inp["weight"], inp["bias"])
        torch.library.opcheck(ops.context_query_attention_fwd, cqa)
        out, aux_row, aux_col = ops.context_query_attention_fwd(*cqa)
        torch.library.opcheck(ops.context_query_attention_bwd, (torch.randn_like(out),) + cqa + (out, aux_row, aux_col))


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU TestGPU runs the tuned path")
def test_autotuned_launch_matches_default_config(monkeypatch):
    """The autotuner's launch path (with its reset of the partial buffer) gives the same bits as the
    untuned one (under the interpreter both have the one configuration)."""
    inp = make_inputs(2, 21, 18, 12, seed=29)
    grad_out = torch.randn(2, 21, 48, device=DEVICE)
    default = _fwd_bwd(**inp, grad_out=grad_out)
    monkeypatch.setenv("FASTQA_TRITON_AUTOTUNE", "1")
    tuned = _fwd_bwd(**inp, grad_out=grad_out)
    for a, b in zip(tuned, default):
        assert torch.equal(a, b)


def _fwd_bwd(c, q, c_mask, q_mask, weight, bias, grad_out):
    out, aux_row, aux_col = ops.context_query_attention_fwd(c, q, c_mask, q_mask, weight, bias)
    return (out,) + tuple(ops.context_query_attention_bwd(grad_out, c, q, c_mask, q_mask, weight, bias,
                                                          out, aux_row, aux_col))


def test_compile_fullgraph_traces_the_ops():
    """torch.compile(fullgraph=True) traces forward + backward ops through their fake kernels
    (aot_eager here: no code generation is needed to prove there is no graph break)."""
    inp = make_inputs(2, 9, 7, 12, seed=13)
    grad_out = torch.randn(2, 9, 48, device=DEVICE)
    compiled = torch.compile(_fwd_bwd, fullgraph=True, backend="aot_eager")
    for got, want in zip(compiled(**inp, grad_out=grad_out), _fwd_bwd(**inp, grad_out=grad_out)):
        assert torch.equal(got, want)


# ----------------------------------------------------------------------------- GPU only

@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
class TestGPU:
    """QANet's shapes (batch 32, context 400, question 50, d 128) with real Triton compilation."""

    @pytest.fixture(autouse=True)
    def autotuned(self, monkeypatch):
        monkeypatch.setenv("FASTQA_TRITON_AUTOTUNE", "1")

    # QANet in every dtype, plus a question longer than one row tile (online row softmax, d = 96).
    @pytest.mark.parametrize("dtype, shape", [(dt, (32, 400, 50, 128)) for dt in
                                              (torch.float32, torch.float16, torch.bfloat16)]
                             + [(torch.float16, (4, 300, 200, 96))])
    def test_model_shapes(self, dtype, shape):
        inp = make_inputs(*shape, dtype=dtype, seed=17)
        inp["c_mask"][:, shape[1] - 37:] = False  # padded tails, as in a batch
        inp["q_mask"][:, shape[2] - 5:] = False
        out, aux_row, aux_col = ops.context_query_attention_fwd(**inp)
        leaves = fp32_leaves(inp, GRAD_NAMES)
        want = ref.context_query_attention(**leaves)
        check(out, want, "out", dtype)
        grad_out = noncontiguous_like(tuple(out.shape), dtype)
        got = ops.context_query_attention_bwd(grad_out, **inp, out=out, aux_row=aux_row, aux_col=aux_col)
        want_grads = dict(zip(GRAD_NAMES, torch.autograd.grad(want, [leaves[k] for k in GRAD_NAMES],
                                                              grad_out.float())))
        check_grads(got, want_grads, True, dtype)
        _check_trilinear(inp, True, dtype)

    @pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
    def test_backward_is_bitwise_deterministic(self, dtype):
        inp = make_inputs(32, 400, 50, 128, dtype=dtype, seed=19)
        out, aux_row, aux_col = ops.context_query_attention_fwd(**inp)
        grad_out = torch.randn_like(out)
        first = ops.context_query_attention_bwd(grad_out, **inp, out=out, aux_row=aux_row, aux_col=aux_col)
        for _ in range(3):
            again = ops.context_query_attention_bwd(grad_out, **inp, out=out, aux_row=aux_row, aux_col=aux_col)
            assert all(torch.equal(a, b) for a, b in zip(first, again))
        tri = (inp["c"], inp["q"], inp["weight"], inp["bias"])
        g_s = torch.randn(32, 400, 50, device=DEVICE, dtype=dtype)
        first = ops.trilinear_similarity_bwd(g_s, *tri)
        assert all(torch.equal(a, b) for a, b in zip(first, ops.trilinear_similarity_bwd(g_s, *tri)))

    def test_compile_fullgraph_inductor(self):
        inp = make_inputs(32, 400, 50, 128, dtype=torch.float16, seed=23)
        grad_out = torch.randn(32, 400, 512, device=DEVICE, dtype=torch.float16)
        compiled = torch.compile(_fwd_bwd, fullgraph=True)
        for got, want in zip(compiled(**inp, grad_out=grad_out), _fwd_bwd(**inp, grad_out=grad_out)):
            assert torch.equal(got, want)
