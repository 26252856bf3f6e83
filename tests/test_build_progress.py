"""The extension build's progress lines (setup.py's ``run_cmake_build``): the real CMake and Ninja on a small
project of the same shape (several C++ files linked into one module), so that ``pip install -v`` shows
``fastqa build:`` stages -- configure, ``[k/n] compile FILE``, link, done with the seconds -- and a failure
says which step failed with the tool's own messages."""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def setup_py():
    """setup.py as a module (its ``setup()`` call runs only as __main__, as the build backend runs it)."""
    spec = importlib.util.spec_from_file_location("fastqa_setup_script", REPO / "setup.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_ninja_lines_become_stages(setup_py):
    stage = setup_py.ninja_stage
    assert stage("[3/12] Building CXX object CMakeFiles/_C.dir/csrc/cpu/glu.cpp.o\n") == "[3/12] compile csrc/cpu/glu.cpp"
    assert (stage("[12/12] Linking CXX shared module /x/fastqa/_C.cpython-311-x86_64-linux-gnu.so")
            == "[12/12] link _C.cpython-311-x86_64-linux-gnu.so")
    assert stage("[1/1] Re-running CMake...") == "[1/1] Re-running CMake..."
    assert stage("csrc/cpu/glu.cpp:10:5: warning: unused variable 'x'") is None
    assert stage("ninja: build stopped: subcommand failed.") is None


def _project(root: Path, files: dict[str, str]) -> Path:
    src = root / "src"
    src.mkdir()
    (src / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.18)\nproject(probe LANGUAGES CXX)\n"
        f"add_library(probe MODULE {' '.join(sorted(files))})\n")
    for name, text in files.items():
        (src / name).write_text(text)
    return src


def _build(setup_py, src: Path, build: Path) -> None:
    cmake, ninja = setup_py._find_tool("cmake", "cmake"), setup_py._find_tool("ninja", "ninja")
    build.mkdir(exist_ok=True)
    setup_py.run_cmake_build(cmake, ["-S", str(src), "-B", str(build), "-G", "Ninja",
                                     f"-DCMAKE_MAKE_PROGRAM={ninja}"], build, "2")


def _stages(out: str) -> list[str]:
    return [line.removeprefix("fastqa build: ") for line in out.splitlines() if line.startswith("fastqa build: ")]


def test_a_build_prints_its_stages(setup_py, tmp_path, capsys):
    src = _project(tmp_path, {"a.cpp": "int a() { return 1; }\n", "b.cpp": "int b() { return 2; }\n"})
    _build(setup_py, src, tmp_path / "build")
    out = capsys.readouterr().out
    stages = _stages(out)
    assert stages[0].startswith("configure with CMake") and re.fullmatch(
        r"configured in \d+\.\d s; compiling with 2 parallel jobs", stages[1]), stages
    # The two files compile in parallel: numbered in the order they finish.
    assert [s[:6] for s in stages[2:4]] == ["[1/3] ", "[2/3] "], stages
    assert sorted(s[6:] for s in stages[2:4]) == ["compile a.cpp", "compile b.cpp"], stages
    assert re.fullmatch(r"\[3/3\] link \S*probe\S*", stages[4]), stages
    assert re.fullmatch(r"done in \d+\.\d s \(configure \d+\.\d s, 3 build steps\)", stages[5]), stages
    assert "-- The CXX compiler identification" not in out  # CMake's chatter stays in the log
    assert "The CXX compiler identification" in (tmp_path / "build" / "configure.log").read_text()

    _build(setup_py, src, tmp_path / "build")  # again: nothing to do, and it says so
    assert "up to date: nothing to compile" in _stages(capsys.readouterr().out)


def test_a_compile_error_is_shown_and_named(setup_py, tmp_path, capsys):
    src = _project(tmp_path, {"a.cpp": "int a() { return 1; }\n", "b.cpp": "int b() { return undeclared_name; }\n"})
    with pytest.raises(setup_py.BuildError, match="compiling the extension failed"):
        _build(setup_py, src, tmp_path / "build")
    assert "undeclared_name" in capsys.readouterr().out  # the compiler's own message, passed through


def test_a_configure_error_shows_cmakes_output(setup_py, tmp_path, capsys):
    src = _project(tmp_path, {"a.cpp": "int a() { return 1; }\n"})
    (src / "CMakeLists.txt").write_text("cmake_minimum_required(VERSION 3.18)\nproject(probe LANGUAGES CXX)\n"
                                        "message(FATAL_ERROR \"probe: a configure error\")\n")
    with pytest.raises(setup_py.BuildError, match="configuring the extension failed"):
        _build(setup_py, src, tmp_path / "build")
    assert "probe: a configure error" in capsys.readouterr().out
