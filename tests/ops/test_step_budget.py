"""The glue around the kernels, proved without a GPU: what one small fast QANet train step dispatches under bf16
autocast on the CPU backend (a budget of aten calls, dtype copies, allocations and host reads), the train step --
forward, backward and optimizer, QANet's and ConvS2S's -- traced by ``torch.compile(fullgraph=True)`` with no graph
break, and a layer's
decoding step compiled with dynamic shapes.

Calls, dtype copies and host reads are counted at the dispatcher (a TorchDispatchMode sees each call from Python or
autograd, not the calls inside a C++ kernel). Allocations are not: while any dispatch mode is active, autograd
takes every tensor for a subclass and sums a parameter's or activation's gradients out of place (``add``, a new
tensor, where a plain step adds in place), and a kernel's own temporaries never reach the dispatcher. So the
allocation budget is every allocation torch's CPU allocator makes in a plain step (every tensor's, a kernel's
temporaries included; not a C++ kernel's own heap buffers, which it does not see), recorded by
``torch.profiler`` (its memory events), on one thread (per-thread buffers and the thread pool's workers would make
it depend on the machine) with the native bf16 routes (a measured route choice could flip between machines).

Before the glue was thinned the step dispatched 1,469 calls, 299 ``_to_copy`` (every weight cast to bf16 at every
call, its gradient cast back per call) and 39 host reads (35 of them the dropout seeds' ``.item()``), and made 3,432
allocations. Casting each weight once per step (a cache shared by the forward's calls) and the seeds drawn on the
device brought that to 1,306 calls, 180 ``_to_copy`` and 4 host reads; the C++ kernels of linear and the depthwise
separable convs taking the float32 master weights (no cast at the dispatcher forward, float32 gradients, so no cast
back either -- though inside, per call, linear's kernel still rounds its weight and bias to bf16 and the convs'
kernels their pointwise weight, copies only the allocator count sees), the dropout seeds drawn once per forward and
no placeholder tensors for absent biases, to 1,145 calls, 18 ``_to_copy`` and 3,192 allocations; the character
embedding's table built once per forward, the highway's carry gate with autograd's gradients but not their copies,
the stochastic-depth factors picked rather than multiplied (no promoted copy of the mask) and the timing signal
added in place where nothing else reads a block's input, to 1,078 calls, 14 ``_to_copy`` and 3,132 allocations.
Most of those (2,625) were inside the C++ kernels, above all the bf16 products of the depthwise separable convs,
taken tile by tile through ATen (each operand narrowed to bf16, the product, its widened copy). Where PyTorch's
batch-reduce GEMM micro-kernel takes bf16 (``cpu_gemm_info()["bf16_brgemm"]``), the convs' native route now
multiplies each tile on it, from per-thread scratch and a pointwise weight packed once per weight value, and linear
rounds a float32 weight to bf16 once per weight value rather than per call: 1,514 allocations, 56% fewer than the
first count (the dtype copies 95% fewer). Without the micro-kernel (an AMD Zen 3) the convs' tiles still go through
ATen. The rest is torch's LayerNorm, the SGD update's per-parameter scalar tensors and the model's own elementwise
ops. (The tensors new at the dispatcher,
counted under the mode, went from 1,164 to 790: a figure that missed the kernels' temporaries and counted the
mode's own gradient sums.)
The budgets are the counts with a little room.
"""
from __future__ import annotations

import collections

import pytest
import torch
import torch.nn.functional as F
from torch.optim.adam import adam as adam_update
from torch.profiler import ProfilerActivity, profile
from torch.utils._python_dispatch import TorchDispatchMode

from fastqa._backend import cpu_available, cpu_gemm_info
from fastqa.models.qanet import QANet, QANetConfig

pytestmark = pytest.mark.skipif(not cpu_available(), reason="needs the C++ extension")

# Per train step of ``_model()`` on ``_batch()`` (measured: 1,078 calls, 14 _to_copy, 4 host reads -- the CPU's
# padding decision, free there --, and 1,213 allocations with the bf16 GEMM micro-kernel, on either float32 GEMM
# engine; the room covers another processor's engine choices). Without the micro-kernel
# the convs' tiles and linear's weight gradients take ATen's bf16 GEMM (measured before the micro-kernel route:
# 3,132 with oneDNN as the float32 engine, 3,144 with BLAS; every route widened 3,021 / 3,163).
BUDGET = {"calls": 1_095, "_to_copy": 16, "allocations": 1_300, "_local_scalar_dense": 4}
ALLOCATIONS_WITHOUT_MICRO_KERNEL = 3_185
FIRST_ALLOCATIONS = 3_432   # before the glue was thinned


def _model(**overrides) -> QANet:
    torch.manual_seed(0)
    config = dict(word_vocab_size=40, char_vocab_size=25, word_dim=8, char_dim=6, char_channels=8, char_kernel=3,
                  d_model=16, heads=2, emb_resize_kernel=3, emb_conv_layers=2, emb_conv_kernel=5, model_blocks=2,
                  model_conv_layers=1, model_conv_kernel=3, dropout=0.1, char_dropout=0.05, layer_dropout=0.1)
    return QANet(QANetConfig(**{**config, **overrides}), "fast").train()


def _batch(b: int = 3, n: int = 17, m: int = 6, w: int = 5) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    cw, qw = torch.randint(2, 40, (b, n), generator=g), torch.randint(2, 40, (b, m), generator=g)
    cc, qc = torch.randint(2, 25, (b, n, w), generator=g), torch.randint(2, 25, (b, m, w), generator=g)
    return cw, cc, qw, qc, torch.tensor([1, 2, 3]), torch.tensor([2, 4, 5])


def _loss(model: QANet, cw, cc, qw, qc, starts, ends) -> torch.Tensor:
    with torch.autocast("cpu", dtype=torch.bfloat16):
        log_s, log_e = model(cw, cc, qw, qc)
    return F.nll_loss(log_s.float(), starts) + F.nll_loss(log_e.float(), ends)


class _Counts(TorchDispatchMode):
    """Calls per aten op (an active mode changes how autograd sums gradients: count allocations with
    ``_allocations``)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def _allocations(run) -> int:
    """The CPU allocator's allocations during ``run()`` (torch.profiler's memory events of positive size): every
    tensor, the C++ kernels' temporaries included, on the threads the profiler follows."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    return sum(e.name() == "[memory]" and e.nbytes() > 0 for e in prof.profiler.kineto_results.events())


@pytest.fixture
def one_thread(monkeypatch):
    """One thread and the native bf16 routes while the test runs: a step's allocations independent of the machine's
    thread count and of the routes' timings (the GEMM engine and the bf16 micro-kernel's presence still count)."""
    monkeypatch.setenv("FASTQA_CPU_BF16_ROUTE", "native")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _sgd_step(model: QANet):
    batch = _batch()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)   # no host read of its own

    def step():
        optimizer.zero_grad(set_to_none=True)
        _loss(model, *batch).backward()
        optimizer.step()

    return step


def test_one_bf16_train_step_stays_within_its_dispatch_budget(one_thread):
    model = _model()
    step = _sgd_step(model)
    step()   # the first step creates the momentum buffers and measures the GEMM engine's choices
    allocations = _allocations(step)
    with _Counts() as counts:
        step()
    got = {"calls": sum(counts.ops.values()), "_to_copy": counts.ops["_to_copy"], "allocations": allocations,
           "_local_scalar_dense": counts.ops["_local_scalar_dense"]}
    budget = dict(BUDGET)
    if not cpu_gemm_info()["bf16_brgemm"]:
        budget["allocations"] = ALLOCATIONS_WITHOUT_MICRO_KERNEL
    assert all(got[k] <= budget[k] for k in budget), f"over budget: {got} > {budget}"
    if cpu_gemm_info()["bf16_brgemm"]:
        assert allocations <= 0.5 * FIRST_ALLOCATIONS
    # The measure sees the step: at least one allocation per parameter's gradient, one per kernel output.
    assert allocations > sum(p.requires_grad for p in model.parameters()) + counts.ops["linear_fwd"]
    # No parameter of linear or the convs is cast at the dispatcher (the kernels take float32 weights; what they
    # round inside is in the allocation count): the copies left are the few other parameters' casts (once per
    # step however often they are used) and activations'.
    assert counts.ops["_to_copy"] <= 0.2 * 299
    # One draw of the forward's dropout seeds, whatever the number of dropout calls.
    assert counts.ops["dropout_add"] > 0 and counts.ops["randint"] == 1


def test_a_dispatch_mode_changes_how_autograd_sums_gradients(one_thread):
    """Why allocations are not counted at the dispatcher: under any TorchDispatchMode autograd sums a tensor's
    gradients out of place (``add``: a new tensor each) where the plain step adds them in place (``add_``), so the
    mode itself adds allocations to the step it counts."""

    class Passthrough(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    step = _sgd_step(_model())
    step()

    def adds(run):
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            run()
        names = collections.Counter(e.name for e in prof.events())
        return names["aten::add"], names["aten::add_"]

    def under_mode():
        with Passthrough():
            step()

    (plain_add, plain_add_), (mode_add, _) = adds(step), adds(under_mode)
    # The mode's events come twice (its redispatch is recorded too): its adds at least double the plain step's,
    # and more -- the gradient sums -- on top.
    assert mode_add > 2 * plain_add + 50 and plain_add_ > 50, (plain_add, plain_add_, mode_add)
    assert _allocations(under_mode) > _allocations(step)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_highway_gives_autograds_values_and_gradients_bit_for_bit(dtype):
    """The highway's carry gate is one autograd Function (its backward without addcmul's scalar products): the
    outputs and every gradient are those of ``addcmul(x, sigmoid(g), relu(h) - x)`` through autograd, bit for bit."""
    from fastqa.models.blocks import Highway

    torch.manual_seed(0)
    highway = Highway(16, 2).to(dtype)
    x0, w = torch.randn(3, 7, 16, dtype=dtype), torch.randn(3, 7, 16)

    def plain(x):
        for layer in highway.layers:
            h, g = layer(x).chunk(2, dim=-1)
            x = torch.addcmul(x, torch.sigmoid(g), F.relu(h) - x)
        return x

    got = []
    for run in (highway, plain):
        x = x0.clone().requires_grad_()
        y = run(x)
        (y.float() * w).sum().backward()
        got.append([y.detach(), x.grad] + [p.grad for p in highway.parameters()])
        highway.zero_grad(set_to_none=True)
    assert all(torch.equal(a, b) for a, b in zip(*got))


@pytest.mark.parametrize("overrides", [{}, dict(emb_conv_layers=1, model_blocks=3, model_conv_layers=2)],
                         ids=["small", "deeper"])
def test_a_training_forward_draws_its_dropout_seeds_once(overrides):
    """QANet's ``dropout_calls`` is the number of dropout calls of a training forward (a padded batch, packed,
    included): the block of seeds it draws is all it draws, one ``randint``, each call a seed of its own."""
    model = _model(**overrides)
    cw, cc, qw, qc, _, _ = _batch()
    cw[0, 12:] = 0   # padding: the packed context path
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16), _Counts() as counts:
        model(cw, cc, qw, qc)
    assert counts.ops["randint"] == 1 and counts.ops["dropout_add"] == model.dropout_calls(), counts.ops


def test_a_convs2s_training_forward_draws_its_dropout_seeds_once():
    """ConvS2S's block of seeds (embeddings, each conv's input, the decoder's output features) is all its
    training forward draws: one ``randint`` for every dropout call."""
    model, _, (src, tgt) = _convs2s_case()
    with torch.no_grad(), _Counts() as counts:
        model(src, tgt[:, :-1])
    assert counts.ops["randint"] == 1 and counts.ops["dropout_add"] == model.dropout_seeds.per_forward, counts.ops


def test_a_weight_changed_in_place_is_cast_anew():
    """The weight cast shared by a forward's calls is keyed by the parameter's version: while a graph still holds
    it, an in-place change (an optimizer step) gives the next forward the new weights, never the stale cast."""
    model = _model(dropout=0.0, char_dropout=0.0, layer_dropout=0.0)
    batch = _batch()[:4]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        before = model(*batch)[0]     # its graph holds the casts
        again = model(*batch)[0]
        with torch.no_grad():
            model.cq_resize.weight.mul_(3.0)
        after = model(*batch)[0]
    assert torch.equal(before, again)
    assert not torch.equal(before, after)


def test_the_training_forward_traces_as_one_graph():
    """Dynamo sees the whole training-mode forward (dropout seeds drawn on the device, stochastic depth and
    timing signal from device buffers, no padding decision read on the host while compiling): one graph."""
    model = _model()
    cw, cc, qw, qc, _, _ = _batch()

    def forward(cw, cc, qw, qc):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return model(cw, cc, qw, qc)

    explained = torch._dynamo.explain(forward)(cw, cc, qw, qc)
    assert explained.graph_break_count == 0 and explained.graph_count == 1, explained.break_reasons


def _qanet_case():
    model = _model(emb_conv_layers=1, model_blocks=1)
    return model, (lambda *batch: _loss(model, *batch)), _batch()


def _convs2s_case():
    from fastqa.models.convs2s import ConvS2S, ConvS2SConfig

    torch.manual_seed(0)
    model = ConvS2S(ConvS2SConfig(src_vocab_size=23, tgt_vocab_size=19, embed_dim=16, hidden_dim=24, encoder_layers=2,
                                  decoder_layers=2, kernel_size=3, dropout=0.2, max_positions=40), layers="fast").train()
    g = torch.Generator().manual_seed(0)
    src, tgt = torch.randint(4, 23, (4, 9), generator=g), torch.randint(4, 19, (4, 8), generator=g)
    src[1, 6:] = 0   # padding
    tgt[:, 0] = 2    # sos

    def loss(src, tgt):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(src, tgt[:, :-1])[0]
        return F.cross_entropy(logits.float().flatten(0, 1), tgt[:, 1:].flatten(), ignore_index=0)

    return model, loss, (src, tgt)


@pytest.mark.parametrize("case", [_qanet_case, _convs2s_case], ids=["qanet", "convs2s"])
def test_the_whole_train_step_compiles_as_one_graph(case):
    """forward + backward + Adam's update in one ``torch.compile(fullgraph=True)`` graph (a break would raise),
    whose losses are the eager step's. The update is torch's functional Adam (``Optimizer.step`` itself
    breaks the graph on purpose around its no_grad switch)."""
    model, loss_of, batch = case()
    params = [p for p in model.parameters() if p.requires_grad]
    state = [[torch.zeros_like(p) for p in params], [torch.zeros_like(p) for p in params],
             [torch.zeros(()) for _ in params]]

    def train_step(*batch):
        loss = loss_of(*batch)
        loss.backward()
        with torch.no_grad():
            adam_update(params, [p.grad for p in params], state[0], state[1], [], state[2], foreach=False,
                        capturable=False, differentiable=False, fused=None, grad_scale=None, found_inf=None,
                        has_complex=False, amsgrad=False, beta1=0.9, beta2=0.999, lr=1e-2, weight_decay=0.0,
                        eps=1e-8, maximize=False)
        for p in params:
            p.grad = None
        return loss.detach()

    def run(step):
        """Two steps from the same weights, optimizer state and seed."""
        with torch.no_grad():
            for p, s in zip(params, start):
                p.copy_(s)
            for t in (t for buffers in state for t in buffers):
                t.zero_()
        torch.manual_seed(1)
        return torch.stack([step(*batch) for _ in range(2)])

    start = [p.detach().clone() for p in params]
    eager = run(train_step)
    with torch._dynamo.config.patch(trace_autograd_ops=True):
        got = run(torch.compile(train_step, fullgraph=True, backend="aot_eager"))
    assert torch.isfinite(got).all() and got[0] != got[1]   # the update ran inside the graph
    torch.testing.assert_close(got, eager, rtol=0.02, atol=0.02)


def test_a_decoding_step_compiles_with_dynamic_shapes():
    """``GLUConv1d.step`` under ``torch.compile(fullgraph=True, dynamic=True)``: its float argument is a symbol
    there, which the scalar checks let through while compiling, and the step gives the eager step's values."""
    from fastqa.layers import GLUConv1d

    torch.manual_seed(0)
    layer = GLUConv1d(8, 3, causal=True).eval()
    step = torch.compile(layer.step, fullgraph=True, dynamic=True, backend="aot_eager")
    with torch.no_grad():
        for batch in (2, 5):
            x, state = torch.randn(batch, 8), torch.randn(batch, 2, 8)
            got, want = step(x, state), layer.step(x, state)
            assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_cpu_layers_take_the_fp32_master_weights_under_autocast():
    """Under bf16 autocast the C++ kernels of linear and the (LayerNorm +) depthwise separable convs take the float32
    parameters uncast: no dtype copy of a parameter at the dispatcher, the parameters' gradients in float32 (summed
    in float32, never rounded to bf16), close to the gradients of the float32 layers; the linear map's output bit
    for bit that of a call with its weight cast first (the weight is rounded once inside the kernel; the float32
    bias is taken as it is)."""
    from helpers import assert_close

    from fastqa.layers import DepthwiseSeparableConv1d, LayerNormDepthwiseSeparableConv1d, Linear

    torch.manual_seed(0)
    ln_conv = LayerNormDepthwiseSeparableConv1d(8, 8, 3, activation="relu", backend="cpu")
    conv = DepthwiseSeparableConv1d(8, 8, 5, backend="cpu")
    lin = Linear(8, 6, backend="cpu")
    modules = (ln_conv, conv, lin)
    x = torch.randn(2, 7, 8)

    def run(x):
        return lin(conv(ln_conv(x, residual=x)))

    with torch.autocast("cpu", dtype=torch.bfloat16), _Counts() as counts:
        out = run(x)
        out.float().sum().backward()
    params = [p for m in modules for p in m.parameters()]
    assert out.dtype == torch.bfloat16
    # The copies of x in and of out.float() and its gradient back: none of a parameter.
    assert counts.ops["_to_copy"] <= 3, counts.ops
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in params)
    got = [p.grad.clone() for p in params]
    for p in params:
        p.grad = None
    run(x).sum().backward()   # float32 throughout
    for (name, p), g in zip(((n, p) for m in modules for n, p in m.named_parameters()), got):
        assert_close(g, p.grad, name=name, rtol=5e-2, atol=5e-2 * p.grad.abs().max().item())

    h = torch.randn(4, 8, dtype=torch.bfloat16)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        uncast = lin(h)
    with torch.no_grad():
        cast = torch.ops.fastqa.linear_fwd(h, lin.weight.to(torch.bfloat16), lin.bias)
    assert torch.equal(uncast, cast)


def test_triton_layers_take_the_fp32_master_weights_under_autocast():
    """Under autocast the Triton path's layers pass their float32 parameters uncast (the kernels round them as
    they load them): no dtype copy of a parameter, the outputs bit for bit those of a call with the parameters
    cast first, and the parameters' gradients in float32."""
    pytest.importorskip("triton")
    from helpers import device_of

    from fastqa.layers import ContextQueryAttention, GLUConv1d, LayerNormDepthwiseSeparableConv1d

    device = device_of("triton")
    torch.manual_seed(0)
    conv = LayerNormDepthwiseSeparableConv1d(8, 8, 3, activation="relu", backend="triton").to(device)
    glu = GLUConv1d(8, 3, causal=True, backend="triton").to(device)
    cqa = ContextQueryAttention(8, backend="triton").to(device)
    x = torch.randn(2, 5, 8, device=device)
    q = torch.randn(2, 3, 8, device=device)
    c_mask, q_mask = torch.ones(2, 5, dtype=torch.bool, device=device), torch.ones(2, 3, dtype=torch.bool, device=device)

    def run(x, q):
        h = glu(conv(x, residual=x))
        return cqa(h, q, c_mask, q_mask)

    with torch.autocast(device.type, dtype=torch.bfloat16), _Counts() as counts:
        out = run(x, q)
        out.float().sum().backward()
    params = [*conv.parameters(), *glu.parameters(), *cqa.parameters()]
    # The copies of the activations x and q in, of out.float() and of its gradient back: none of a parameter.
    assert counts.ops["_to_copy"] <= 4, counts.ops
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in params)
    for module in (conv, glu, cqa):
        module.to(torch.bfloat16)
    with torch.no_grad():
        want = run(x.to(torch.bfloat16), q.to(torch.bfloat16))
    assert out.dtype == torch.bfloat16 and torch.equal(out.detach(), want)
