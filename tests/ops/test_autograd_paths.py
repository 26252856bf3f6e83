"""Every autograd path is right or refuses loudly: torch.export'ed modules train like eager
(the autograd formula lives on the custom ops), double backward on that path gives the ops' one clear
error, forward-mode AD (torch.func.jvp, forward_ad) gives the reference's tangents or a clear error,
NaN / inf propagate as through torch's own ops, softmax probabilities underflow to exactly 0, odd
tensor kinds get a TypeError naming the argument, and dwsep weight gradients do not depend on the
thread count."""
from __future__ import annotations

import copy
import importlib

import pytest
import torch
from torch.autograd import forward_ad

import fastqa
from fastqa import layers
from helpers import TOLERANCES, assert_close, compiled_backends, device_of, num_threads


def _rand(g: torch.Generator, *shape, scale: float = 1.0, device="cpu") -> torch.Tensor:
    return (torch.randn(*shape, generator=g) * scale).to(device)


# ------------------------------------------------------------------------------------------------
# torch.export: the exported module trains with the eager module's gradients
# ------------------------------------------------------------------------------------------------

class _ResidualIsInput(torch.nn.Module):
    """QANet's conv sublayer: ``layer(x, residual=x)``."""

    def __init__(self, layer: torch.nn.Module) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x, residual=x)

    @property
    def backend(self) -> str:
        return self.layer.backend

    @backend.setter
    def backend(self, value: str) -> None:
        self.layer.backend = value


def _modules(backend: str, device: torch.device):
    """(name, module, example inputs) for every layer with a backward."""
    g = torch.Generator().manual_seed(3)
    torch.manual_seed(3)
    x = _rand(g, 2, 9, 8, device=device)
    c, q = _rand(g, 2, 7, 8, device=device), _rand(g, 2, 5, 8, device=device)
    cm = torch.ones(2, 7, dtype=torch.bool, device=device)
    qm = torch.ones(2, 5, dtype=torch.bool, device=device)
    cm[1, 5:] = False
    qm[0, 4:] = False
    mask = torch.ones(2, 9, dtype=torch.bool, device=device)
    mask[1, 7:] = False
    return [
        ("dwsep", layers.DepthwiseSeparableConv1d(8, 6, 3, activation="relu", depthwise_bias=True, backend=backend),
         (x, _rand(g, 2, 9, 6, device=device))),
        ("ln_dwsep", _ResidualIsInput(layers.LayerNormDepthwiseSeparableConv1d(8, 8, 5, activation="relu",
                                                                               backend=backend)), (x,)),
        ("glu_causal", layers.GLUConv1d(8, 3, causal=True, backend=backend), (x,)),
        ("glu_centred_masked", layers.GLUConv1d(8, 3, causal=False, backend=backend), (x, mask)),
        ("trilinear", layers.TrilinearSimilarity(8, backend=backend), (c, q)),
        ("cqa", layers.ContextQueryAttention(8, backend=backend), (c, q, cm, qm)),
    ]


MODULES = [name for name, _, _ in _modules("reference", torch.device("cpu"))]


def _train_step(module: torch.nn.Module, inputs: tuple, weight: torch.Tensor):
    """One loss + backward; returns (output, input gradient of the first input, {param name: grad})."""
    first = inputs[0].detach().clone().requires_grad_()
    out = module(first, *inputs[1:])
    (out * weight).sum().backward()
    return out.detach(), first.grad, {n: p.grad for n, p in module.named_parameters()}


@pytest.mark.parametrize("strict", [False, True], ids=["non_strict", "strict"])
@pytest.mark.parametrize("name", MODULES)
def test_exported_module_trains_like_eager(name, strict, backend, device):
    """torch.export in training mode, strict (Dynamo) or not: forward, input and parameter gradients equal
    eager's (same kernels, so bit for bit), and an SGD step on each leaves the two modules equal. (Strict
    export used to run the fused ops under no_grad: no gradient reached the parameters at all.)"""
    _, eager, inputs = next(m for m in _modules(backend, device) if m[0] == name)
    eager = eager.to(device)
    exported = torch.export.export(copy.deepcopy(eager), inputs, strict=strict).module()
    assert any("fastqa" in str(n.target) for n in exported.graph.nodes), "the graph calls the fused ops"
    weight = torch.randn(eager(*inputs).shape, generator=torch.Generator().manual_seed(5)).to(device)
    for _ in range(2):  # two steps: the second runs on the updated parameters
        out_e, gx_e, grads_e = _train_step(eager, inputs, weight)
        out_x, gx_x, grads_x = _train_step(exported, inputs, weight)
        torch.testing.assert_close(out_x, out_e, rtol=0, atol=0)
        torch.testing.assert_close(gx_x, gx_e, rtol=0, atol=0)
        assert set(grads_x) == set(grads_e)
        for pname, grad in grads_e.items():
            assert grad is not None and grads_x[pname] is not None, pname
            torch.testing.assert_close(grads_x[pname], grad, rtol=0, atol=0, msg=pname)
        with torch.no_grad():
            for module in (eager, exported):
                for p in module.parameters():
                    p -= 0.1 * p.grad
                    p.grad = None


class _PlusInput(torch.nn.Module):
    """``op(x) + x`` (a residual the module adds itself): where an exported graph dropped the op's gradient,
    x would still get one -- a wrong gradient rather than an error."""

    def __init__(self, layer: torch.nn.Module, *args) -> None:
        super().__init__()
        self.layer, self.args = layer, args

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x, *self.args) + x

    @property
    def backend(self) -> str:
        return self.layer.backend

    @backend.setter
    def backend(self, value: str) -> None:
        self.layer.backend = value


class _DropoutAddOp(torch.nn.Module):
    """``fastqa.dropout_add`` with a fixed seed (its layer draws a new seed per call)."""

    def __init__(self, backend: str) -> None:
        super().__init__()
        self.backend = backend

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fastqa.dropout_add(x * 2, 0.3, 7, x, backend=self.backend)


def _reference_cases():
    """(name, fused module on the cpu backend, inputs) whose exported forms are checked against the reference
    modules: every module above, the reported shape of the dwsep one (its own input as the residual) and the
    ops with a CPU kernel only (linear, self_attention) or no parameters (dropout_add)."""
    g = torch.Generator().manual_seed(31)
    torch.manual_seed(31)
    x = _rand(g, 2, 9, 8)
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[1, 6:] = False
    return [*_modules("cpu", torch.device("cpu")),
            ("dwsep_residual_is_input", _ResidualIsInput(layers.DepthwiseSeparableConv1d(8, 8, 3, activation="relu",
                                                                                         backend="cpu")), (x,)),
            ("dwsep_plus_input", _PlusInput(layers.DepthwiseSeparableConv1d(8, 8, 3, backend="cpu")), (x,)),
            ("glu_plus_input", _PlusInput(layers.GLUConv1d(8, 3, causal=True, backend="cpu")), (x,)),
            ("linear_plus_input", _PlusInput(layers.Linear(8, 8, backend="cpu")), (x,)),
            ("self_attention_plus_input", _PlusInput(layers.SelfAttention(8, 2, backend="cpu"), mask), (x,)),
            ("dropout_add", _DropoutAddOp("cpu"), (x,))]


@pytest.mark.parametrize("strict", [False, True], ids=["non_strict", "strict"])
@pytest.mark.parametrize("name", [name for name, _, _ in _reference_cases()])
def test_exported_module_gradients_match_reference(name, strict):
    """The exported fused module's gradients are the reference module's (the formula is right, not just
    the same as eager's; each gradient counted once), strict export included."""
    _, fused, inputs = next(m for m in _reference_cases() if m[0] == name)
    reference = copy.deepcopy(fused)
    reference.backend = "reference"
    exported = torch.export.export(fused, inputs, strict=strict).module()
    assert any("fastqa" in str(n.target) for n in exported.graph.nodes), "the graph calls the fused ops"
    weight = torch.randn(fused(*inputs).shape, generator=torch.Generator().manual_seed(5))
    out, gx, grads = _train_step(exported, inputs, weight)
    out_ref, gx_ref, grads_ref = _train_step(reference, inputs, weight)
    atol, rtol = TOLERANCES["same dtype"][torch.float32]
    assert_close(out, out_ref, atol=atol, rtol=rtol, name="output")
    assert_close(gx, gx_ref, atol=atol, rtol=rtol, name="grad of the first input")
    assert set(grads) == set(grads_ref)
    for pname, grad in grads_ref.items():
        assert grads[pname] is not None, f"{pname}: no gradient"
        assert_close(grads[pname], grad, atol=atol, rtol=rtol, name=pname)


@pytest.mark.parametrize("name", ["dwsep", "ln_dwsep", "glu_causal", "trilinear", "cqa"])
def test_exported_module_double_backward_raises_one_clear_error(name, backend, device):
    """create_graph=True through the exported module's ops: first-order gradients right, the second
    raises the op's one double-backward RuntimeError (as the Function path does)."""
    _, module, inputs = next(m for m in _modules(backend, device) if m[0] == name)
    exported = torch.export.export(module.to(device), inputs).module()
    first = inputs[0].detach().clone().requires_grad_()
    grad, = torch.autograd.grad((exported(first, *inputs[1:]) ** 2).sum(), first, create_graph=True)
    first_ref = inputs[0].detach().clone().requires_grad_()
    grad_ref, = torch.autograd.grad((module(first_ref, *inputs[1:]) ** 2).sum(), first_ref)
    torch.testing.assert_close(grad.detach(), grad_ref, rtol=0, atol=0)
    with pytest.raises(RuntimeError, match=r"fastqa\.\w+: double backward .* backend='reference'"):
        (grad ** 2).sum().backward()


# ------------------------------------------------------------------------------------------------
# Forward-mode AD
# ------------------------------------------------------------------------------------------------

def _calls(device: torch.device):
    """(name, primal inputs, fn(*inputs, backend)) for every public op (glu_conv1d_step too)."""
    g = torch.Generator().manual_seed(11)
    # The fourth draw is unused; it stays so that every later draw keeps its values.
    x, dw, pw, _ = (_rand(g, 2, 9, 8, device=device), _rand(g, 8, 1, 3, scale=0.5, device=device),
                    _rand(g, 6, 8, 1, scale=0.3, device=device), _rand(g, 6, device=device))
    lnw, lnb = 1 + _rand(g, 8, scale=0.1, device=device), _rand(g, 8, scale=0.1, device=device)
    c, q, w = _rand(g, 2, 7, 4, device=device), _rand(g, 2, 5, 4, device=device), _rand(g, 12, scale=0.3, device=device)
    cm = torch.ones(2, 7, dtype=torch.bool, device=device)
    qm = torch.ones(2, 5, dtype=torch.bool, device=device)
    qm[1, 3:] = False
    gw, gb = _rand(g, 16, 8, 3, scale=0.2, device=device), _rand(g, 16, device=device)
    state, x_t = _rand(g, 2, 2, 8, device=device), _rand(g, 2, 8, device=device)
    pw8, pb8 = _rand(g, 8, 8, 1, scale=0.3, device=device), _rand(g, 8, device=device)
    return [
        ("dwsep_conv1d", (x, dw, pw8, pb8), lambda x, dw, pw, pb, backend: fastqa.dwsep_conv1d(
            x, dw, pw, pb, activation="relu", residual=x, backend=backend)),
        ("ln_dwsep_conv1d", (x, lnw, lnb, dw, pw), lambda x, lnw, lnb, dw, pw, backend: fastqa.ln_dwsep_conv1d(
            x, lnw, lnb, dw, pw, activation="relu", backend=backend)),
        ("trilinear_similarity", (c, q, w), lambda c, q, w, backend: fastqa.trilinear_similarity(
            c, q, w, backend=backend)),
        ("context_query_attention", (c, q, w), lambda c, q, w, backend: fastqa.context_query_attention(
            c, q, cm, qm, w, backend=backend)),
        ("glu_conv1d", (x, gw, gb), lambda x, gw, gb, backend: fastqa.glu_conv1d(x, gw, gb, causal=True,
                                                                                 backend=backend)),
        ("glu_conv1d_step", (x_t, state, gw), lambda x_t, state, gw, backend: fastqa.glu_conv1d_step(
            x_t, state, gw, backend=backend)[0]),
    ]


OPS = [name for name, _, _ in _calls(torch.device("cpu"))]


def _tangents(primals):
    g = torch.Generator().manual_seed(7)
    return tuple(torch.randn(p.shape, generator=g).to(p.device) for p in primals)


@pytest.mark.parametrize("op", OPS)
def test_func_jvp_matches_reference(op, backend, device):
    """torch.func.jvp through every op: the tangent is the reference's, never zero."""
    _, primals, fn = next(c for c in _calls(device) if c[0] == op)
    tangents = _tangents(primals)
    out, tangent = torch.func.jvp(lambda *a: fn(*a, backend=backend), primals, tangents)
    out_ref, tangent_ref = torch.func.jvp(lambda *a: fn(*a, backend="reference"), primals, tangents)
    assert tangent_ref.abs().max() > 0.1
    atol, rtol = TOLERANCES["same dtype"][torch.float32]
    assert_close(out, out_ref, atol=atol, rtol=rtol, name=f"{op} output")
    assert_close(tangent, tangent_ref, atol=atol, rtol=rtol, name=f"{op} tangent")


@pytest.mark.parametrize("op", OPS)
def test_forward_ad_dual_tensors_match_reference(op, backend, device):
    """torch.autograd.forward_ad: dual inputs (requires_grad False, so glu_conv1d_step's forward-only
    kernel path would drop them) give the reference's tangent, never None."""
    _, primals, fn = next(c for c in _calls(device) if c[0] == op)
    tangents = _tangents(primals)
    results = []
    for be in (backend, "reference"):
        with forward_ad.dual_level():
            duals = [forward_ad.make_dual(p, t) for p, t in zip(primals, tangents)]
            assert not any(d.requires_grad for d in duals)
            results.append(forward_ad.unpack_dual(fn(*duals, backend=be)))
    (out, tangent), (out_ref, tangent_ref) = results
    assert tangent is not None, f"{op}: forward-mode tangent dropped"
    atol, rtol = TOLERANCES["same dtype"][torch.float32]
    assert_close(out, out_ref, atol=atol, rtol=rtol, name=f"{op} output")
    assert_close(tangent, tangent_ref, atol=atol, rtol=rtol, name=f"{op} tangent")


def test_forward_ad_on_the_kernel_op_raises_clearly():
    """Forward-mode AD reaching a fused custom op directly (an exported module's graph) raises one clear
    RuntimeError naming the op and the way out, instead of dropping the tangent."""
    _, module, inputs = next(m for m in _modules("cpu", torch.device("cpu")) if m[0] == "glu_causal")
    exported = torch.export.export(module, inputs).module()
    with pytest.raises(RuntimeError, match=r"fastqa\.glu_conv1d: forward-mode AD .* backend='reference'"):
        torch.func.jvp(exported, inputs, _tangents(inputs))
    with forward_ad.dual_level():
        dual = forward_ad.make_dual(inputs[0], _tangents(inputs)[0])
        with pytest.raises(RuntimeError, match=r"fastqa\.glu_conv1d: forward-mode AD"):
            exported(dual)


@pytest.mark.parametrize("transform", ["grad", "vmap"])
def test_func_grad_and_vmap_still_refuse_clearly(transform):
    """torch.func.grad / vmap over a fused op: torch's clear autograd.Function error, not a wrong answer."""
    _, (x, gw, gb), fn = next(c for c in _calls(torch.device("cpu")) if c[0] == "glu_conv1d")
    f = (lambda t: fn(t, gw, gb, backend="cpu").sum()) if transform == "grad" else (
        lambda t: fn(t[None], gw, gb, backend="cpu"))
    with pytest.raises(RuntimeError, match="autograd.Function with functorch transforms"):
        getattr(torch.func, transform)(f)(x)


# ------------------------------------------------------------------------------------------------
# NaN / inf and extreme values
# ------------------------------------------------------------------------------------------------

def _nan_cases(device: torch.device):
    """(name, inputs, fn): one poisoned element in the first input (set by the test)."""
    g = torch.Generator().manual_seed(13)
    x, dw, pw, pb = (_rand(g, 2, 9, 8, device=device), _rand(g, 8, 1, 3, scale=0.5, device=device),
                     _rand(g, 6, 8, 1, scale=0.3, device=device), _rand(g, 6, device=device))
    res = _rand(g, 2, 9, 6, device=device)
    lnw, lnb = 1 + _rand(g, 8, scale=0.1, device=device), _rand(g, 8, scale=0.1, device=device)
    gw, gb = _rand(g, 16, 8, 3, scale=0.2, device=device), _rand(g, 16, device=device)
    return [
        ("dwsep_relu_residual", (x, dw, pw, pb), lambda x, dw, pw, pb, backend: fastqa.dwsep_conv1d(
            x, dw, pw, pb, activation="relu", residual=res, backend=backend)),
        ("ln_dwsep_relu", (x, lnw, lnb, dw, pw), lambda x, lnw, lnb, dw, pw, backend: fastqa.ln_dwsep_conv1d(
            x, lnw, lnb, dw, pw, activation="relu", backend=backend)),
        ("glu_conv1d", (x, gw, gb), lambda x, gw, gb, backend: fastqa.glu_conv1d(x, gw, gb, causal=True,
                                                                                 backend=backend)),
    ]


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("case", ["dwsep_relu_residual", "ln_dwsep_relu", "glu_conv1d"])
def test_nonfinite_values_propagate_like_torch(case, value, backend, device):
    """One NaN / ±inf in x: the output and every gradient have NaN / ±inf exactly where the same-dtype
    reference (torch's own ops) has them, and the finite values agree (with the old ReLU mask
    ``pre > 0`` a NaN pre-activation hid its gradient: grad_x was finite and wrong next to it)."""
    _, inputs, fn = next(c for c in _nan_cases(device) if c[0] == case)
    x = inputs[0].clone()
    x[0, 4, 2] = value
    inputs = (x, *inputs[1:])
    weight = torch.randn(fn(*inputs, backend="reference").shape, generator=torch.Generator().manual_seed(2)).to(device)
    results = []
    for be in (backend, "reference"):
        leaves = [t.detach().clone().requires_grad_() for t in inputs]
        out = fn(*leaves, backend=be)
        out.backward(weight)
        results.append([out.detach()] + [t.grad for t in leaves])
    atol, rtol = TOLERANCES["same dtype"][torch.float32]
    names = ["output"] + [f"grad {i}" for i in range(len(inputs))]
    for name, got, want in zip(names, *results):
        assert torch.equal(got.isnan(), want.isnan()), f"{case} {name}: NaN positions differ"
        assert torch.equal(got.isposinf(), want.isposinf()) and torch.equal(got.isneginf(), want.isneginf()), \
            f"{case} {name}: inf positions differ"
        finite = want.isfinite()
        assert_close(got[finite], want[finite], atol=atol, rtol=rtol, name=f"{case} {name}")


def test_dwsep_nan_preactivation_reaches_grad_x_like_torch():
    """The reproduction: a NaN in x makes the pre-activation NaN; torch's ReLU backward lets the
    gradient of a NaN through (threshold_backward tests ``result <= 0``), so grad_x must equal the
    reference's, NaN for NaN."""
    g = torch.Generator().manual_seed(17)
    x = torch.randn(2, 9, 8, generator=g)
    x[0, 4, 2] = float("nan")
    dw, pw, pb = torch.randn(8, 1, 3, generator=g), torch.randn(6, 8, 1, generator=g), torch.randn(6, generator=g)
    res, grad_y = torch.randn(2, 9, 6, generator=g), torch.randn(2, 9, 6, generator=g)
    grads = []
    for be in ("cpu", "reference"):
        leaf = x.clone().requires_grad_()
        fastqa.dwsep_conv1d(leaf, dw, pw, pb, activation="relu", residual=res, backend=be).backward(grad_y)
        grads.append(leaf.grad)
    torch.testing.assert_close(grads[0], grads[1], equal_nan=True, atol=2e-5, rtol=2e-5)


def _cqa_with_grads(c, q, cm, qm, w, backend):
    leaves = [t.detach().clone().requires_grad_() for t in (c, q, w)]
    out = fastqa.context_query_attention(leaves[0], leaves[1], cm, qm, leaves[2], backend=backend)
    out.backward(torch.ones_like(out))
    return [out.detach()] + [t.grad for t in leaves]


# Tiles pinned for the CQA kernels in the huge-input test: the row kernels' BLOCK_N and the column kernels'
# (BLOCK_M, BLOCK_N). Autotuning (on a GPU) picks each kernel's tiles on its own, so the row and the column
# kernels rebuild S with different tile shapes; "as_launched" keeps whatever the launch path picks.
_CQA_TILES = {"as_launched": None, "row16-col32x32": (16, (32, 32)), "row64-col16x64": (64, (16, 64))}
_CQA_HUGE_CASES = [("cpu", "as_launched")] * ("cpu" in compiled_backends()) + [
    ("triton", tiles) for tiles in _CQA_TILES if "triton" in compiled_backends()]


def _pin_cqa_tiles(monkeypatch, tiles: str) -> None:
    """Every CQA kernel runs one configuration: ``_CQA_TILES[tiles]`` (row kernels, column kernels)."""
    if _CQA_TILES[tiles] is None:
        return
    import triton

    kernels = importlib.import_module("fastqa.triton_kernels.context_query_attention")
    row_n, (col_m, col_n) = _CQA_TILES[tiles]
    monkeypatch.setenv("FASTQA_TRITON_AUTOTUNE", "0")
    for tuner in list(vars(kernels).values()):
        if not isinstance(tuner, triton.runtime.Autotuner):
            continue
        if tuner.configs is kernels._ROW_CONFIGS or tuner.configs is kernels._BWD_ROW_CONFIGS:
            monkeypatch.setattr(tuner, "configs", [triton.Config({"BLOCK_N": row_n}, num_warps=4, num_stages=2)])
        elif tuner.configs is kernels._COL_CONFIGS or tuner.configs is kernels._BWD_COL_CONFIGS:
            monkeypatch.setattr(tuner, "configs", [
                triton.Config({"BLOCK_M": col_m, "BLOCK_N": col_n}, num_warps=4, num_stages=2)])


@pytest.mark.parametrize("backend, tiles", _CQA_HUGE_CASES, ids=lambda v: str(v))
@pytest.mark.parametrize("n, m", [(7, 5), (37, 20)], ids=["one_tile", "several_tiles"])
@pytest.mark.parametrize("case", ["one_huge_query_value", "everything_times_1e15"])
def test_cqa_huge_inputs_match_same_dtype_reference(case, n, m, backend, tiles, monkeypatch):
    """Inputs up to 1e30 (the softmax probabilities of all but the top word underflow): output and
    gradients within tolerance of the same-dtype (float32) torch reference, relative to its magnitude.
    Triton recomputes the probabilities from saved log-sum-exps: it needs every kernel to rebuild the
    same bits of S (one ulp of 1e30 is 1e23, and exp(±1e23) is inf or 0), and the one-hot rows' dS
    to come out exactly 0 as torch's does (the grad weight here is 0 to within 1e-4, with c, q ~ 1e15).
    Not for one tile shape only: the row and column kernels run with different tiles here, as autotuning
    may give them, and the context and question span one tile or several."""
    _pin_cqa_tiles(monkeypatch, tiles)
    device = device_of(backend)
    g = torch.Generator().manual_seed(19)
    c, q, w = _rand(g, 2, n, 4, device=device), _rand(g, 2, m, 4, device=device), _rand(g, 12, device=device)
    cm = torch.ones(2, n, dtype=torch.bool, device=device)
    qm = torch.ones(2, m, dtype=torch.bool, device=device)
    if case == "one_huge_query_value":
        q[1, 2, 0] = 1e30
    else:
        c, q = c * 1e15, q * 1e15
    got = _cqa_with_grads(c, q, cm, qm, w, backend)
    want = _cqa_with_grads(c, q, cm, qm, w, "reference")
    for name, a, b in zip(["output", "grad c", "grad q", "grad weight"], got, want):
        assert torch.isfinite(b).all(), f"the reference is finite here: {name}"
        scale = max(1.0, b.abs().max().item())
        assert (a - b).abs().max().item() <= 1e-4 * scale, f"{case} {name}: {(a - b).abs().max().item()} vs {scale}"


def test_softmax_probabilities_underflow_to_exactly_zero():
    """Each context word's similarities differ by >> 104 (exp underflows in float32): the row softmax is
    exactly one-hot, so A = S̄q is exactly the top question word (an exp clamped at -87 gave the others
    1.6e-38)."""
    d = 4
    q = torch.zeros(1, 3, d)
    q[0, :, 0] = torch.tensor([0.0, 1.0, 2.0])
    q[0, :, 1] = torch.tensor([1.0, 1.0, 0.0])  # the top word's 0: a 1e-38 "probability" of another shows
    c = torch.zeros(1, 5, d)
    c[0, :, 0] = torch.tensor([300.0, -300.0, 500.0, 250.0, -1000.0])
    w = torch.zeros(3 * d)
    w[2 * d] = 1.0  # w_cq = e_0: S[i, j] = c_i0 * q_j0
    cm, qm = torch.ones(1, 5, dtype=torch.bool), torch.ones(1, 3, dtype=torch.bool)
    out = fastqa.context_query_attention(c, q, cm, qm, w, backend="cpu")
    top = torch.where(c[0, :, 0] > 0, 2, 0)  # argmax_j c_i0 * q_j0
    expected_a = q[0, top]
    torch.testing.assert_close(out[0, :, d:2 * d], expected_a, rtol=0, atol=0)


# ------------------------------------------------------------------------------------------------
# Odd tensor kinds
# ------------------------------------------------------------------------------------------------

def _odd_kind_cases():
    g = torch.Generator().manual_seed(23)
    x, w = torch.randn(2, 6, 8, generator=g), torch.randn(16, 8, 3, generator=g)
    dw, pw = torch.randn(8, 1, 3, generator=g), torch.randn(6, 8, 1, generator=g)
    c, q, sw = torch.randn(2, 6, 4, generator=g), torch.randn(2, 5, 4, generator=g), torch.randn(12, generator=g)
    cm, qm = torch.ones(2, 6, dtype=torch.bool), torch.ones(2, 5, dtype=torch.bool)
    lnw, lnb = torch.ones(8), torch.zeros(8)
    nested = lambda t: torch.nested.nested_tensor([t[0], t[1, :3]], layout=torch.jagged)  # noqa: E731
    return [
        ("glu sparse x", "x", lambda: fastqa.glu_conv1d(x.to_sparse(), w, causal=True, backend="cpu")),
        ("glu nested x", "x", lambda: fastqa.glu_conv1d(nested(x), w, causal=True, backend="cpu")),
        ("glu quantized x", "x", lambda: fastqa.glu_conv1d(
            torch.quantize_per_tensor(x, 0.1, 0, torch.qint8), w, causal=True, backend="cpu")),
        ("glu mkldnn x", "x", lambda: fastqa.glu_conv1d(x.to_mkldnn(), w, causal=True, backend="cpu")),
        ("glu sparse weight", "weight", lambda: fastqa.glu_conv1d(x, w.to_sparse(), causal=True, backend="cpu")),
        ("glu sparse mask", "mask", lambda: fastqa.glu_conv1d(x, w, causal=True, mask=cm.to_sparse(), backend="cpu")),
        ("step sparse state", "state", lambda: fastqa.glu_conv1d_step(x[:, 0], x[:, :2].to_sparse(), w,
                                                                      backend="cpu")),
        ("dwsep sparse x", "x", lambda: fastqa.dwsep_conv1d(x.to_sparse(), dw, pw, backend="cpu")),
        ("dwsep csr pw_weight", "pw_weight", lambda: fastqa.dwsep_conv1d(
            x, dw, pw[:, :, 0].to_sparse_csr().to_dense().to_sparse()[..., None], backend="cpu")),
        ("dwsep nested residual", "residual", lambda: fastqa.dwsep_conv1d(
            x, dw, pw, residual=nested(torch.randn(2, 6, 6)), backend="cpu")),
        ("ln_dwsep sparse ln_weight", "ln_weight", lambda: fastqa.ln_dwsep_conv1d(
            x, lnw.to_sparse(), lnb, dw, pw, backend="cpu")),
        ("cqa sparse c", "c", lambda: fastqa.context_query_attention(c.to_sparse(), q, cm, qm, sw, backend="cpu")),
        ("cqa sparse c_mask", "c_mask", lambda: fastqa.context_query_attention(
            c, q, cm.to_sparse(), qm, sw, backend="cpu")),
        ("cqa nested q", "q", lambda: fastqa.context_query_attention(c, nested(q), cm, qm, sw, backend="cpu")),
        ("trilinear sparse weight", "weight", lambda: fastqa.trilinear_similarity(c, q, sw.to_sparse(),
                                                                                  backend="cpu")),
    ]


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("case", [name for name, _, _ in _odd_kind_cases()])
def test_non_strided_tensors_raise_type_error_naming_the_argument(case):
    _, argument, call = next(c for c in _odd_kind_cases() if c[0] == case)
    with pytest.raises(TypeError, match=rf"^{argument} must be a dense"):
        call()


# ------------------------------------------------------------------------------------------------
# Determinism across thread counts
# ------------------------------------------------------------------------------------------------

def _dwsep_grads(op: str, shape: tuple, threads: int) -> list:
    batch, length, c_in, c_out, k = shape
    with num_threads(threads):
        g = torch.Generator().manual_seed(29)
        x = torch.randn(batch, length, c_in, generator=g)
        params = [torch.randn(c_in, 1, k, generator=g), torch.randn(c_out, c_in, 1, generator=g) * 0.2,
                  torch.randn(c_out, generator=g), torch.randn(c_in, generator=g)]
        ln = [1 + 0.1 * torch.randn(c_in, generator=g), 0.1 * torch.randn(c_in, generator=g)]
        leaves = [t.requires_grad_() for t in [x, *params, *ln]]
        x, dw, pw, pb, db, lnw, lnb = leaves
        if op == "dwsep_conv1d":
            y = fastqa.dwsep_conv1d(x, dw, pw, pb, dw_bias=db, activation="relu", backend="cpu")
        else:
            y = fastqa.ln_dwsep_conv1d(x, lnw, lnb, dw, pw, pb, dw_bias=db, activation="relu", backend="cpu")
        y.backward(torch.randn(y.shape, generator=g))
        # ln_dwsep_conv1d: the LayerNorm's weight and bias gradients too (ATen's layer_norm backward,
        # which the cpu path used to run, reduces them per thread).
        return [t.grad for t in (leaves if op == "ln_dwsep_conv1d" else leaves[:5])]


@pytest.mark.skipif("cpu" not in compiled_backends(), reason="needs the C++ extension")
@pytest.mark.parametrize("op", ["dwsep_conv1d", "ln_dwsep_conv1d"])
@pytest.mark.parametrize("shape", [(1, 64, 64, 64, 3), (2, 300, 96, 128, 7), (1, 2000, 32, 48, 5), (8, 40, 16, 16, 3)],
                         ids=["one_block", "batch", "long_sequence", "small"])
def test_dwsep_weight_gradients_bit_identical_across_thread_counts(op, shape):
    """Weight (and bias, input; for ln_dwsep_conv1d also ln_weight, ln_bias) gradients of the cpu dwsep
    kernels are the same bits for 1, 2 and 4 threads: the backward's tiles and reduction blocks depend
    on the shapes only."""
    one = _dwsep_grads(op, shape, 1)
    assert all(t is not None for t in one)
    for threads in (2, 4):
        for i, (a, b) in enumerate(zip(one, _dwsep_grads(op, shape, threads))):
            assert torch.equal(a, b), f"{op} {shape}: gradient {i} differs between 1 and {threads} threads"
