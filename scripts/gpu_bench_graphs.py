"""CUDA graphs on a GPU, in one command of at most ~5 minutes: whole-step graphs against eager and compiled steps.

    python3 scripts/gpu_bench_graphs.py --out DIR [--budget-s 270] [--sections qanet,profile,convs2s,glu]
    python3 scripts/gpu_bench_graphs.py --out DIR --dry-run      # tiny shapes on the CPU: the code path, no figures

What it runs, in this order (each item only when the budget still holds its least time; a failing item records
its error and the run goes on):

- ``qanet``: the ``paper`` preset at B32 (context 400, question 50), bf16 autocast then fp32, the train step
  (forward, NLL, backward, clip 5, Adam at rate 0, as ``benchmarks.cases_qanet``) and inference: fastqa graphed
  (``fastqa.train.cuda_graphs.GraphedTrainStep``; ``fastqa.models.qanet.graphed.GraphedReader``), fastqa eager,
  the reference layers eager, timed round-robin in one loop; then ``torch.compile(reference,
  mode="reduce-overhead")`` timed interleaved with the graphed and the reference step.
- ``profile``: a torch.profiler kernel breakdown of one graphed bf16 train step (and of the eager fast step).
- ``convs2s``: the ``tutorial`` preset's train step (graphed, eager, reference; fp32 and bf16) and greedy and
  beam-5 translation of 200 generated sentences: graphed decoding vs today's eager decoding vs the reference
  layers, with the share of sentences whose tokens agree.
- ``glu``: ``glu_conv1d_step`` kernel-only (each replayed in a CUDA graph) against the eager reference, per
  configuration (rows, channels, kernel, dtype).
- ``tests``: the graphs' GPU tests (``pytest -m gpu`` of their test files): captured steps, decoding and reading
  against the eager ones.

The record, ``DIR/gpu-<device>-<date>-graphs.json`` (benchmarks/results' naming), is rewritten after every item,
so a run cut short keeps what it measured. Run from a checkout with torch and Triton installed: no build (the
GPU path does not use the C++ extension); ``fastqa/triton_kernels`` is linked to the checkout's kernels while
it runs when it is not there.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import math
import platform
import re
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

SECTIONS = ("qanet", "profile", "convs2s", "glu", "tests")
SCHEMA = "gpu-bench-graphs/1"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="gpu_bench_graphs.py", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, metavar="DIR", help="folder for the JSON record")
    p.add_argument("--budget-s", type=float, default=270.0, metavar="S",
                   help="seconds for everything, imports and compiles included (default 270)")
    p.add_argument("--sections", default=",".join(SECTIONS), metavar="LIST",
                   help=f"comma-separated, in run order (default {','.join(SECTIONS)})")
    p.add_argument("--device", default=None, help="default: cuda (the --dry-run: cpu)")
    p.add_argument("--dry-run", action="store_true",
                   help="tiny shapes, one timed round, no torch.compile: that every item runs (a CPU is enough)")
    args = p.parse_args(argv)
    if args.budget_s <= 0 or not math.isfinite(args.budget_s):
        p.error(f"--budget-s must be a positive number of seconds, got {args.budget_s}")
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = [s for s in sections if s not in SECTIONS]
    if unknown or not sections:
        p.error(f"--sections: unknown {', '.join(unknown) or '(none given)'}; known: {', '.join(SECTIONS)}")
    args.sections = sections
    return args


@contextlib.contextmanager
def kernels_linked():
    """``fastqa/triton_kernels`` (where the installed package keeps the kernels) linked to the checkout's
    ``triton_kernels/`` while the run lasts, when it is not there."""
    link = REPO / "fastqa" / "triton_kernels"
    made = False
    if not link.exists() and (REPO / "triton_kernels").is_dir():
        link.symlink_to(Path("..") / "triton_kernels")
        made = True
    try:
        yield
    finally:
        if made:
            link.unlink()


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


# ------------------------------------------------------------------------------------------------ the record

class Run:
    """The record and the clock: ``item`` runs one measurement if the budget holds it, records its figures or
    its error, and rewrites the JSON."""

    def __init__(self, args: argparse.Namespace, device: Any) -> None:
        import torch

        from benchmarks.measure import device_name

        self.t0 = time.monotonic()
        self.budget_s, self.device, self.dry = args.budget_s, device, args.dry_run
        name = device_name(device)
        kind = "gpu" if device.type == "cuda" else "cpu"
        date = datetime.date.today().isoformat()
        suffix = "graphs-dry-run" if args.dry_run else "graphs"
        self.path = Path(args.out) / f"{kind}-{slug(name)}-{date}-{suffix}.json"
        try:
            import triton
            triton_version = triton.__version__
        except ImportError:
            triton_version = None
        self.record: dict[str, Any] = {
            "schema": SCHEMA, "device": name, "torch": torch.__version__, "cuda": torch.version.cuda,
            "triton": triton_version, "python": platform.python_version(), "dry_run": args.dry_run,
            "budget_s": args.budget_s, "started": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "items": {}}

    def left(self) -> float:
        return self.budget_s - (time.monotonic() - self.t0)

    def item(self, name: str, fn: Callable[[], dict[str, Any]], min_s: float = 0.0) -> dict[str, Any] | None:
        if not self.dry and self.left() < min_s:
            self.record["items"][name] = {"skipped": f"{self.left():.0f} s left of the budget, the item needs "
                                                     f"{min_s:.0f} s"}
            self.write()
            return None
        t0 = time.monotonic()
        print(f"[{time.monotonic() - self.t0:6.1f} s] {name}", flush=True)
        try:
            figures = fn()
        except Exception as e:  # noqa: BLE001 -- an item's failure is its record; the run goes on
            figures = {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
                       "traceback": traceback.format_exc().splitlines()[-12:]}
            print(f"  failed: {figures['error']}", flush=True)
        figures["item_s"] = round(time.monotonic() - t0, 2)
        self.record["items"][name] = figures
        self.write()
        return figures

    def write(self) -> None:
        from fastqa.data.files import atomic_write_json

        self.record["elapsed_s"] = round(time.monotonic() - self.t0, 1)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(self.path, self.record)


# ---------------------------------------------------------------------------------------------- measuring

def measure(fns: dict[str, Callable[[], Any]], device: Any, *, dry: bool, warmup: int = 3,
            seconds: float = 2.0) -> dict[str, Any]:
    """Each fn warmed up (``warmup`` calls: a graph's eager runs and its capture), then timed round-robin in
    one loop: ms per call (median, p25, p75) and the host's ms to issue one call."""
    from benchmarks.measure import Settings, call_seconds, quantiles_ms, time_interleaved

    out: dict[str, Any] = {}
    est: dict[str, float] = {}
    for name, fn in fns.items():
        t0 = time.monotonic()
        for _ in range(1 if dry else warmup):
            fn()
        if device.type == "cuda":
            import torch
            torch.cuda.synchronize(device)
        out[name] = {"warmup_s": round(time.monotonic() - t0, 3)}
        est[name] = call_seconds(fn, device, 1)[0]
    settings = Settings(min_runs=1 if dry else 8, max_runs=1 if dry else 40, target_s=0.0 if dry else seconds,
                        min_sample_s=0.0 if dry else 5e-3)
    samples = time_interleaved(fns, device, settings, est)
    for name, fn in fns.items():
        median, p25, p75 = quantiles_ms(samples[name])
        host = call_seconds(fn, device, 5)[1] if device.type == "cuda" else median / 1e3  # the CPU: the same wall time
        out[name].update(median_ms=round(median, 4), p25_ms=round(p25, 4), p75_ms=round(p75, 4),
                         host_ms=round(host * 1e3, 4), samples=len(samples[name]))
    return out


def ratios(figures: dict[str, Any], pairs: list[tuple[str, str, str]]) -> dict[str, float]:
    """{label: figures[b] / figures[a] median times} (how many times faster ``a`` is than ``b``)."""
    out = {}
    for label, a, b in pairs:
        if a in figures and b in figures and "median_ms" in figures[a] and "median_ms" in figures[b]:
            out[label] = round(figures[b]["median_ms"] / max(figures[a]["median_ms"], 1e-9), 3)
    return out


# ----------------------------------------------------------------------------------------------- QANet

class _FixedBatchTask:
    """The one batch a benchmark step trains on, as ``GraphedTrainStep`` reads a task (host copy, its loss)."""

    def __init__(self, batch: tuple, loss: Callable[[Any, tuple], Any]) -> None:
        self.batch = tuple(t.cpu() for t in batch)
        self._loss = loss

    def collate(self, indices: list[int], device: Any) -> tuple:
        return self.batch

    def loss(self, model: Any, batch: tuple) -> Any:
        return self._loss(model, batch)


def graphed_train_runner(model: Any, batch: tuple, loss: Callable[[Any, tuple], Any], *, clip: float,
                         autocast: Any, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                         weight_decay: float = 0.0) -> Callable[[], Any]:
    """The graphed train step on one fixed batch (Adam at rate 0: all its work, the weights unchanged)."""
    import torch

    from fastqa.train.cuda_graphs import GraphedTrainStep, prepare_optimizer

    device = next(model.parameters()).device
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=0.0, betas=betas, eps=eps, weight_decay=weight_decay)
    prepare_optimizer(opt, device, graphed=True)
    step = GraphedTrainStep(_FixedBatchTask(batch, loss), model, opt, None, device=device, plan=None,
                            clip_norm=clip, amp_dtype=autocast)
    rows = list(range(batch[0].shape[0]))
    runner = functools.partial(step.step, rows)
    runner.step = step  # type: ignore[attr-defined]
    return runner


def _qanet_loss(model: Any, batch: tuple) -> Any:
    import torch.nn.functional as F

    cw, cc, qw, qc, start, end = batch
    log_s, log_e = model(cw, cc, qw, qc)
    return F.nll_loss(log_s.float(), start) + F.nll_loss(log_e.float(), end)


def _qanet_case(run: Run) -> tuple[Any, dict, tuple, tuple[int, int, int]]:
    """The QANet case of the run: the ``paper`` preset at B32 n400 m50 (a tiny one under --dry-run), one batch
    on the run's device: the inputs by name, and as the tuple (context words, context chars, question words,
    question chars, start, end)."""
    import torch

    from benchmarks import cases_qanet as cq

    if run.dry:
        cfg = cq.paper_config(word_dim=16, char_dim=8, char_channels=16, d_model=16, heads=2, emb_conv_layers=1,
                              model_blocks=1, model_conv_layers=1)
        B, n, m, W = 2, 24, 8, 6
    else:
        cfg = cq.paper_config()
        B, n, m, W = 32, 400, 50, cq.MAX_WORD_LEN
    data = {k: v.to(run.device) for k, v in cq.make_batch(torch.Generator().manual_seed(0), B, n, m, W).items()}
    batch = (data["context_words"], data["context_chars"], data["question_words"], data["question_chars"],
             data["start"], data["end"])
    return cfg, data, batch, (B, n, m)


def section_qanet(run: Run) -> None:
    import torch

    from benchmarks import cases_qanet as cq
    from fastqa.models.qanet.graphed import GraphedReader

    device, dry = run.device, run.dry
    cfg, data, batch, (B, n, m) = _qanet_case(run)
    run.record["qanet"] = {"preset": "tiny" if dry else "paper", "batch": B, "context": n, "question": m}
    models = cq.build_models(cfg, ["fast", "reference"], device, torch.float32)
    # The graphed step gets parameters of its own (the same weights): its graphs accumulate into gradients that
    # stay in place, which the eager steps would set to None.
    graphed_model = cq.build_models(cfg, ["fast"], device, torch.float32)["fast"]
    adam = dict(betas=(0.8, 0.999), eps=1e-7, weight_decay=3e-7)
    kept: dict[str, dict[str, Callable[[], Any]]] = {}

    for precision in ("bf16", "fp32"):
        autocast = torch.bfloat16 if precision == "bf16" else None

        def train_fns(precision: str = precision, autocast: Any = autocast) -> dict[str, Callable[[], Any]]:
            return {"fastqa graphed": graphed_train_runner(graphed_model, batch, _qanet_loss, clip=5.0,
                                                           autocast=autocast, **adam),
                    "fastqa eager": cq.train_step_runner(models["fast"], data, autocast=autocast),
                    "reference eager": cq.train_step_runner(models["reference"], data, autocast=autocast)}

        def infer_fns(autocast: Any = autocast) -> dict[str, Callable[[], Any]]:
            reader = GraphedReader.of(models["fast"].eval())

            def graphed() -> Any:
                with cq.autocast_context(device, autocast):
                    return tuple(t.exp() for t in reader(*batch[:4]))
            return {"fastqa graphed": graphed,
                    "fastqa eager": cq.inference_runner(models["fast"], data, autocast=autocast),
                    "reference eager": cq.inference_runner(models["reference"], data, autocast=autocast)}

        for mode, make in (("train", train_fns), ("infer", infer_fns)):
            def item(mode: str = mode, make: Callable = make, precision: str = precision) -> dict[str, Any]:
                fns = make()
                kept[f"{mode} {precision}"] = fns
                figures = measure(fns, device, dry=dry)
                if mode == "infer":
                    figures["fastqa graphed"]["replays"] = GraphedReader.of(models["fast"]).replays
                    out = {k: tuple(t.double().cpu() for t in fn()) for k, fn in fns.items()}
                    ref = out["reference eager"]
                    for k in ("fastqa graphed", "fastqa eager"):
                        figures[k]["max_diff_vs_reference"] = max(float((a - b).abs().max())
                                                                  for a, b in zip(out[k], ref))
                else:
                    figures["fastqa graphed"]["graphs"] = fns["fastqa graphed"].step.summary()
                figures["speedups"] = ratios(figures, [
                    ("graphed_vs_reference_eager", "fastqa graphed", "reference eager"),
                    ("eager_vs_reference_eager", "fastqa eager", "reference eager"),
                    ("graphed_vs_eager", "fastqa graphed", "fastqa eager")])
                return figures
            run.item(f"qanet {mode} {precision}", item, min_s=15.0)
            if device.type == "cuda":
                torch.cuda.empty_cache()

    _qanet_compiled_items(run, models, data, kept)


def _qanet_compiled_items(run: Run, models: dict[str, Any], data: dict[str, Any],
                          kept: dict[str, dict[str, Callable[[], Any]]]) -> None:
    """The QANet items of ``torch.compile(reference, mode="reduce-overhead")``, after section_qanet's eager ones
    (``kept``: their step functions by item, already warm)."""
    import torch

    from benchmarks import cases_qanet as cq

    device, dry = run.device, run.dry
    # torch.compile last: the slowest to start. Each compiled step is timed interleaved with the graphed and the
    # reference step of the same mode and precision (already warm).
    for precision in ("bf16", "fp32"):
        autocast = torch.bfloat16 if precision == "bf16" else None
        for mode in ("train", "infer"):
            def compiled_item(mode: str = mode, precision: str = precision, autocast: Any = autocast
                              ) -> dict[str, Any]:
                if dry:
                    return {"skipped": "--dry-run compiles nothing"}
                fns = kept.get(f"{mode} {precision}")
                if fns is None:
                    return {"skipped": "its eager item did not run"}
                for model in models.values():   # the runners set the mode when made; later items changed it
                    model.train(mode == "train")
                compiled = torch.compile(models["reference"], mode="reduce-overhead", dynamic=False)
                make = cq.train_step_runner if mode == "train" else cq.inference_runner
                t0 = time.monotonic()
                run_compiled = make(compiled, data, autocast=autocast)

                def step() -> Any:
                    torch.compiler.cudagraph_mark_step_begin()   # a new iteration: the last one's outputs are read
                    return run_compiled()
                step()
                torch.cuda.synchronize(device)
                first_s = time.monotonic() - t0
                timed = {"reference compiled reduce-overhead": step, "fastqa graphed": fns["fastqa graphed"],
                         "reference eager": fns["reference eager"]}
                figures = measure(timed, device, dry=dry)
                figures["reference compiled reduce-overhead"]["compile_s"] = round(first_s, 2)
                figures["speedups"] = ratios(figures, [
                    ("graphed_vs_compiled", "fastqa graphed", "reference compiled reduce-overhead"),
                    ("graphed_vs_reference_eager", "fastqa graphed", "reference eager"),
                    ("compiled_vs_reference_eager", "reference compiled reduce-overhead", "reference eager")])
                return figures
            run.item(f"qanet {mode} {precision} compiled", compiled_item, min_s=90.0)
            if device.type == "cuda":
                torch.cuda.empty_cache()


def section_profile(run: Run) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from benchmarks import cases_qanet as cq

    device, dry = run.device, run.dry
    cfg, data, batch, _ = _qanet_case(run)
    model = cq.build_models(cfg, ["fast"], device, torch.float32)["fast"]
    eager_model = cq.build_models(cfg, ["fast"], device, torch.float32)["fast"]   # see section_qanet
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])

    def breakdown(step: Callable[[], Any]) -> dict[str, Any]:
        for _ in range(1 if dry else 4):   # warm: eager runs, capture
            step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        with profile(activities=activities) as prof:
            step()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
        rows = []
        for e in prof.key_averages():
            device_us = getattr(e, "self_device_time_total", None)
            if device_us is None:
                device_us = getattr(e, "self_cuda_time_total", 0.0)
            rows.append({"name": e.key[:120], "calls": e.count, "self_device_ms": round(device_us / 1e3, 4),
                         "self_cpu_ms": round(e.self_cpu_time_total / 1e3, 4)})
        key = "self_device_ms" if device.type == "cuda" else "self_cpu_ms"
        rows.sort(key=lambda r: r[key], reverse=True)
        kernels = [r for r in rows if r["self_device_ms"] > 0]
        return {"top": rows[:30], "device_ms": round(sum(r["self_device_ms"] for r in kernels), 4),
                "kernel_kinds": len(kernels), "kernel_launches": sum(r["calls"] for r in kernels)}

    run.item("profile qanet train bf16 graphed", lambda: breakdown(graphed_train_runner(
        model, batch, _qanet_loss, clip=5.0, autocast=torch.bfloat16, betas=(0.8, 0.999), eps=1e-7)),
        min_s=20.0)
    run.item("profile qanet train bf16 eager", lambda: breakdown(cq.train_step_runner(
        eager_model, data, autocast=torch.bfloat16)), min_s=15.0)


# --------------------------------------------------------------------------------------------- ConvS2S

def _mt_loss(model: Any, batch: tuple) -> Any:
    import torch.nn.functional as F

    src, tgt = batch
    logits, _ = model(src, tgt[:, :-1])
    return F.cross_entropy(logits.flatten(0, 1).float(), tgt[:, 1:].flatten(), ignore_index=model.config.pad_id)


def section_convs2s(run: Run) -> None:
    import torch

    from benchmarks import cases_convs2s as cc
    from benchmarks.measure import call_seconds
    from fastqa.models.convs2s import beam_search, greedy_decode
    from fastqa.models.convs2s.graphed import StaticDecoding

    device, dry = run.device, run.dry
    if dry:
        overrides = {"embed_dim": 8, "hidden_dim": 16, "encoder_layers": 2, "decoder_layers": 2,
                     "src_vocab_size": 41, "tgt_vocab_size": 37}
        B, S, T, sentences, lo, hi, beam = 2, 6, 6, 5, 3, 6, 2
    else:
        overrides = {}
        B, S, T, sentences, lo, hi, beam = 64, 30, 30, 200, 12, 30, 5
    run.record["convs2s"] = {"preset": "tiny" if dry else "tutorial", "batch": B, "src_len": S, "tgt_len": T,
                             "sentences": sentences, "beam": beam}
    train = cc._models("tutorial", overrides, device, torch.float32, train=True)
    graphed_model = cc._models("tutorial", overrides, device, torch.float32, train=True)["fast"]  # see section_qanet
    cfg = train["fast"].config
    src, tgt = cc.train_batch(cfg, B, S, T, device)
    for precision in ("fp32", "bf16"):
        autocast = torch.bfloat16 if precision == "bf16" else None

        def train_item(autocast: Any = autocast) -> dict[str, Any]:
            fns = {"fastqa graphed": graphed_train_runner(graphed_model, (src, tgt), _mt_loss, clip=0.1,
                                                          autocast=autocast),
                   "fastqa eager": cc.train_step_runner(train["fast"], src, tgt, autocast=autocast),
                   "reference eager": cc.train_step_runner(train["reference"], src, tgt, autocast=autocast)}
            figures = measure(fns, device, dry=dry)
            figures["speedups"] = ratios(figures, [
                ("graphed_vs_reference_eager", "fastqa graphed", "reference eager"),
                ("graphed_vs_eager", "fastqa graphed", "fastqa eager")])
            return figures
        run.item(f"convs2s train {precision}", train_item, min_s=10.0)

    decode = cc._models("tutorial", overrides, device, torch.float32, train=False)
    sources = cc._sources(sentences, lo, hi, device, cfg.src_vocab_size)

    def translate(model: Any, beam_size: int, graphs: bool) -> Callable[[], list[list[int]]]:
        if beam_size == 1:
            return lambda: greedy_decode(model, sources, max_len_a=1.0, max_len_b=0, graphs=graphs)
        return lambda: [h[0].tokens for h in beam_search(model, sources, beam=beam_size, max_len_a=1.0, max_len_b=0,
                                                         graphs=graphs)]

    for beam_size in (beam, 1):
        label = "greedy" if beam_size == 1 else f"beam{beam_size}"

        def decode_item(beam_size: int = beam_size) -> dict[str, Any]:
            fns = {"fastqa graphed": translate(decode["fast"], beam_size, True),
                   "fastqa eager": translate(decode["fast"], beam_size, False),
                   "reference eager": translate(decode["reference"], beam_size, False)}
            figures: dict[str, Any] = {}
            tokens = {}
            for name, fn in fns.items():
                t0 = time.monotonic()
                tokens[name] = fn()     # the first call: graphs captured, kernels compiled
                first = time.monotonic() - t0
                fn()
                times = [call_seconds(fn, device, 1)[0] for _ in range(1 if dry else 3)]
                median = sorted(times)[len(times) // 2]
                figures[name] = {"first_call_s": round(first, 3), "median_s": round(median, 4),
                                 "sentences_per_s": round(sentences / median, 1)}
            want = tokens["fastqa eager"]
            figures["fastqa graphed"]["replays_so_far"] = StaticDecoding.of(decode["fast"]).replays
            figures["fastqa graphed"]["same_tokens_as_eager"] = sum(a == b for a, b in zip(tokens["fastqa graphed"],
                                                                                            want)) / len(want)
            figures["speedups"] = {
                "graphed_vs_reference_eager": round(figures["reference eager"]["median_s"]
                                                    / figures["fastqa graphed"]["median_s"], 3),
                "graphed_vs_eager": round(figures["fastqa eager"]["median_s"] / figures["fastqa graphed"]["median_s"], 3)}
            return figures
        run.item(f"convs2s translate {label}", decode_item, min_s=15.0)


# ------------------------------------------------------------------------------------------------ glu step

def section_glu(run: Run) -> None:
    import torch

    from benchmarks.measure import call_seconds, graph_replay_seconds
    from fastqa import reference
    from fastqa.ops import glu_conv1d_step

    device, dry = run.device, run.dry
    configs = [(2, 8, 3), (10, 8, 3)] if dry else [(64, 512, 3), (320, 512, 3), (64, 256, 3), (320, 256, 5)]
    for rows, h, k in configs:
        for dtype in (torch.bfloat16, torch.float32):
            def item(rows: int = rows, h: int = h, k: int = k, dtype: Any = dtype) -> dict[str, Any]:
                gen = torch.Generator().manual_seed(0)
                x = torch.randn(rows, h, generator=gen).to(device, dtype)
                state = torch.randn(rows, k - 1, h, generator=gen).to(device, dtype)
                weight = (torch.randn(2 * h, h, k, generator=gen) / math.sqrt(h * k)).to(device, dtype)
                bias = torch.zeros(2 * h).to(device, dtype)
                fns = {"fastqa": lambda: glu_conv1d_step(x, state, weight, bias, residual=False, scale=1.0),
                       "reference eager": lambda: reference.glu_conv1d_step(x, state, weight, bias, residual=False,
                                                                            scale=1.0)}
                figures: dict[str, Any] = {}
                with torch.no_grad():
                    for name, fn in fns.items():
                        if device.type == "cuda":
                            per = graph_replay_seconds(fn, device, 200)
                        else:
                            fn()
                            per = call_seconds(fn, device, 1 if dry else 20)[0]
                        figures[name] = {"us_per_step": round(per * 1e6, 3)}
                    got, want = fns["fastqa"]()[0].float(), fns["reference eager"]()[0].float()
                figures["max_diff_vs_reference"] = float((got - want).abs().max())
                figures["speedup_vs_reference"] = round(figures["reference eager"]["us_per_step"]
                                                        / max(figures["fastqa"]["us_per_step"], 1e-9), 3)
                return figures
            run.item(f"glu_conv1d_step B{rows} H{h} K{k} {str(dtype).removeprefix('torch.')}", item, min_s=3.0)


GPU_TESTS = ("tests/train/test_cuda_graphs.py", "tests/models/test_convs2s_graphed.py",
             "tests/models/test_qanet_graphed.py")


def section_tests(run: Run) -> None:
    import subprocess

    def item() -> dict[str, Any]:
        if run.dry:
            return {"skipped": "--dry-run runs no test (the tests run the --dry-run)"}
        limit = max(10.0, run.left() - 5.0)
        try:
            proc = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider",
                                   *GPU_TESTS], cwd=REPO, capture_output=True, text=True, timeout=limit)
        except subprocess.TimeoutExpired:
            return {"error": f"the GPU tests ran past the {limit:.0f} s the budget left"}
        lines = proc.stdout.strip().splitlines()
        return {"returncode": proc.returncode, "summary": lines[-1] if lines else "", "tail": lines[-25:]}
    run.item("gpu tests", item, min_s=30.0)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with kernels_linked():
        import torch

        device = torch.device(args.device or ("cpu" if args.dry_run else "cuda"))
        if device.type == "cuda" and not torch.cuda.is_available():
            print("gpu_bench_graphs.py: no CUDA device here (--dry-run runs the code path on the CPU)", file=sys.stderr)
            return 2
        run = Run(args, device)
        run.write()
        sections = {"qanet": section_qanet, "profile": section_profile, "convs2s": section_convs2s,
                    "glu": section_glu, "tests": section_tests}
        for name in args.sections:
            try:
                sections[name](run)
            except Exception as e:  # noqa: BLE001 -- a section that cannot even set up: recorded, the next runs
                run.record["items"][f"{name} (set-up)"] = {"error": f"{type(e).__name__}: {e}",
                                                           "traceback": traceback.format_exc().splitlines()[-12:]}
                run.write()
        run.write()
        print(f"wrote {run.path} ({run.record['elapsed_s']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
