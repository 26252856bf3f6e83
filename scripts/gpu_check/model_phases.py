"""Phases c and d, in a child: the models' train steps and inference / translation, with fastqa's fast layers
against the reference layers (and torch.compile of the reference QANet), built with the benchmark's model cases
(``benchmarks.cases_qanet``, ``benchmarks.cases_convs2s``) and timed through ``measuring``."""
from __future__ import annotations

import functools
import math
from typing import Any

import torch

from benchmarks import cases_convs2s as cc
from benchmarks import cases_qanet as cq

from .child import Ctx, Recorder
from .measuring import first_call, host_profile, measure_step, peak_memory_gib, reset_peak_memory, time_steps


def phase_qanet(ctx: Ctx, rec: Recorder) -> None:
    """Phase c: the ``paper`` preset at B32 (context 400, question 50), train step and inference, with fast
    layers, reference layers and torch.compile of the reference model, under bf16 autocast and in fp32."""
    device = ctx.device
    if ctx.tiny:
        cfg = cq.paper_config(word_dim=16, char_dim=8, char_channels=16, d_model=16, heads=2, emb_conv_layers=1,
                              model_blocks=1, model_conv_layers=1)
        B, n, m, W, steps, warmup = 2, 24, 8, 6, 1, 1
    else:
        cfg = cq.paper_config()
        B, n, m, W, steps, warmup = 32, 400, 50, cq.MAX_WORD_LEN, 10, 2
    rec.info.update(preset="tiny" if ctx.tiny else "paper", batch=B, context=n, question=m, steps=steps,
                    compile_backend=ctx.compile_backend)
    batch = {k: v.to(device) for k, v in cq.make_batch(torch.Generator().manual_seed(0), B, n, m, W).items()}
    models = cq.build_models(cfg, ["fast", "reference"], device, torch.float32)
    compiled: dict[str, Any] = {}

    def model_for(impl: str) -> Any:
        if impl != "compiled":
            return models[impl]
        if "model" not in compiled:
            # dynamic=False: the shapes never change here, and one static graph per (mode, precision) is
            # what a training run at a fixed batch shape gets.
            compiled["model"] = torch.compile(models["reference"], backend=ctx.compile_backend, dynamic=False)
        return compiled["model"]

    probabilities: dict[tuple[str, str], Any] = {}   # (precision, impl) -> eval-mode (p_start, p_end)

    def item(mode: str, precision: str, impl: str) -> dict[str, Any]:
        autocast = torch.bfloat16 if precision == "bf16" else None
        make = cq.train_step_runner if mode == "train" else cq.inference_runner
        run = make(model_for(impl), batch, autocast=autocast)
        figures = measure_step(run, device, warmup=warmup + (1 if impl == "compiled" else 0), steps=steps)
        if (mode, precision, impl) == ("train", "bf16", "fast"):
            figures["host_profile"] = host_profile(run, device, 2)
        if "loss" in figures and not math.isfinite(figures["loss"]):
            figures["failed"] = f"the loss is {figures['loss']}"
        if mode == "infer":
            # Inference has no dropout: the same weights must give the same probabilities on every impl.
            probs = tuple(t.detach().double().cpu() for t in run())
            probabilities[(precision, impl)] = probs
            ref = probabilities.get((precision, "reference"))
            if impl != "reference" and ref is not None:
                figures["max_diff_vs_reference"] = max(float((a - b).abs().max()) for a, b in zip(probs, ref))
        return figures

    # What the targets need first (bf16 training, fast vs reference), torch.compile last: it is the slowest
    # to start and the least needed. --tiny compiles one item: the code path, not the figures.
    order = [(mode, prec, impl) for prec in ("bf16", "fp32") for mode in ("train", "infer")
             for impl in ("reference", "fast")]
    compiled_items = [(mode, prec) for prec in ("bf16", "fp32") for mode in ("train", "infer")]
    order += [(mode, prec, "compiled") for mode, prec in (compiled_items[-2:-1] if ctx.tiny else compiled_items)]
    for mode, prec, impl in order:
        rec.item(f"qanet {mode} {prec} {impl}", functools.partial(item, mode, prec, impl),
                 min_s=(2.0 if ctx.tiny else 30.0) if impl == "compiled" else 0.0,
                 mode=mode, precision=prec, impl=impl)
        if device.type == "cuda":
            torch.cuda.empty_cache()


def _tokens_of(result: Any) -> torch.Tensor:
    """The tokens of a translation's result (beam search also returns its scores)."""
    return result[0] if isinstance(result, tuple) else result


def phase_convs2s(ctx: Ctx, rec: Recorder) -> None:
    """Phase d: the ``tutorial`` preset's train step (fast vs reference layers, fp32 and bf16 autocast) and the
    translation of 200 generated sentences, greedy and beam 5, incremental vs full-recompute decoding."""
    device = ctx.device
    if ctx.tiny:
        overrides = {"embed_dim": 8, "hidden_dim": 16, "encoder_layers": 2, "decoder_layers": 2,
                     "src_vocab_size": 41, "tgt_vocab_size": 37}
        B, S, T, sentences, lo, hi, steps, runs, warmup, beam = 2, 6, 6, 4, 3, 6, 1, 1, 1, 2
    else:
        overrides = {}
        B, S, T, sentences, lo, hi, steps, runs, warmup, beam = 64, 30, 30, 200, 12, 30, 10, 2, 2, 5
    rec.info.update(preset="tiny" if ctx.tiny else "tutorial", batch=B, src_len=S, tgt_len=T, sentences=sentences,
                    beam=beam)
    train_models = cc._models("tutorial", overrides, device, torch.float32, train=True)
    cfg = train_models["fast"].config
    src, tgt = cc.train_batch(cfg, B, S, T, device)

    def train_item(precision: str, layers: str) -> dict[str, Any]:
        autocast = torch.bfloat16 if precision == "bf16" else None
        run = cc.train_step_runner(train_models[layers], src, tgt, autocast=autocast)
        figures = measure_step(run, device, warmup=warmup, steps=steps)
        if "loss" in figures and not math.isfinite(figures["loss"]):
            figures["failed"] = f"the loss is {figures['loss']}"
        return figures

    decode_models: dict[str, Any] = {}
    sources = cc._sources(sentences, lo, hi, device, cfg.src_vocab_size)
    outputs: dict[tuple[int, str, bool], Any] = {}

    def translate_item(beam_size: int, layers: str, incremental: bool) -> dict[str, Any]:
        if not decode_models:
            decode_models.update(cc._models("tutorial", overrides, device, torch.float32, train=False))
        case = cc.TranslateCase("tutorial", sentences, beam=beam_size, min_len=lo, max_len=hi, overrides=overrides)
        run = case.decoder(decode_models[layers], sources, incremental)
        reset_peak_memory(device)
        result, first_s = first_call(run, device)
        # Decoding is deterministic: the first call's tokens are every call's.
        seconds = time_steps(run, device, runs)["median_ms"] / 1e3
        tokens = _tokens_of(result)
        out_tokens = int(tokens.ne(-1).sum()) + tokens.shape[0]   # with each sentence's EOS
        figures: dict[str, Any] = {"first_call_s": round(first_s, 3), "median_s": seconds, "runs": runs,
                                   "sentences_per_s": sentences / seconds, "tokens_per_s": out_tokens / seconds,
                                   "peak_gib": peak_memory_gib(device)}
        outputs[(beam_size, layers, incremental)] = tokens.cpu()
        other = outputs.get((beam_size, layers, not incremental))
        if other is not None and other.shape == tokens.shape:
            figures["same_output_as_" + ("full" if incremental else "incremental")] = float(
                (other == tokens.cpu()).all(dim=1).double().mean())
        return figures

    rec.item("convs2s train fp32 fast", functools.partial(train_item, "fp32", "fast"), kind="train",
             precision="fp32", impl="fast")
    rec.item("convs2s train fp32 reference", functools.partial(train_item, "fp32", "reference"), kind="train",
             precision="fp32", impl="reference")
    for beam_size in (beam, 1):
        label = f"beam{beam_size}" if beam_size > 1 else "greedy"
        for incremental in (True, False):
            rec.item(f"convs2s translate {label} fast {'incremental' if incremental else 'full recompute'}",
                     functools.partial(translate_item, beam_size, "fast", incremental), kind="translate",
                     search=label, impl="fast", incremental=incremental)
    for beam_size in (beam, 1):
        label = f"beam{beam_size}" if beam_size > 1 else "greedy"
        rec.item(f"convs2s translate {label} reference incremental",
                 functools.partial(translate_item, beam_size, "reference", True), kind="translate",
                 search=label, impl="reference", incremental=True)
    rec.item("convs2s train bf16 fast", functools.partial(train_item, "bf16", "fast"), kind="train",
             precision="bf16", impl="fast")
    rec.item("convs2s train bf16 reference", functools.partial(train_item, "bf16", "reference"), kind="train",
             precision="bf16", impl="reference")
