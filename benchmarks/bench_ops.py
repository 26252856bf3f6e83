"""pytest-benchmark versions of the op cases (the models' shapes), for ``--benchmark-compare``:

    pytest benchmarks/bench_ops.py --benchmark-only [--benchmark-autosave] [--benchmark-compare]

One test per (case, mode, implementation); torch.compile is left to ``python -m benchmarks`` (it costs
tens of seconds per graph). Each test also checks its result against the float64 reference. Not part
of ``make test``.
"""
from __future__ import annotations

import pytest
import torch

from benchmarks.registry import CASES, OpCase, Prepared, max_abs_err, select

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
IMPLS = ("naive", "eager", "fastqa[cpu]" if DEVICE.type == "cpu" else "fastqa[triton]")
TOLERANCE = 1e-2  # float32 vs float64 after a backward through O(100)-long reductions; scaled up for results
# above 100 (gradients reach a few hundred, where the summation order alone moves the last digits by 1e-2)

select()  # registers the op cases
PARAMS = [pytest.param(case, mode, impl, id=f"{case.id}-{mode}-{impl}")
          for case in CASES if isinstance(case, OpCase) for mode in case.modes for impl in IMPLS
          if impl != "naive" or case.naive is not None]


_last: dict[tuple[str, str], Prepared] = {}


def _prepared(case: OpCase, mode: str) -> Prepared:
    """Consecutive tests share one (case, mode): its inputs and ground truth; only the last is kept."""
    key = (case.id, mode)
    if key not in _last:
        _last.clear()
        _last[key] = case.prepare(mode, DEVICE, torch.float32, compile=False, naive_limit_bytes=4 * 2 ** 30)
    return _last[key]


@pytest.mark.parametrize("case, mode, impl", PARAMS)
def test_op(benchmark, case: OpCase, mode: str, impl: str) -> None:
    prepared = _prepared(case, mode)
    if impl not in prepared.runners:
        pytest.skip(prepared.unavailable.get(impl) or prepared.unavailable.get("fastqa", f"{impl} not offered"))
    benchmark.group = f"{case.id} [{mode}]"
    benchmark.extra_info.update(shape=case.shape, flops=prepared.flops, bytes=prepared.bytes)
    run = prepared.runners[impl]
    if DEVICE.type == "cuda":
        def run_synced():
            out = prepared.runners[impl]()
            torch.cuda.synchronize()
            return out
        run = run_synced
    result = benchmark(run)
    largest = max(float(t.detach().abs().max()) for t in (prepared.expected if isinstance(prepared.expected, (tuple, list))
                                                         else [prepared.expected]) if t.numel())
    assert max_abs_err(result, prepared.expected) < TOLERANCE * max(1.0, largest / 100)
