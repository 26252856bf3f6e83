"""Packaging: the wheel layout, the pure-Python install, and the build's message for a missing tool."""
import os
import subprocess
import sys
import zipfile
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]


def _pip_wheel(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-q", "-w", str(tmp_path / "dist"), str(ROOT)],
        env={**os.environ, "FASTQA_BUILD_DIR": str(tmp_path / "cmake"), **env},
        capture_output=True, text=True, timeout=600,
    )


def test_pure_python_wheel_ships_triton_kernels_as_a_subpackage(tmp_path):
    result = _pip_wheel(tmp_path, FASTQA_NO_EXT="1")
    assert result.returncode == 0, result.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").glob("fastqa-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "fastqa/triton_kernels/__init__.py" in names
    assert "fastqa/reference/__init__.py" in names and "fastqa/ops/__init__.py" in names
    assert not any(n.startswith("triton_kernels/") for n in names), "triton_kernels must not ship top-level"
    assert not any(n.endswith(".so") for n in names), "FASTQA_NO_EXT=1 must not compile the extension"


def test_missing_compiler_is_named(tmp_path):
    result = _pip_wheel(tmp_path, CXX="no-such-c++-compiler")
    assert result.returncode != 0
    assert "needs a C++ compiler (no-such-c++-compiler)" in result.stdout + result.stderr
