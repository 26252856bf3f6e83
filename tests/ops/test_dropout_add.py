"""dropout_add (and the DropoutAdd layer): the seeded one-pass C++ kernel against the reference, bit for bit
(the mask is a hash of (seed, element index), so both compute the very same numbers), its gradients, the
mask's statistics and the argument errors. The Triton kernel: tests/ops/test_triton_dropout_add.py."""
from __future__ import annotations

import pytest
import torch

import fastqa
from fastqa import reference
from fastqa._backend import cpu_available
from fastqa.layers import DropoutAdd
from fastqa.reference.dropout_add import keep_mask

from helpers import check_against_reference, check_bf16_against_float64, ran_ops

pytestmark = pytest.mark.skipif(not cpu_available(), reason="the kernel is C++ only: needs fastqa._C")

# A QANet sublayer's output, a ConvS2S one, then edges: one element, odd sizes (a hash pair cut in two), a
# row that is not a multiple of the kernel's chunk and examples that straddle chunks.
REAL = [(32, 400, 128), (64, 27, 256)]
EDGE = [(1, 1), (3, 5, 3), (2, 1025), (5, 1, 7)]
SEEDS = [0, 123456789012345, -5, 2 ** 63 - 1]


def make_inputs(shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    branch = torch.randn(*shape, generator=g, dtype=dtype)
    residual = torch.randn(*shape, generator=g, dtype=dtype)
    # Stochastic depth's factors: 0 (dropped) or 1 / survival.
    scale = (torch.rand(shape[0], generator=g) < 0.7).to(dtype) / 0.7
    return branch, residual, scale


@pytest.mark.parametrize("shape", REAL + EDGE, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("with_residual, with_scale", [(True, True), (True, False), (False, True), (False, False)])
def test_forward_equals_reference_bit_for_bit(shape, dtype, with_residual, with_scale):
    branch, residual, scale = make_inputs(shape, dtype)
    residual = residual if with_residual else None
    scale = scale if with_scale else None
    for p in (0.0, 0.1, 0.5, 1.0):
        for seed in SEEDS:
            got = fastqa.dropout_add(branch, p, seed, residual, scale, backend="cpu")
            want = reference.dropout_add(branch, p, seed, residual, scale)
            assert got.dtype == dtype and got.shape == branch.shape
            assert torch.equal(got, want), f"p={p} seed={seed}: max diff {(got - want).abs().max()}"


@pytest.mark.parametrize("shape", [REAL[1], *EDGE], ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gradients_equal_reference_bit_for_bit(shape, dtype):
    """grad_branch is the kernel on the gradient with the same seed (the mask recomputed, never stored);
    grad_residual the gradient itself. Checked exactly (atol = rtol = 0), with a non-contiguous grad_out."""
    branch, residual, scale = make_inputs(shape, dtype, seed=1)
    check_against_reference(
        lambda b, r, s: fastqa.dropout_add(b, 0.25, 99, r, s, backend="cpu"),
        lambda b, r, s: reference.dropout_add(b, 0.25, 99, r, s),
        (branch, residual, scale), names=("branch", "residual", "example_scale"), grad_args=(True, True, False),
        atol=0.0, rtol=0.0)
    assert "fastqa::dropout_add" in ran_ops(
        lambda: fastqa.dropout_add(branch.requires_grad_(), 0.25, 99, residual, scale).sum().backward())


def test_gradcheck_float64():
    branch, residual, scale = make_inputs((3, 4, 5), torch.float64, seed=2)
    assert torch.autograd.gradcheck(lambda b, r: fastqa.dropout_add(b, 0.3, 5, r, scale, backend="cpu"),
                                    (branch.requires_grad_(), residual.requires_grad_()))


def test_non_contiguous_inputs_follow_the_logical_element_order():
    """The mask belongs to the element's row-major index in branch's shape, whatever its strides."""
    branch, residual, scale = make_inputs((6, 10, 8), seed=3)
    b_t = branch.transpose(1, 2).contiguous().transpose(1, 2)  # same values, other strides
    r_t = residual[:, :, :].transpose(0, 0)
    got = fastqa.dropout_add(b_t, 0.3, 11, r_t, scale, backend="cpu")
    assert torch.equal(got, reference.dropout_add(branch, 0.3, 11, residual, scale))


def test_mask_rate_independence_and_seeds():
    """P(keep) = 1 - round(p 65536)/65536; neighbours (the two halves of one hash) and consecutive seeds
    are uncorrelated; a seed gives the same mask every time, on any shape of the same size."""
    n = 1 << 20
    for p in (0.1, 0.5, 0.9):
        keep = keep_mask((n,), p, 1234).float()
        q = 1 - round(p * 65536) / 65536
        assert abs(keep.mean().item() - q) < 4 * (q * (1 - q) / n) ** 0.5
        pairs = keep.view(-1, 2)
        corr = torch.corrcoef(pairs.T)[0, 1].item()
        assert abs(corr) < 0.01, f"p={p}: neighbours correlate ({corr})"
        other = keep_mask((n,), p, 1235).float()
        assert abs(torch.corrcoef(torch.stack([keep, other]))[0, 1].item()) < 0.01
    assert torch.equal(keep_mask((64, 8), 0.1, 7), keep_mask((512,), 0.1, 7).view(64, 8))
    ones = torch.ones(1000, 100)
    out = fastqa.dropout_add(ones, 0.1, 3, backend="cpu")
    kept = out != 0
    torch.testing.assert_close(out[kept], torch.full_like(out[kept], 65536 / (65536 - round(0.1 * 65536))))
    assert torch.equal(out, fastqa.dropout_add(ones, 0.1, 3, backend="cpu"))
    assert not torch.equal(out, fastqa.dropout_add(ones, 0.1, 4, backend="cpu"))


def test_edge_values_p_zero_one_and_empty():
    branch, residual, scale = make_inputs((4, 9))
    assert torch.equal(fastqa.dropout_add(branch, 0.0, 1, residual, backend="cpu"), residual + branch)
    assert torch.equal(fastqa.dropout_add(branch, 1.0, 1, residual, backend="cpu"), residual + 0 * branch)
    assert not fastqa.dropout_add(branch, 1.0, 1, backend="cpu").any()
    empty = torch.empty(0, 5)
    assert fastqa.dropout_add(empty, 0.5, 1, empty, backend="cpu").shape == (0, 5)


def test_layer_matches_reference_layer_and_is_identity_in_eval():
    branch, residual, scale = make_inputs((8, 30, 16), seed=4)
    fast, ref = DropoutAdd(0.2), reference.DropoutAdd(0.2)
    torch.manual_seed(5)
    a = fast(branch, residual, scale)
    torch.manual_seed(5)
    b = ref(branch, residual, scale)
    assert torch.equal(a, b)
    g = torch.Generator().manual_seed(6)
    assert torch.equal(fast(branch, generator=g), ref(branch, generator=torch.Generator().manual_seed(6)))
    fast.eval()
    assert fast(branch) is branch
    assert torch.equal(fast(branch, residual, scale), residual + branch)  # no scale in evaluation
    assert "p=0.2" in repr(fast)


@pytest.mark.parametrize("shape", REAL + EDGE, ids=str)
def test_bfloat16_matches_float64_reference(shape):
    """bf16 in and out, float32 per element: the output and both gradients against float64 on the same values."""
    branch, residual, scale = make_inputs(shape, seed=5)
    check_bf16_against_float64(lambda b, r, s: fastqa.dropout_add(b, 0.25, 77, r, s, backend="cpu"),
                               lambda b, r, s: reference.dropout_add(b, 0.25, 77, r, s),
                               (branch, residual, scale), names=("branch", "residual", "example_scale"),
                               grad_args=(True, True, False))


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16)


@pytest.mark.parametrize("shape", [REAL[1], *EDGE], ids=str)
@pytest.mark.parametrize("with_residual, with_scale", [(True, True), (False, False)])
def test_bfloat16_is_the_float32_kernel_rounded(shape, with_residual, with_scale):
    """The bf16 kernel computes each element as the float32 kernel does on the widened values and rounds it to
    nearest even: bit for bit that result rounded (overflow to inf and NaN included), so its keep mask is the
    float32 one for every seed and p."""
    branch, residual, scale = (t.to(torch.bfloat16) for t in make_inputs(shape, seed=6))
    flat = branch.view(-1)
    specials = torch.tensor([float("inf"), float("-inf"), float("nan"), 3.3e38, -3.3e38], dtype=torch.bfloat16)
    flat[:specials.numel()] = specials[:flat.numel()]
    residual = residual if with_residual else None
    scale = scale if with_scale else None
    for p in (0.0, 0.1, 0.5, 1.0):
        for seed in SEEDS:
            got = fastqa.dropout_add(branch, p, seed, residual, scale, backend="cpu")
            want = fastqa.dropout_add(branch.float(), p, seed, None if residual is None else residual.float(),
                                      None if scale is None else scale.float(), backend="cpu").to(torch.bfloat16)
            assert got.dtype == torch.bfloat16 and got.shape == branch.shape
            nan = want.isnan()
            assert torch.equal(got.isnan(), nan), f"p={p} seed={seed}"
            assert torch.equal(_bits(got)[~nan], _bits(want)[~nan]), f"p={p} seed={seed}"


def test_bfloat16_rounding_overflow_and_ties():
    """A float32 sum above bf16's largest value rounds to inf; an exact tie goes to the even neighbour."""
    top = torch.tensor([[3.3895e38, -3.3895e38, 1.0, 1.0078125]], dtype=torch.bfloat16)
    bump = torch.tensor([[2e36, -2e36, 2.0 ** -8, 2.0 ** -8]], dtype=torch.bfloat16)
    got = fastqa.dropout_add(top, 0.0, 1, bump, backend="cpu")
    assert got.dtype == torch.bfloat16
    assert got.float().tolist() == [[float("inf"), float("-inf"), 1.0, 1.015625]]


def test_bfloat16_keep_mask_equals_float32():
    ones = torch.ones(64, 27, 256)
    for seed in SEEDS:
        kept32 = fastqa.dropout_add(ones, 0.25, seed, backend="cpu") != 0
        kept16 = fastqa.dropout_add(ones.to(torch.bfloat16), 0.25, seed, backend="cpu") != 0
        assert torch.equal(kept16, kept32)
        assert torch.equal(kept16, keep_mask(ones.shape, 0.25, seed))


def test_opcheck():
    branch, residual, scale = make_inputs((3, 5, 4))
    seed = torch.tensor([17])
    torch.library.opcheck(torch.ops.fastqa.dropout_add.default, (branch, residual, scale, 0.3, seed))
    torch.library.opcheck(torch.ops.fastqa.dropout_add.default, (branch, None, None, 0.0, torch.tensor([-1])))
    low = [t.to(torch.bfloat16) for t in (branch, residual, scale)]
    torch.library.opcheck(torch.ops.fastqa.dropout_add.default, (*low, 0.3, seed))


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(p=1.5), ValueError, r"p must be a float in \[0, 1\]"),
    (dict(p=-0.1), ValueError, "p must be"),
    (dict(p=True), ValueError, "p must be"),
    (dict(p=float("nan")), ValueError, "p must be"),
    (dict(seed=2 ** 64), ValueError, "seed must be an int64"),
    (dict(seed=1.5), ValueError, "seed must be an int64"),
    (dict(seed=torch.tensor([1, 2])), ValueError, "seed must be an int64 or a one-element int64 tensor"),
    (dict(seed=torch.tensor([1.0])), ValueError, "seed must be an int64 or a one-element int64 tensor"),
    (dict(seed=torch.tensor([1], device="meta")), ValueError, "seed must be on cpu like branch"),
    (dict(residual=torch.zeros(4, 8)), ValueError, "residual must have shape"),
    (dict(residual=torch.zeros(4, 9, dtype=torch.float64)), TypeError, "residual must have dtype"),
    (dict(example_scale=torch.ones(5)), ValueError, "example_scale must have shape"),
    (dict(branch=torch.zeros(4, 9, dtype=torch.int64)), TypeError, "branch must be a floating-point tensor"),
    (dict(branch=torch.tensor(1.0)), ValueError, "branch must have a batch dimension"),
    (dict(branch=[1.0]), TypeError, "branch must be a torch.Tensor"),
])
def test_bad_arguments(kwargs, error, match):
    args = dict(branch=torch.zeros(4, 9), p=0.1, seed=0, residual=None, example_scale=None, backend="cpu")
    args.update(kwargs)
    with pytest.raises(error, match=match):
        fastqa.dropout_add(args.pop("branch"), args.pop("p"), args.pop("seed"), **args)


def test_layer_rejects_bad_p():
    with pytest.raises(ValueError, match=r"p must be in \[0, 1\]"):
        DropoutAdd(1.2)


# ------------------------------------------------------------------------------------- device seed tensors

def test_a_seed_tensor_gives_the_int_seeds_mask_and_a_changed_seed_changes_it():
    """A one-element int64 tensor seeds as its value does (on every path); changing the tensor's value in place
    changes the mask, so a step that advances its seed on the device draws a new mask each call."""
    branch, residual, scale = make_inputs((4, 9, 8), seed=7)
    seed = torch.tensor([-123456789012345])
    got = fastqa.dropout_add(branch, 0.3, seed, residual, scale, backend="cpu")
    assert torch.equal(got, fastqa.dropout_add(branch, 0.3, -123456789012345, residual, scale, backend="cpu"))
    assert torch.equal(got, reference.dropout_add(branch, 0.3, seed, residual, scale))
    seed.add_(1)
    assert not torch.equal(got, fastqa.dropout_add(branch, 0.3, seed, residual, scale, backend="cpu"))


def test_the_backward_reuses_the_forward_mask_whatever_is_drawn_in_between():
    """The layer's seed is drawn on the device per call and saved for the backward: the gradient's zeros are
    exactly the forward's dropped elements, though other calls draw (and the generator moves) in between."""
    torch.manual_seed(0)
    layer = fastqa.layers.DropoutAdd(0.5).train()
    branch = torch.randn(6, 40, 8, requires_grad=True)
    out = layer(branch)
    for _ in range(3):
        layer(torch.randn(6, 40, 8))      # later calls: new seeds, new masks
    out.backward(torch.ones_like(out))
    kept = out != 0
    assert 0.3 < kept.float().mean() < 0.7
    assert torch.equal(branch.grad != 0, kept)
    assert torch.equal(branch.grad[kept], torch.full_like(branch.grad[kept], 2.0))   # 1 / P(keep)


def test_an_overwritten_seed_refuses_the_backward():
    """A seed tensor overwritten in place after the forward read it would give the backward another mask:
    autograd's saved-tensor version check refuses it."""
    branch = torch.randn(3, 10, requires_grad=True)
    seed = torch.tensor([5])
    out = fastqa.dropout_add(branch, 0.5, seed, backend="cpu")
    seed.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


def test_the_layers_seeds_repeat_with_torch_manual_seed_and_never_reach_the_host():
    """Training calls draw their seeds on the device: no host read (no ``.item()``) per call; the same
    torch.manual_seed gives the same masks, another seed other masks."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    layer = fastqa.layers.DropoutAdd(0.2).train()
    branch, residual, _ = make_inputs((5, 12, 8), seed=8)

    def run(seed):
        torch.manual_seed(seed)
        return [layer(branch, residual) for _ in range(3)]

    with Ops() as ops:
        first = run(1)
    assert "_local_scalar_dense" not in ops.names and ops.names.count("dropout_add") == 3
    assert all(torch.equal(a, b) for a, b in zip(first, run(1)))
    assert not torch.equal(first[0], first[1])
    assert not torch.equal(first[0], run(2)[0])


def test_a_forwards_shared_seeds_are_one_draw_and_each_call_its_own():
    """``share_dropout_seeds``: the layers of a module take their seeds from one block per forward (one draw on
    the device, one-element views of it, no allocation per call), a call past the block draws the next block;
    each call its own mask, the same torch.manual_seed the same masks, and a backward after later forwards
    (new blocks) still reuses its forward's mask. Outside a drawn forward a layer draws its own seed."""
    from torch import nn
    from torch.utils._python_dispatch import TorchDispatchMode

    from fastqa.models.regularization import TorchDropoutAdd
    from fastqa.reference.dropout_add import DropoutSeeds, share_dropout_seeds

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    model = nn.ModuleDict({"a": DropoutAdd(0.5), "b": reference.DropoutAdd(0.5), "plain": TorchDropoutAdd(0.5)})
    seeds = share_dropout_seeds(model.train(), 2)
    assert isinstance(seeds, DropoutSeeds) and model["a"].seeds is seeds and model["b"].seeds is seeds
    assert model["plain"].seeds is None   # its masks hash no seed
    assert share_dropout_seeds(nn.ModuleDict({"plain": TorchDropoutAdd(0.5)}), 2) is None
    branch = torch.randn(4, 30, 8, requires_grad=True)

    def forward(seed):
        torch.manual_seed(seed)
        seeds.draw(branch.device)
        outs = [model["a"](branch), model["b"](branch), model["a"](branch)]   # the third: past the block
        seeds.release()
        return outs

    with Ops() as ops:
        first = forward(1)
    assert ops.names.count("randint") == 2 and "_local_scalar_dense" not in ops.names
    assert all(not torch.equal(first[i] != 0, first[j] != 0) for i, j in ((0, 1), (0, 2), (1, 2)))
    again = forward(1)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    other = forward(2)
    assert not torch.equal(first[0], other[0])
    first[0].backward(torch.ones_like(first[0]))     # after two more forwards (new blocks)
    assert torch.equal(branch.grad != 0, first[0] != 0)
    with Ops() as ops:
        model["a"](branch)                            # outside a drawn forward: its own seed
    assert ops.names.count("randint") == 1 and seeds.take() is None
    with pytest.raises(ValueError, match="per_forward"):
        DropoutSeeds(0)
