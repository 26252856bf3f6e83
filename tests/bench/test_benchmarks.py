"""The benchmark harness itself, on tiny shapes (no torch.compile): records, table, chart, compare."""
from __future__ import annotations

import json

import pytest
import torch

from benchmarks import __main__ as cli
from benchmarks import compare, measure, registry, report, runner
from fastqa._backend import cpu_available
from fastqa.data.files import atomic_write_json
from benchmarks.cases import (cqa_case, decode_attention_case, dwsep_case, glu_case, glu_step_case, linear_argmax_case,
                              ln_dwsep_case)

FIELDS = {"op", "case", "shape", "impl", "mode", "median_ms", "p25_ms", "p75_ms", "peak_mem_bytes",
          "max_abs_err", "bound_ms", "device", "torch", "triton", "fastqa"}
TINY = measure.Settings(min_runs=10, max_runs=10, target_s=0.0, min_sample_s=0.0, warmup_calls=2, warmup_s=0.0)


class _ModelLikeCase(registry.Case):
    """A non-op case through the plug-in interface: one good implementation and one that fails."""
    op, name, shape, modes = "toy_model", "tiny", {"n": 4}, ("fwd",)

    def prepare(self, mode, device, dtype, *, compile, naive_limit_bytes):
        x = torch.ones(4, device=device, dtype=dtype)

        def broken():
            raise RuntimeError("kernel exploded")
        return registry.Prepared(runners={"eager": lambda: x * 2, "fastqa[cpu]": broken},
                                 expected=torch.full((4,), 2.0, dtype=torch.float64), flops=8.0, bytes=32.0,
                                 unavailable={"naive": "none for this case"})


@pytest.fixture(scope="module")
def result():
    cases = [dwsep_case(2, 16, 8, 6, 3, relu_residual=True), ln_dwsep_case(2, 16, 8, 3), cqa_case(2, 8, 4, 8),
             glu_case(2, 8, 6, 3, causal=True), glu_step_case(2, 8, 3, steps=4), decode_attention_case(3, 2, 5, 8),
             linear_argmax_case(4, 8, 9), _ModelLikeCase()]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny ops: a second thread only adds synchronisation on a busy machine
    try:
        return runner.run(cases, device=torch.device("cpu"), dtype=torch.float32, settings=TINY,
                          compile_per_op=0, progress=False, peaks={"gemm_flops": 1e11, "mem_bw": 1e10})
    finally:
        torch.set_num_threads(threads)


def test_records_have_the_documented_fields(result):
    recs = result["records"]
    assert {(r["op"], r["mode"]) for r in recs} >= {
        ("dwsep_conv1d", "fwd"), ("dwsep_conv1d", "fwd+bwd"), ("ln_dwsep_conv1d", "fwd+bwd"),
        ("context_query_attention", "fwd+bwd"),
        ("glu_conv1d", "fwd+bwd"), ("glu_conv1d_step", "fwd"), ("decode_attention", "fwd"),
        ("linear_argmax", "fwd"), ("toy_model", "fwd")}
    for r in recs:
        assert FIELDS <= r.keys(), FIELDS - r.keys()
        assert r["runs"] >= 10
        assert 0 < r["p25_ms"] <= r["median_ms"] <= r["p75_ms"]
        assert r["bound_ms"] > 0 and r["peak_mem_bytes"] >= 0
        # Every implementation (naive baselines included) computes the reference's result.
        assert r["max_abs_err"] < 1e-4, r
    impls = {r["impl"] for r in recs if r["op"] == "context_query_attention"}
    assert {"naive", "eager"} <= impls and "compiled" not in impls
    assert "naive" in {r["impl"] for r in recs if r["op"] == "glu_conv1d_step"}


def test_failures_and_absences_are_reported_not_fatal(result):
    skipped = {(s["op"], s["impl"]): s["reason"] for s in result["skipped"]}
    assert "kernel exploded" in skipped[("toy_model", "fastqa[cpu]")]
    assert skipped[("toy_model", "naive")] == "none for this case"
    assert "compiled" in {impl for _, impl in skipped}
    assert [r["impl"] for r in result["records"] if r["op"] == "toy_model"] == ["eager"]


def test_table_json_and_chart(result, tmp_path):
    text = report.table(result)
    assert "dwsep_conv1d B2_L16_C8-6_K3_relu_res [fwd+bwd]" in text and "kernel exploded" in text
    dwsep_rows = [r for r in result["records"] if r["op"] == "dwsep_conv1d"]
    assert {r["impl"] for r in dwsep_rows} >= {"eager"} and {r["mode"] for r in dwsep_rows} == {"fwd", "fwd+bwd"}
    assert report.markdown(result).count("| dwsep_conv1d |") == len(dwsep_rows)  # one Markdown row per record
    atomic_write_json(tmp_path / "results.json", result, indent=1)  # as python -m benchmarks writes it
    assert len(report.load_records(tmp_path / "results.json")) == len(result["records"])
    report.speedup_chart(result, tmp_path / "speedup.png")
    assert (tmp_path / "speedup.png").read_bytes()[:4] == b"\x89PNG"


def test_peak_memory_sees_a_temporary():
    def fn():
        t = torch.empty(2 ** 20, dtype=torch.float32).fill_(1.0)  # 4 MiB, freed before returning
        return t.sum()
    peak = measure.peak_memory(fn, torch.device("cpu"))
    assert 4 * 2 ** 20 <= peak < 8 * 2 ** 20


def test_machine_peaks_are_plausible():
    peaks = measure.machine_peaks(torch.device("cpu"), torch.float32, quick=True)
    assert 1e8 < peaks["gemm_flops"] < 1e14 and 1e8 < peaks["mem_bw"] < 1e13


def test_cli_lists_and_filters(capsys):
    assert cli.main(["--list", "--quick", "--ops", "glu_conv1d"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out and all(line.startswith("glu_conv1d/") and "(quick)" in line for line in out)
    assert cli.main(["--list", "--cases", "no-such-case"]) == 2
    assert cli.main(["--list", "--ops", "nope"]) == 2


def _records(ms: dict[str, float]) -> dict:
    return {"meta": {}, "records": [{"op": "op", "case": c, "impl": "fastqa[cpu]", "mode": "fwd", "median_ms": v}
                                    for c, v in ms.items()]}


@pytest.mark.parametrize("slowdown, flagged", [(1.20, True), (1.05, False), (0.80, False)])
def test_compare_flags_only_real_regressions(tmp_path, capsys, slowdown, flagged):
    old, new = tmp_path / "old.json", tmp_path / "new.json"
    old.write_text(json.dumps(_records({"a": 10.0, "b": 2.0, "gone": 1.0})))
    new.write_text(json.dumps(_records({"a": 10.0 * slowdown, "b": 2.0, "added": 1.0})))
    assert compare.main([str(old), str(new)]) == (1 if flagged else 0)
    out = capsys.readouterr().out
    assert ("REGRESSION" in out) == flagged
    assert "only in OLD" in out and "gone" in out and "added" in out


@pytest.mark.skipif(not cpu_available(), reason="compares the C++ kernels in two dtypes")
def test_bf16_benchmark_writes_rows_with_speedups_and_errors(tmp_path):
    """benchmarks.cpu_bf16 on one quick op: a row per mode with the three implementations timed, the bf16 result's
    error against float64 at bf16's size, and the JSON and markdown written."""
    from benchmarks import cpu_bf16

    out = tmp_path / "bf16.json"
    assert cpu_bf16.main(["--quick", "--ops", "linear", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    rows = result["rows"]
    assert rows and {r["case"].split()[-1] for r in rows} == {"fwd", "fwd+bwd"}
    for r in rows:
        assert set(r["ms"]) == {"fp32", "bf16", "autocast"} and all(v > 0 for v in r["ms"].values())
        assert 0 < r["bf16_relative_error"] < 3e-2
        assert r["bf16_speedup"] == pytest.approx(r["ms"]["fp32"] / r["ms"]["bf16"])
    assert "| linear/" in out.with_suffix(".md").read_text()


@pytest.mark.skipif(not cpu_available(), reason="compares the C++ kernels in two dtypes")
def test_bf16_benchmark_names_the_cpu_its_bf16_units_and_the_routes(tmp_path, monkeypatch):
    """The record says which processor and bf16 units it was measured on, and which route each bf16 op took."""
    from benchmarks import cpu_bf16
    from benchmarks.measure import device_name

    monkeypatch.delenv("FASTQA_CPU_BF16_ROUTE", raising=False)
    out = tmp_path / "bf16.json"
    assert cpu_bf16.main(["--quick", "--ops", "glu_conv1d_step", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["machine"] == device_name(torch.device("cpu")) and result["machine"]
    assert result["bf16_units"] == cpu_bf16.bf16_units() and isinstance(result["bf16_brgemm"], bool)
    assert [r["op"] for r in result["bf16_routes"]].count("glu_conv1d_step") >= 1
    assert all(r["route"] in ("native", "widen") for r in result["bf16_routes"])
    md = out.with_suffix(".md").read_text()
    assert "bf16 units: " in md and "glu_conv1d_step B=" in md


@pytest.mark.skipif(not cpu_available(), reason="compares the C++ kernels in two dtypes")
def test_bf16_benchmark_quick_runs_the_ops_the_op_suite_leaves_out(tmp_path):
    """trilinear_similarity and dropout_add are not registered op cases; --quick --ops still measures them."""
    from benchmarks import cpu_bf16

    out = tmp_path / "bf16.json"
    assert cpu_bf16.main(["--quick", "--ops", "trilinear_similarity", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["case"].split("/")[0] for r in rows] == ["trilinear_similarity"] * 2
    assert {r["case"].split()[-1] for r in rows} == {"fwd", "fwd+bwd"}


def test_bf16_units_reads_every_unit_from_the_flags():
    from benchmarks.cpu_bf16 import bf16_units

    assert bf16_units("flags\t: fpu avx512f avx512_bf16 amx_tile amx_bf16\n") == ["amx_bf16", "avx512_bf16"]
    assert bf16_units("flags\t: fpu avx512f avx512_bf16\n") == ["avx512_bf16"]
    assert bf16_units("flags\t: fpu avx2\n") == []
    assert bf16_units("processor\t: 0\n") is None
