"""Set-up steps of ``make``, written once in Python so they behave the same on every machine.

    setup_env.py link-host VENV      let VENV see the packages of the interpreter running this script (a
                                     preinstalled torch, also when that interpreter is itself a virtualenv,
                                     which ``venv --system-site-packages`` alone would not see)
    setup_env.py require REQ...      install what is missing or too old of REQ (a failure is an error)
    setup_env.py optional EXTRA...   install what is missing or too old of the package's optional extras;
                                     without registry access those are listed and their tests skip
    setup_env.py pip-build ARGS...   ``pip install -v ARGS`` showing only the build's stages (the lines
                                     "fastqa build: ..." of setup.py) as they come; all of pip's output when
                                     it fails

A requirement is met by the copy of the package this interpreter would import (the first on sys.path) when
its version is one the requirement's specifier accepts: a venv's own setuptools (Python 3.11's venv installs
65.5) shadows a newer one of the interpreter it sees, and is what the build would use. Nothing met is
reinstalled, so the set-up works offline once its packages are present, and never replaces an installed
torch; what is too old is upgraded inside the environment running this script.
"""
from __future__ import annotations

import importlib
import importlib.metadata
import re
import shutil
import site
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# Build tools found on PATH serve as well as their PyPI packages (setup.py looks on PATH first).
TOOLS = {"cmake", "ninja"}


def _requirement(text: str) -> Any:
    """``packaging``'s Requirement of ``text``: the standalone package where present, else the copy pip carries
    (a bare venv has pip but not always packaging)."""
    try:
        from packaging.requirements import Requirement
    except ImportError:
        from pip._vendor.packaging.requirements import Requirement
    return Requirement(text)


def _tool_version(path: str) -> str | None:
    """The version a build tool on PATH reports (``cmake --version``: "cmake version 3.31.6"), or None."""
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    found = re.search(r"\d+(\.\d+)+", out)
    return found.group(0) if found else None


def _accepts(req: Any, version: str | None) -> bool:
    return version is not None and req.specifier.contains(version, prereleases=True)


def _installed(name: str) -> str | None:
    """The version of the distribution ``name`` this interpreter imports (the first on sys.path), or None."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _unmet(requirement: str) -> str | None:
    """Why ``requirement`` is not met here ("missing", "65.5.0 installed"), or None when it is."""
    req = _requirement(requirement)
    if req.marker is not None and not req.marker.evaluate():
        return None
    if req.name in TOOLS:  # setup.py runs the tool on PATH first
        path = shutil.which(req.name)
        if path is not None and (not req.specifier or _accepts(req, _tool_version(path))):
            return None
    version = _installed(req.name)
    if version is None:
        return "missing"
    return None if _accepts(req, version) else f"{version} installed"


def _present(requirement: str) -> bool:
    return _unmet(requirement) is None


def _pip_install(requirements: list[str]) -> bool:
    if not requirements:
        return True
    print(f"fastqa: installing {' '.join(requirements)}", flush=True)
    return subprocess.run([sys.executable, "-m", "pip", "install", "-q", *requirements]).returncode == 0


def link_host(venv: str) -> None:
    """Write a .pth file into VENV naming this interpreter's site-packages folders."""
    target = subprocess.run([str(Path(venv) / "bin" / "python"), "-c",
                             "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                            check=True, capture_output=True, text=True).stdout.strip()
    folders = [p for p in site.getsitepackages() if Path(p).is_dir()]
    (Path(target) / "_fastqa_host_site.pth").write_text("".join(f"{p}\n" for p in folders))


def require(requirements: list[str]) -> int:
    unmet = {r: why for r in requirements if (why := _unmet(r)) is not None}
    for r, why in unmet.items():
        if why != "missing":
            print(f"fastqa: {r} is needed and {why} ({sys.prefix}): upgrading it there", flush=True)
    if not _pip_install(list(unmet)):
        return 1
    importlib.invalidate_caches()  # the folders pip wrote into were listed before
    still = {r: why for r in unmet if (why := _unmet(r)) is not None}
    for r, why in still.items():  # pip succeeded, yet the interpreter would import another copy
        print(f"fastqa: {r} is still not met after pip install ({why}); python -m pip list -v shows where each "
              "copy lives", file=sys.stderr)
    return 1 if still else 0


def _extras() -> dict[str, list[str]]:
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return project.get("optional-dependencies", {})


def optional(extras: list[str]) -> int:
    table = _extras()
    unknown = [e for e in extras if e not in table]
    if unknown:
        print(f"fastqa: unknown extras {unknown}; pyproject.toml defines {sorted(table)}", file=sys.stderr)
        return 2
    wanted = list(dict.fromkeys(r for e in extras for r in table[e]))
    missing = [r for r in wanted if not _present(r)]
    if missing and not _pip_install(missing):
        importlib.invalidate_caches()
        still = [r for r in missing if not _present(r)]
        print(f"fastqa: could not install {', '.join(still)} (no registry access?): the tests that need them skip",
              file=sys.stderr)
    return 0


def pip_build(args: list[str]) -> int:
    """``pip install -v ARGS``: its build's stage lines printed as they come, the rest kept and printed only
    when pip fails (so that a build of a minute or two is neither silent nor buried in pip's own lines)."""
    kept: list[str] = []
    with subprocess.Popen([sys.executable, "-m", "pip", "install", "-v", *args], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, errors="replace") as pip:
        for line in pip.stdout:
            kept.append(line)
            if line.lstrip().startswith("fastqa build:"):
                print(line.strip(), flush=True)
    if pip.returncode != 0:
        sys.stdout.write("".join(kept))
        print(f"fastqa: pip install {' '.join(args)} failed (exit status {pip.returncode}); its output is above",
              file=sys.stderr)
    return pip.returncode


COMMANDS = ("link-host", "require", "optional", "pip-build")


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] not in COMMANDS:
        print(__doc__, file=sys.stderr)
        return 2
    command, args = argv[0], argv[1:]
    if command == "link-host":
        link_host(args[0])
        return 0
    if command == "pip-build":
        return pip_build(args)
    return require(args) if command == "require" else optional(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
