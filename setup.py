"""Build script: compiles ``fastqa._C`` from ``csrc/`` with CMake + Ninja against the installed torch.

``pip install --no-build-isolation .`` (or ``-e .``) builds the extension. The build never installs
or upgrades torch: it compiles against whatever torch is importable, and stops with a sentence
saying what is missing when torch, CMake, Ninja or a C++ compiler cannot be found.

``FASTQA_NATIVE=0`` builds without ``-march=native`` (a portable wheel). ``FASTQA_NO_EXT=1`` skips the extension and installs the pure-Python package (reference backend,
plus Triton where it is installed).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


class BuildError(RuntimeError):
    """A prerequisite of the extension build is missing."""


def _find_tool(name: str, python_module: str | None = None) -> str:
    """Path of a build tool: on PATH, or shipped by its PyPI package (``cmake``, ``ninja``)."""
    found = shutil.which(name)
    if found:
        return found
    if python_module is not None:
        try:
            module = __import__(python_module)
            candidate = Path(module.BIN_DIR) / name  # both the cmake and ninja wheels define BIN_DIR
            if candidate.exists():
                return str(candidate)
        except (ImportError, AttributeError):
            pass
    raise BuildError(
        f"fastqa: building the C++ extension needs '{name}', which was not found on PATH "
        f"(pip install {python_module or name}, or set FASTQA_NO_EXT=1 for the pure-Python package)."
    )


class CMakeExtension(Extension):
    def __init__(self, name: str, source_dir: Path) -> None:
        super().__init__(name, sources=[])
        self.source_dir = source_dir


class CMakeBuild(build_ext):
    """Configure once, then let Ninja rebuild only what changed (the build folder persists)."""

    def build_extension(self, ext: Extension) -> None:
        if not isinstance(ext, CMakeExtension):
            return super().build_extension(ext)
        try:
            import torch
        except ImportError as exc:
            raise BuildError(
                "fastqa: building the C++ extension needs PyTorch installed in this environment "
                "(pip install torch, then pip install --no-build-isolation .); the build never "
                "installs torch itself."
            ) from exc
        try:
            import pybind11
        except ImportError as exc:
            raise BuildError("fastqa: building the C++ extension needs pybind11 (pip install pybind11).") from exc

        cmake = _find_tool("cmake", "cmake")
        ninja = _find_tool("ninja", "ninja")
        wanted = [os.environ["CXX"]] if os.environ.get("CXX") else ["c++", "g++", "clang++"]
        cxx = next((found for found in map(shutil.which, wanted) if found), None)
        if cxx is None:
            raise BuildError(f"fastqa: building the C++ extension needs a C++ compiler ({' or '.join(wanted)}), "
                             "which was not found on PATH (or set FASTQA_NO_EXT=1 for the pure-Python package).")

        out_dir = Path(self.get_ext_fullpath(ext.name)).resolve().parent
        build_dir = Path(os.environ.get("FASTQA_BUILD_DIR", ROOT / "build" / "cmake")).resolve()
        build_dir.mkdir(parents=True, exist_ok=True)
        build_type = os.environ.get("FASTQA_BUILD_TYPE", "Release")
        configure = [
            cmake,
            "-S", str(ext.source_dir),
            "-B", str(build_dir),
            "-G", "Ninja",
            f"-DCMAKE_MAKE_PROGRAM={ninja}",
            f"-DCMAKE_CXX_COMPILER={cxx}",
            f"-DCMAKE_BUILD_TYPE={build_type}",
            f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path};{pybind11.get_cmake_dir()}",
            f"-DPython_EXECUTABLE={sys.executable}",
            f"-DFASTQA_OUTPUT_DIR={out_dir}",
            f"-DFASTQA_EXT_SUFFIX={Path(self.get_ext_fullpath(ext.name)).name[len('_C'):]}",
            # -march=native by default (the extension is built where it runs); FASTQA_NATIVE=0 for a portable wheel.
            f"-DFASTQA_NATIVE={'OFF' if os.environ.get('FASTQA_NATIVE', '1') == '0' else 'ON'}",
        ]
        jobs = os.environ.get("MAX_JOBS") or str(os.cpu_count() or 1)
        try:
            subprocess.run(configure, check=True)
            subprocess.run([cmake, "--build", str(build_dir), "--", f"-j{jobs}"], check=True)
        except subprocess.CalledProcessError as exc:
            raise BuildError(f"fastqa: the extension build failed ({' '.join(exc.cmd[:2])} ...); see the log above.") from exc


def _ext_modules() -> list[Extension]:
    if os.environ.get("FASTQA_NO_EXT", "0") == "1":
        return []
    return [CMakeExtension("fastqa._C", ROOT)]


# Every package under fastqa/ by discovery (a new subpackage cannot be left out of the wheel), plus the Triton
# kernels, which live at the top of the repository and ship under one name only: fastqa.triton_kernels.
PACKAGES = find_packages(include=["fastqa", "fastqa.*"]) + ["fastqa.triton_kernels"]

setup(
    packages=PACKAGES,
    package_dir={"fastqa.triton_kernels": "triton_kernels"},
    ext_modules=_ext_modules(),
    cmdclass={"build_ext": CMakeBuild},
)
