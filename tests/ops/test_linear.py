"""linear (and the Linear layer): the C++ op on the GEMM entry point against F.linear."""
from __future__ import annotations

import pytest
import torch
from torch.nn.utils import parametrizations

import fastqa
from fastqa import reference
from fastqa._backend import cpu_available, cpu_gemm_info, triton_usable_here
from fastqa.layers import Linear

from helpers import (
    TOLERANCES,
    assert_close,
    check_against_reference,
    check_bf16_against_float64,
    device_of,
    num_threads,
    ran_ops,
    row_strided,
)

pytestmark = pytest.mark.skipif(not cpu_available(), reason="the kernel is C++ only: needs fastqa._C")

NAMES = ["x", "weight", "bias"]

# (leading dims, K, N): ConvS2S's output projection (a smaller vocabulary) and a decode step's, QANet's
# feed-forward layer and its context-query resizer, then edges.
REAL = [((200,), 256, 1000), ((2, 400), 128, 128), ((2, 400), 512, 128)]
EDGE = [
    ((1,), 1, 1),          # one row, one input, one output
    ((3, 7), 5, 3),        # odd sizes below the vector width
    ((2, 3, 4), 9, 17),    # two leading dimensions
]


def make_inputs(lead, k, n, *, dtype=torch.float32, seed=0, bias=True):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*lead, k, generator=g, dtype=dtype)
    weight = torch.randn(n, k, generator=g, dtype=dtype) / k ** 0.5
    b = torch.randn(n, generator=g, dtype=dtype) if bias else None
    return x, weight, b


def fused(x, weight, bias):
    return fastqa.linear(x, weight, bias, backend="cpu")


@pytest.mark.parametrize("shape", REAL + EDGE, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
def test_matches_reference_forward_and_gradient(shape, dtype, bias):
    x, weight, b = make_inputs(*shape, dtype=dtype, bias=bias)
    check_against_reference(fused, reference.linear, (x, weight, b), names=NAMES)


def test_matches_reference_with_strided_operands():
    """x a transposed view, weight a slice of a wider matrix: any strides in, the same values out."""
    x, weight, b = make_inputs((6, 40), 32, 48)
    x_t = x.transpose(0, 1).contiguous().transpose(0, 1)       # [6, 40, 32], non-contiguous
    wide = torch.cat([weight, weight[:, :8]], dim=1)[:, :32]   # [48, 32], row stride 40
    assert not x_t.is_contiguous() and not wide.is_contiguous()
    check_against_reference(fused, reference.linear, (x_t, wide, b), names=NAMES)


def test_runs_the_kernels_and_repeated_backward_is_bit_identical():
    x, weight, b = make_inputs((64, 30), 256, 512)
    assert ran_ops(lambda: fused(x, weight, b)) == {"fastqa::linear_fwd"}

    def grads():
        leaves = [t.clone().requires_grad_() for t in (x, weight, b)]
        fused(*leaves).pow(2).sum().backward()
        return [t.grad for t in leaves]

    first = grads()
    assert ran_ops(grads) == {"fastqa::linear_fwd", "fastqa::linear_bwd"}
    for a, c in zip(first, grads()):
        assert torch.equal(a, c)


@pytest.mark.parametrize("rows, k, n", [(96, 200, 700), (6, 24, 16)])   # 27 MFLOP; a small model's 5 kFLOP
def test_products_large_and_small_are_measured_per_shape(rows, k, n):
    """FASTQA_CPU_GEMM=auto: a top-level product gets an entry in info() with both engines' rates and the
    chooser's pick, a small one too (the engine that wins a large product can lose a small one several times
    over: its fixed cost per call); a forced engine measures nothing."""
    x, weight, b = make_inputs((rows,), k, n)
    fused(x, weight, b)
    gemm = cpu_gemm_info()
    shapes = gemm["shapes"]
    if gemm["requested"] != "auto" or not gemm["onednn_available"]:
        assert shapes == []
        return
    from fastqa import _C
    key = (1 << (rows - 1).bit_length(), k, n, torch.get_num_threads(), "r", "r", True, False)

    def mine(shapes: list[dict]) -> list[dict]:
        return [s for s in shapes if (s["m"], s["k"], s["n"], s["threads"], s["a"], s["w"], s["bias"],
                                      s["accumulate"]) == key]
    assert len(mine(shapes)) == 1, shapes
    (shape,) = mine(shapes)
    if not shape["restored"]:   # measured here (a restored decision, from a plan loaded earlier, has no rates)
        rates = shape["gflops"]
        assert rates["blas"] > 0 and rates["onednn"] > 0
        assert shape["engine"] == _C.gemm_choose(rates["blas"], rates["onednn"], True, "auto")
    fused(x[:rows - 1], weight, b)   # the same power-of-two bucket: no second measurement
    assert mine(cpu_gemm_info()["shapes"]) == [shape]


def test_layer_is_nn_linear_with_the_same_state_dict_and_weight_norm():
    torch.manual_seed(0)
    ref = torch.nn.Linear(24, 40)
    fast = Linear(24, 40)
    assert isinstance(fast, torch.nn.Linear)
    fast.load_state_dict(ref.state_dict())
    assert list(fast.state_dict()) == ["weight", "bias"]
    x = torch.randn(3, 5, 24)
    check_against_reference(lambda x: fast(x), lambda x: ref(x), (x,), names=["x"])
    # Weight-normalised (as ConvS2S builds them): gradients reach weight_g and weight_v alike.
    parametrizations.weight_norm(ref, dim=0)
    parametrizations.weight_norm(fast, dim=0)
    fast.load_state_dict(ref.state_dict())
    fast(x).pow(2).sum().backward()
    ref(x).pow(2).sum().backward()
    for (name, p), q in zip(fast.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-5, msg=name)


def test_without_gradients_runs_the_kernel_alone():
    x, weight, b = make_inputs((8,), 16, 12)
    with torch.no_grad():
        y = fused(x.requires_grad_(), weight, b)
    assert y.grad_fn is None
    torch.testing.assert_close(y, reference.linear(x.detach(), weight, b))


@pytest.mark.parametrize("bias", [True, False])
def test_opcheck(bias):
    x, weight, b = make_inputs((4, 6), 8, 5, bias=bias)
    torch.library.opcheck(torch.ops.fastqa.linear_fwd, (x, weight, b))
    torch.library.opcheck(torch.ops.fastqa.linear_bwd, (torch.randn(4, 6, 5), x, weight, [True, True, bias]))


def test_backward_computes_only_the_gradients_asked_for():
    """linear_bwd's output_mask: a gradient not asked for (an input that needs none, an absent bias) is None,
    nothing allocated; the ones asked for are those of the full call."""
    x, weight, b = make_inputs((4, 6), 8, 5)
    grad_y = torch.randn(4, 6, 5)
    full = torch.ops.fastqa.linear_bwd(grad_y, x, weight, [True, True, True])
    for mask in ([False, True, False], [True, False, False], [False, False, True]):
        got = torch.ops.fastqa.linear_bwd(grad_y, x, weight, mask)
        for wanted, g, want in zip(mask, got, full):
            assert (g is None) if not wanted else torch.equal(g, want)
    # Through autograd: a frozen weight's gradient is never computed, x's is the full call's.
    x.requires_grad_()
    fused(x, weight.detach(), None).backward(grad_y)
    assert torch.equal(x.grad, full[0])


def test_compiles_without_graph_breaks():
    x, weight, b = make_inputs((4, 6), 8, 5)
    compiled = torch.compile(fused, fullgraph=True)
    torch.testing.assert_close(compiled(x, weight, b), reference.linear(x, weight, b))


@pytest.mark.parametrize("bad, error, match", [
    (lambda x, w, b: (x[0, 0], w, b), ValueError, "x must have at least 2 dimensions"),
    (lambda x, w, b: (x, w[:, :3], b), ValueError, "weight must have shape"),
    (lambda x, w, b: (x, w, b[:2]), ValueError, "bias must have shape"),
    (lambda x, w, b: (x, w.double(), b), TypeError, "weight must have dtype"),
    (lambda x, w, b: (x.long(), w, b), TypeError, "x must be a floating-point tensor"),
    (lambda x, w, b: (x, w, "b"), TypeError, "bias must be a torch.Tensor"),
    (lambda x, w, b: ([[1.0]], w, b), TypeError, "x must be a torch.Tensor"),
    (lambda x, w, b: (x[..., :0], w[:, :0], b), ValueError, "weight must have a non-zero size in dimension 1"),
])
def test_bad_arguments_name_the_argument(bad, error, match):
    with pytest.raises(error, match=match):
        fastqa.linear(*bad(*make_inputs((2, 3), 4, 5)))


def _backends():
    """Every backend of linear / linear_argmax that runs here ("triton" is the GPU path, torch ops)."""
    return ["reference", "cpu"] + (["triton"] if triton_usable_here() else [])


@pytest.mark.parametrize("backend", _backends())
@pytest.mark.parametrize("lead", [(0,), (2, 0), (0, 3)], ids=str)
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
def test_empty_batch_as_nn_linear(backend, lead, bias):
    """An empty batch (any leading size 0), accepted as nn.Linear accepts it: an empty output of the right
    shape, and gradients of the right shapes (zero for the parameters), for the op, the layer and argmax."""
    device = device_of(backend)
    x, weight, b = (None if t is None else t.to(device) for t in make_inputs(lead, 4, 5, bias=bias))
    leaves = [None if t is None else t.clone().requires_grad_() for t in (x, weight, b)]
    y = fastqa.linear(*leaves, backend=backend)
    assert y.shape == (*lead, 5)
    y.sum().backward()
    assert leaves[0].grad.shape == x.shape
    assert torch.equal(leaves[1].grad, torch.zeros_like(weight))
    if bias:
        assert torch.equal(leaves[2].grad, torch.zeros_like(b))
    layer, plain = Linear(4, 5, bias=bias, backend=backend).to(device), torch.nn.Linear(4, 5, bias=bias).to(device)
    plain.load_state_dict(layer.state_dict())
    assert layer(x).shape == plain(x).shape
    index = fastqa.linear_argmax(x, weight, b, [1], backend=backend)
    assert index.shape == lead and index.dtype == torch.long


@pytest.mark.skipif(not triton_usable_here(), reason="the triton backend cannot run here")
def test_triton_backend_is_the_gpu_path():
    """backend="triton" (what "auto" runs on CUDA) is F.linear: the reference's values, no custom op."""
    args = [t.to(device_of("triton")) for t in make_inputs((2, 3), 4, 5)]
    assert torch.equal(fastqa.linear(*args, backend="triton"), reference.linear(*args))
    assert not ran_ops(lambda: fastqa.linear(*args, backend="triton"))


# --- linear_argmax: greedy decoding's next token -------------------------------------------------------------

@pytest.mark.parametrize("shape", REAL + EDGE, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
def test_argmax_matches_reference(shape, dtype, bias):
    x, weight, b = make_inputs(*shape, dtype=dtype, bias=bias)
    n = weight.shape[0]
    for exclude in ([], [0] if n > 1 else [], sorted({0, 2, n - 1}) if n > 3 else []):
        got = fastqa.linear_argmax(x, weight, b, exclude, backend="cpu")
        want = reference.linear_argmax(x, weight, b, exclude)
        assert got.dtype == torch.long and got.shape == x.shape[:-1]
        assert torch.equal(got, want), f"exclude={exclude}"
        assert not any(int(i) in exclude for i in got.flatten())


def test_argmax_ties_infinities_and_nan_as_torch_argmax():
    """Zero inputs make the logits the bias exactly: ties give the first, +inf wins, a NaN anywhere gives the
    first NaN (torch.argmax), nothing finite gives 0, an excluded maximum is passed over; 37 features, so
    the scan's vector part and its scalar tail both see the winner."""
    n = 37
    rows = torch.randn(6, n)
    rows[0, [5, 30]] = 9.0                     # a tie: the first
    rows[1, 20] = float("inf")
    rows[2, [3, 33]] = float("nan")            # the first NaN
    rows[3, :] = float("-inf")                 # nothing finite: index 0, as torch
    rows[4, 36] = 50.0                         # the last element (the scalar tail of the scan)
    rows[5, 1] = 100.0                         # excluded below: the next largest instead
    x, weight = torch.zeros(2, 4), torch.randn(n, 4)
    got = [fastqa.linear_argmax(x, weight, row, [1], backend="cpu") for row in rows]
    logits = rows.clone()
    logits[:, 1] = float("-inf")
    assert [g.tolist() for g in got] == [[int(i)] * 2 for i in logits.argmax(1)]
    assert [g[0].item() for g in got][:5] == [5, 20, 3, 0, 36]


def test_argmax_layer_method_and_opcheck():
    torch.manual_seed(0)
    fast, ref = Linear(16, 50), reference.Linear(16, 50)
    ref.load_state_dict(fast.state_dict())
    parametrizations.weight_norm(fast, dim=0)      # as ConvS2S's output layer
    parametrizations.weight_norm(ref, dim=0)
    ref.load_state_dict(fast.state_dict())
    x = torch.randn(4, 3, 16)
    with torch.no_grad():
        assert torch.equal(fast.argmax(x, [7]), ref.argmax(x, [7]))
        assert ran_ops(lambda: fast.argmax(x, [7])) == {"fastqa::linear_argmax"}
    x2, weight, b = make_inputs((5,), 8, 9)
    torch.library.opcheck(torch.ops.fastqa.linear_argmax, (x2, weight, b, [0, 3]))


@pytest.mark.parametrize("backend", _backends())
def test_argmax_never_returns_an_excluded_id(backend):
    """The rule, the same on every backend: the first allowed id holding the largest allowed logit, a NaN
    counting as the largest; so a row whose allowed logits are all -inf gives the lowest allowed id (where
    -inf everywhere used to give id 0, excluded or not)."""
    inf, nan = float("inf"), float("nan")
    n = 37   # the kernel's vector part and its scalar tail
    cases = [  # (logits by id, exclude, expected id)
        ({}, [0, 1], 2),                               # all -inf
        ({}, [1], 0),
        ({}, [0, 2, 3], 1),
        ({}, list(range(36)), 36),                     # one allowed id, the last
        ({0: 5.0, 1: 7.0}, [0, 1], 2),                 # excluded ones finite, the allowed all -inf
        ({4: nan, 9: nan}, [0, 1], 4),                 # the first NaN
        ({0: nan}, [0], 1),                            # an excluded NaN is passed over
        ({3: inf, 20: inf}, [3], 20),                  # +inf, excluded then allowed
        ({6: -1.0, 30: -1.0}, [2], 6),                 # a tie: the first
    ]
    device = device_of(backend)
    x, weight = torch.zeros(2, 3, device=device), torch.randn(n, 3).to(device)
    for values, exclude, expected in cases:
        logits = torch.full((n,), -inf)
        for i, v in values.items():
            logits[i] = v
        got = fastqa.linear_argmax(x, weight, logits.to(device), exclude, backend=backend)
        assert got.tolist() == [expected] * 2, (values, exclude)
    for exclude in ([], [0], [5, 6, 7]):
        rows = torch.full((3, n), -inf)
        rows[1, 10] = 1.0
        got = torch.stack([fastqa.linear_argmax(x, weight, r.to(device), exclude, backend=backend) for r in rows])
        allowed = [i for i in range(n) if i not in exclude]
        assert got[:, 0].tolist() == [allowed[0], 10, allowed[0]]


@pytest.mark.parametrize("backend", _backends())
def test_argmax_excluding_every_id_names_exclude(backend):
    x, weight, b = (t.to(device_of(backend)) for t in make_inputs((2,), 4, 5))
    with pytest.raises(ValueError, match="exclude leaves none of the 5 output features"):
        fastqa.linear_argmax(x, weight, b, [4, 3, 2, 1, 0], backend=backend)
    with pytest.raises(ValueError, match="exclude leaves none"):
        reference.linear_argmax(x, weight, b, list(range(5)))


@pytest.mark.parametrize("exclude, error, match", [
    ([9], ValueError, r"exclude holds 9, outside the 9 output features"),
    ([-1], ValueError, "exclude holds -1"),
    (list(range(9)), ValueError, "leaves none of the 9 output features"),
    ([1.0], TypeError, "exclude must hold ints"),
    ("ab", TypeError, "exclude must be a sequence of ints"),
])
def test_argmax_bad_exclude_names_it(exclude, error, match):
    with pytest.raises(error, match=match):
        fastqa.linear_argmax(*make_inputs((2,), 4, 9), exclude)


@pytest.mark.skipif(not triton_usable_here(), reason="the triton backend cannot run here")
def test_argmax_triton_backend_is_the_gpu_path():
    """backend="triton" is ``device_linear_argmax``: the reference's indices (excluded runs filled in place
    of an index copy), no custom op."""
    args = [t.to(device_of("triton")) for t in make_inputs((3, 7), 6, 11, seed=4)]
    for exclude in ([], [0], [3, 1, 2], [10, 0, 5, 4]):
        assert torch.equal(fastqa.linear_argmax(*args, exclude, backend="triton"),
                           reference.linear_argmax(*args, exclude))
    assert not ran_ops(lambda: fastqa.linear_argmax(*args, [1], backend="triton"))


@pytest.mark.parametrize("shape", REAL + EDGE, ids=str)
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
def test_bfloat16_matches_float64_reference(shape, bias):
    """bf16 in and out, the products on the bf16 engine: forward and every gradient against float64."""
    x, weight, b = make_inputs(*shape, bias=bias)
    check_bf16_against_float64(fused, reference.linear, (x, weight, b), names=NAMES)


@pytest.mark.parametrize("route", ["native", "widen"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
def test_bfloat16_with_float32_parameters(monkeypatch, route, bias):
    """bf16 x with float32 weight and bias (the master weights under autocast): the weight's rounding bit for bit
    that of casting it first (on either route; a float32 bias is added as it is on the native route, rounded first
    on the other), argmax too; the parameters' gradients float32 (what the fake
    kernel declares), summed in float32 from the exact products of the bf16 operands; float32 x with bf16
    parameters is refused."""
    monkeypatch.setenv("FASTQA_CPU_BF16_ROUTE", route)
    x, weight, b = make_inputs((4, 6), 8, 5, bias=bias)
    low = x.to(torch.bfloat16)
    cast = (weight.to(torch.bfloat16), None if b is None else b.to(torch.bfloat16))
    torch.library.opcheck(torch.ops.fastqa.linear_fwd, (low, weight, b))
    assert torch.equal(torch.ops.fastqa.linear_fwd(low, weight, b), torch.ops.fastqa.linear_fwd(low, cast[0], b))
    assert torch.equal(torch.ops.fastqa.linear_argmax(low, weight, b, [1]),
                       torch.ops.fastqa.linear_argmax(low, cast[0], b, [1]))
    grad_y = torch.randn(4, 6, 5).to(torch.bfloat16)
    torch.library.opcheck(torch.ops.fastqa.linear_bwd, (grad_y, low, weight, [True, True, bias]))
    grad_x, grad_w, grad_b = torch.ops.fastqa.linear_bwd(grad_y, low, weight, [True, True, bias])
    assert (grad_b is None) == (not bias)   # no placeholder for an absent bias
    assert grad_x.dtype == torch.bfloat16 and grad_w.dtype == torch.float32
    g2, x2 = grad_y.double().reshape(-1, 5), low.double().reshape(-1, 8)
    assert_close(grad_w, (g2.t() @ x2).float(), name="grad_weight", atol=1e-5, rtol=1e-5)
    if bias:
        assert grad_b.dtype == torch.float32
        assert_close(grad_b, g2.sum(0).float(), name="grad_bias", atol=1e-5, rtol=1e-5)
    with pytest.raises(RuntimeError, match="weight"):
        torch.ops.fastqa.linear_fwd(x, *cast)


@pytest.mark.parametrize("route", ["native", "widen"])
@pytest.mark.parametrize("lead, k, n", [((4, 6), 8, 5), ((3, 401), 24, 37), ((1,), 2, 1), ((1031,), 130, 20)],
                         ids=str)
def test_bfloat16_weight_gradient_on_each_route_is_the_float32_sum_of_exact_products(monkeypatch, route, lead, k, n):
    """With bf16 x and a float32 weight the weight's gradient is float32 on either route (the bf16 micro-kernel in
    blocks of rows, or a float32 GEMM on widened copies): the exact products of the bf16 values summed in float32,
    also for an odd number of rows, several blocks of them, several bands of output columns, an output narrower
    than a vector and a grad_y whose rows lie apart (a slice); on the native route the same sums whatever the thread
    count (the widened route's float32 GEMM is torch's, on the engine measured for each thread count: not held to it)."""
    monkeypatch.setenv("FASTQA_CPU_BF16_ROUTE", route)
    x, weight, _ = make_inputs(lead, k, n, bias=False)
    low = x.to(torch.bfloat16)
    grad_y = row_strided(torch.randn(*lead, n, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16))
    with num_threads(1):
        one = torch.ops.fastqa.linear_bwd(grad_y, low, weight, [False, True, False])[1]
    with num_threads(2):
        two = torch.ops.fastqa.linear_bwd(grad_y, low, weight, [False, True, False])[1]
    assert one.dtype == torch.float32
    want = grad_y.double().reshape(-1, n).t() @ low.double().reshape(-1, k)
    for got in (one, two):
        assert_close(got, want.float(), name="grad_weight", atol=1e-4, rtol=1e-5)
    if route == "native" and cpu_gemm_info()["bf16_brgemm"]:   # without the micro-kernel native is the widened GEMM
        assert torch.equal(one, two)


@pytest.mark.parametrize("lead, n", [((3, 401), 37), ((1,), 1), ((0,), 4)], ids=str)
def test_bfloat16_bias_gradient_is_the_float32_sum_read_in_place(lead, n):
    """With bf16 x and a float32 bias the bias's gradient sums the bf16 rows of grad_y in float32 without a
    widened copy (several blocks of rows, one row, none; a grad_y with a row stride of its own), the same
    sums whatever the thread count."""
    x, weight, b = make_inputs(lead, 8, n)
    low = x.to(torch.bfloat16)
    grad_y = row_strided(torch.randn(*lead, n, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16))
    with num_threads(1):
        one = torch.ops.fastqa.linear_bwd(grad_y, low, weight, [False, False, True])[2]
    with num_threads(2):
        two = torch.ops.fastqa.linear_bwd(grad_y, low, weight, [False, False, True])[2]
    assert one.dtype == torch.float32 and one.shape == (n,)
    assert_close(one, grad_y.double().reshape(-1, n).sum(0).float(), name="grad_bias", atol=1e-4, rtol=1e-5)
    assert torch.equal(one, two)


@pytest.mark.parametrize("shape", REAL[:1] + EDGE, ids=str)
def test_bfloat16_argmax_is_the_argmax_of_the_bf16_logits(shape):
    x, weight, b = (t.to(torch.bfloat16) for t in make_inputs(*shape))
    got = fastqa.linear_argmax(x, weight, b, backend="cpu")
    logits = fastqa.linear(x, weight, b, backend="cpu").float()
    # The id it picks holds the largest of the op's bf16 logits (ties between rounded logits may pick either).
    picked = logits.gather(-1, got.unsqueeze(-1)).squeeze(-1)
    assert torch.equal(picked, logits.max(-1).values)


def _bf16_forward_and_input_grad(x, weight, b, grad_y):
    """(y, grad_x) of the C++ ops on bf16 x and grad_y, with their float64 references on the same values (the
    weight as the ops round it, the bias as given), and Σ|x||w| per output (the scale of a float32 sum's error)."""
    y = torch.ops.fastqa.linear_fwd(x, weight, b)
    grad_x = torch.ops.fastqa.linear_bwd(grad_y, x, weight, [True, False, False])[0]
    w = weight.to(torch.bfloat16).double()
    want_y = x.double() @ w.t() + (0 if b is None else b.double())
    want_gx = grad_y.double() @ w
    return (y, want_y, x.double().abs() @ w.abs().t()), (grad_x, want_gx, grad_y.double().abs() @ w.abs())


def _assert_bf16_close(got, want, absdot, what, *, once):
    """bf16 within the table's tolerance of float64; `once`: each value the float32 sum rounded to bf16 once (within
    half a bf16 ulp, 2^-8 of the value, of the float32 sum, itself within a float32 sum's error of the exact one)."""
    assert got.dtype == torch.bfloat16 and got.shape == want.shape, (what, got.dtype, got.shape)
    atol, rtol = TOLERANCES["vs float64"][torch.bfloat16]
    scale = max(1.0, float(want.abs().max())) if want.numel() else 1.0
    assert_close(got.double(), want, name=what, atol=atol * scale, rtol=rtol)
    if once:
        err = (got.double() - want).abs()
        bound = 2.0 ** -8 * want.abs() + 1e-4 * absdot + 1e-6
        assert bool((err <= bound).all()), f"{what}: worst excess {float((err - bound).max()):.3e}"


# Shapes of the bf16 products' two routes: QANet's feed-forward and attention projections, then edges (one row,
# K 2 and odd, one output, outputs past a band of 128 and not a multiple of 16, leading dimensions, a row tail).
ROUTE_SHAPES = [((3200,), 128, 128), ((3200,), 128, 384), ((8, 400), 384, 128), ((1,), 128, 128), ((7,), 2, 1),
                ((5, 3), 9, 17), ((130,), 7, 129), ((65,), 40, 200)]
PARAMS = ["float32", "bfloat16", "float32 no bias", "bfloat16 weight float32 bias"]


@pytest.mark.parametrize("route", ["native", "widen"])
@pytest.mark.parametrize("params", PARAMS)
@pytest.mark.parametrize("lead, k, n", ROUTE_SHAPES, ids=str)
def test_bfloat16_forward_and_input_gradient_on_each_route(monkeypatch, route, params, lead, k, n):
    """y = x Wᵀ + b and grad_x = grad_y W for bf16 x and grad_y whose rows lie apart (slices of wider tensors), on
    each route forced, against float64 on the same values; on the native route each value is its float32 sum
    (the bias's float32 value added) rounded to bf16 once."""
    monkeypatch.setenv("FASTQA_CPU_BF16_ROUTE", route)
    _, weight, b = make_inputs(lead, k, n, bias="no bias" not in params)
    if params == "bfloat16":
        weight, b = weight.to(torch.bfloat16), b.to(torch.bfloat16)
    elif params == "bfloat16 weight float32 bias":
        weight = weight.to(torch.bfloat16)
    g = torch.Generator().manual_seed(7)
    x = torch.randn(*lead, k + 5, generator=g).to(torch.bfloat16)[..., 3:k + 3]
    grad_y = torch.randn(*lead, n + 2, generator=g).to(torch.bfloat16)[..., 1:n + 1]
    assert x.stride(-2) == k + 5 and grad_y.stride(-2) == n + 2
    fwd, gx = _bf16_forward_and_input_grad(x, weight, b, grad_y)
    once = route == "native" and cpu_gemm_info()["bf16_brgemm"]
    _assert_bf16_close(*fwd, "y", once=once)
    _assert_bf16_close(*gx, "grad_x", once=once)


@pytest.mark.parametrize("route", ["native", "widen"])
def test_bfloat16_products_of_transposed_operands(monkeypatch, route):
    """x and grad_y transposed views (columns apart, not rows): the same values as from contiguous copies."""
    monkeypatch.setenv("FASTQA_CPU_BF16_ROUTE", route)
    _, weight, b = make_inputs((70,), 33, 20)
    g = torch.Generator().manual_seed(8)
    x = torch.randn(33, 70, generator=g).to(torch.bfloat16).t()
    grad_y = torch.randn(20, 70, generator=g).to(torch.bfloat16).t()
    assert x.stride(-1) != 1 and grad_y.stride(-1) != 1
    got = _bf16_forward_and_input_grad(x, weight, b, grad_y)
    want = _bf16_forward_and_input_grad(x.contiguous(), weight, b, grad_y.contiguous())
    for (a, *_), (c, *_) in zip(got, want):
        assert torch.equal(a, c)


@pytest.mark.parametrize("lead, k, n", [((3200,), 128, 384), ((130,), 7, 129), ((1,), 2, 1)], ids=str)
def test_bfloat16_native_route_is_the_same_on_any_thread_count(monkeypatch, lead, k, n):
    """The native route's blocks of rows and bands of columns are fixed by the shape: y and grad_x bit-identical on
    1 and 2 threads."""
    if not cpu_gemm_info()["bf16_brgemm"]:
        pytest.skip("no bf16 micro-kernel on this CPU: the native route is torch's bf16 GEMM, not held to it")
    monkeypatch.setenv("FASTQA_CPU_BF16_ROUTE", "native")
    x, weight, b = make_inputs(lead, k, n)
    x = x.to(torch.bfloat16)
    grad_y = torch.randn(*lead, n, generator=torch.Generator().manual_seed(9)).to(torch.bfloat16)
    runs = []
    for t in (1, 2):
        with num_threads(t):
            runs.append([r[0] for r in _bf16_forward_and_input_grad(x, weight, b, grad_y)])
    for name, a, c in zip(["y", "grad_x"], *runs):
        assert torch.equal(a, c), name


@pytest.mark.parametrize("route", ["native", "widen"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bfloat16_products_follow_in_place_weight_updates(monkeypatch, route, dtype):
    """The weight is packed once per weight value: after an in-place update (an optimizer step's add_, a load's
    copy_) the next forward and grad_x use the new value, never the cached packing of the old one."""
    monkeypatch.setenv("FASTQA_CPU_BF16_ROUTE", route)
    x, weight, b = make_inputs((300,), 64, 48)
    x = x.to(torch.bfloat16)
    w = torch.nn.Parameter(weight.to(dtype))
    grad_y = torch.randn(300, 48, generator=torch.Generator().manual_seed(10)).to(torch.bfloat16)
    once = route == "native" and cpu_gemm_info()["bf16_brgemm"]
    for update in (lambda: w.add_(1), lambda: w.copy_(-weight), lambda: w.mul_(0.5)):
        _bf16_forward_and_input_grad(x, w.detach(), b, grad_y)   # packs (or reuses) the current value
        with torch.no_grad():
            update()
        fwd, gx = _bf16_forward_and_input_grad(x, w.detach(), b, grad_y)
        _assert_bf16_close(*fwd, "y after the update", once=once)
        _assert_bf16_close(*gx, "grad_x after the update", once=once)


def test_bfloat16_products_pick_a_route_per_direction_once(monkeypatch):
    """Unforced, the forward and grad_x each time both routes the first time their shape class is met (where the
    micro-kernel takes bf16; else the one route, nothing measured) and keep the choice: repeated calls bit-identical."""
    monkeypatch.delenv("FASTQA_CPU_BF16_ROUTE", raising=False)
    x, weight, b = make_inputs((3, 37), 72, 24)   # a shape class no other test uses
    x = x.to(torch.bfloat16)
    grad_y = torch.randn(3, 37, 24, generator=torch.Generator().manual_seed(11)).to(torch.bfloat16)
    first = [r[0] for r in _bf16_forward_and_input_grad(x, weight, b, grad_y)]
    info = cpu_gemm_info()
    routes = [r for r in info["routes"] if r["shape"] in ("M=128 R=128 C=32", "M=128 R=32 C=128")]
    if info["bf16_brgemm"]:
        assert sorted(r["op"] for r in routes) == ["linear_bwd_x", "linear_fwd"], routes
        for r in routes:
            assert r["route"] in ("native", "widen") and r["ms"]["native"] > 0 and r["ms"]["widen"] > 0, r
    else:
        assert routes == []
    again = [r[0] for r in _bf16_forward_and_input_grad(x, weight, b, grad_y)]
    for name, a, c in zip(["y", "grad_x"], first, again):
        assert torch.equal(a, c), name
