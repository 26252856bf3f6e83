"""trilinear_similarity and context_query_attention: every backend against the pure-PyTorch reference."""
from __future__ import annotations

import functools

import pytest
import torch

import fastqa
from fastqa import reference
from fastqa.layers import ContextQueryAttention, TrilinearSimilarity
from fastqa.ops import context_query_attention, trilinear_similarity

from helpers import (TOLERANCES, assert_close, check_against_reference, check_bf16_against_float64, compiled_backends,
                     kernel_ops, ran_kernels, ran_ops)

BACKENDS = compiled_backends()

SIM_NAMES = ["c", "q", "weight", "bias"]
CQA_NAMES = ["c", "q", "c_mask", "q_mask", "weight", "bias"]

# (B, n, m, d): QANet's real sizes (d=128, context 400, question 50) at a small batch, then edges.
REAL = (2, 400, 50, 128)
EDGE_SHAPES = [
    (1, 1, 1, 1),     # one context word, one question word, one channel
    (1, 7, 3, 13),    # batch 1, odd lengths, d not a multiple of 8
    (3, 1, 9, 20),    # context length 1
    (2, 33, 1, 24),   # question length 1
    (3, 65, 17, 5),   # odd everything
]
# The Triton interpreter runs ~0.2 ms per operation per program: the model-sized case runs on the
# Triton backend only on a GPU (tests/ops/test_triton_context_query_attention.py covers its kernels in depth).
CASES = [(b, shape) for b in BACKENDS for shape in EDGE_SHAPES] + [
    (b, REAL) for b in BACKENDS if b == "cpu" or torch.cuda.is_available()]


def make_inputs(batch, n, m, d, *, dtype=torch.float32, bias=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    c = torch.randn(batch, n, d, generator=g, dtype=dtype)
    q = torch.randn(batch, m, d, generator=g, dtype=dtype)
    c_mask = torch.rand(batch, n, generator=g) < 0.8
    q_mask = torch.rand(batch, m, generator=g) < 0.8
    c_mask[:, 0] = True  # at least one real word per slice unless a test says otherwise
    q_mask[:, 0] = True
    w = torch.randn(3 * d, generator=g, dtype=dtype) / (3 * d) ** 0.5
    b = torch.randn(1, generator=g, dtype=dtype) if bias else None
    return c, q, c_mask, q_mask, w, b


def channels_first(t: torch.Tensor) -> torch.Tensor:
    """The same values as a [B, L, C] view of channels-first [B, C, L] storage (non-contiguous)."""
    return t.transpose(1, 2).contiguous().transpose(1, 2)


def sim(backend):
    return functools.partial(trilinear_similarity, backend=backend)


def cqa(backend):
    return functools.partial(context_query_attention, backend=backend)


# ------------------------------------------------------------------ forward + every gradient

@pytest.mark.parametrize("backend, shape", CASES, ids=str)
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_trilinear_similarity_matches_reference(backend, shape, bias):
    c, q, _, _, w, b = make_inputs(*shape, bias=bias)
    check_against_reference(sim(backend), reference.trilinear_similarity, (c, q, w, b), names=SIM_NAMES)


@pytest.mark.parametrize("backend, shape", CASES, ids=str)
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_context_query_attention_matches_reference(backend, shape, bias):
    check_against_reference(cqa(backend), reference.context_query_attention, make_inputs(*shape, bias=bias),
                            names=CQA_NAMES)


@pytest.mark.parametrize("backend", BACKENDS)
def test_noncontiguous_and_channels_first_inputs(backend):
    c, q, c_mask, q_mask, w, b = make_inputs(3, 37, 11, 24)
    c, q = channels_first(c), channels_first(q)
    w = torch.stack([w, w], dim=1)[:, 0]  # stride 2
    c_mask = torch.stack([c_mask, c_mask], dim=2)[..., 1]
    assert not (c.is_contiguous() or q.is_contiguous() or w.is_contiguous() or c_mask.is_contiguous())
    check_against_reference(cqa(backend), reference.context_query_attention, (c, q, c_mask, q_mask, w, b),
                            names=CQA_NAMES)
    check_against_reference(sim(backend), reference.trilinear_similarity, (c, q, w, b), names=SIM_NAMES)


@pytest.mark.parametrize("backend", BACKENDS)
def test_scalar_bias(backend):
    c, q, c_mask, q_mask, w, b = make_inputs(2, 9, 4, 6)
    check_against_reference(cqa(backend), reference.context_query_attention,
                            (c, q, c_mask, q_mask, w, b.reshape(())), names=CQA_NAMES)


@pytest.mark.parametrize("backend", BACKENDS)
def test_all_masked_rows_and_columns_give_zeros(backend):
    c, q, c_mask, q_mask, w, b = make_inputs(4, 12, 6, 8)
    q_mask[1] = False           # every row of S̄ masked: A = B = 0
    c_mask[2] = False           # every column of S̿ masked: B = 0
    q_mask[3] = False
    c_mask[3] = False
    c_mask[0, 5:] = False       # padded tail
    q_mask[0, 3:] = False
    check_against_reference(cqa(backend), reference.context_query_attention, (c, q, c_mask, q_mask, w, b),
                            names=CQA_NAMES)
    out = context_query_attention(c, q, c_mask, q_mask, w, b, backend=backend)
    d = c.shape[2]
    assert torch.isfinite(out).all()
    assert not out[1, :, d:].any() and not out[3, :, d:].any()
    assert not out[2, :, 3 * d:].any()


@pytest.mark.parametrize("backend", BACKENDS)
def test_masked_words_get_no_attention(backend):
    """Changing a masked question word changes nothing (its weight is exactly zero)."""
    c, q, c_mask, q_mask, w, b = make_inputs(2, 10, 7, 8)
    q_mask[:, 4] = False
    q2 = q.clone()
    q2[:, 4] = 1e4
    out = context_query_attention(c, q, c_mask, q_mask, w, b, backend=backend)
    out2 = context_query_attention(c, q2, c_mask, q_mask, w, b, backend=backend)
    torch.testing.assert_close(out, out2, rtol=0, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_only_needed_gradients(backend):
    c, q, c_mask, q_mask, w, b = make_inputs(2, 6, 4, 5)
    c.requires_grad_()
    out = context_query_attention(c, q, c_mask, q_mask, w, b, backend=backend)
    out.sum().backward()
    assert c.grad is not None and q.grad is None and w.grad is None and b.grad is None


@pytest.mark.parametrize("backend", BACKENDS)
def test_incoming_gradient_is_not_modified(backend):
    c, q, c_mask, q_mask, w, b = make_inputs(2, 6, 4, 5)
    c.requires_grad_()
    out = context_query_attention(c, q, c_mask, q_mask, w, b, backend=backend)
    grad = torch.randn_like(out)
    keep = grad.clone()
    out.backward(grad)
    assert torch.equal(grad, keep)


# ------------------------------------------------------------------ gradcheck, opcheck, compile

@pytest.mark.parametrize("backend", ["cpu"])  # float64 is a CPU dtype; Triton takes fp32/fp16/bf16
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_gradcheck_float64(backend, bias):
    c, q, c_mask, q_mask, w, b = make_inputs(2, 5, 4, 3, dtype=torch.float64, bias=bias)
    c_mask[1, 3:] = False
    q_mask[0, 2:] = False
    diff = [t.requires_grad_() for t in (c, q, w, b) if t is not None]
    assert torch.autograd.gradcheck(
        lambda c, q, w, *b: context_query_attention(c, q, c_mask, q_mask, w, *b, backend=backend), diff)
    assert torch.autograd.gradcheck(lambda c, q, w, *b: trilinear_similarity(c, q, w, *b, backend=backend), diff)


def _kernel_args(backend, bias=True):
    c, q, c_mask, q_mask, w, b = make_inputs(2, 9, 5, 6, bias=bias)
    c = channels_first(c)  # a non-contiguous input too
    out, aux_row, aux_col = kernel_ops(backend).context_query_attention_fwd(c, q, c_mask, q_mask, w, b)
    return c, q, c_mask, q_mask, w, b, out, aux_row, aux_col


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_opcheck(backend, bias):
    c, q, c_mask, q_mask, w, b, out, aux_row, aux_col = _kernel_args(backend, bias)
    g_out = torch.randn_like(out)
    g_s = torch.randn(c.shape[0], c.shape[1], q.shape[1])
    op = functools.partial(getattr, kernel_ops(backend))
    torch.library.opcheck(op("trilinear_similarity_fwd"), (c, q, w, b))
    torch.library.opcheck(op("trilinear_similarity_bwd"), (g_s, c, q, w, b))
    torch.library.opcheck(op("context_query_attention_fwd"), (c, q, c_mask, q_mask, w, b))
    torch.library.opcheck(op("context_query_attention_bwd"),
                          (g_out, c, q, c_mask, q_mask, w, b, out, aux_row, aux_col))


@pytest.mark.parametrize("backend", BACKENDS)
def test_absent_bias_gradient_is_empty(backend):
    c, q, c_mask, q_mask, w, b, out, aux_row, aux_col = _kernel_args(backend, bias=False)
    grads = kernel_ops(backend).context_query_attention_bwd(
        torch.randn_like(out), c, q, c_mask, q_mask, w, None, out, aux_row, aux_col)
    assert [tuple(g.shape) for g in grads] == [tuple(c.shape), tuple(q.shape), tuple(w.shape), (0,)]


@pytest.mark.parametrize("backend", BACKENDS)
def test_torch_compile_fullgraph(backend):
    """aot_eager (not inductor): traces through the custom ops with their fake kernels, fast on 2 cores."""
    torch.manual_seed(0)
    c, q, c_mask, q_mask, _, _ = make_inputs(2, 11, 5, 8)
    for layer, args in ((ContextQueryAttention(8, backend=backend), (c, q, c_mask, q_mask)),
                        (TrilinearSimilarity(8, backend=backend), (c, q))):
        compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
        grads = []
        for fn in (layer, compiled):
            x = c.clone().requires_grad_()
            out = fn(x, *args[1:])
            out.backward(torch.ones_like(out))
            grads.append((out.detach(), x.grad, layer.weight.grad.clone(), layer.bias.grad.clone()))
            layer.zero_grad()
        for got, want in zip(grads[1], grads[0]):
            torch.testing.assert_close(got, want)


@pytest.mark.parametrize("backend", BACKENDS)
def test_backward_is_deterministic(backend):
    c, q, c_mask, q_mask, w, b = make_inputs(8, 40, 12, 16)
    grad = torch.randn(8, 40, 64)
    runs = []
    for _ in range(2):
        xs = [t.clone().requires_grad_() for t in (c, q, w, b)]
        out = context_query_attention(xs[0], xs[1], c_mask, q_mask, xs[2], xs[3], backend=backend)
        runs.append(torch.autograd.grad(out, xs, grad))
    for g1, g2 in zip(*runs):
        assert torch.equal(g1, g2)


# ------------------------------------------------------------------ bfloat16 (the CPU kernels)

def _padded_inputs():
    """Padding everywhere: a slice with no real question word, one with no real context word, one with
    neither, and padded tails (the bf16 path through every masked branch)."""
    c, q, c_mask, q_mask, w, b = make_inputs(4, 12, 6, 8)
    q_mask[1] = False
    c_mask[2] = False
    q_mask[3] = False
    c_mask[3] = False
    c_mask[0, 5:] = False
    q_mask[0, 3:] = False
    return c, q, c_mask, q_mask, w, b


# The model's shape with its bias (the most time), the edges with and without.
BF16_CASES = [(REAL, True)] + [(shape, bias) for shape in EDGE_SHAPES for bias in (True, False)]


@pytest.mark.parametrize("route", ["native", "widen"])
@pytest.mark.parametrize("shape, bias", BF16_CASES, ids=str)
def test_bfloat16_matches_float64_reference(shape, bias, route, monkeypatch):
    """bf16 in and out, each route forced (native: the GEMMs on the bf16 engine; widen: in float32; softmaxes
    in float32 either way): forward and every gradient of both ops against float64 on the same rounded values."""
    monkeypatch.setenv("FASTQA_CPU_BF16_ROUTE", route)
    c, q, c_mask, q_mask, w, b = make_inputs(*shape, bias=bias)
    check_bf16_against_float64(cqa("cpu"), reference.context_query_attention, (c, q, c_mask, q_mask, w, b),
                               names=CQA_NAMES)
    check_bf16_against_float64(sim("cpu"), reference.trilinear_similarity, (c, q, w, b), names=SIM_NAMES)


@pytest.mark.parametrize("route", ["native", "widen"])
def test_bfloat16_with_padding_and_empty_slices(route, monkeypatch):
    monkeypatch.setenv("FASTQA_CPU_BF16_ROUTE", route)
    args = _padded_inputs()
    check_bf16_against_float64(cqa("cpu"), reference.context_query_attention, args, names=CQA_NAMES)
    c, q, c_mask, q_mask, w, b = (t.to(torch.bfloat16) if t.is_floating_point() else t for t in args)
    out = context_query_attention(c, q, c_mask, q_mask, w, b, backend="cpu")
    d = c.shape[2]
    assert torch.isfinite(out).all()
    assert not out[1, :, d:].any() and not out[3, :, d:].any() and not out[2, :, 3 * d:].any()
    assert ran_ops(lambda: context_query_attention(c, q, c_mask, q_mask, w, b, backend="cpu")) == {
        "fastqa::context_query_attention_fwd"}


def test_bfloat16_kernels_keep_the_probabilities_in_float32_and_match_their_fakes():
    """out and every gradient in bf16, aux_row / aux_col (the softmaxes the backward differentiates) in float32;
    the fake kernels say the same (opcheck)."""
    c, q, c_mask, q_mask, w, b = (t.to(torch.bfloat16) if t.is_floating_point() else t
                                  for t in make_inputs(2, 9, 5, 6))
    ops = torch.ops.fastqa
    out, aux_row, aux_col = ops.context_query_attention_fwd(c, q, c_mask, q_mask, w, b)
    assert (out.dtype, aux_row.dtype, aux_col.dtype) == (torch.bfloat16, torch.float32, torch.float32)
    g_out = torch.randn(out.shape).to(torch.bfloat16)
    grads = ops.context_query_attention_bwd(g_out, c, q, c_mask, q_mask, w, b, out, aux_row, aux_col)
    assert [g.dtype for g in grads] == [torch.bfloat16] * 4
    torch.library.opcheck(ops.context_query_attention_fwd, (c, q, c_mask, q_mask, w, b))
    torch.library.opcheck(ops.context_query_attention_bwd, (g_out, c, q, c_mask, q_mask, w, b, out, aux_row, aux_col))
    torch.library.opcheck(ops.trilinear_similarity_fwd, (c, q, w, None))
    g_s = torch.randn(2, 9, 5).to(torch.bfloat16)
    torch.library.opcheck(ops.trilinear_similarity_bwd, (g_s, c, q, w, None))


def test_bfloat16_mixed_dtypes_are_refused():
    c, q, c_mask, q_mask, w, b = make_inputs(2, 6, 4, 5)
    c16, q16, w16, b16 = (t.to(torch.bfloat16) for t in (c, q, w, b))
    with pytest.raises(TypeError, match="q"):
        context_query_attention(c16, q, c_mask, q_mask, w16, b16, backend="cpu")
    ops = torch.ops.fastqa
    with pytest.raises(RuntimeError, match="share a dtype"):
        ops.context_query_attention_fwd(c16, q, c_mask, q_mask, w16, b16)
    with pytest.raises(RuntimeError, match="bias"):
        ops.trilinear_similarity_fwd(c16, q16, w16, b.double())
    with pytest.raises(RuntimeError, match="weight"):   # float32 c takes float32 parameters only
        ops.trilinear_similarity_fwd(c, q, w16, None)
    out, aux_row, aux_col = ops.context_query_attention_fwd(c16, q16, c_mask, q_mask, w16, b16)
    with pytest.raises(RuntimeError, match="aux_row"):   # the probabilities of a bf16 forward are float32
        ops.context_query_attention_bwd(torch.zeros_like(out), c16, q16, c_mask, q_mask, w16, b16, out,
                                        aux_row.to(torch.bfloat16), aux_col)
    with pytest.raises(RuntimeError, match="grad_out"):
        ops.context_query_attention_bwd(torch.zeros(out.shape), c16, q16, c_mask, q_mask, w16, b16, out, aux_row,
                                        aux_col)


@pytest.mark.parametrize("route", ["native", "widen"])
@pytest.mark.parametrize("shape", [(2, 40, 11, 16), (3, 65, 17, 5)], ids=str)
def test_bfloat16_with_float32_parameters(shape, route, monkeypatch):
    """bf16 c and q with the float32 master weight and bias (what autocast passes): both ops, forward and every
    gradient against float64 on the same values, the parameters' gradients in float32."""
    monkeypatch.setenv("FASTQA_CPU_BF16_ROUTE", route)
    c, q, c_mask, q_mask, w, b = make_inputs(*shape)
    c16, q16 = c.to(torch.bfloat16), q.to(torch.bfloat16)
    atol, rtol = TOLERANCES["vs float64"][torch.bfloat16]
    for op, ref, args in (
            (context_query_attention, reference.context_query_attention, (c16, q16, c_mask, q_mask, w, b)),
            (trilinear_similarity, reference.trilinear_similarity, (c16, q16, w, b))):
        leaves = [a.clone().requires_grad_() if a.is_floating_point() else a for a in args]
        exact = [a.detach().double().requires_grad_() if a.is_floating_point() else a for a in args]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got = op(*leaves, backend="cpu")
        want = ref(*exact)
        assert got.dtype == torch.bfloat16
        grad = torch.randn(got.shape, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
        floats = [i for i, a in enumerate(args) if a.is_floating_point()]
        got_grads = torch.autograd.grad(got, [leaves[i] for i in floats], grad)
        want_grads = torch.autograd.grad(want, [exact[i] for i in floats], grad.double())
        assert [g.dtype for g in got_grads] == [args[i].dtype for i in floats]
        for name, g, ww in [("out", got, want)] + list(zip(["c", "q", "weight", "bias"], got_grads, want_grads)):
            scale = max(1.0, float(ww.detach().abs().max()))
            assert_close(g.double(), ww.detach(), name=f"{op.__name__} {name}", atol=atol * scale, rtol=rtol)


# ------------------------------------------------------------------ layers

# ------------------------------------------------------------------ validation and dispatch

def _bad_inputs():
    c, q, c_mask, q_mask, w, b = make_inputs(2, 6, 4, 5)
    meta = torch.device("meta")
    return [
        ("c", dict(c=c[0]), ValueError),
        ("c", dict(c=c.long()), TypeError),
        ("c", dict(c=c[:0], c_mask=c_mask[:0]), ValueError),                 # empty batch
        ("c", dict(c=c[:, :0], c_mask=c_mask[:, :0]), ValueError),           # empty context
        ("c", dict(c=c.to(meta), q=q.to(meta), w=w.to(meta), b=b.to(meta),
                   c_mask=c_mask.to(meta), q_mask=q_mask.to(meta)), ValueError),
        ("q", dict(q=q[:1]), ValueError),                                    # batch mismatch
        ("q", dict(q=q[..., :4]), ValueError),                               # channel mismatch
        ("q", dict(q=q.double()), TypeError),
        ("q", dict(q=q.to(meta)), ValueError),                               # device mismatch
        ("q", dict(q=q[:, :0], q_mask=q_mask[:, :0]), ValueError),           # empty question
        ("weight", dict(w=w[:-1]), ValueError),
        ("weight", dict(w=w.double()), TypeError),
        ("bias", dict(b=torch.zeros(2)), ValueError),
        ("bias", dict(b=b.double()), TypeError),
        ("c_mask", dict(c_mask=c_mask.float()), TypeError),
        ("c_mask", dict(c_mask=c_mask[:, :-1]), ValueError),
        ("q_mask", dict(q_mask=q_mask[:1]), ValueError),
        ("q_mask", dict(q_mask=q_mask.to(meta)), ValueError),
    ], (c, q, c_mask, q_mask, w, b)


@pytest.mark.parametrize("index", range(len(_bad_inputs()[0])))
def test_bad_input_names_the_argument(index):
    (name, changes, error), (c, q, c_mask, q_mask, w, b) = _bad_inputs()[0][index], _bad_inputs()[1]
    args = dict(c=c, q=q, c_mask=c_mask, q_mask=q_mask, w=w, b=b) | changes
    with pytest.raises(error, match=name):
        context_query_attention(args["c"], args["q"], args["c_mask"], args["q_mask"], args["w"], args["b"])
    if "mask" not in name:
        with pytest.raises(error, match=name):
            trilinear_similarity(args["c"], args["q"], args["w"], args["b"])


def test_bad_backend_values():
    c, q, c_mask, q_mask, w, b = make_inputs(2, 6, 4, 5)
    with pytest.raises(ValueError, match="backend"):
        context_query_attention(c, q, c_mask, q_mask, w, b, backend="fast")
    with pytest.raises(TypeError, match="backend"):
        trilinear_similarity(c, q, w, b, backend=1)


def test_kernels_check_their_arguments():
    c, q, c_mask, q_mask, w, b = make_inputs(2, 6, 4, 5)
    with pytest.raises(RuntimeError, match="q_mask"):
        torch.ops.fastqa.context_query_attention_fwd(c, q, c_mask, q_mask[:, :-1], w, b)
    with pytest.raises(RuntimeError, match="weight"):
        torch.ops.fastqa.trilinear_similarity_fwd(c, q, w[:-3], b)
    with pytest.raises(RuntimeError, match="grad_s"):
        torch.ops.fastqa.trilinear_similarity_bwd(torch.zeros(2, 6, 5), c, q, w, b)


def test_reference_backend_and_env_forcing(monkeypatch):
    c, q, c_mask, q_mask, w, b = make_inputs(2, 6, 4, 5)
    c.requires_grad_()
    want = reference.context_query_attention(c, q, c_mask, q_mask, w, b)
    got = context_query_attention(c, q, c_mask, q_mask, w, b, backend="reference")
    assert torch.equal(got, want)
    assert not ran_kernels(lambda: context_query_attention(c, q, c_mask, q_mask, w, b, backend="reference"))
    assert ran_kernels(lambda: context_query_attention(c, q, c_mask, q_mask, w, b))  # auto: cpu
    monkeypatch.setenv("FASTQA_BACKEND", "reference")
    assert not ran_kernels(lambda: context_query_attention(c, q, c_mask, q_mask, w, b))
    monkeypatch.setenv("FASTQA_BACKEND", "cpu")
    assert ran_kernels(lambda: context_query_attention(c, q, c_mask, q_mask, w, b))
    assert ran_kernels(lambda: ContextQueryAttention(5)(c, q, c_mask, q_mask))


def test_forcing_triton_on_cpu_without_interpreter_raises(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    c, q, c_mask, q_mask, w, b = make_inputs(2, 6, 4, 5)
    with pytest.raises(RuntimeError, match="triton"):
        context_query_attention(c, q, c_mask, q_mask, w, b, backend="triton")
    monkeypatch.setenv("FASTQA_BACKEND", "triton")
    with pytest.raises(RuntimeError, match="triton"):
        trilinear_similarity(c, q, w, b)


def test_top_level_exports():
    assert fastqa.context_query_attention is context_query_attention
    assert fastqa.trilinear_similarity is trilinear_similarity
    assert fastqa.layers.ContextQueryAttention is ContextQueryAttention
