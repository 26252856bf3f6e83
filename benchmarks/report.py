"""Results out: the terminal table, results.json and the speedup chart."""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable

from .registry import IMPL_ORDER

def _impl_key(impl: str) -> int:
    return IMPL_ORDER.index(impl) if impl in IMPL_ORDER else len(IMPL_ORDER)


def grouped(records: Iterable[dict]) -> dict[tuple[str, str, str], list[dict]]:
    """(op, case, mode) -> its records in display order, groups in run order."""
    groups: dict[tuple[str, str, str], list[dict]] = defaultdict(list)
    for r in records:
        groups[(r["op"], r["case"], r["mode"])].append(r)
    return {k: sorted(v, key=lambda r: _impl_key(r["impl"])) for k, v in groups.items()}


def speedups(group: list[dict], baseline: str) -> dict[str, float]:
    """impl -> baseline median / impl median (> 1: faster than the baseline)."""
    base = next((r["median_ms"] for r in group if r["impl"] == baseline), None)
    return {} if base is None else {r["impl"]: base / r["median_ms"] for r in group}


def _baseline(group: list[dict]) -> str:
    """The impl a group's speedups are over: "eager", unless the case named another (results before the
    field existed: "eager")."""
    return group[0].get("baseline", "eager")


def _fmt_ms(ms: float) -> str:
    return f"{ms:.3f}" if ms < 1 else f"{ms:.2f}" if ms < 100 else f"{ms:.0f}"


def _fmt_x(x: float | None) -> str:
    return "" if x is None else f"{x:.2f}x"


def _gemm_engines(meta: dict[str, Any]) -> str:
    """" (blas 175, onednn 390, fastqa on onednn, GLU taps: auto)": each CPU GEMM engine's rate, fastqa's
    engine and its GLU convolution setting (FASTQA_CPU_GLU_CONV); empty for results without them (GPU runs,
    older results)."""
    rates = [f"{name} {meta[key] / 1e9:.0f}" for name, key in (("blas", "gemm_flops_blas"),
                                                                ("onednn", "gemm_flops_onednn")) if key in meta]
    gemm = meta.get("cpu_gemm") or {}
    if gemm.get("engine"):
        rates.append(f"fastqa on {gemm['engine']}")
    if meta.get("cpu_glu_conv"):
        rates.append(f"GLU taps: {meta['cpu_glu_conv']}")
    return f" ({', '.join(rates)})" if rates else ""


def table(result: dict[str, Any]) -> str:
    """The per-case table: time per impl, speedups vs eager and compiled, ratio to the bound, memory."""
    meta = result["meta"]
    lines = [f"fastqa benchmarks -- {meta['date']} -- {meta['device']} ({meta['device_type']}, "
             f"{meta['threads']} threads, {meta['dtype']}) -- torch {meta['torch']}, triton {meta['triton']}, "
             f"fastqa {meta['fastqa']}",
             f"roofs measured now: GEMM {meta['gemm_flops'] / 1e9:.1f} GFLOP/s{_gemm_engines(meta)}, "
             f"memory {meta['mem_bw'] / 1e9:.1f} GB/s; "
             f"time = median [p25-p75] ms; err = max |diff| vs the float64 reference (output and gradients)", ""]
    header = (f"{'impl':<15}{'median ms':>11}{'p25-p75':>17}{'vs eager':>10}{'vs compiled':>12}"
              f"{'x bound':>9}{'peak MB':>10}{'max err':>10}{'compile s':>11}")
    for (op, case, mode), group in grouped(result["records"]).items():
        base = _baseline(group)
        vs_eager, vs_compiled = speedups(group, base), speedups(group, "compiled")
        lines.append(f"{op} {case} [{mode}]  bound {_fmt_ms(group[0]['bound_ms'])} ms "
                     f"({group[0]['flops'] / 1e9:.2f} GFLOP, {group[0]['bytes'] / 1e6:.1f} MB)"
                     + ("" if base == "eager" else f"  -- 'vs eager' is vs {base}"))
        lines.append(header)
        for r in group:
            mem = "" if r["peak_mem_bytes"] is None else f"{r['peak_mem_bytes'] / 2 ** 20:.1f}"
            spread = f"{_fmt_ms(r['p25_ms'])}-{_fmt_ms(r['p75_ms'])}"
            lines.append(f"{r['impl']:<15}{_fmt_ms(r['median_ms']):>11}{spread:>17}"
                         f"{_fmt_x(vs_eager.get(r['impl'])):>10}{_fmt_x(vs_compiled.get(r['impl'])):>12}"
                         f"{r['bound_ratio']:>8.1f}x{mem:>10}{r['max_abs_err']:>10.1e}"
                         f"{'' if r['compile_s'] is None else format(r['compile_s'], '.1f'):>11}")
        lines.append("")
    if result["skipped"]:
        lines.append("not run:")
        seen = set()
        for s in result["skipped"]:
            # One line per (impl, reason) and op: the same note for every case is noise.
            key = (s["op"], s["impl"], s["reason"])
            if key not in seen:
                seen.add(key)
                lines.append(f"  {s['op']} {s['impl']}: {s['reason']} (e.g. {s['case']} {s['mode']})")
    return "\n".join(lines)


def markdown(result: dict[str, Any]) -> str:
    """The table as Markdown (results.md; pasted into the README)."""
    meta = result["meta"]
    lines = [f"{meta['date'][:10]}, {meta['device']}, {meta['threads']} threads, {meta['dtype']}, "
             f"torch {meta['torch']}, triton {meta['triton']}, fastqa {meta['fastqa']}; measured roofs: GEMM "
             f"{meta['gemm_flops'] / 1e9:.0f} GFLOP/s{_gemm_engines(meta)}, copy {meta['mem_bw'] / 1e9:.1f} GB/s.", "",
             "| op | case | mode | impl | median ms [p25-p75] | vs eager | vs compiled | x bound | peak MB | max err | compile s |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for (op, case, mode), group in grouped(result["records"]).items():
        base = _baseline(group)
        vs_eager, vs_compiled = speedups(group, base), speedups(group, "compiled")
        note = "" if base == "eager" else f" (vs {base})"
        for r in group:
            mem = "" if r["peak_mem_bytes"] is None else f"{r['peak_mem_bytes'] / 2 ** 20:.1f}"
            comp = "" if r["compile_s"] is None else f"{r['compile_s']:.1f}"
            lines.append(f"| {op} | {case} | {mode} | {r['impl']} | {_fmt_ms(r['median_ms'])} "
                         f"[{_fmt_ms(r['p25_ms'])}-{_fmt_ms(r['p75_ms'])}] | {_fmt_x(vs_eager.get(r['impl']))}{note} | "
                         f"{_fmt_x(vs_compiled.get(r['impl']))} | {r['bound_ratio']:.1f} | {mem} | "
                         f"{r['max_abs_err']:.1e} | {comp} |")
    return "\n".join(lines)


def load_records(path: str | Path) -> list[dict]:
    """Records of a results.json (the whole object, or a bare list of records)."""
    data = json.loads(Path(path).read_text())
    return data["records"] if isinstance(data, dict) else data


_COLOURS = {"naive": "#bbbbbb", "compiled": "#4c72b0", "fastqa[cpu]": "#dd8452", "fastqa[triton]": "#c44e52"}


_TICKS = [m * 10.0 ** e for e in range(-3, 4) for m in (1, 2, 5)]


def _colour(impl: str) -> str:
    return _COLOURS.get(impl, "#55a868")


def speedup_chart(result: dict[str, Any], path: Path) -> None:
    """Horizontal bars, one panel per op: each implementation's speedup over the eager reference
    (log scale, 1x marked), one row per (case, mode). Written by the package's figure rule
    (``fastqa.plots.save_figure``: the format by the suffix, atomically), never through pyplot."""
    from matplotlib import ticker
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    from fastqa.plots import save_figure

    groups = grouped(result["records"])
    ops = list(dict.fromkeys(op for op, _, _ in groups))
    bases = {_baseline(g) for g in groups.values()}
    impls = sorted({r["impl"] for g in groups.values() for r in g} - bases, key=_impl_key)
    # Rows with nothing but eager (no other implementation ran) carry no speedup: left out.
    rows_per_op = {op: [k for k in groups if k[0] == op and len(groups[k]) > 1] for op in ops}
    ops = [op for op in ops if rows_per_op[op]] or ops[:1]
    heights = [max(1, len(rows_per_op[op])) * (0.3 * max(1, len(impls)) + 0.25) + 0.8 for op in ops]
    fig = Figure(figsize=(10, sum(heights) + 1.2))
    axes = fig.subplots(len(ops), 1, squeeze=False, gridspec_kw={"height_ratios": heights})
    bar_h = 0.8 / max(1, len(impls))
    all_x = [s for g in groups.values() for i, s in speedups(g, _baseline(g)).items() if i != _baseline(g)]
    lo, hi = (min(all_x + [1.0]), max(all_x + [1.0])) if all_x else (0.5, 2.0)
    for ax, op in zip(axes[:, 0], ops):
        keys = rows_per_op[op]
        for j, impl in enumerate(impls):
            for i, key in enumerate(keys):
                s = speedups(groups[key], _baseline(groups[key])).get(impl)
                if s is None:
                    continue
                y = i + (j - (len(impls) - 1) / 2) * bar_h
                ax.barh(y, s, height=bar_h * 0.9, color=_colour(impl))
                ax.text(s * 1.03, y, f"{s:.2f}x", va="center", fontsize=7)
        ax.axvline(1.0, color="black", lw=1)
        ax.set_xscale("log")
        ax.set_xlim(lo / 1.6, hi * 1.8)
        ax.set_yticks(range(len(keys)))
        ax.set_yticklabels([f"{case}  [{mode}]" for _, case, mode in keys], fontsize=8)
        ax.invert_yaxis()
        base = _baseline(groups[keys[0]]) if keys else "eager"
        ax.set_title(op if base == "eager" else f"{op} (speedup over {base})", loc="left", fontsize=10,
                     fontweight="bold")
        ax.grid(axis="x", which="both", alpha=0.25)
        ax.xaxis.set_major_locator(ticker.FixedLocator(_TICKS))
        ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}x"))
        ax.xaxis.set_minor_formatter(ticker.NullFormatter())
    handles = [Patch(color=_colour(impl), label=impl) for impl in impls]
    meta = result["meta"]
    fig.suptitle(f"Speedup over the eager PyTorch reference (median time; > 1x is faster)\n"
                 f"{meta['device']}, {meta['threads']} threads, {meta['dtype']}, torch {meta['torch']}, "
                 f"{meta['date'][:10]}", fontsize=10)
    fig.legend(handles=handles, loc="upper right", fontsize=8, ncol=max(1, len(handles)), frameon=False,
               bbox_to_anchor=(0.98, 1 - 0.55 / fig.get_figheight()))
    axes[-1, 0].set_xlabel("speedup vs eager (log scale)")
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.9 / fig.get_figheight()))
    save_figure(fig, path)
