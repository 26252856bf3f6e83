"""bfloat16 against float32 on the CPU, in one process, interleaved: what ``--precision bf16`` buys.

For every fused op's benchmark case (the shapes of ``python -m benchmarks``), forward and forward+backward,
three implementations are timed round-robin:

  fp32       fastqa's CPU kernel on float32 tensors (the baseline)
  bf16       fastqa's CPU kernel on bfloat16 tensors
  autocast   the eager reference on float32 tensors under ``torch.autocast("cpu", dtype=torch.bfloat16)``:
             what a PyTorch user gets from autocast without fastqa

with the bf16 result's largest error against the float64 reference (relative to the reference's largest
magnitude) and each dtype's lower bound from the machine's measured GEMM rate and bandwidth in that dtype
(``measure.machine_peaks``). Then the model cases (``--models``): the QANet ``paper`` B32 training step and
inference, fp32 against bf16 autocast (fp32 weights: what ``--precision bf16`` trains with), its inference with
bfloat16 weights (what ``ask --precision bf16`` runs), and ConvS2S
``tutorial``'s training step likewise, and its beam-5 translation of 200 sentences with float32 against
bfloat16 weights (what ``translate --precision bf16`` runs).

The record names the CPU model, its bf16 units (``amx_bf16``, ``avx512_bf16`` or none) and the route each bf16
op chose per shape class (native bf16 or widened to float32, with the milliseconds each measured).

``python -m benchmarks.cpu_bf16 [--quick] [--models] [--threads 2] [--out FILE.json]``; ``make bench-bf16``
writes ``bench-results/cpu-bf16.{json,md}`` (the records are ``benchmarks/results/cpu-<machine>-<threads>threads-
<date>-bf16.{json,md}``).
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import statistics
import sys
from pathlib import Path
from typing import Any, Callable

import torch

from fastqa._backend import cpu_bf16_units
from fastqa.data.files import atomic_write_json, atomic_write_text

from . import measure
from .cases import dropout_add_case, trilinear_case
from .registry import OpCase, max_abs_err, select

CPU = torch.device("cpu")
IMPLS = ("fp32", "bf16", "autocast")


def _autocast(fn: Callable[[], Any]) -> Callable[[], Any]:
    def run() -> Any:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return fn()
    return run


def _relative_error(got: Any, expected: Any) -> float:
    """max |got - expected| over the result's tensors, over the largest |expected| (at least 1)."""
    tensors = expected if isinstance(expected, (tuple, list)) else [expected]
    scale = max([1.0] + [float(t.detach().abs().max()) for t in tensors if t.numel()])
    return max_abs_err(got, expected) / scale


def _time(fns: dict[str, Callable[[], Any]], settings: measure.Settings) -> dict[str, float]:
    """Median milliseconds per call of each fn, warmed up, sampled round-robin."""
    est = {}
    for name, fn in fns.items():
        for _ in range(max(2, settings.warmup_calls)):
            fn()
        est[name] = measure.sampler(fn, CPU)(1)
    samples = measure.time_interleaved(fns, CPU, settings, est)
    return {name: 1e3 * statistics.median(s) for name, s in samples.items()}


def _row(what: str, ms: dict[str, float], **extra: Any) -> dict[str, Any]:
    row = {"case": what, "ms": ms, "bf16_speedup": ms["fp32"] / ms["bf16"]}
    if "autocast" in ms:
        row["bf16_vs_autocast"] = ms["autocast"] / ms["bf16"]
    row.update(extra)
    return row


def op_rows(cases: list[OpCase], settings: measure.Settings, peaks: dict[str, dict[str, float]],
            log: Callable[[str], None]) -> list[dict[str, Any]]:
    rows = []
    for case in cases:
        for mode in case.modes:
            p32 = case.prepare(mode, CPU, torch.float32, compile=False, naive_limit_bytes=0)
            p16 = case.prepare(mode, CPU, torch.bfloat16, compile=False, naive_limit_bytes=0)
            if "fastqa[cpu]" not in p32.runners:
                log(f"{case.id} {mode}: skipped ({p32.unavailable.get('fastqa', 'no cpu backend')})")
                continue
            fns = {"fp32": p32.runners["fastqa[cpu]"], "bf16": p16.runners["fastqa[cpu]"],
                   "autocast": _autocast(p32.runners["eager"])}
            error = _relative_error(fns["bf16"](), p16.expected_of("fastqa[cpu]"))
            ms = _time(fns, settings)
            bounds = {name: 1e3 * max(p.flops / peaks[name]["gemm_flops"], p.bytes / peaks[name]["mem_bw"])
                      for name, p in (("fp32", p32), ("bf16", p16))}
            rows.append(_row(f"{case.id} {mode}", ms, bf16_relative_error=error, bound_ms=bounds))
            log(_line(rows[-1]))
    return rows


def model_rows(settings: measure.Settings, log: Callable[[str], None], *, quick: bool) -> list[dict[str, Any]]:
    from . import cases_convs2s as mt
    from . import cases_qanet as qa

    rows = []
    B = 4 if quick else 32
    cfg = qa.paper_config()
    model = qa.build_models(cfg, ["fast"], CPU, torch.float32)["fast"]
    batch = qa.make_batch(torch.Generator().manual_seed(0), B, 400, 50)
    for mode, make in (("train step", qa.train_step_runner), ("inference", qa.inference_runner)):
        fns = {"fp32": make(model, batch), "bf16": make(model, batch, autocast=torch.bfloat16)}
        ms = _time(fns, settings)
        rows.append(_row(f"qanet paper B{B} n400 m50 {mode} (bf16: autocast, fp32 weights)", ms))
        log(_line(rows[-1]))
    bf16_model = qa.build_models(cfg, ["fast"], CPU, torch.bfloat16)["fast"]
    ms = _time({"fp32": qa.inference_runner(model, batch), "bf16": qa.inference_runner(bf16_model, batch)}, settings)
    rows.append(_row(f"qanet paper B{B} n400 m50 inference (bf16: bf16 weights)", ms))
    log(_line(rows[-1]))

    models = mt._models("tutorial", {}, CPU, torch.float32, train=True)
    fast = models["fast"]
    src, tgt = mt.train_batch(fast.config, 64, 30, 30, CPU)
    fns = {"fp32": mt.train_step_runner(fast, src, tgt),
           "bf16": mt.train_step_runner(fast, src, tgt, autocast=torch.bfloat16)}
    ms = _time(fns, settings)
    rows.append(_row("convs2s tutorial B64 S30 T30 train step (bf16: autocast, fp32 weights)", ms))
    log(_line(rows[-1]))

    sentences = 20 if quick else 200
    case = mt.TranslateCase("tutorial", sentences, beam=5)
    fp32_model = mt._models("tutorial", {}, CPU, torch.float32, train=False)["fast"]
    bf16_model = mt._models("tutorial", {}, CPU, torch.float32, train=False)["fast"].to(torch.bfloat16)
    sources = mt._sources(sentences, case.min_len, case.max_len, CPU, fp32_model.config.src_vocab_size)
    fns = {"fp32": case.decoder(fp32_model, sources, incremental=True),
           "bf16": case.decoder(bf16_model, sources, incremental=True)}
    tokens32, tokens16 = fns["fp32"]()[0], fns["bf16"]()[0]
    same = float((tokens32 == tokens16).all(1).float().mean()) if tokens32.shape == tokens16.shape else 0.0
    ms = _time(fns, dataclasses.replace(settings, min_runs=min(settings.min_runs, 5), max_runs=5))
    rows.append(_row(f"convs2s tutorial beam5 {sentences} sentences (bf16: bf16 weights)", ms,
                     same_translation=same))
    log(_line(rows[-1]))
    return rows


def _line(row: dict[str, Any]) -> str:
    ms = row["ms"]
    text = f"{row['case']:<70} fp32 {ms['fp32']:9.2f} ms  bf16 {ms['bf16']:9.2f} ms  x{row['bf16_speedup']:.2f}"
    if "autocast" in ms:
        text += f"  autocast {ms['autocast']:9.2f} ms  (bf16 x{row['bf16_vs_autocast']:.2f} over it)"
    if "bf16_relative_error" in row:
        text += f"  err {row['bf16_relative_error']:.1e}"
    return text


# The CPU's bf16 units by their /proc/cpuinfo flags: the package's own reading of them.
bf16_units = cpu_bf16_units


def markdown(result: dict[str, Any]) -> str:
    units = result.get("bf16_units")
    routes = result.get("bf16_routes") or []
    lines = [f"# bf16 vs fp32 on the CPU: {result['machine']}, {result['threads']} threads, {result['date']}", "",
             f"torch {result['torch']}; native bf16: {result['cpu_bf16']} (bf16 units: "
             f"{'unknown' if units is None else ', '.join(units) or 'none'}; batch-reduce GEMM micro-kernel on "
             f"packed bf16: {'usable' if result.get('bf16_brgemm') else 'not usable'}); measured GEMM rate fp32 "
             f"{result['peaks']['fp32']['gemm_flops'] / 1e9:.0f} GFLOP/s, bf16 "
             f"{result['peaks']['bf16']['gemm_flops'] / 1e9:.0f} GFLOP/s. Medians of interleaved runs.", "",
             *(["bf16 routes chosen (op, shape class: route, each route's measured ms): " + "; ".join(
                 f"{r['op']} {r['shape']}: {r['route']} ({r['ms']['native']:.3g} / {r['ms']['widen']:.3g})"
                 for r in routes), ""] if routes else []),
             "| case | fp32 ms | bf16 ms | bf16 speedup | autocast ms | bf16 over autocast | bf16 bound ms | "
             "bf16 rel. error |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in result["rows"]:
        ms = r["ms"]
        cells = [r["case"], f"{ms['fp32']:.2f}", f"{ms['bf16']:.2f}", f"{r['bf16_speedup']:.2f}x",
                 f"{ms['autocast']:.2f}" if "autocast" in ms else "",
                 f"{r['bf16_vs_autocast']:.2f}x" if "bf16_vs_autocast" in r else "",
                 f"{r['bound_ms']['bf16']:.2f}" if "bound_ms" in r else "",
                 f"{r['bf16_relative_error']:.1e}" if "bf16_relative_error" in r else ""]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.cpu_bf16", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="the quick op cases, few runs, small model batches")
    p.add_argument("--models", action="store_true", help="also the QANet and ConvS2S model cases (minutes)")
    p.add_argument("--ops", nargs="+", help="only these ops")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--target-s", type=float, default=1.0, help="timed seconds per implementation and case")
    p.add_argument("--out", type=Path, default=None, help="results JSON (and .md beside it)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from fastqa._backend import cpu_bf16_support

    settings = dataclasses.replace(measure.QUICK if args.quick else measure.Settings(), target_s=args.target_s,
                                   memory=False)
    if args.quick:
        settings.target_s = 0.0
    peaks = {name: measure.machine_peaks(CPU, dtype, quick=args.quick)
             for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16))}
    # The two ops the op suite leaves to the GPU check, at QANet's shapes, so that every op has its bf16 row.
    B = 8 if args.quick else 32
    extra = [trilinear_case(B, 400, 50, 128, quick=args.quick), dropout_add_case(B, 400, 128, quick=args.quick)]
    registered = [op for op in args.ops or () if op not in {c.op for c in extra}]
    cases = [] if args.ops and not registered else [
        c for c in select(registered or None, None, quick=args.quick) if isinstance(c, OpCase)]
    cases += [c for c in extra if not args.ops or c.op in args.ops]
    rows = op_rows(cases, settings, peaks, print)
    if args.models:
        rows += model_rows(settings, print, quick=args.quick)
    from fastqa._backend import cpu_gemm_info

    gemm = cpu_gemm_info() or {}
    result = {"machine": measure.device_name(CPU), "threads": torch.get_num_threads(),
              "date": datetime.date.today().isoformat(), "torch": torch.__version__, "cpu_bf16": cpu_bf16_support(),
              "bf16_units": bf16_units(), "bf16_routes": gemm.get("routes", []),
              "bf16_brgemm": gemm.get("bf16_brgemm"), "peaks": peaks, "rows": rows}
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(args.out, result, indent=1)
        atomic_write_text(args.out.with_suffix(".md"), markdown(result))
        print(f"wrote {args.out} and {args.out.with_suffix('.md')}")
    else:
        print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
