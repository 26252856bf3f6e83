"""The CPU kernels' GEMM engine (csrc/cpu/gemm.h, FASTQA_CPU_GEMM): the chooser, info(), and every
op against the reference (forward, every gradient, bit-identical repeated backward) with each engine
forced, plus the fallback where torch has no usable oneDNN.

The engine is chosen once per process, so each engine runs the op tests in a subprocess."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import fastqa
from fastqa._backend import cpu_available, cpu_gemm_info

pytestmark = pytest.mark.skipif(not cpu_available(), reason="fastqa._C is not built")

TESTS = Path(__file__).resolve().parent
ONEDNN = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")

# The op tests that compare forward and gradients with the reference at the existing shapes, and the
# determinism tests, on the cpu backend (compile/opcheck/gradcheck do not depend on the engine:
# float64 always runs on BLAS).
OP_TESTS = [str(TESTS / f) for f in ("test_glu_conv1d.py", "test_dwsep_conv1d.py",
                                     "test_context_query_attention.py", "test_linear.py")]
ENGINE_SELECTION = ("cpu and (matches_reference or edge_shapes or real_shapes or model_shapes or odd_shapes"
                    " or deterministic or bit_identical or step_kernel or step_sequence or residual_scale_bias"
                    " or strided or noncontiguous)")


def _chooser():
    from fastqa import _C
    return _C.gemm_choose


def test_chooser_prefers_onednn_only_when_measurably_faster():
    choose = _chooser()
    assert choose(175.0, 390.0, True, "auto") == "onednn"  # AMD EPYC: MKL's AVX2 sgemm vs oneDNN's AVX-512
    assert choose(290.0, 287.0, True, "auto") == "blas"    # Intel: a tie stays on BLAS
    assert choose(100.0, 104.0, True, "auto") == "blas"    # within the 5 % noise margin
    assert choose(100.0, 106.0, True, "auto") == "onednn"
    assert choose(100.0, 0.0, False, "auto") == "blas"     # no oneDNN: BLAS whatever the rates
    assert choose(100.0, 500.0, False, "auto") == "blas"


def test_chooser_obeys_the_variable():
    choose = _chooser()
    assert choose(100.0, 500.0, True, "blas") == "blas"
    assert choose(500.0, 100.0, True, "onednn") == "onednn"
    with pytest.raises(RuntimeError, match="FASTQA_CPU_GEMM=onednn"):
        choose(100.0, 0.0, False, "onednn")
    with pytest.raises(RuntimeError, match="auto, blas or onednn"):
        choose(100.0, 100.0, True, "fastest")


def test_info_names_the_engine_and_each_rate():
    gemm = fastqa.info()["cpu_extension"]["gemm"]
    assert gemm == cpu_gemm_info()
    assert gemm["engine"] in ("blas", "onednn")
    assert gemm["requested"] == (os.environ.get("FASTQA_CPU_GEMM") or "auto")
    for rates in ("gflops", "tile_gflops"):
        assert gemm["onednn_available"] == ("onednn" in gemm[rates])
        assert all(rate > 0 for rate in gemm[rates].values())
    if gemm["requested"] == "auto" and gemm["onednn_available"]:
        # The process's engine serves the kernels' tile products: chosen on those, not on the 512^3 product.
        tiles = gemm["tile_gflops"]
        assert gemm["engine"] == _chooser()(tiles["blas"], tiles["onednn"], True, "auto")


def _run(code: str, env_engine: str, timeout: float = 1800, *argv: str,
         text: bool = True) -> subprocess.CompletedProcess:
    """``python -c code *argv`` with FASTQA_CPU_GEMM=env_engine (output as text, or bytes with text=False)."""
    env = {**os.environ, "FASTQA_CPU_GEMM": env_engine}
    return subprocess.run([sys.executable, "-c", code, *argv], cwd=TESTS.parents[1], env=env, capture_output=True,
                          text=text, timeout=timeout)


def _run_script(lines: list[str], env_engine: str) -> None:
    """Run the script ``lines`` under FASTQA_CPU_GEMM=env_engine; it must exit 0 after its last line."""
    proc = _run("\n".join([*lines, "print('ok')"]), env_engine, 600)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]


def _op_tests_code(disable_onednn: bool, expect_engine: str) -> str:
    return "\n".join([
        "import sys, torch, pytest",
        f"torch.backends.mkldnn.enabled = {not disable_onednn}",
        f"rc = pytest.main({OP_TESTS!r} + ['-q', '-x', '-p', 'no:cacheprovider', '-k', {ENGINE_SELECTION!r}])",
        "from fastqa._backend import cpu_gemm_info",
        "info = cpu_gemm_info()",
        "print('GEMM', info)",
        f"assert info['engine'] == {expect_engine!r}, info",
        f"assert info['onednn_available'] == {not disable_onednn and ONEDNN}, info",
        "sys.exit(int(rc))",
    ])


@pytest.mark.parametrize("engine", ["blas", pytest.param("onednn", marks=pytest.mark.skipif(
    not ONEDNN, reason="this torch build has no oneDNN linear op"))])
def test_ops_match_reference_with_each_engine(engine):
    """Forward and every gradient vs the reference at the op tests' shapes, and bit-identical repeated
    backwards, with the engine forced by FASTQA_CPU_GEMM."""
    proc = _run(_op_tests_code(disable_onednn=False, expect_engine=engine), engine)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert " passed" in proc.stdout and "GEMM" in proc.stdout


def test_without_onednn_auto_falls_back_to_blas():
    """torch.backends.mkldnn disabled (what a torch without oneDNN looks like to fastqa): auto picks
    BLAS without error and the ops still match the reference; forcing onednn then raises, naming the
    variable, and info() reports the error instead of failing."""
    proc = _run(_op_tests_code(disable_onednn=True, expect_engine="blas").replace(
        ENGINE_SELECTION, "cpu and (real_shapes or model_shapes or step_kernel or matches_reference)"), "auto")
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    _run_script([
        "import torch, fastqa, pytest",
        "torch.backends.mkldnn.enabled = False",
        "x, w = torch.randn(2, 5, 8), torch.randn(16, 8, 3)",
        "with pytest.raises(RuntimeError, match='FASTQA_CPU_GEMM=onednn'):",
        "    fastqa.glu_conv1d(x, w, causal=True, backend='cpu')",
        "assert 'FASTQA_CPU_GEMM=onednn' in fastqa.info()['cpu_extension']['gemm']['error']",
    ], "onednn")


def test_bad_variable_raises_naming_it():
    _run_script([
        "import torch, fastqa, pytest",
        "with pytest.raises(RuntimeError, match='FASTQA_CPU_GEMM must be auto, blas or onednn'):",
        "    fastqa.glu_conv1d(torch.randn(2, 5, 8), torch.randn(16, 8, 3), causal=True, backend='cpu')",
    ], "fastest")


@pytest.mark.skipif(not ONEDNN, reason="this torch build has no oneDNN linear op: nothing to choose")
def test_restored_plan_sets_each_shape_and_the_process_engine():
    """A plan from another process (what a training checkpoint carries) decides every shape it names and
    the process engine: the product then equals, bit for bit, the one of a process forced to that engine."""
    code = "\n".join([
        "import sys, torch, fastqa",
        "from fastqa._backend import cpu_gemm_info, cpu_gemm_plan, restore_cpu_gemm_plan",
        "g = torch.Generator().manual_seed(0)",
        "x, w, b = torch.randn(300, 256, generator=g), torch.randn(900, 256, generator=g), torch.randn(900, generator=g)",
        "if sys.argv[1] != 'auto':",
        "    sys.stdout.buffer.write(fastqa.linear(x, w, b, backend='cpu').numpy().tobytes()); sys.exit(0)",
        "fastqa.linear(x, w, b, backend='cpu')",
        "plan = cpu_gemm_plan()",
        "mine = [s for s in plan['shapes'] if (s['m'], s['k'], s['n'], s['bias']) == (512, 256, 900, True)]",
        "assert len(mine) == 1, plan",
        "other = {'blas': 'onednn', 'onednn': 'blas'}",
        "flipped = {'engine': other[plan['engine']], 'shapes': [{**s, 'engine': other[s['engine']]} for s in plan['shapes']]}",
        "restore_cpu_gemm_plan(flipped)",
        "info = cpu_gemm_info()",
        "assert info['engine'] == flipped['engine'], info",
        "now = [s for s in info['shapes'] if (s['m'], s['k'], s['n'], s['bias']) == (512, 256, 900, True)]",
        "assert len(now) == 1 and now[0]['restored'] and now[0]['engine'] == other[mine[0]['engine']], now",
        "print(now[0]['engine'], file=sys.stderr)",
        "sys.stdout.buffer.write(fastqa.linear(x, w, b, backend='cpu').numpy().tobytes())",
    ])

    def run(engine: str) -> subprocess.CompletedProcess:
        proc = _run(code, engine, 600, engine, text=False)
        assert proc.returncode == 0, proc.stderr.decode()[-3000:]
        return proc

    restored = run("auto")
    engine = restored.stderr.decode().strip().splitlines()[-1]
    forced = run(engine)
    assert len(restored.stdout) == 300 * 900 * 4 and restored.stdout == forced.stdout
    # (Whether the other engine would round this product differently depends on the processor: on an AVX2
    # EPYC it does, on an AVX-512 Xeon the two can agree bit for bit, so that is not asserted.)


def test_restoring_under_a_forced_engine_changes_nothing():
    _run_script([
        "import torch, fastqa",
        "from fastqa._backend import cpu_gemm_info, restore_cpu_gemm_plan",
        "restore_cpu_gemm_plan({'engine': 'onednn', 'shapes': [dict(m=512, k=256, n=900, threads=1, a='r', w='r',"
        " bias=True, accumulate=False, engine='onednn')]})",
        "info = cpu_gemm_info()",
        "assert info['engine'] == 'blas' and info['shapes'] == [], info",
    ], "blas")


# ------------------------------------------------------------------ bf16 routes (native vs widened to float32)

# A bf16 decode step and a bf16 context-query attention forward at shapes no other test of the script uses.
_ROUTE_SETUP = [
    "import os, sys, torch, fastqa",
    "os.environ.pop('FASTQA_CPU_BF16_ROUTE', None)",
    "from fastqa._backend import cpu_gemm_info, cpu_gemm_plan, restore_cpu_gemm_plan",
    "g = torch.Generator().manual_seed(0)",
    "x = torch.randn(3, 40, generator=g).bfloat16()",
    "state = torch.randn(3, 2, 40, generator=g).bfloat16()",
    "w = (torch.randn(80, 40, 3, generator=g) / 11).bfloat16()",
    "b = torch.randn(80, generator=g).bfloat16()",
    "def step():",
    "    return torch.ops.fastqa.glu_conv1d_step(x, state, w, b, True, 0.5)",
    "def routes(op='glu_conv1d_step'):",
    "    return [r for r in cpu_gemm_info()['routes'] if r['op'] == op]",
]


def test_bf16_route_is_measured_once_fixed_and_recorded():
    """The first bf16 call of a shape class times both routes (both measured, > 0 ms) and keeps one; later
    calls take it without measuring again and give bit-identical results; the plan (what checkpoints and the
    machine's cache save) names it; another shape class is a decision of its own."""
    _run_script([
        *_ROUTE_SETUP,
        "assert routes() == []",
        "y0, s0 = step()",
        "first = routes()",
        "assert len(first) == 1, first",
        "r = first[0]",
        "assert r['shape'] == 'B=4 H=64 K=4' and r['threads'] == torch.get_num_threads() and not r['restored'], r",
        "assert r['route'] in ('native', 'widen') and r['ms']['native'] > 0 and r['ms']['widen'] > 0, r",
        "for _ in range(3):",
        "    y, s = step()",
        "    assert torch.equal(y, y0) and torch.equal(s, s0)",
        "assert routes() == first",
        "plan = cpu_gemm_plan()",
        "assert {'op': 'glu_conv1d_step', 'shape': 'B=4 H=64 K=4', 'threads': r['threads'], 'route': r['route']}"
        " in plan['routes'], plan",
        "torch.ops.fastqa.glu_conv1d_step(x[:1], state[:1], w, b, True, 0.5)",
        "assert len(routes()) == 2 and routes()[0] == r and routes()[1]['shape'] == 'B=1 H=64 K=4', routes()",
    ], "auto")


@pytest.mark.parametrize("route", ["native", "widen"])
def test_restored_route_is_taken_without_measuring(route):
    """A plan from another process (a checkpoint's, or the machine's cache) decides the route: the op then
    equals, bit for bit, the route forced by FASTQA_CPU_BF16_ROUTE, and measures nothing."""
    _run_script([
        *_ROUTE_SETUP,
        "threads = torch.get_num_threads()",
        "plan = cpu_gemm_plan()",
        f"plan['routes'] = [dict(op='glu_conv1d_step', shape='B=4 H=64 K=4', threads=threads, route={route!r}),",
        f"                  dict(op='context_query_attention_fwd', shape='B=2 n=16 m=8 d=8', threads=threads,"
        f" route={route!r})]",
        "restore_cpu_gemm_plan(plan)",
        "y, s = step()",
        f"assert routes() == [dict(op='glu_conv1d_step', shape='B=4 H=64 K=4', threads=threads, route={route!r},"
        " ms=dict(native=0.0, widen=0.0), restored=True)], routes()",
        "c, q = torch.randn(2, 13, 8, generator=g).bfloat16(), torch.randn(2, 7, 8, generator=g).bfloat16()",
        "cm, qm = torch.ones(2, 13, dtype=torch.bool), torch.ones(2, 7, dtype=torch.bool)",
        "cw, cb = torch.randn(24, generator=g).bfloat16(), torch.zeros(1).bfloat16()",
        "out = torch.ops.fastqa.context_query_attention_fwd(c, q, cm, qm, cw, cb)[0]",
        "assert routes('context_query_attention_fwd')[0]['restored'], routes('context_query_attention_fwd')",
        f"os.environ['FASTQA_CPU_BF16_ROUTE'] = {route!r}",
        "y2, s2 = step()",
        "assert torch.equal(y, y2) and torch.equal(s, s2)",
        "assert torch.equal(out, torch.ops.fastqa.context_query_attention_fwd(c, q, cm, qm, cw, cb)[0])",
    ], "auto")


def test_forced_route_is_not_recorded_and_a_bad_one_names_the_variable():
    _run_script([
        *_ROUTE_SETUP,
        "import pytest",
        "os.environ['FASTQA_CPU_BF16_ROUTE'] = 'widen'",
        "step()",
        "assert routes() == [] and cpu_gemm_info()['bf16_route'] == 'widen'",
        "os.environ['FASTQA_CPU_BF16_ROUTE'] = 'fastest'",
        "with pytest.raises(RuntimeError, match='FASTQA_CPU_BF16_ROUTE must be auto, native or widen'):",
        "    step()",
        "assert 'FASTQA_CPU_BF16_ROUTE' in cpu_gemm_info()['error']",
    ], "auto")


def test_native_step_repacks_an_updated_weight():
    """The native step packs its weight once per weight value: an in-place update (an optimizer step) is seen
    by the next call, and a weight of the same shape at another address is packed afresh."""
    _run_script([
        *_ROUTE_SETUP,
        "os.environ['FASTQA_CPU_BF16_ROUTE'] = 'native'",
        "y0, _ = step()",
        "with torch.no_grad():",
        "    w.mul_(-1)",
        "y1, _ = step()",
        "os.environ['FASTQA_CPU_BF16_ROUTE'] = 'widen'",
        "y1_widen, _ = step()",
        "assert not torch.equal(y0, y1)",
        "assert (y1.float() - y1_widen.float()).abs().max() <= 0.05 * y1_widen.float().abs().max(), (y1, y1_widen)",
        "os.environ['FASTQA_CPU_BF16_ROUTE'] = 'native'",
        "w2 = w.clone() * 2",
        "y2 = torch.ops.fastqa.glu_conv1d_step(x, state, w2, b, True, 0.5)[0]",
        "w2_widen = torch.ops.fastqa.glu_conv1d_step(x.float(), state.float(), w2.float(), b.float(), True, 0.5)[0]",
        "assert (y2.float() - w2_widen).abs().max() <= 0.05 * w2_widen.abs().max()",
    ], "auto")
