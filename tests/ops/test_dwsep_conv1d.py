"""fastqa.dwsep_conv1d and layers.DepthwiseSeparableConv1d against the pure-PyTorch reference."""
from __future__ import annotations

import sys

import pytest
import torch

import fastqa
from fastqa import reference
from fastqa._backend import cpu_available, cpu_gemm_info
from fastqa.reference.dwsep_conv1d import conv_padding
from helpers import (as_leaves, assert_close, check_against_reference, check_bf16_against_float64, compiled_backends,
                     num_threads, padding_mask, row_strided)

pytestmark = pytest.mark.skipif(not cpu_available(), reason="fastqa._C is not built")


BACKENDS = compiled_backends()
# The Triton interpreter runs ~0.2 ms per operation per program: model-sized shapes take minutes there,
# so on CPU the Triton backend runs the small cases here (tests/ops/test_triton_dwsep_conv1d.py covers its
# kernels in depth) and the model-sized ones only on a GPU.
FULL_SIZE_BACKENDS = [b for b in BACKENDS if b == "cpu" or torch.cuda.is_available()]
NAMES = ["x", "dw_weight", "pw_weight", "pw_bias", "dw_bias", "residual"]


def make_inputs(B, L, c_in, c_out, K, *, dw_bias=False, pw_bias=True, residual=False, dtype=torch.float32,
                seed=0):
    """Positional args in NAMES order (absent optionals are None)."""
    g = torch.Generator().manual_seed(seed)

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(dtype)

    return [rand(B, L, c_in), rand(c_in, 1, K, scale=K ** -0.5), rand(c_out, c_in, 1, scale=c_in ** -0.5),
            rand(c_out) if pw_bias else None, rand(c_in) if dw_bias else None,
            rand(B, L, c_out) if residual else None]


def fused(backend):
    def fn(x, dw_weight, pw_weight, pw_bias, dw_bias, residual, **kw):
        return fastqa.dwsep_conv1d(x, dw_weight, pw_weight, pw_bias, dw_bias=dw_bias, residual=residual,
                                   backend=backend, **kw)
    return fn


def ref(x, dw_weight, pw_weight, pw_bias, dw_bias, residual, **kw):
    return reference.dwsep_conv1d(x, dw_weight, pw_weight, pw_bias, dw_bias=dw_bias, residual=residual, **kw)


def compare(backend, args, **kw):
    grad_args = [a is not None for a in args]
    check_against_reference(fused(backend), ref, args, kw, names=NAMES, grad_args=grad_args)


# --- forward and every gradient against the reference -------------------------------------------------------

@pytest.mark.parametrize("backend", FULL_SIZE_BACKENDS)
@pytest.mark.parametrize("B, L, c_in, c_out, K, relu, residual, dw_bias", [
    (2, 400, 128, 128, 7, True, True, False),   # QANet embedding-encoder conv
    (2, 400, 128, 128, 5, True, True, True),    # QANet model-encoder conv, with a depthwise bias
    (2, 400, 500, 128, 5, False, False, False),  # embedding resizer 500 -> 128
])
@pytest.mark.parametrize("padding", ["same", "causal"])
def test_model_shapes(backend, B, L, c_in, c_out, K, relu, residual, dw_bias, padding):
    args = make_inputs(B, L, c_in, c_out, K, dw_bias=dw_bias, residual=residual)
    compare(backend, args, padding=padding, activation="relu" if relu else None)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("padding", ["same", "causal"])
def test_odd_shapes(backend, padding):
    """Odd sizes, channel counts not multiples of 8, even K, a depthwise bias."""
    args = make_inputs(3, 37, 13, 21, 4, dw_bias=True)
    compare(backend, args, padding=padding, activation="relu")

@pytest.mark.parametrize("backend", FULL_SIZE_BACKENDS)
@pytest.mark.parametrize("threads", [1, 3])
def test_many_short_sequences(backend, threads):
    """A served batch: many short sequences, several sharing a tile of the CPU forward (one GEMM; how many
    depends on the thread count), the last tile with fewer."""
    args = make_inputs(37, 23, 16, 24, 5, dw_bias=True, residual=True)
    with num_threads(threads):
        compare(backend, args, padding="same", activation="relu")



SMALL_EDGE_SHAPES = [
    (2, 1, 8, 8, 7),     # length 1
    (1, 3, 5, 6, 7),     # length < K, batch 1
    (2, 9, 12, 7, 1),    # K = 1
    (2, 6, 9, 9, 6),     # L == K, even
    (1, 1, 1, 1, 1),     # smallest everything
    (2, 23, 13, 9, 3),   # K = 3: the CPU weight gradient's one-pass path, interior rows in 4-row steps + tails
]
TILED_EDGE_SHAPES = [
    (1, 1500, 20, 11, 5),  # batch 1, long: sequences split into tiles, one per thread (halo rows in backward)
    (1, 300, 600, 40, 7),  # wide channels: sequences split into tiles whatever the thread count
]


@pytest.mark.parametrize("backend, B, L, c_in, c_out, K",
                         [(b, *shape) for b in BACKENDS for shape in SMALL_EDGE_SHAPES]
                         + [(b, *shape) for b in FULL_SIZE_BACKENDS for shape in TILED_EDGE_SHAPES])
@pytest.mark.parametrize("padding", ["same", "causal"])
@pytest.mark.parametrize("pw_bias, dw_bias", [(True, True), (False, False)])
def test_edge_shapes(backend, B, L, c_in, c_out, K, padding, pw_bias, dw_bias):
    args = make_inputs(B, L, c_in, c_out, K, pw_bias=pw_bias, dw_bias=dw_bias, residual=True)
    compare(backend, args, padding=padding, activation="relu")
    compare(backend, args[:5] + [None], padding=padding, activation=None)


@pytest.mark.parametrize("backend", BACKENDS)
def test_noncontiguous_inputs(backend):
    """Channels-first data as a transposed view, a strided residual and weights, sliced channels."""
    B, L, c_in, c_out, K = 2, 33, 24, 16, 5
    x_cf = torch.randn(B, c_in, L)                         # channels-first storage
    x = x_cf.transpose(1, 2)                               # [B, L, C_in] view
    residual = torch.randn(B, c_out, L).transpose(1, 2)
    dw_weight = torch.randn(c_in, 1, 2 * K)[..., ::2]      # [C_in, 1, K] view, non-contiguous
    pw_weight = torch.randn(c_in, c_out, 1).transpose(0, 1)
    pw_bias = torch.randn(2 * c_out)[::2]
    dw_bias = torch.randn(2 * c_in)[1::2]
    assert not x.is_contiguous() and not dw_weight.is_contiguous() and not pw_weight.is_contiguous()
    compare(backend, [x, dw_weight, pw_weight, pw_bias, dw_bias, residual], activation="relu")
    wide = torch.randn(B, L, 2 * c_in)[..., ::2]           # every other channel
    compare(backend, [wide, dw_weight, pw_weight, pw_bias, None, None], padding="causal")


@pytest.mark.parametrize("backend", BACKENDS)
def test_upstream_gradient_untouched_and_residual_grad(backend):
    args = make_inputs(2, 11, 6, 6, 3, residual=True)
    leaves = as_leaves(args)
    y = fused(backend)(*leaves, activation="relu")
    grad = torch.randn(6, 11, 2).permute(2, 1, 0)          # non-contiguous upstream gradient
    before = grad.clone()
    y.backward(grad)
    assert torch.equal(grad, before), "the incoming gradient was modified"
    assert_close(leaves[5].grad, before, name="grad of residual")
    assert leaves[4] is None and all(t.grad is not None for t in leaves[:4])


@pytest.mark.parametrize("backend", BACKENDS)
def test_nan_propagates_like_reference(backend):
    args = make_inputs(1, 9, 4, 3, 3, residual=True)
    args[0][0, 4, 1] = float("nan")
    got, want = fused(backend)(*args, activation="relu"), ref(*args, activation="relu")
    assert want.isnan().any()
    torch.testing.assert_close(got, want, equal_nan=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_only_some_inputs_need_grad(backend):
    args = make_inputs(2, 10, 6, 5, 3, dw_bias=True, residual=True)
    for wanted in ([True, False, False, False, False, False], [False, True, True, False, False, False],
                   [False, False, False, True, True, True], [False] * 5 + [True]):
        check_against_reference(fused(backend), ref, args, {"activation": "relu"}, names=NAMES,
                                grad_args=wanted)


def test_double_backward_raises():
    args = as_leaves(make_inputs(1, 5, 3, 2, 3, dtype=torch.float64))
    y = fused("cpu")(*args)
    (grad_x,) = torch.autograd.grad(y.square().sum(), args[0], create_graph=True)
    with pytest.raises(RuntimeError):
        grad_x.sum().backward()


@pytest.mark.parametrize("padding, activation", [("same", "relu"), ("causal", None)])
def test_gradcheck_float64(padding, activation):
    leaves = as_leaves(make_inputs(2, 6, 3, 4, 3, dw_bias=True, residual=True, dtype=torch.float64))
    assert torch.autograd.gradcheck(lambda *t: fused("cpu")(*t, padding=padding, activation=activation), leaves)


# --- custom ops, compile, determinism, layer -----------------------------------------------------------------

@pytest.mark.parametrize("relu, optionals", [(True, True), (False, False)])
def test_opcheck(relu, optionals):
    x, dw_weight, pw_weight, pw_bias, dw_bias, residual = make_inputs(
        2, 9, 6, 5, 3, dw_bias=optionals, pw_bias=optionals, residual=optionals)
    fwd_args = (x, dw_weight, dw_bias, pw_weight, pw_bias, residual, 1, relu)
    torch.library.opcheck(torch.ops.fastqa.dwsep_conv1d_fwd, fwd_args)
    _, aux = torch.ops.fastqa.dwsep_conv1d_fwd(*fwd_args)
    grad_y = torch.randn(2, 9, 5)
    torch.library.opcheck(torch.ops.fastqa.dwsep_conv1d_bwd,
                          (grad_y, x, dw_weight, dw_bias, pw_weight, pw_bias, aux, 1, relu))


def test_torch_compile_fullgraph():
    """aot_eager: traces the autograd Function and the fake kernels without the slow inductor codegen."""
    torch.manual_seed(0)
    layer = fastqa.layers.DepthwiseSeparableConv1d(12, 10, 5, activation="relu", depthwise_bias=True,
                                                   backend="cpu")
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    x = torch.randn(2, 17, 12, requires_grad=True)
    residual = torch.randn(2, 17, 10, requires_grad=True)
    outs = []
    for fn in (layer, compiled):
        layer.zero_grad()
        x.grad = residual.grad = None
        y = fn(x, residual)
        y.square().sum().backward()
        outs.append([y.detach(), x.grad, residual.grad] + [p.grad for p in layer.parameters()])
    for i, (got, want) in enumerate(zip(outs[1], outs[0])):
        assert_close(got, want, name=f"compiled output/grad {i}")


@pytest.mark.parametrize("backend", BACKENDS)
def test_mask_matches_reference(backend):
    """Masked rows of x enter the conv as zeros; the residual (here x itself) is added unmasked."""
    args = make_inputs(3, 17, 8, 8, 5, dw_bias=True)
    args[-1] = args[0]  # residual = x
    mask = padding_mask(3, 17)
    compare(backend, args, activation="relu", mask=mask)
    got = fused(backend)(*args, activation="relu", mask=mask)
    zeroed = args[0].masked_fill(~mask.unsqueeze(-1), 0.0)
    assert_close(got, fused("reference")(zeroed, *args[1:5], args[0], activation="relu"), name="mask = zeroed x")


@pytest.mark.parametrize("backend", BACKENDS)
def test_residual_is_the_input(backend):
    """layer(x, x): x is both the conv input and the residual -- eager and compiled (Dynamo refuses an
    autograd.Function given one tensor twice, so the op passes it once)."""
    torch.manual_seed(0)
    layer = fastqa.layers.DepthwiseSeparableConv1d(12, 12, 5, activation="relu", backend=backend)
    ref_layer = reference.DepthwiseSeparableConv1d(12, 12, 5, activation="relu")
    ref_layer.load_state_dict(layer.state_dict())
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    x0 = torch.randn(2, 17, 12)
    grads = []
    for fn in (ref_layer, layer, compiled):
        x = x0.clone().requires_grad_()
        y = fn(x, x)
        y.square().sum().backward()
        grads.append((y.detach(), x.grad))
    for got in grads[1:]:
        assert_close(got[0], grads[0][0], name="output")
        assert_close(got[1], grads[0][1], name="grad of x (input and residual)")


# Model-sized where every thread gets tiles (cpu, or triton on a GPU); interpreter-sized otherwise.
@pytest.mark.parametrize("backend, shape", [(b, (4, 400, 128, 128, 7)) for b in FULL_SIZE_BACKENDS]
                         + [(b, (2, 40, 24, 16, 7)) for b in BACKENDS if b not in FULL_SIZE_BACKENDS])
def test_backward_bit_identical(backend, shape):
    args = make_inputs(*shape, dw_bias=True, residual=True)
    grad = torch.randn(*shape[:2], shape[3])
    runs = []
    for _ in range(2):
        leaves = as_leaves(args)
        y = fused(backend)(*leaves, activation="relu")
        runs.append([y] + list(torch.autograd.grad(y, leaves, grad)))
    for i, (a, b) in enumerate(zip(*runs)):
        assert torch.equal(a, b), f"run-to-run difference in output/grad {i}"


@pytest.mark.parametrize("backend", ["auto", "reference", "cpu"])
def test_layer_backends(backend):
    layer = fastqa.layers.DepthwiseSeparableConv1d(6, 4, 3, padding="causal", backend=backend)
    x = torch.randn(2, 8, 6)
    assert_close(layer(x), reference.DepthwiseSeparableConv1d.forward(layer, x), name=f"layer {backend}")
    assert f"backend={backend!r}" in repr(layer)


# --- bfloat16 (the CPU kernel: float32 inside, the pointwise products on the bf16 GEMM) --------------------------

def ref_under_kernel_mask(x, dw_weight, pw_weight, pw_bias, dw_bias, residual, *, padding="same", activation=None):
    """The float64 reference with its ReLU taken where the bf16 kernel's own forward kept the value: a
    pre-activation within bf16 rounding of 0 may land on either side of it, and its gradient (grad_y or 0)
    with it, which no tolerance on the gradients could absorb."""
    y = ref(x, dw_weight, pw_weight, pw_bias, dw_bias, None, padding=padding)
    if activation == "relu":
        low = [None if t is None else t.detach().to(torch.bfloat16) for t in (x, dw_weight, dw_bias, pw_weight,
                                                                              pw_bias)]
        pad_left, _ = conv_padding(dw_weight.shape[-1], padding)
        _, kept = torch.ops.fastqa.dwsep_conv1d_fwd(*low, None, pad_left, True)
        y = torch.where(kept, y, 0.0)
    return y if residual is None else y + residual


BF16_MODEL_SHAPES = [(2, 400, 128, 128, 7), (2, 400, 128, 128, 5), (2, 400, 500, 128, 5)]


@pytest.mark.parametrize("B, L, c_in, c_out, K", BF16_MODEL_SHAPES + SMALL_EDGE_SHAPES + TILED_EDGE_SHAPES, ids=str)
@pytest.mark.parametrize("padding, activation, optionals", [("same", "relu", True), ("causal", None, False)],
                         ids=["same-relu-optionals", "causal-plain"])
def test_bfloat16_matches_float64_reference(B, L, c_in, c_out, K, padding, activation, optionals):
    """bf16 in and out: forward and every gradient against float64 (ReLU under the kernel's mask)."""
    args = make_inputs(B, L, c_in, c_out, K, dw_bias=optionals, pw_bias=optionals, residual=optionals)
    check_bf16_against_float64(fused("cpu"), ref_under_kernel_mask, args, {"padding": padding, "activation": activation},
                               names=NAMES, grad_args=[a is not None for a in args])


def test_bfloat16_relu_forward_matches_float64_reference():
    """The ReLU forward needs no mask: it is continuous, a flip near 0 moves y by a rounding error."""
    args = make_inputs(2, 400, 128, 128, 7, dw_bias=True, residual=True)
    check_bf16_against_float64(fused("cpu"), ref, args, {"activation": "relu"}, names=NAMES,
                               grad_args=[False] * len(args))


def test_bfloat16_noncontiguous_inputs_mask_and_residual_is_x():
    """Channels-first bf16 data as a transposed view, strided weights, a padding mask, and x as its own
    residual (the kernel widens it once for both uses)."""
    B, L, c_in, c_out, K = 2, 33, 24, 16, 5
    g = torch.Generator().manual_seed(3)
    x = torch.randn(B, c_in, L, generator=g).transpose(1, 2)
    dw_weight = torch.randn(c_in, 1, 2 * K, generator=g)[..., ::2] * K ** -0.5
    pw_weight = torch.randn(c_in, c_out, 1, generator=g).transpose(0, 1) * c_in ** -0.5
    pw_bias, dw_bias = torch.randn(2 * c_out, generator=g)[::2], torch.randn(c_in, generator=g)
    residual = torch.randn(B, c_out, L, generator=g).transpose(1, 2)
    args = [x, dw_weight, pw_weight, pw_bias, dw_bias, residual]
    check_bf16_against_float64(fused("cpu"), ref_under_kernel_mask, args, {"padding": "causal"}, names=NAMES)
    mask = padding_mask(B, L)
    check_bf16_against_float64(fused("cpu"), ref, args, {"mask": mask}, names=NAMES)
    square = [x, dw_weight, torch.randn(c_in, c_in, 1, generator=g) * c_in ** -0.5, None, dw_bias]

    def with_x_as_residual(fn):
        return lambda x, dw_weight, pw_weight, pw_bias, dw_bias, **kw: fn(x, dw_weight, pw_weight, pw_bias, dw_bias,
                                                                           x, **kw)

    check_bf16_against_float64(with_x_as_residual(fused("cpu")), with_x_as_residual(ref_under_kernel_mask), square,
                               {"activation": "relu"}, names=NAMES[:5], grad_args=[True, True, True, False, True])


@pytest.mark.parametrize("route", ["native", "widen"])
@pytest.mark.parametrize("B, L, C, K, padding", [(1, 301, 24, 5, "causal"), (3, 37, 16, 7, "same")], ids=str)
@pytest.mark.parametrize("residual_is_x", [False, True], ids=["residual", "residual_is_x"])
def test_bfloat16_row_strided_views_on_both_routes(monkeypatch, route, B, L, C, K, padding, residual_is_x):
    """bf16 x and residual as slices with a row stride of their own (the kernel reads bf16 rows tile by tile,
    with the depthwise halo across tiles: one sequence split between the threads, or short ones grouped), the
    residual a tensor of its own or x itself, on each forced route: forward and every gradient against float64."""
    monkeypatch.setenv("FASTQA_CPU_BF16_ROUTE", route)
    args = make_inputs(B, L, C, C, K, dw_bias=True, residual=not residual_is_x)

    def on_views(fn):
        def run(x, dw_weight, pw_weight, pw_bias, dw_bias, residual, **kw):
            x = row_strided(x)
            return fn(x, dw_weight, pw_weight, pw_bias, dw_bias, x if residual_is_x else row_strided(residual), **kw)
        return run

    check_bf16_against_float64(on_views(fused("cpu")), on_views(ref_under_kernel_mask), args,
                               {"padding": padding, "activation": "relu"}, names=NAMES,
                               grad_args=[a is not None for a in args])


@pytest.mark.parametrize("route", ["native", "widen"])
@pytest.mark.parametrize("shape", [(2, 300, 96, 128, 7), (1, 2000, 32, 48, 5)], ids=["batch", "long_sequence"])
def test_bfloat16_bit_identical_across_thread_counts(monkeypatch, route, shape):
    """On either route (forced: the automatic choice is measured per thread count) the bf16 kernels keep the
    float32 kernel's tiling and the backward's block order: the same bits on 1 thread as on all (its GEMMs run
    inside the parallel region on any thread count). x, the residual and grad_y are bf16 row-strided views."""
    monkeypatch.setenv("FASTQA_CPU_BF16_ROUTE", route)
    B, L, c_in, c_out, K = shape
    x, dw_weight, pw_weight, pw_bias, dw_bias, residual = (
        None if t is None else t.to(torch.bfloat16) for t in make_inputs(*shape, dw_bias=True, residual=True))
    x, residual = row_strided(x), row_strided(residual)
    grad_y = row_strided(torch.randn(B, L, c_out, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16))
    runs = []
    for threads in (1, max(2, torch.get_num_threads())):
        with num_threads(threads):
            y, aux = torch.ops.fastqa.dwsep_conv1d_fwd(x, dw_weight, dw_bias, pw_weight, pw_bias, residual, K // 2,
                                                       True)
            runs.append((y, aux, *torch.ops.fastqa.dwsep_conv1d_bwd(grad_y, x, dw_weight, dw_bias, pw_weight,
                                                                    pw_bias, aux, K // 2, True)))
    for name, a, b in zip(["y", "aux", "grad x", "grad dw_weight", "grad dw_bias", "grad pw_weight",
                           "grad pw_bias"], *runs):
        assert a.dtype in (torch.bfloat16, torch.bool) and torch.equal(a, b), f"{name} depends on the thread count"


@pytest.mark.skipif(not (cpu_available() and cpu_gemm_info()["bf16_brgemm"]),
                    reason="the native route packs the weight only where the bf16 micro-kernel takes bf16 (elsewhere "
                           "it multiplies through torch's bf16 GEMM, whose kernel may depend on the weight's layout)")
@pytest.mark.parametrize("weight_dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_bfloat16_native_pointwise_weight_packed_through_its_strides(monkeypatch, weight_dtype):
    """On the native route the pointwise weight is packed straight from its values, for the forward's product and
    the backward's transposed one (a float32 master weight rounded as it is packed, a transposed view read through
    its strides): the same bits as from a contiguous bf16 copy of it, forward and every gradient (the float32
    weight's own gradient float32, rounded here to compare)."""
    monkeypatch.setenv("FASTQA_CPU_BF16_ROUTE", "native")
    B, L, c_in, c_out, K = 2, 37, 24, 40, 5
    x, dw_weight, _, pw_bias, dw_bias, residual = (
        None if t is None else t.to(torch.bfloat16) for t in make_inputs(B, L, c_in, c_out, K, dw_bias=True,
                                                                         residual=True))
    g = torch.Generator().manual_seed(11)
    pw_view = (torch.randn(c_in, c_out, 1, generator=g) * c_in ** -0.5).to(weight_dtype).transpose(0, 1)
    pw_copy = pw_view.to(torch.bfloat16).contiguous()
    assert not pw_view.is_contiguous() and pw_view.shape == (c_out, c_in, 1)
    grad_y = torch.randn(B, L, c_out, generator=g).to(torch.bfloat16)

    def run(pw_weight):
        y, aux = torch.ops.fastqa.dwsep_conv1d_fwd(x, dw_weight, dw_bias, pw_weight, pw_bias, residual, K // 2, True)
        return (y, aux, *torch.ops.fastqa.dwsep_conv1d_bwd(grad_y, x, dw_weight, dw_bias, pw_weight, pw_bias, aux,
                                                           K // 2, True))

    for name, a, b in zip(["y", "aux", "grad x", "grad dw_weight", "grad dw_bias", "grad pw_weight", "grad pw_bias"],
                          run(pw_view), run(pw_copy)):
        assert torch.equal(a.to(b.dtype), b), f"{name} depends on how the pointwise weight is stored"


def test_bfloat16_opcheck():
    """The fake kernels give the bf16 outputs' dtypes (the bool mask stays bool)."""
    x, dw_weight, pw_weight, pw_bias, dw_bias, residual = (
        t.to(torch.bfloat16) for t in make_inputs(2, 9, 6, 5, 3, dw_bias=True, residual=True))
    fwd_args = (x, dw_weight, dw_bias, pw_weight, pw_bias, residual, 1, True)
    torch.library.opcheck(torch.ops.fastqa.dwsep_conv1d_fwd, fwd_args)
    _, aux = torch.ops.fastqa.dwsep_conv1d_fwd(*fwd_args)
    grad_y = torch.randn(2, 9, 5).to(torch.bfloat16)
    torch.library.opcheck(torch.ops.fastqa.dwsep_conv1d_bwd,
                          (grad_y, x, dw_weight, dw_bias, pw_weight, pw_bias, aux, 1, True))


# --- dispatch ------------------------------------------------------------------------------------------------

def test_backend_reference_and_env_forcing(monkeypatch):
    args = make_inputs(2, 8, 6, 4, 3)
    calls = []
    real = reference.dwsep_conv1d
    # (the submodule, not the function fastqa.ops re-exports under the same name)
    monkeypatch.setattr(sys.modules["fastqa.ops.dwsep_conv1d"], "dwsep_conv1d_reference",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    fused("reference")(*args)
    assert calls == [1]
    fused("auto")(*args)
    assert calls == [1], "auto on float32 CPU tensors should run the cpu kernels"
    monkeypatch.setenv("FASTQA_BACKEND", "reference")
    fused("auto")(*args)
    assert calls == [1, 1]
    monkeypatch.setenv("FASTQA_BACKEND", "cpu")
    assert_close(fused("auto")(*args), ref(*args), name="FASTQA_BACKEND=cpu")
    assert calls == [1, 1]


def test_forcing_triton_on_cpu_without_interpreter_raises(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match="triton"):
        fused("triton")(*make_inputs(1, 4, 3, 3, 3))
    monkeypatch.setenv("FASTQA_BACKEND", "triton")
    with pytest.raises(RuntimeError, match="triton"):
        fused("auto")(*make_inputs(1, 4, 3, 3, 3))


def test_unsupported_dtype_falls_back_with_warning():
    args = make_inputs(1, 6, 4, 4, 3, dtype=torch.float16)
    with pytest.warns(RuntimeWarning, match="reference"):
        y = fused("auto")(*args)
    assert torch.equal(y, ref(*args))
    with pytest.raises(RuntimeError, match="float32, float64 or bfloat16, got torch.float16"):
        fused("cpu")(*args)


# --- bad input -----------------------------------------------------------------------------------------------

def _bad_cases():
    x, dw, pw, pb, db, res = make_inputs(2, 8, 6, 4, 3, dw_bias=True, residual=True)
    ok = dict(x=x, dw_weight=dw, pw_weight=pw, pw_bias=pb, dw_bias=db, residual=res)
    cases = [
        ("x", ValueError, dict(x=x[0])),                                  # wrong rank
        ("x", TypeError, dict(x=[[1.0]])),                                # not a tensor
        ("x", TypeError, dict(x=x.long())),                               # integer dtype
        ("x", ValueError, dict(x=x[:0])),                                 # empty batch
        ("x", ValueError, dict(x=x[:, :0])),                              # empty length
        ("x", ValueError, dict(x=x.to("meta"))),                          # no data
        ("dw_weight", ValueError, dict(dw_weight=dw[:5])),                # channels mismatch
        ("dw_weight", ValueError, dict(dw_weight=dw.squeeze(1))),         # wrong rank
        ("dw_weight", ValueError, dict(dw_weight=dw[..., :0])),           # K = 0
        ("dw_weight", TypeError, dict(dw_weight=dw.double())),            # dtype mismatch
        ("dw_weight", ValueError, dict(dw_weight=dw.to("meta"))),         # device mismatch
        ("pw_weight", ValueError, dict(pw_weight=pw[:, :5])),             # channels mismatch
        ("pw_weight", ValueError, dict(pw_weight=pw.expand(4, 6, 2))),    # not 1x1
        ("pw_bias", ValueError, dict(pw_bias=pb[:3])),
        ("pw_bias", TypeError, dict(pw_bias=pb.double())),
        ("dw_bias", ValueError, dict(dw_bias=db[:5])),
        ("residual", ValueError, dict(residual=res[:1])),                 # batch mismatch
        ("residual", ValueError, dict(residual=res[..., :3])),            # channels mismatch
        ("residual", TypeError, dict(residual=res.double())),
    ]
    return ok, cases


@pytest.mark.parametrize("case", range(len(_bad_cases()[1])))
def test_bad_tensor_arguments(case):
    ok, cases = _bad_cases()
    name, exc, change = cases[case]
    kwargs = {**ok, **change}
    x, dw, pw = kwargs.pop("x"), kwargs.pop("dw_weight"), kwargs.pop("pw_weight")
    with pytest.raises(exc, match=name):
        fastqa.dwsep_conv1d(x, dw, pw, kwargs.pop("pw_bias"), **kwargs, backend="cpu")


@pytest.mark.parametrize("name, value, exc", [
    ("padding", "valid", ValueError), ("padding", None, ValueError), ("activation", "gelu", ValueError),
    ("backend", "cuda-graphs", ValueError), ("backend", 3, TypeError),
])
def test_bad_kwargs(name, value, exc):
    x, dw, pw, pb, _, _ = make_inputs(1, 5, 4, 4, 3)
    with pytest.raises(exc, match=name):
        fastqa.dwsep_conv1d(x, dw, pw, pb, **{name: value})


def test_bad_layer_arguments():
    with pytest.raises(ValueError, match="activation"):
        fastqa.layers.DepthwiseSeparableConv1d(4, 4, 3, activation="tanh")
    with pytest.raises(ValueError, match="padding"):
        fastqa.layers.DepthwiseSeparableConv1d(4, 4, 3, padding="full")


def test_cpp_checks_name_arguments():
    """The custom ops check their own arguments (RuntimeError with the argument's name)."""
    x, dw, pw, pb, _, _ = make_inputs(1, 5, 4, 4, 3)
    with pytest.raises(RuntimeError, match="pad_left"):
        torch.ops.fastqa.dwsep_conv1d_fwd(x, dw, None, pw, pb, None, 3, False)
    with pytest.raises(RuntimeError, match="pw_weight"):
        torch.ops.fastqa.dwsep_conv1d_fwd(x, dw, None, pw[:, :3], pb, None, 1, False)
    with pytest.raises(RuntimeError, match="aux"):
        torch.ops.fastqa.dwsep_conv1d_bwd(torch.randn(1, 5, 4), x, dw, None, pw, pb,
                                          torch.empty(0, dtype=torch.bool), 1, True)
    with pytest.raises(RuntimeError, match="with relu, aux must be .* got None"):
        torch.ops.fastqa.dwsep_conv1d_bwd(torch.randn(1, 5, 4), x, dw, None, pw, pb, None, 1, True)
    with pytest.raises(RuntimeError, match="without relu, aux must be None"):
        torch.ops.fastqa.dwsep_conv1d_bwd(torch.randn(1, 5, 4), x, dw, None, pw, pb,
                                          torch.ones(1, 5, 4, dtype=torch.bool), 1, False)
    # float32 x with bf16 parameters is refused; bf16 x takes bf16 or float32 parameters (the master weights
    # under autocast), whose gradients come back in their own dtype.
    low = x.to(torch.bfloat16)
    with pytest.raises(RuntimeError, match="dw_weight"):
        torch.ops.fastqa.dwsep_conv1d_fwd(x, dw.to(torch.bfloat16), None, pw, None, None, 1, False)
    with pytest.raises(RuntimeError, match="pw_weight"):
        torch.ops.fastqa.dwsep_conv1d_fwd(x, dw, None, pw.to(torch.bfloat16), None, None, 1, False)
    with pytest.raises(RuntimeError, match="dw_weight"):
        torch.ops.fastqa.dwsep_conv1d_fwd(low, dw.double(), None, pw, None, None, 1, False)
    y, aux = torch.ops.fastqa.dwsep_conv1d_fwd(low, dw, None, pw.to(torch.bfloat16), pb, None, 1, False)
    assert aux is None   # no ReLU mask without ReLU: nothing allocated for it
    grads = torch.ops.fastqa.dwsep_conv1d_bwd(torch.ones_like(y), low, dw, None, pw.to(torch.bfloat16), pb, aux, 1,
                                              False)
    # The absent dw_bias has no gradient at all (None, not an empty placeholder).
    assert [None if g is None else g.dtype for g in grads] == [torch.bfloat16, torch.float32, None, torch.bfloat16,
                                                               torch.float32]
    with pytest.raises(RuntimeError, match="grad_y"):
        torch.ops.fastqa.dwsep_conv1d_bwd(torch.randn(1, 5, 4), low, dw.to(torch.bfloat16), None,
                                          pw.to(torch.bfloat16), None, None, 1, False)


def test_conv_padding_values():
    assert conv_padding(7, "same") == (3, 3) and conv_padding(4, "same") == (1, 2)
    assert conv_padding(5, "causal") == (4, 0)
