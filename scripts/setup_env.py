"""Set-up steps of ``make``, written once in Python so they behave the same on every machine.

    setup_env.py link-host VENV      let VENV see the packages of the interpreter running this script (a
                                     preinstalled torch, also when that interpreter is itself a virtualenv,
                                     which ``venv --system-site-packages`` alone would not see)
    setup_env.py require REQ...      install what is missing of REQ (a failure is an error)
    setup_env.py optional EXTRA...   install what is missing of the package's optional extras; without
                                     registry access the missing ones are listed and their tests skip

Nothing already importable is reinstalled, so the set-up works offline once its packages are present, and
never replaces an installed torch.
"""
from __future__ import annotations

import importlib.metadata
import re
import shutil
import site
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Build tools found on PATH serve as well as their PyPI packages (setup.py looks on PATH first).
TOOLS = {"cmake", "ninja"}


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].strip()


def _present(requirement: str) -> bool:
    name = _name(requirement)
    if name in TOOLS and shutil.which(name):
        return True
    try:
        importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


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
    return 0 if _pip_install([r for r in requirements if not _present(r)]) else 1


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
        still = [r for r in missing if not _present(r)]
        print(f"fastqa: could not install {', '.join(still)} (no registry access?): the tests that need them skip",
              file=sys.stderr)
    return 0


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] not in ("link-host", "require", "optional"):
        print(__doc__, file=sys.stderr)
        return 2
    command, args = argv[0], argv[1:]
    if command == "link-host":
        link_host(args[0])
        return 0
    return require(args) if command == "require" else optional(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
