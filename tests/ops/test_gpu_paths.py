"""The GPU path: every op the models call runs on CUDA tensors without a Python loop over sequences and without
a host sync, the models decide their packing without reading device data, a fallback to the reference on a
CUDA tensor warns once per op, Triton launches run under a device guard, and the autotuner's choices survive a
checkpoint.

Most of it runs here on CPU tensors: the GPU paths of self_attention, decode_attention, linear and
linear_argmax are torch ops, called directly or through backend="triton" (CPU tensors under the interpreter),
inside ``NoHostReads``, which fails on any op whose result the host would have to wait for on a GPU. The GPU
class at the bottom checks the same on CUDA with ``torch.cuda.set_sync_debug_mode("error")``.
"""
from __future__ import annotations

import importlib
import warnings

import pytest
import torch

import fastqa
from fastqa import _backend, reference
from fastqa.models import packing, regularization
from fastqa.models.device import reads_are_free
from fastqa.models.qanet import modeling as qanet_modeling
from fastqa.ops._declare import EXAMPLES
from fastqa.ops._torch_private import registered_op_names
from fastqa.ops.linear import device_linear_argmax
from fastqa.ops.self_attention import packed_attention
from helpers import NoHostReads, assert_close, padding_mask

needs_triton = pytest.mark.skipif(not _backend.triton_usable_here(), reason="the triton backend cannot run here")


def _qkv(b: int, length: int, heads: int, d: int, *, dtype=torch.float32, seed: int = 0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(b, length, 3 * heads * d, generator=g, dtype=dtype)
    mask = torch.rand(b, length, generator=g) < 0.7
    return qkv.to(device), mask.to(device)


# ----------------------------------------------------------------------------- self_attention

@pytest.mark.parametrize("segments, b", [([3, 5, 1, 4], 2), ([7], 3), ([2, 2], 1), ([1, 1, 1], 2), (None, 2)],
                         ids=str)
def test_packed_attention_equals_reference_with_gradients(segments, b):
    """Values and gradients of the reference's per-segment loop, a segment with no real position included."""
    length = sum(segments) if segments else 6
    qkv, mask = _qkv(b, length, 2, 4, dtype=torch.float64, seed=len(segments or ()))
    if segments:
        mask[0, :segments[0]] = False   # segment 0 of row 0: every position padded
    leaves = [qkv.clone().requires_grad_() for _ in range(2)]
    got = packed_attention(leaves[0], mask, 2, segments)
    want = reference.self_attention(leaves[1], mask, 2, segments)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    grad = torch.randn_like(got)
    torch.testing.assert_close(torch.autograd.grad(got, leaves[0], grad)[0],
                               torch.autograd.grad(want, leaves[1], grad)[0], rtol=1e-12, atol=1e-12)


def test_packed_attention_is_one_attention_call_without_host_reads(monkeypatch):
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def counting(*args, **kwargs):
        calls.append(args[0].shape)
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", counting)
    qkv, mask = _qkv(2, 13, 2, 4)
    qkv.requires_grad_()
    with NoHostReads():
        out = packed_attention(qkv, mask, 2, [3, 5, 1, 4])
        out.sum().backward()
    assert len(calls) == 1 and calls[0] == (2 * 4, 2, 5, 4)   # [B * S, heads, longest segment, D]


def test_no_host_reads_guard_catches_reads():
    """The guard itself: the reference's per-segment loop is fine (segments are host ints), but reads fail."""
    qkv, mask = _qkv(2, 6, 1, 4)
    with NoHostReads(), pytest.raises(AssertionError, match="host read"):
        int(mask.sum())
    with NoHostReads(), pytest.raises(AssertionError, match="host read"):
        qkv[mask]
    with NoHostReads(), pytest.raises(AssertionError, match="host read"):
        torch.repeat_interleave(torch.arange(2), torch.tensor([1, 2]))


@needs_triton
def test_auto_on_the_gpu_path_runs_packed_attention(monkeypatch):
    """backend="triton" (what "auto" resolves to on CUDA) goes to packed_attention, not the reference loop."""
    module = importlib.import_module("fastqa.ops.self_attention")   # fastqa.ops.self_attention is the function
    seen = []
    monkeypatch.setattr(module, "packed_attention", lambda *a: seen.append(a) or reference.self_attention(*a))
    qkv, mask = _qkv(1, 6, 2, 4)
    fastqa.self_attention(qkv, mask, 2, segments=[2, 4], backend="triton")
    assert len(seen) == 1 and seen[0][3] == [2, 4]


# ----------------------------------------------------------------------------- decode_attention, linear(_argmax)

@needs_triton
def test_decode_attention_and_linear_gpu_paths_read_nothing_on_the_host():
    g = torch.Generator().manual_seed(3)
    q, keys, values = torch.randn(4, 2, 8, generator=g), torch.randn(4, 9, 8, generator=g), torch.randn(4, 9, 5,
                                                                                                        generator=g)
    mask = padding_mask(4, 9, seed=3)
    bias = torch.randn(4, 1, 9, generator=g)
    w, b = torch.randn(11, 8, generator=g), torch.randn(11, generator=g)
    with NoHostReads():
        out, weights = fastqa.decode_attention(q, keys, values, bias, mask, scale=0.5, backend="triton")
        y = fastqa.linear(q, w, b, backend="triton")
        idx = fastqa.linear_argmax(q, w, b, [0, 1, 2, 7], backend="triton")
    want = reference.decode_attention(q, keys, values, bias, mask, scale=0.5)
    assert torch.equal(out, want[0]) and torch.equal(weights, want[1])
    assert torch.equal(y, reference.linear(q, w, b))
    assert torch.equal(idx, reference.linear_argmax(q, w, b, [0, 1, 2, 7]))


@pytest.mark.parametrize("exclude", [[], [0], [5, 3, 4], [10, 0, 9, 1], list(range(10))], ids=str)
def test_device_linear_argmax_equals_reference(exclude):
    g = torch.Generator().manual_seed(len(exclude))
    x, w = torch.randn(3, 4, 6, generator=g), torch.randn(11, 6, generator=g)
    x[0, 0] = 0.0   # a row of ties: the first index wins in both
    with NoHostReads():
        got = device_linear_argmax(x, w, None, exclude)
    assert torch.equal(got, reference.linear_argmax(x, w, None, exclude))


# ----------------------------------------------------------------------------- every op's GPU path

def triton_kernel_ops() -> list[str]:
    """The public ops whose GPU path is a Triton kernel (a ``fastqa_triton::<op>`` or ``<op>_fwd`` custom op); the
    others' GPU path is torch ops."""
    importlib.import_module("fastqa.triton_kernels")   # registers torch.ops.fastqa_triton.*
    names = {name.split("::", 1)[1] for name in registered_op_names() if name.startswith("fastqa_triton::")}
    return sorted(op for op in EXAMPLES if op in names or f"{op}_fwd" in names)


# The ops whose GPU path is torch ops; a Triton kernel's launches are checked on a GPU (TestGPU).
_TORCH_GPU_PATHS = sorted(set(EXAMPLES) - set(triton_kernel_ops())) if _backend.triton_usable_here() else []


@needs_triton
def test_the_ops_split_into_kernels_and_torch_paths():
    assert {"linear", "self_attention"} <= set(_TORCH_GPU_PATHS)
    assert {"dwsep_conv1d", "glu_conv1d_step"} <= set(triton_kernel_ops())


@needs_triton
@pytest.mark.parametrize("op", _TORCH_GPU_PATHS)
def test_every_torch_op_gpu_path_reads_nothing_on_the_host(op):
    """An op whose GPU path is torch ops (no Triton kernel of its own) runs backend="triton" on its example
    (fastqa.ops._declare.Example) without one host read, forward and backward, with the reference's values."""
    example = EXAMPLES[op]
    args, kwargs = example.inputs()
    leaves = [t.clone().requires_grad_() if i in example.grads else t for i, t in enumerate(args)]
    with NoHostReads():
        out = getattr(fastqa, op)(*leaves, **kwargs, backend="triton")
        outs = out if isinstance(out, tuple) else (out,)
        grads = (torch.autograd.grad(outs[0].sum(), [leaves[i] for i in example.grads]) if example.grads else ())
    want = getattr(reference, op)(*args, **kwargs)
    for i, (got, ref) in enumerate(zip(outs, want if isinstance(want, tuple) else (want,))):
        assert_close(got, ref, name=f"{op} output {i}")
    ref_leaves = [t.clone().requires_grad_() if i in example.grads else t for i, t in enumerate(args)]
    if example.grads:
        ref_out = getattr(reference, op)(*ref_leaves, **kwargs)
        ref_grads = torch.autograd.grad((ref_out[0] if isinstance(ref_out, tuple) else ref_out).sum(),
                                        [ref_leaves[i] for i in example.grads])
        for i, got, ref in zip(example.grads, grads, ref_grads):
            assert_close(got, ref, name=f"{op} gradient of input {i}")


# ----------------------------------------------------------------------------- warnings

def test_cuda_fallback_warns_once_per_op(monkeypatch):
    """On a CUDA tensor an automatic fallback warns once per op, whatever the reason; on the CPU once per
    (op, reason), as before."""
    monkeypatch.setattr(_backend, "_WARNED", set())
    monkeypatch.delenv("FASTQA_BACKEND", raising=False)
    cuda = torch.device("cuda")   # a device object only: nothing runs on it
    with pytest.warns(RuntimeWarning, match="falling back to the reference backend on a CUDA tensor"):
        assert _backend.resolve_backend("auto", "some_op", cuda, torch.float64) == "reference"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _backend.warn_cuda_reference("some_op", cuda, "another reason")
        _backend.warn_cuda_reference("other_op", torch.device("cpu"), "CPU tensors never warn here")
    with pytest.warns(RuntimeWarning, match="other_op"):
        _backend.warn_cuda_reference("other_op", cuda, "a reason")


# ----------------------------------------------------------------------------- the models' packing

def test_packing_is_decided_without_reading_device_data(monkeypatch):
    mask = padding_mask(6, 20, seed=1)
    assert packing.should_pack(mask)   # a CPU batch with much padding packs
    assert not reads_are_free(torch.device("cuda"))
    monkeypatch.setattr(packing, "reads_are_free", lambda device: False)   # the decision a GPU batch gets
    with NoHostReads():
        assert not packing.should_pack(mask)
    with NoHostReads():
        scales = regularization.survival_scales(6, [0.9, 1.0], device=torch.device("cpu"), dtype=torch.float32)
    assert scales.shape == (2, 6)


def test_qanet_train_step_reads_nothing_on_the_host_on_the_gpu_path(monkeypatch):
    """The QANet forward + backward as a GPU batch runs it (no packing, no char compaction), with the fast
    layers: not one host read of tensor data, and the values of the CPU run (which packs)."""
    from fastqa.models.qanet import QANet, QANetConfig

    cfg = QANetConfig(word_vocab_size=40, char_vocab_size=25, word_dim=8, char_dim=6, char_channels=8,
                      char_kernel=3, d_model=16, heads=2, emb_resize_kernel=3, emb_conv_layers=2, emb_conv_kernel=5,
                      model_blocks=2, model_conv_layers=1, model_conv_kernel=3)
    g = torch.Generator().manual_seed(0)
    cw, qw = torch.randint(2, 40, (3, 17), generator=g), torch.randint(2, 40, (3, 6), generator=g)
    cc, qc = torch.randint(2, 25, (3, 17, 5), generator=g), torch.randint(2, 25, (3, 6, 5), generator=g)
    cw[1, 6:], cc[1, 6:], cw[2, 9:], cc[2, 9:], cc[:, :, 3:] = 0, 0, 0, 0, 0   # much padding: the CPU run packs
    torch.manual_seed(0)
    model = QANet(cfg, "fast")

    def step():
        torch.manual_seed(1)   # the dropout seeds are drawn on the device: no host read
        model.zero_grad()
        log_s, log_e = model(cw, cc, qw, qc)
        loss = -(log_s[:, 2] + log_e[:, 4]).sum()
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]

    # Values in evaluation mode (training draws its dropout masks over the packed or the padded shape).
    model.eval()
    want_loss, want_grads = step()
    monkeypatch.setattr(packing, "reads_are_free", lambda device: False)
    monkeypatch.setattr(qanet_modeling, "reads_are_free", lambda device: False)
    with NoHostReads():
        got_loss, got_grads = step()
        model.train()
        step()   # dropout, stochastic depth and their fused kernels too
    torch.testing.assert_close(got_loss, want_loss, rtol=1e-5, atol=1e-5)
    assert len(got_grads) == len(want_grads)
    for got, want in zip(got_grads, want_grads):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


# ----------------------------------------------------------------------------- device guard, autotuning

triton = pytest.importorskip("triton")
from fastqa.triton_kernels import _common  # noqa: E402
from fastqa.triton_kernels import glu_conv1d as glu_kernels  # noqa: E402


def test_device_guard_is_a_no_op_for_cpu_tensors():
    import contextlib
    assert isinstance(_common._device_guard((torch.zeros(1), 3)), contextlib.nullcontext)
    assert isinstance(_common._device_guard((3, "x")), contextlib.nullcontext)


@needs_triton
def test_autotune_choices_round_trip(monkeypatch):
    """A kernel tuned between two configurations: its choice is exported per key, and restoring it into a
    fresh cache makes the next launch use it without benchmarking again; kernel_choices carries it with the
    CPU GEMM plan, and older checkpoints (the plan alone, or nothing) still restore."""
    tuner = glu_kernels._glu_dpre
    slow, fast = (triton.Config({"BLOCK_N": 16}, num_warps=4, num_stages=1),
                  triton.Config({"BLOCK_N": 32}, num_warps=4, num_stages=1))
    monkeypatch.setattr(tuner, "configs", [slow, fast])
    monkeypatch.setattr(tuner, "cache", {})
    monkeypatch.setattr(tuner, "_bench", lambda *args, config, **kw: [1.0 if config is fast else 2.0] * 3,
                        raising=False)
    monkeypatch.setenv("FASTQA_TRITON_AUTOTUNE", "1")
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(2, 5, 8, generator=g), torch.randn(16, 8, 3, generator=g) * 0.2
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    x, w = x.to(device), w.to(device)
    y, aux = torch.ops.fastqa_triton.glu_conv1d_fwd(x, w, None, None, 2, True, 0.5)
    first = torch.ops.fastqa_triton.glu_conv1d_bwd(y, x, w, None, aux, 2, True, 0.5, False)

    choices = _common.autotune_choices()
    assert choices["glu_conv1d._glu_dpre"] == {repr(k): fast.all_kwargs() for k in tuner.cache}
    state = _backend.kernel_choices()
    assert state["triton"]["glu_conv1d._glu_dpre"] == choices["glu_conv1d._glu_dpre"]
    assert state["cpu_gemm"] == _backend.cpu_gemm_plan()

    tuner.cache.clear()

    def no_benchmark(*args, **kwargs):
        raise AssertionError("a restored key was benchmarked again")

    monkeypatch.setattr(tuner, "_bench", no_benchmark, raising=False)
    _backend.restore_kernel_choices(state)
    assert list(tuner.cache.values()) == [fast]
    again = torch.ops.fastqa_triton.glu_conv1d_bwd(y, x, w, None, aux, 2, True, 0.5, False)
    assert tuner.best_config is fast
    assert all((a is None and b is None) or torch.equal(a, b) for a, b in zip(first, again))

    # Unknown kernels, keys and configurations are skipped; older checkpoints restore the plan alone.
    _common.restore_autotune_choices({"no_such.kernel": {"(1,)": {}}, "glu_conv1d._glu_dpre": {
        "(99,)": {"BLOCK_N": 4096, "num_warps": 1}, "not a tuple": fast.all_kwargs()}})
    assert list(tuner.cache.values()) == [fast]
    _backend.restore_kernel_choices(None)
    _backend.restore_kernel_choices(_backend.cpu_gemm_plan())
    with pytest.raises(TypeError, match="state must be a dict"):
        _backend.restore_kernel_choices([1, 2])


def test_kernel_choices_keep_triton_choices_where_triton_cannot_run(monkeypatch):
    """A GPU run's choices restored on a machine without Triton go back out with the next checkpoint."""
    monkeypatch.setattr(_backend, "triton_usable_here", lambda: False)
    monkeypatch.setattr(_backend, "_UNAPPLIED_TRITON", {})
    choices = {"glu_conv1d._glu_dpre": {"(64, 'torch.float32')": {"BLOCK_N": 64, "num_warps": 2}}}
    _backend.restore_kernel_choices({"cpu_gemm": None, "triton": choices})
    assert _backend.kernel_choices()["triton"]["glu_conv1d._glu_dpre"] == choices["glu_conv1d._glu_dpre"]


# ----------------------------------------------------------------------------- GPU only

@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
class TestGPU:
    """The CUDA paths against the references, with no host sync, and tensors on a second GPU."""

    @pytest.fixture(autouse=True)
    def _no_sync_allowed(self, ieee_fp32):
        yield
        torch.cuda.set_sync_debug_mode(0)

    @pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
    @pytest.mark.parametrize("segments", [None, [100, 37, 200, 63]], ids=["padded", "packed"])
    def test_self_attention(self, dtype, segments):
        qkv, mask = _qkv(4, 400, 8, 16, dtype=dtype, device="cuda")
        qkv.requires_grad_()
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        got = fastqa.self_attention(qkv, mask, 8, segments=segments)
        grad, = torch.autograd.grad(got, qkv, torch.ones_like(got))
        torch.cuda.set_sync_debug_mode(0)
        ref_in = qkv.detach().double().requires_grad_()
        want = reference.self_attention(ref_in, mask, 8, segments)
        want_grad, = torch.autograd.grad(want, ref_in, torch.ones_like(want))
        tol = 2e-3 if dtype == torch.float32 else 5e-2
        torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol)
        torch.testing.assert_close(grad.double(), want_grad, rtol=tol, atol=tol * want_grad.abs().max().item())

    def test_decode_attention_linear_and_argmax(self):
        g = torch.Generator().manual_seed(0)
        q, keys, values = (torch.randn(200, 5, 256, generator=g).cuda(), torch.randn(200, 30, 256, generator=g).cuda(),
                           torch.randn(200, 30, 256, generator=g).cuda())
        mask = padding_mask(200, 30).cuda()
        w, b = torch.randn(5893, 256, generator=g).cuda() / 16, torch.randn(5893, generator=g).cuda()
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        with torch.no_grad():
            out, weights = fastqa.decode_attention(q, keys, values, None, mask, scale=0.3)
            y = fastqa.linear(q, w, b)
            idx = fastqa.linear_argmax(q, w, b, [0, 1, 2])
        torch.cuda.set_sync_debug_mode(0)
        want = reference.decode_attention(q.double(), keys.double(), values.double(), None, mask, scale=0.3)
        torch.testing.assert_close(out.double(), want[0], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(weights.double(), want[1], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(y, reference.linear(q, w, b))
        assert torch.equal(idx, reference.linear_argmax(q, w, b, [0, 1, 2]))

    def test_every_triton_op_on_the_second_gpu(self):
        """Tensors on cuda:1 while cuda:0 is current: the same results as on cuda:0 (the device guard), for every
        op with a Triton kernel, on its example (fastqa.ops._declare.Example)."""
        if torch.cuda.device_count() < 2:
            pytest.skip("needs two GPUs")

        def run(device):
            results = []
            for op in triton_kernel_ops():
                example = EXAMPLES[op]
                args, kwargs = example.inputs(device)
                args = [t.requires_grad_() if i in example.grads else t for i, t in enumerate(args)]
                out = getattr(fastqa, op)(*args, **kwargs, backend="triton")
                out = out[0] if isinstance(out, tuple) else out
                if example.grads:
                    results += torch.autograd.grad(out.float().sum(), [args[i] for i in example.grads])
                results.append(out.detach())
            return [r.cpu() for r in results]

        want = run(torch.device("cuda:0"))
        with torch.cuda.device(0):
            got = run(torch.device("cuda:1"))
        assert len(got) == len(want)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b)

    @pytest.mark.parametrize("precision", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
    def test_qanet_train_step_has_no_host_sync(self, precision):
        from fastqa.models.qanet import QANet, QANetConfig
        cfg = QANetConfig.from_preset("small", word_vocab_size=500, char_vocab_size=80)
        model = QANet(cfg, "fast").cuda().train()
        g = torch.Generator().manual_seed(0)
        cw, qw = torch.randint(2, 500, (8, 120), generator=g), torch.randint(2, 500, (8, 20), generator=g)
        cc, qc = torch.randint(2, 80, (8, 120, 12), generator=g), torch.randint(2, 80, (8, 20, 12), generator=g)
        cw[1:, 60:], cc[1:, 60:] = 0, 0   # much padding: a CPU batch would pack
        cw, cc, qw, qc = (t.cuda() for t in (cw, cc, qw, qc))
        starts, ends = torch.full((8,), 3, device="cuda"), torch.full((8,), 5, device="cuda")

        def step():
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision == torch.bfloat16):
                log_s, log_e = model(cw, cc, qw, qc)
            loss = -(log_s.gather(1, starts[:, None]) + log_e.gather(1, ends[:, None])).mean()
            loss.backward()
            return loss

        step()   # compiles and tunes the kernels first
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        step()
        torch.cuda.set_sync_debug_mode(0)

    def test_convs2s_train_step_has_no_host_sync(self):
        from fastqa.models.convs2s import ConvS2S, ConvS2SConfig
        cfg = ConvS2SConfig(src_vocab_size=300, tgt_vocab_size=200, embed_dim=64, hidden_dim=128, encoder_layers=3,
                            decoder_layers=3, kernel_size=3, dropout=0.2, max_positions=64, layers="fast")
        model = ConvS2S(cfg).cuda().train()
        g = torch.Generator().manual_seed(0)
        src, tgt = torch.randint(4, 300, (16, 30), generator=g), torch.randint(4, 200, (16, 25), generator=g)
        src[1:, 12:] = 0   # much padding: a CPU batch would pack
        tgt[:, 0] = 2
        src, tgt = src.cuda(), tgt.cuda()

        def step():
            out = model(src, tgt[:, :-1])
            logits = out[0] if isinstance(out, tuple) else out
            torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), tgt[:, 1:].flatten()).backward()

        step()
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        step()
        torch.cuda.set_sync_debug_mode(0)
