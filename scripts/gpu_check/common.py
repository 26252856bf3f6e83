"""What the supervisor and the phase children share: the repository root (put on ``sys.path``), the op
tolerances that phase b applies and the summary prints (the "gpu check" row of the one table,
tests/tolerances.py), and small text helpers. Standard library only (files are written with fastqa's atomic
writer, ``fastqa.data.files``, which is too), so that the supervisor runs (and reports) even where torch,
fastqa's kernels or the benchmarks cannot be imported."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # run from a checkout: the benchmarks package and an uninstalled fastqa live here
    sys.path.insert(0, str(REPO))


def _tolerance_table() -> dict:
    """The one tolerance table, tests/tolerances.py, loaded by its path (standard library only; ``tests`` is no
    package, and a module named so elsewhere on the path must not stand in for it)."""
    spec = importlib.util.spec_from_file_location("fastqa_test_tolerances", REPO / "tests" / "tolerances.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.TABLE


# Pass/fail of phase b (the table's "gpu check" row): max |got - ref| / max |ref| per tensor, ref = the float64
# reference on the same (rounded) inputs, by dtype name.
TOLERANCES = {dtype: atol for dtype, (atol, _rtol) in _tolerance_table()["gpu check"].items()}
# ... or at most this many times eager PyTorch's error in the same dtype against the same float64 reference.
EAGER_FACTOR = 2.0
DTYPE_SHORT = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "float64": "fp64"}
TAIL_LINES = 40


def tail(text: str, lines: int = TAIL_LINES) -> str:
    """The last ``lines`` lines of ``text``."""
    return "\n".join(text.rstrip().splitlines()[-lines:])


def read_tail(path: Path, lines: int = TAIL_LINES) -> str:
    """The last ``lines`` lines of the file at ``path``, or why there are none."""
    try:
        return tail(path.read_text(errors="replace"), lines)
    except OSError as exc:
        return f"(no log: {exc})"


def short_error(exc: BaseException) -> str:
    """An exception as one line of at most 300 characters: its type and the first line of its message."""
    text = f"{type(exc).__name__}: {exc}".strip().splitlines()
    return text[0][:300] if text else type(exc).__name__
