"""Triton dropout_add kernel (fastqa_triton::dropout_add) against the reference, bit for bit.

The mask is a hash of (seed, element index) computed in uint32 by the kernel and in int64 torch ops by the
reference, and every rounding step is the reference's, so forward and backward must give the very same bits
in every dtype. Without a GPU the kernel runs in the Triton interpreter on CPU tensors (tests/conftest.py sets
TRITON_INTERPRET=1): small shapes there, the models' shapes in the GPU class at the bottom.
"""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

import fastqa  # noqa: E402
from fastqa import reference  # noqa: E402
from fastqa._backend import cpu_available  # noqa: E402
from helpers import device_of, ran_ops  # noqa: E402

OPS = torch.ops.fastqa_triton
DEVICE = device_of("triton")
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# Seeds with every kind of half: zero, high bit set in the low half (uint32-only values), negative seeds
# (high half all ones), the int64 extremes.
SEEDS = [0, 1, 2 ** 31 + 5, 2 ** 32 - 1, -5, 123456789012345, -2 ** 63, 2 ** 63 - 1]
# Odd sizes (a hash pair cut in two), one element, several programs with a ragged end, examples that
# straddle programs.
SHAPES = [(1, 1), (3, 5, 3), (2, 131), (5, 1, 7), (4, 33, 5)]


def seed_of(seed: int, device: torch.device | str = DEVICE) -> torch.Tensor:
    """The op's seed argument: a one-element int64 tensor on the data's device."""
    return torch.tensor([seed], dtype=torch.int64, device=device)


def make_inputs(shape, dtype=torch.float32, seed=0, device=DEVICE):
    g = torch.Generator().manual_seed(seed)
    branch = torch.randn(*shape, generator=g).to(dtype)
    residual = torch.randn(*shape, generator=g).to(dtype)
    scale = ((torch.rand(shape[0], generator=g) < 0.7).float() / 0.7).to(dtype)   # stochastic depth
    return branch.to(device), residual.to(device), scale.to(device)


def assert_bits_equal(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape, what
    assert torch.equal(got, want), f"{what}: max |diff| {(got.float() - want.float()).abs().max().item()}"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_forward_equals_reference_bit_for_bit(shape, dtype):
    branch, residual, scale = make_inputs(shape, dtype)
    for with_residual, with_scale in ((True, True), (True, False), (False, True), (False, False)):
        r, s = (residual if with_residual else None), (scale if with_scale else None)
        for p in (0.0, 0.1, 0.5, 1.0):
            for seed in SEEDS:
                got = OPS.dropout_add(branch, r, s, p, seed_of(seed))
                want = reference.dropout_add(branch, p, seed, r, s)
                assert_bits_equal(got, want, f"p={p} seed={seed} residual={with_residual} scale={with_scale}")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gradients_equal_reference_bit_for_bit(dtype):
    """Through the public entry point: grad_branch is the kernel on the gradient with the same seed (nothing
    stored), grad_residual the gradient itself; exactly the reference's autograd gradients."""
    branch, residual, scale = make_inputs((4, 33, 5), dtype, seed=1)
    grad_out = torch.randn(5, 33, 4).to(dtype).to(DEVICE).permute(2, 1, 0)   # non-contiguous
    grads = []
    for backend in ("triton", "reference"):
        b, r = branch.clone().requires_grad_(), residual.clone().requires_grad_()
        out = fastqa.dropout_add(b, 0.25, 99, r, scale, backend=backend)
        grads.append((out, *torch.autograd.grad(out, (b, r), grad_out)))
    for name, got, want in zip(("output", "grad_branch", "grad_residual"), *grads):
        assert_bits_equal(got, want, name)


def test_public_entry_runs_the_triton_op_forward_and_backward():
    branch, residual, scale = make_inputs((3, 5, 3))
    branch.requires_grad_()
    ran = ran_ops(lambda: fastqa.dropout_add(branch, 0.3, 7, residual, scale, backend="triton").sum().backward())
    assert ran == {"fastqa_triton::dropout_add"}


def test_same_seed_same_mask_as_the_cpu_backend():
    if not cpu_available():
        pytest.skip("the C++ extension is not built")
    branch, residual, scale = make_inputs((4, 33, 5), device="cpu")
    want = fastqa.dropout_add(branch, 0.2, -77, residual, scale, backend="cpu")
    got = fastqa.dropout_add(branch.to(DEVICE), 0.2, -77, residual.to(DEVICE), scale.to(DEVICE), backend="triton")
    assert_bits_equal(got.cpu(), want, "triton vs cpu")


def test_non_contiguous_inputs_follow_the_logical_element_order():
    branch, residual, scale = make_inputs((6, 10, 8), seed=3)
    b_t = branch.transpose(1, 2).contiguous().transpose(1, 2)
    got = OPS.dropout_add(b_t, residual, scale, 0.3, seed_of(11))
    assert_bits_equal(got, reference.dropout_add(branch, 0.3, 11, residual, scale), "strided branch")


def test_empty_and_extreme_values():
    empty = torch.empty(0, 5, device=DEVICE)
    assert OPS.dropout_add(empty, empty, None, 0.5, seed_of(1)).shape == (0, 5)
    x = torch.tensor([[float("nan"), float("inf"), -float("inf"), 3.0e38, -0.0, 1e-40]], device=DEVICE)
    for dtype in DTYPES:
        xd = x.to(dtype)
        for p in (0.0, 0.5):
            got = OPS.dropout_add(xd, xd, None, p, seed_of(5))
            want = reference.dropout_add(xd, p, 5, xd)
            assert torch.equal(got.isnan(), want.isnan())
            assert torch.equal(got.nan_to_num(), want.nan_to_num()), f"{dtype} p={p}"


def test_the_kernel_reads_its_seed_from_the_device():
    """The seed tensor is loaded by the kernel: a value changed in place (as a captured step's seed is) gives
    that value's mask, and a seed on another device than the data is refused."""
    branch, residual, scale = make_inputs((4, 33, 5))
    seed = seed_of(3)
    first = OPS.dropout_add(branch, residual, scale, 0.3, seed)
    seed.fill_(-2 ** 40 + 1)
    assert_bits_equal(OPS.dropout_add(branch, residual, scale, 0.3, seed),
                      reference.dropout_add(branch, 0.3, -2 ** 40 + 1, residual, scale), "changed seed")
    assert not torch.equal(first, OPS.dropout_add(branch, residual, scale, 0.3, seed))
    with pytest.raises(ValueError, match="seed must be a one-element int64 tensor"):
        OPS.dropout_add(branch, residual, scale, 0.3, torch.tensor([1, 2], device=DEVICE))


@pytest.mark.parametrize("bad, error, match", [
    (lambda b, r, s: (b, r[:, :2], s), ValueError, "residual"),
    (lambda b, r, s: (b, r, s[:2]), ValueError, "example_scale"),
    (lambda b, r, s: (b.double(), None, None), TypeError, "branch must be"),
    (lambda b, r, s: (b[0, 0, 0], None, None), ValueError, "batch dimension"),
])
def test_direct_call_rejects_bad_arguments(bad, error, match):
    with pytest.raises(error, match=match):
        OPS.dropout_add(*bad(*make_inputs((3, 5, 3))), 0.1, seed_of(0))


def test_opcheck():
    branch, residual, scale = make_inputs((3, 5, 4))
    torch.library.opcheck(OPS.dropout_add.default, (branch, residual, scale, 0.3, seed_of(17)))
    torch.library.opcheck(OPS.dropout_add.default, (branch, None, None, 0.0, seed_of(-1)))


def test_torch_compile_fullgraph():
    branch, residual, scale = make_inputs((3, 5, 4))

    def f(b, r, s):
        return fastqa.dropout_add(b, 0.3, 17, r, s, backend="triton") * 2.0

    backend = "inductor" if DEVICE.type == "cuda" else "aot_eager"
    got = torch.compile(f, fullgraph=True, backend=backend)(branch, residual, scale)
    assert_bits_equal(got, f(branch, residual, scale), "compiled")


# ---------------------------------------------------------------------------------------------
# GPU: the models' shapes
# ---------------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
class TestGPU:
    @pytest.mark.parametrize("dtype", DTYPES, ids=str)
    @pytest.mark.parametrize("shape", [(32, 400, 128), (64, 27, 256), (3, 1_000_003)], ids=str)
    def test_model_shapes_bit_for_bit(self, shape, dtype):
        """QANet's and ConvS2S's sublayer outputs: the reference (torch integer ops on the GPU) and the CPU
        reference give the same bits as the kernel, forward and backward."""
        branch, residual, scale = make_inputs(shape, dtype, device="cuda")
        for seed in (3, -2 ** 40 + 1):
            got = OPS.dropout_add(branch, residual, scale, 0.1, seed_of(seed, branch.device))
            assert_bits_equal(got, reference.dropout_add(branch, 0.1, seed, residual, scale), "vs GPU reference")
            cpu = reference.dropout_add(branch.cpu(), 0.1, seed, residual.cpu(), scale.cpu())
            assert_bits_equal(got.cpu(), cpu, "vs CPU reference")
            grad = OPS.dropout_add(residual, None, scale, 0.1, seed_of(seed, branch.device))
            assert_bits_equal(grad, reference.dropout_add(residual, 0.1, seed, None, scale), "backward")

    def test_tensor_on_another_gpu(self):
        """The launch runs on the tensor's device (the device guard), not the current one."""
        if torch.cuda.device_count() < 2:
            pytest.skip("needs two GPUs")
        branch, residual, scale = make_inputs((4, 33, 5), device="cuda:1")
        with torch.cuda.device(0):
            got = OPS.dropout_add(branch, residual, scale, 0.3, seed_of(9, branch.device))
        assert got.device == torch.device("cuda:1")
        assert_bits_equal(got, reference.dropout_add(branch, 0.3, 9, residual, scale), "cuda:1")
