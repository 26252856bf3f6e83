"""What the supervisor writes: the targets judged from the phases' figures, and summary.txt (summary.json is the
same record as JSON). Standard library only: it reads the phases' records, never the device."""
from __future__ import annotations

import math
from typing import Any, Callable

from .common import DTYPE_SHORT, EAGER_FACTOR, TOLERANCES
from .environment import environment_lines


def fmt_s(seconds: float | None) -> str:
    """Seconds to one decimal, or "-"."""
    return "-" if seconds is None else f"{seconds:.1f} s"


def fmt_num(x: float | None, spec: str = ".2f") -> str:
    """A number in ``spec``, or "-" for none or NaN."""
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def _items(phase: dict[str, Any]) -> list[dict[str, Any]]:
    """The items a phase recorded (none where it did not run)."""
    return phase.get("result", {}).get("items", [])


def _ms(item: dict[str, Any]) -> float | None:
    """An item's ms per step where it succeeded."""
    return item.get("median_ms") if item.get("status") == "ok" else None


def targets(phases: dict[str, dict[str, Any]], tiny: bool) -> list[dict[str, str]]:
    """The GPU targets, judged from what the phases measured: met / missed / unknown, with the figures."""
    out: list[dict[str, str]] = []

    def add(name: str, verdict: bool | None, figures: str) -> None:
        out.append({"target": name, "verdict": "unknown" if verdict is None else ("met" if verdict else "missed"),
                    "figures": figures})

    c = {(i.get("mode"), i.get("precision"), i.get("impl")): i for i in _items(phases.get("c", {}))}
    fast, ref = c.get(("train", "bf16", "fast"), {}), c.get(("train", "bf16", "reference"), {})
    if _ms(fast) and _ms(ref):
        ratio = _ms(ref) / _ms(fast)
        add("QANet paper B32 bf16 train step: fast layers >= 1.5x reference layers", ratio >= 1.5,
            f"{_ms(fast):.1f} vs {_ms(ref):.1f} ms/step: {ratio:.2f}x")
    else:
        add("QANet paper B32 bf16 train step: fast layers >= 1.5x reference layers", None, "not measured")
    syncs = (fast.get("host_syncs") or {}) if fast else {}
    if "count" in syncs:
        add("QANet fast bf16 train step: no host sync inside a step", syncs["count"] == 0,
            f"{syncs['count']} per step" + (f" ({'; '.join(syncs['sites'][:3])})" if syncs.get("sites") else ""))
    else:
        add("QANet fast bf16 train step: no host sync inside a step", None, "CUDA only" if fast else "not measured")
    d = {(i.get("search"), i.get("impl"), i.get("incremental")): i for i in _items(phases.get("d", {}))}
    beams = sorted({k[0] for k in d if k[0] and k[0].startswith("beam")})
    label = beams[0] if beams else "beam5"
    inc, full = d.get((label, "fast", True), {}), d.get((label, "fast", False), {})
    if inc.get("status") == "ok" and full.get("status") == "ok":
        ratio = full["median_s"] / inc["median_s"]
        add(f"ConvS2S {label} translation: incremental >= 5x full recompute", ratio >= 5.0,
            f"{inc['sentences_per_s']:.1f} vs {full['sentences_per_s']:.1f} sentences/s: {ratio:.2f}x")
    else:
        add(f"ConvS2S {label} translation: incremental >= 5x full recompute", None, "not measured")
    rows = [r for r in phases.get("e", {}).get("result", {}).get("rows", []) if r.get("vs_eager")]
    if rows:
        slow = [f"{r['op']}/{r['case']} {r['mode']} {r['vs_eager']:.2f}x" for r in rows if r["vs_eager"] < 1.5]
        add("every fastqa op >= 1.5x eager (bench --quick cases)", not slow,
            f"{len(rows) - len(slow)}/{len(rows)} cases" + (f"; below: {', '.join(slow[:6])}" if slow else ""))
        comp = [r for r in rows if r.get("vs_compiled")]
        if comp:
            slow_c = [f"{r['op']}/{r['case']} {r['mode']} {r['vs_compiled']:.2f}x" for r in comp if r["vs_compiled"] < 1.0]
            add("every fastqa op >= 1.0x torch.compile (bench --quick, compiled cases)", not slow_c,
                f"{len(comp) - len(slow_c)}/{len(comp)} cases" + (f"; below: {', '.join(slow_c[:6])}" if slow_c else ""))
    else:
        add("every fastqa op >= 1.5x eager (bench --quick cases)", None, "not measured")
    if tiny:
        for t in out:
            t["figures"] += " [tiny shapes: not a measurement]"
    return out


def _status(item: dict[str, Any]) -> str:
    """An item's status and, where it has one, the reason."""
    return item["status"] + (f": {item['reason']}" if item.get("reason") else "")


def _host_profile_lines(result: dict[str, Any], label: Callable[[dict[str, Any]], str], limit: int) -> list[str]:
    """The first profiled item's host profile (its first ``limit`` lines), headed by ``label(item)``."""
    profiled = next((i for i in result.get("items", []) if i.get("host_profile")), None)
    if profiled is None:
        return []
    return [f"host profile, {label(profiled)}:"] + ["  " + line[:160] for line in profiled["host_profile"][:limit]]


def _detail_a(result: dict[str, Any]) -> list[str]:
    """Phase a: the pytest command, its counts and its output's tail."""
    lines: list[str] = []
    lines.append(f"$ {result.get('command', '')}")
    if result.get("counts"):
        lines.append("counts: " + ", ".join(f"{v} {k}" for k, v in result["counts"].items()))
    lines.append(f"log: {result.get('log')}; its tail:")
    lines += ["  " + s for s in result.get("output_tail", "").splitlines()[-15:]]
    return lines


def _detail_b(result: dict[str, Any]) -> list[str]:
    """Phase b: a row per op check, its worst tensor's errors against the float64 reference and eager's."""
    lines: list[str] = []
    lines.append("rel = max|got - ref| / max(max|ref|, max|ref output|) per tensor, ref = fastqa.reference in "
                 f"float64 on the same device and rounded inputs; tolerance fp32 {TOLERANCES['float32']:.0e}, bf16 {TOLERANCES['bfloat16']:.0e}, "
                 f"or {EAGER_FACTOR:g}x eager rel (the reference op run in the same dtype)")
    lines.append(f"{'op':<24}{'case':<30}{'dtype':<6}{'backend':<10}{'kernels':>8}  {'worst tensor':<18}"
                 f"{'max abs':>10}{'rel':>10}{'eager rel':>10}  result")
    for i in result.get("items", []):
        t = (i.get("tensors") or {}).get(i.get("worst"), {})
        kernels = (i.get("launches") or {}).get("kernels")
        fallback = " (fallback warned)" if i.get("fallback_warnings") else ""
        lines.append(f"{i.get('op', ''):<24}{i.get('case', '')[:29]:<30}{DTYPE_SHORT.get(i.get('dtype'), '?'):<6}"
                     f"{i.get('backend', '-'):<10}{fmt_num(kernels, 'd') if kernels is not None else '-':>8}  "
                     f"{i.get('worst', '-'):<18}{fmt_num(t.get('max_abs'), '.2e'):>10}{fmt_num(t.get('rel'), '.2e'):>10}"
                     f"{fmt_num(t.get('eager_rel'), '.2e'):>10}  "
                     f"{i['status']}{fallback}" + (f": {i['reason']}" if i.get("reason") else ""))
    return lines


def _detail_c(result: dict[str, Any]) -> list[str]:
    """Phase c: a row per QANet item (ms/step, against the reference layers, syncs, kernels, memory), then the
    host's share and profile."""
    lines: list[str] = []
    info = result.get("info", {})
    lines.append(f"QANet {info.get('preset')} B{info.get('batch')} context {info.get('context')} question "
                 f"{info.get('question')}; ms/step: the median of {info.get('steps')} timed steps; torch.compile backend "
                 f"{info.get('compile_backend')}")
    lines.append("x ref: the reference layers' ms/step over this one's; dp: max |p - p_reference| of the start/end "
                 "probabilities (inference, same weights)")
    lines.append(f"{'mode':<7}{'prec':<6}{'impl':<11}{'ms/step':>9}{'x ref':>7}{'syncs':>7}{'kernels':>9}"
                 f"{'memcpy':>8}{'peak GiB':>9}{'first s':>9}{'loss':>9}{'dp':>10}  result")
    ref = {(i.get("mode"), i.get("precision")): _ms(i) for i in result.get("items", []) if i.get("impl") == "reference"}
    for i in result.get("items", []):
        ms, base = _ms(i), ref.get((i.get("mode"), i.get("precision")))
        launches = i.get("launches") or {}
        syncs = (i.get("host_syncs") or {}).get("count")
        lines.append(f"{i.get('mode', ''):<7}{i.get('precision', ''):<6}{i.get('impl', ''):<11}{fmt_num(ms):>9}"
                     f"{fmt_num(base / ms if ms and base else None):>7}{fmt_num(syncs, 'd') if syncs is not None else '-':>7}"
                     f"{fmt_num(launches.get('kernels'), 'd') if launches else '-':>9}"
                     f"{fmt_num(launches.get('memcpy'), 'd') if launches else '-':>8}{fmt_num(i.get('peak_gib')):>9}"
                     f"{fmt_num(i.get('first_call_s'), '.1f'):>9}{fmt_num(i.get('loss'), '.4f'):>9}"
                     f"{fmt_num(i.get('max_diff_vs_reference'), '.1e'):>10}  {i['status']}"
                     + (f": {i['reason']}" if i.get("reason") else ""))
        if (i.get("host_syncs") or {}).get("sites"):
            lines.append(f"{'':<24}sync sites: {'; '.join(i['host_syncs']['sites'])}")
    for i in result.get("items", []):
        if i.get("host_ms") is not None and i.get("status") == "ok":
            lines.append(f"host ms to issue a step, {i['mode']} {i['precision']} {i['impl']}: "
                         f"{i['host_ms']:.2f} of {i['median_ms']:.2f}")
    lines += _host_profile_lines(result, lambda i: f"{i['mode']} {i['precision']} {i['impl']}", 20)
    return lines


def _detail_d(result: dict[str, Any]) -> list[str]:
    """Phase d: a row per ConvS2S item: ms/step of a train step, sentences/s of a translation."""
    lines: list[str] = []
    info = result.get("info", {})
    lines.append(f"ConvS2S {info.get('preset')}: train step B{info.get('batch')} source {info.get('src_len')} "
                 f"target {info.get('tgt_len')}; translation of {info.get('sentences')} sentences")
    for i in result.get("items", []):
        head = f"{i['name']:<52}"
        if i.get("status") != "ok":
            lines.append(head + _status(i))
        elif i.get("kind") == "train":
            syncs = (i.get("host_syncs") or {}).get("count")
            kernels = (i.get("launches") or {}).get("kernels")
            lines.append(f"{head}{i['median_ms']:9.2f} ms/step  syncs {fmt_num(syncs, 'd') if syncs is not None else '-'}"
                         f"  kernels {fmt_num(kernels, 'd') if kernels is not None else '-'}  loss {fmt_num(i.get('loss'), '.4f')}")
        else:
            same = next((f"  same tokens as {k[len('same_output_as_'):]}: {v:.0%}" for k, v in i.items()
                         if k.startswith("same_output_as_")), "")
            lines.append(f"{head}{i['median_s']:9.3f} s  {i['sentences_per_s']:8.1f} sentences/s  "
                         f"{i['tokens_per_s']:9.0f} tokens/s{same}")
    return lines


def _detail_f(result: dict[str, Any]) -> list[str]:
    """Phase f: a row per op, fastqa and eager, waited for, issued by the host, and as a CUDA graph's replay."""
    lines: list[str] = []
    lines.append("ms per call waited for (host: the host's ms to issue it; graph: per CUDA-graph replay, the "
                 "kernels alone); bf16")
    lines.append(f"{'case':<44}{'fastqa fwd':>11}{'host':>7}{'graph':>7}{'eager fwd':>10}{'host':>7}{'graph':>7}"
                 f"{'fastqa f+b':>11}{'host':>7}{'eager f+b':>10}{'host':>7}")
    for i in result.get("items", []):
        head = f"{(i.get('op', '') + '/' + i.get('case', ''))[:43]:<44}"
        if i.get("status") != "ok":
            lines.append(head + _status(i))
            continue
        lines.append(head + "".join(f"{fmt_num(i.get(k), '.3f'):>{w}}" for k, w in (
            ("fastqa_fwd_ms", 11), ("fastqa_fwd_host_ms", 7), ("fastqa_fwd_graph_ms", 7), ("eager_fwd_ms", 10),
            ("eager_fwd_host_ms", 7), ("eager_fwd_graph_ms", 7), ("fastqa_fwdbwd_ms", 11),
            ("fastqa_fwdbwd_host_ms", 7), ("eager_fwdbwd_ms", 10), ("eager_fwdbwd_host_ms", 7))))
        for k in ("fastqa_fwd_graph_error", "eager_fwd_graph_error"):
            if i.get(k):
                lines.append(f"{'':<44}{k}: {i[k][:150]}")
    lines += _host_profile_lines(result, lambda i: f"{i['op']} fastqa forward+backward", 14)
    return lines


def _detail_e(result: dict[str, Any]) -> list[str]:
    """Phase e: the bench command and a row per (case, mode): fastqa's ms, its speedups, its share of the bound."""
    lines: list[str] = []
    lines.append(f"$ {result.get('command', '')}")
    rows = result.get("rows", [])
    if rows:
        lines.append(f"{'case':<52}{'mode':<9}{'fastqa ms':>10}{'x eager':>9}{'x compiled':>11}{'of bound':>9}")
        for r in rows:
            lines.append(f"{(r['op'] + '/' + r['case'])[:51]:<52}{r['mode']:<9}{fmt_num(r['fastqa_ms'], '.3f'):>10}"
                         f"{fmt_num(r['vs_eager']):>9}{fmt_num(r['vs_compiled']):>11}"
                         f"{fmt_num(r['of_bound'] * 100 if r.get('of_bound') else None, '.0f'):>8}%")
    for s in result.get("skipped_impls", [])[:12]:
        lines.append(f"  not timed: {s}")
    return lines


# Phase key -> its section of summary.txt (before the lines every phase may have: its first error, note, tail).
DETAIL_LINES: dict[str, Callable[[dict[str, Any]], list[str]]] = {
    "a": _detail_a, "b": _detail_b, "c": _detail_c, "d": _detail_d, "e": _detail_e, "f": _detail_f}


def _phase_detail_lines(key: str, result: dict[str, Any]) -> list[str]:
    """The per-phase section of summary.txt."""
    lines = DETAIL_LINES[key](result)
    first_error = next((i for i in result.get("items", []) if i.get("error_tail")), None)
    if first_error is not None:
        lines.append(f"first error ({first_error['name']}):")
        lines += ["  " + s for s in first_error["error_tail"].splitlines()[-12:]]
    if result.get("note"):
        lines.append(f"note: {result['note']}")
    if result.get("error_tail"):
        lines.append("error tail:")
        lines += ["  " + s for s in result["error_tail"].splitlines()[-20:]]
    return lines


def render_summary(summary: dict[str, Any]) -> str:
    """summary.txt: the header, a line per phase, the targets, then each phase's detail."""
    meta = summary["meta"]
    lines = [f"fastqa gpu-check  {meta['started']}  ({'tiny mode, ' if meta['tiny'] else ''}device {meta['device']}, "
             f"global budget {meta['budget_s']:.0f} s, ran {meta['elapsed_s']:.0f} s)"]
    lines += environment_lines(summary["environment"])
    lines.append("")
    for p in summary["phases"]:
        reason = f"  {p['reason']}" if p.get("reason") else ""
        lines.append(f"phase {p['key']}  {p['title']:<62} {p['status']:<8}{fmt_s(p.get('seconds')):>9}{reason}")
    lines.append("")
    lines.append("targets:")
    for t in summary.get("targets", []):
        lines.append(f"  {t['verdict']:<8}{t['target']}: {t['figures']}")
    for p in summary["phases"]:
        if not p.get("result"):
            continue
        lines.append("")
        lines.append(f"== phase {p['key']}: {p['title']} ({p['status']}) ==")
        lines += _phase_detail_lines(p["key"], p["result"])
    return "\n".join(lines) + "\n"
