"""Build script: compiles ``fastqa._C`` from ``csrc/`` with CMake + Ninja against the installed torch.

``pip install --no-build-isolation .`` (or ``-e .``) builds the extension. The build never installs
or upgrades torch: it compiles against whatever torch is importable, and stops with a sentence
saying what is missing when torch, CMake, Ninja or a C++ compiler cannot be found.

``FASTQA_NATIVE=0`` builds without ``-march=native`` (a portable wheel). ``FASTQA_NO_EXT=1`` skips the extension and installs the pure-Python package (reference backend,
plus Triton where it is installed).

The build prints its stages as lines starting ``fastqa build:`` (configure, each ``[k/n]`` compile, link, done
with the seconds taken), which ``pip install -v`` shows as they come; CMake's configure output goes to
``configure.log`` in the build folder and is shown only when configuring fails.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
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


def _stage(message: str) -> None:
    """One line of the build's progress, on stdout (pip shows it with -v, and with the error when a build fails)."""
    print(f"fastqa build: {message}", flush=True)


# Ninja's status line, as NINJA_STATUS is set below, and CMake's descriptions of its steps.
_NINJA_STEP = re.compile(r"^\[(\d+)/(\d+)\] (.*)$")
_COMPILE = re.compile(r"^Building CXX object .*?\.dir/(.+?)\.o$")
_LINK = re.compile(r"^Linking CXX \w+(?: \w+)? (.+)$")


def ninja_stage(line: str) -> str | None:
    """A stage of Ninja's output line (``[3/12] Building CXX object CMakeFiles/_C.dir/csrc/cpu/glu.cpp.o``:
    ``[3/12] compile csrc/cpu/glu.cpp``; a link step: ``[12/12] link <file name>``), or None for other lines
    (compiler diagnostics, passed through as they are)."""
    step = _NINJA_STEP.match(line.rstrip())
    if step is None:
        return None
    done, total, what = step.groups()
    compiled, linked = _COMPILE.match(what), _LINK.match(what)
    if compiled:
        what = f"compile {compiled.group(1)}"
    elif linked:
        what = f"link {Path(linked.group(1)).name}"
    return f"[{done}/{total}] {what}"


def run_cmake_build(cmake: str, configure: list[str], build_dir: Path, jobs: str) -> None:
    """Configure (its output to ``build_dir/configure.log``, shown when it fails), then build with Ninja, printing
    the stages as they come; BuildError names the step that failed."""
    t0 = time.perf_counter()
    log = build_dir / "configure.log"
    _stage(f"configure with CMake (its output: {log})")
    with open(log, "w", encoding="utf-8") as out:
        configured = subprocess.run([cmake, *configure], stdout=out, stderr=subprocess.STDOUT)
    if configured.returncode != 0:
        print(log.read_text(encoding="utf-8", errors="replace"), flush=True)
        raise BuildError(f"fastqa: configuring the extension failed (cmake exit status {configured.returncode}); "
                         f"CMake's output is above and in {log}.")
    t1 = time.perf_counter()
    _stage(f"configured in {t1 - t0:.1f} s; compiling with {jobs} parallel jobs")
    env = {**os.environ, "NINJA_STATUS": "[%f/%t] "}
    steps = 0
    with subprocess.Popen([cmake, "--build", str(build_dir), "--", f"-j{jobs}"], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, errors="replace", env=env) as build:
        for line in build.stdout:
            stage = ninja_stage(line)
            if stage is not None:
                steps += 1
                _stage(stage)
            elif line.strip() == "ninja: no work to do.":
                _stage("up to date: nothing to compile")
            else:
                print(line, end="", flush=True)
    if build.returncode != 0:
        raise BuildError(f"fastqa: compiling the extension failed (ninja exit status {build.returncode}); the "
                         "compiler's messages are above.")
    _stage(f"done in {time.perf_counter() - t0:.1f} s (configure {t1 - t0:.1f} s, {steps} build step{'' if steps == 1 else 's'})")


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
        run_cmake_build(cmake, configure[1:], build_dir, jobs)


def _ext_modules() -> list[Extension]:
    if os.environ.get("FASTQA_NO_EXT", "0") == "1":
        return []
    return [CMakeExtension("fastqa._C", ROOT)]


# Every package under fastqa/ by discovery (a new subpackage cannot be left out of the wheel), plus the Triton
# kernels, which live at the top of the repository and ship under one name only: fastqa.triton_kernels.
PACKAGES = find_packages(include=["fastqa", "fastqa.*"]) + ["fastqa.triton_kernels"]

if __name__ == "__main__":  # setuptools' build backend runs this file as __main__; tests import the helpers above
    setup(
        packages=PACKAGES,
        package_dir={"fastqa.triton_kernels": "triton_kernels"},
        ext_modules=_ext_modules(),
        cmdclass={"build_ext": CMakeBuild},
    )
