"""Phases b and f, in a child: every op against its float64 reference at the models' shapes (b), and per op,
fastqa against eager PyTorch split into launching and kernels (f). The ops' cases and their runners are the
benchmark's (``benchmarks.cases``, ``benchmarks.registry.op_runner``), the timing is ``benchmarks.measure``'s."""
from __future__ import annotations

import functools
import inspect
import math
import warnings
from typing import Any, Callable

import torch

import fastqa
from benchmarks import cases as bc
from benchmarks.measure import _sync, graph_replay_seconds
from benchmarks.registry import OpCase, OpInputs, op_runner
from fastqa import _backend, reference

from .child import Ctx, Recorder
from .common import DTYPE_SHORT, EAGER_FACTOR, TOLERANCES, short_error
from .measuring import count_kernels, counted, host_profile, time_steps


def _presets() -> tuple[Any, Any]:
    """The presets the checks run at: QANet ``paper`` and ConvS2S ``tutorial``, as their config classes declare
    them (the widths, heads and kernel sizes; no kernel depends on the vocabularies' sizes)."""
    from fastqa.models.convs2s import ConvS2SConfig
    from fastqa.models.qanet import QANetConfig

    return (QANetConfig.from_preset("paper", word_vocab_size=1000, char_vocab_size=1000),
            ConvS2SConfig.from_preset("tutorial", src_vocab_size=1000, tgt_vocab_size=1000))


def op_cases(tiny: bool) -> list[OpCase]:
    """The op checks at the models' shapes (QANet ``paper``: B32, context 400, question 50, d 128, kernels 7
    and 5, 8 heads; ConvS2S ``tutorial``: B64, T 30, H 512, embedding 256, vocabulary 5893, beam 5), the widths,
    heads and kernels from the presets, built with the benchmark's case constructors. The first case of each op
    comes first, so a short time box still covers every op."""
    qanet, convs2s = _presets()
    k_emb, k_model, k_resize, k_glu = (qanet.emb_conv_kernel, qanet.model_conv_kernel, qanet.emb_resize_kernel,
                                       convs2s.kernel_size)
    if tiny:
        B, n, m, d, h, res_in = 2, 12, 5, 8, 2, 12
        Bt, T, H, E, V, beam = 2, 6, 8, 8, 37, 2
        packed = (5, 7, 4)
    else:
        d, h = qanet.d_model, qanet.heads
        res_in = qanet.word_dim + qanet.char_channels + int(qanet.word_match)   # the resize conv's input
        H, E = convs2s.hidden_dim, convs2s.embed_dim
        B, n, m = (bc.QANET_BATCH[k] for k in ("B", "n", "m"))
        Bt, T, V, beam = (bc.CONVS2S_BATCH[k] for k in ("B", "T", "V", "beam"))
        # a packed batch of contexts: the lengths a padded B32 batch of 400 leaves (uniform in [200, 400])
        packed = tuple(200 + (37 * i) % 201 for i in range(B))
    first = [
        bc.dwsep_case(B, n, d, d, k_emb, relu_residual=True),         # QANet embedding encoder conv, context
        bc.ln_dwsep_case(B, n, d, k_emb),                             # its whole sublayer, LayerNorm fused
        bc.trilinear_case(B, n, m, d),
        bc.cqa_case(B, n, m, d),
        bc.self_attention_case(B, n, d, h),
        bc.dropout_add_case(B, n, d),
        bc.linear_case((B, n), d, d, what="ffn"),
        bc.glu_case(Bt, H, T, k_glu, causal=True),                     # ConvS2S decoder
        bc.glu_step_case(Bt, H, k_glu, steps=T),                       # ... incremental decoding
        bc.decode_attention_case(Bt, beam, T, E),                      # a beam step's attention
        bc.linear_argmax_case(Bt * beam, E, V),                        # greedy / beam next token
    ]
    more = [
        bc.glu_case(Bt, H, T, k_glu, causal=False),                    # ConvS2S encoder (padding masked)
        bc.dwsep_case(B, n, d, d, k_model, relu_residual=True),       # QANet model encoder conv
        bc.ln_dwsep_case(B, n, d, k_model),
        bc.dwsep_case(B, m, d, d, k_emb, relu_residual=True),         # question side
        bc.dwsep_case(B, n, res_in, d, k_resize, relu_residual=False),  # [word; char] -> d resize
        bc.self_attention_case(B, m, d, h),
        bc.packed_self_attention_case(packed, d, h),
        bc.linear_case((Bt, T), E, V, what="vocab"),                   # ConvS2S output projection, training
    ]
    return first + more


def _param_names(fn: Callable) -> list[str]:
    """The names of ``fn``'s parameters (a gradient's label), or none where Python cannot read them."""
    try:
        return list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return []


def _evaluate(fn: Callable, inputs: OpInputs, with_grads: bool, grad_out: torch.Tensor | None,
              names: list[str]) -> dict[str, Any]:
    """{"out": fn's output} plus {"grad_<input>": ...} of every differentiable input when ``with_grads``: one
    call of the benchmark's runner, its tensors named."""
    if not with_grads:
        return {"out": op_runner(fn, inputs, "fwd", None)()}
    out, *grads = op_runner(fn, inputs, "fwd+bwd", grad_out)()
    result = {"out": out}
    for key, g in zip(inputs.grad, grads):
        label = key if isinstance(key, str) else (names[key] if key < len(names) else f"arg{key}")
        result[f"grad_{label}"] = g
    return result


def _compare(got: torch.Tensor, want: torch.Tensor, floor: float) -> dict[str, Any]:
    """max |got - want|, that over max(max |want|, ``floor``) (the relative error), and whether ``got`` is
    finite. The floor keeps a tensor that is zero in exact arithmetic (the context-query attention's bias
    gradient: a constant added before a softmax) from turning rounding noise into a huge relative error."""
    g, w = got.detach().double(), want.detach().double().to(got.device)
    if g.shape != w.shape:
        raise ValueError(f"shape {tuple(g.shape)} != the reference's {tuple(w.shape)}")
    if not g.numel():
        return {"max_abs": 0.0, "rel": 0.0, "finite": True}
    max_abs = float((g - w).abs().max())
    scale = max(float(w.abs().max()), floor)
    return {"max_abs": max_abs, "rel": max_abs / scale if scale > 0 else max_abs,
            "finite": bool(g.isfinite().all())}


def _argmax_errors(ref_inputs: OpInputs, picked: torch.Tensor) -> dict[str, Any]:
    """linear_argmax: how much worse (in float64 logits) the picked token is than the best one, over the
    largest logit: a near tie may pick either token; a wrong pick shows as a gap."""
    x, w, b = ref_inputs.args
    logits = reference.linear(x, w, b)
    exclude = list(ref_inputs.kwargs.get("exclude") or [])
    if exclude:
        logits[..., exclude] = float("-inf")
    best, best_idx = logits.max(dim=-1)
    chosen = logits.gather(-1, picked.long().unsqueeze(-1)).squeeze(-1)
    gap = best - chosen
    scale = float(logits[torch.isfinite(logits)].abs().max())
    max_gap = float(gap.max()) if gap.numel() else 0.0
    return {"max_abs": max_gap, "rel": max_gap / scale if scale > 0 else max_gap, "finite": math.isfinite(max_gap),
            "mismatch_fraction": float((picked.long() != best_idx).double().mean())}


def check_op(case: OpCase, dtype_name: str, device: torch.device) -> dict[str, Any]:
    """Run ``fastqa.<op>`` (backend auto) on the case's inputs rounded to ``dtype``, and the reference in
    float64 on the same rounded inputs and device; compare the output and every input gradient."""
    dtype = getattr(torch, dtype_name)
    gen = torch.Generator().manual_seed(0)
    base = case.make_inputs(gen)
    inputs = base.to(device, dtype)
    ref_inputs = inputs.to(device, torch.float64)   # exact: every value is representable in float64
    names = _param_names(case.reference)
    with_grads = "fwd+bwd" in case.modes
    fast_fn = case.program(getattr(fastqa, case.fastqa_fn))
    ref_fn = case.program(case.reference)
    grad_out = grad_out64 = None
    if with_grads:
        shape = op_runner(ref_fn, ref_inputs, "fwd", None)().shape
        grad_out = torch.randn(shape, generator=gen, dtype=torch.float64).to(device, dtype)
        grad_out64 = grad_out.double()

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        backend = _backend.resolve_backend("auto", case.op, device, dtype)
        got = _evaluate(fast_fn, inputs, with_grads, grad_out, names)
    fallbacks = sorted({str(w.message)[:200] for w in caught if "fall" in str(w.message).lower()})
    want = _evaluate(ref_fn, ref_inputs, with_grads, grad_out64, names)
    # The same reference in the same dtype (eager PyTorch, rounding between its ops): the error a user of
    # the unfused op already accepts at this precision.
    eager = _evaluate(ref_fn, inputs, with_grads, grad_out, names)
    if case.op == "linear_argmax":
        tensors = {"out": _argmax_errors(ref_inputs, got["out"])}
        eager_tensors = {"out": _argmax_errors(ref_inputs, eager["out"])}
    else:
        # Every tensor is judged at its own scale, and never at less than the output's.
        floor = float(want["out"].detach().abs().max()) if want["out"].numel() else 0.0
        tensors = {k: _compare(got[k], want[k], floor) for k in want}
        eager_tensors = {k: _compare(eager[k], want[k], floor) for k in want}
    for k, v in tensors.items():
        if k in eager_tensors:
            v["eager_rel"] = eager_tensors[k]["rel"]
    tol = TOLERANCES[dtype_name]
    worst_name, worst = max(tensors.items(), key=lambda kv: kv[1]["rel"] if kv[1]["finite"] else math.inf)
    figures: dict[str, Any] = {"backend": backend, "fallback_warnings": fallbacks, "tensors": tensors,
                               "worst": worst_name, "worst_rel": worst["rel"], "tolerance": tol}
    if device.type == "cuda":
        figures["launches"] = counted(count_kernels, lambda: _evaluate(fast_fn, inputs, with_grads, grad_out, names),
                                      device)
    # A tensor passes under the tolerance, or within EAGER_FACTOR of eager PyTorch's own error in this dtype
    # (bf16 gradients through a ReLU: a pre-activation that rounds across zero flips its whole gradient).
    bad = [k for k, v in tensors.items()
           if not v["finite"] or v["rel"] > max(tol, EAGER_FACTOR * v.get("eager_rel", 0.0))]
    if bad:
        figures["failed"] = "over tolerance: " + ", ".join(
            (f"{k} rel {tensors[k]['rel']:.2e} (eager {tensors[k].get('eager_rel', math.nan):.2e})"
             if tensors[k]["finite"] else f"{k} not finite") for k in bad)
    return figures


def phase_ops(ctx: Ctx, rec: Recorder) -> None:
    """Phase b. Every tensor compared against the float64 reference on the same device, TF32 off (the
    references in float64 never use it; the kernels' fp32 is then compared with true fp32 arithmetic)."""
    if ctx.device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    cases = op_cases(ctx.tiny)
    covered = {c.op for c in cases}
    rec.info["ops_without_a_check"] = sorted(set(fastqa.ops.__all__) - covered)
    rec.info["tolerances"] = TOLERANCES
    for case in cases:
        for dtype_name in ("float32", "bfloat16"):
            rec.item(f"{case.id} {DTYPE_SHORT[dtype_name]}", functools.partial(check_op, case, dtype_name, ctx.device),
                     op=case.op, case=case.name, dtype=dtype_name)


def launch_overhead(case: OpCase, dtype_name: str, device: torch.device, calls: int) -> dict[str, Any]:
    """One op case, forward and forward+backward, fastqa against eager PyTorch (the reference in the same
    dtype): ms per call waited for, the host's ms to issue it, and (forward) ms per CUDA-graph replay,
    i.e. the kernels alone. Where the first two are close and far above the third, the op is bound by its
    launching, not by its kernels. With a host profile of fastqa's forward+backward."""
    dtype = getattr(torch, dtype_name)
    inputs = case.make_inputs(torch.Generator().manual_seed(0)).to(device, dtype)
    impls = {"fastqa": case.program(getattr(fastqa, case.fastqa_fn)), "eager": case.program(case.reference)}
    with_grads = "fwd+bwd" in case.modes
    figures: dict[str, Any] = {}
    for label, fn in impls.items():
        forward = op_runner(fn, inputs, "fwd", None)
        forward()
        _sync(device)
        timed = time_steps(forward, device, calls)
        figures[f"{label}_fwd_ms"], figures[f"{label}_fwd_host_ms"] = timed["median_ms"], timed.get("host_ms")
        if device.type == "cuda":
            try:
                figures[f"{label}_fwd_graph_ms"] = graph_replay_seconds(forward, device, calls) * 1e3
            except Exception as exc:  # a capture that breaks is a finding, not the end of the phase
                figures[f"{label}_fwd_graph_error"] = short_error(exc)
        if with_grads:
            grad_out = torch.randn(forward().shape, generator=torch.Generator().manual_seed(1)).to(device, dtype)
            both = op_runner(fn, inputs, "fwd+bwd", grad_out)
            both()
            _sync(device)
            timed = time_steps(both, device, calls)
            figures[f"{label}_fwdbwd_ms"], figures[f"{label}_fwdbwd_host_ms"] = timed["median_ms"], timed.get("host_ms")
            if label == "fastqa":
                figures["host_profile"] = host_profile(both, device, calls)
    return figures


def phase_overhead(ctx: Ctx, rec: Recorder) -> None:
    """Phase f: per op (the first case of each), fastqa vs eager: time per call, the host's share, and the
    kernels alone (CUDA-graph replay), bf16."""
    calls = 3 if ctx.tiny else 20
    seen: set[str] = set()
    for case in op_cases(ctx.tiny):
        if case.op in seen:
            continue
        seen.add(case.op)
        rec.item(f"{case.id} bf16 launching", functools.partial(launch_overhead, case, "bfloat16", ctx.device, calls),
                 op=case.op, case=case.name, dtype="bfloat16")
