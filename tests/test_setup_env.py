"""scripts/setup_env.py: a requirement is met by the version this interpreter imports, not by the name alone.

The real case: ``make`` creates ``.venv`` with ``python -m venv --system-site-packages``, and Python 3.11's venv
installs its own setuptools 65.5, which shadows the newer one of the interpreter it sees and cannot read
pyproject.toml's ``license = "MIT"``, so ``pip install -e .`` failed. Here a fresh venv made the Makefile's way
gets ``setup_env.py require "setuptools>=77"``, which must upgrade it inside that venv."""
from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "setup_env.py"
READ_PYPROJECT = ("from setuptools.config.pyprojecttoml import read_configuration; "
                  "print(read_configuration('pyproject.toml')['project']['license'])")


def _module():
    spec = importlib.util.spec_from_file_location("setup_env", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_requirement_is_checked_against_its_specifier():
    setup_env = _module()
    pytest_version = importlib.metadata.version("pytest")
    assert setup_env._unmet(f"pytest=={pytest_version}") is None
    assert setup_env._unmet("pytest>=1") is None
    assert setup_env._unmet("pytest>=999") == f"{pytest_version} installed"
    assert setup_env._unmet(f"pytest!={pytest_version}") == f"{pytest_version} installed"
    assert setup_env._unmet("no-such-package-fastqa-probe>=1") == "missing"
    assert setup_env._unmet('pytest>=999; python_version < "3"') is None  # a marker that does not apply here
    assert setup_env._unmet("pytest[testing]>=1") is None  # extras do not hide the name


def test_require_upgrades_a_shadowing_setuptools_inside_the_venv(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True, timeout=300)
    subprocess.run([sys.executable, str(SCRIPT), "link-host", str(venv)], check=True, timeout=60)
    python = str(venv / "bin" / "python")

    def setuptools_version() -> tuple[int, ...]:
        out = subprocess.run([python, "-c", "import setuptools; print(setuptools.__version__)"], capture_output=True,
                             text=True, check=True, timeout=60).stdout
        return tuple(int(x) for x in re.findall(r"\d+", out)[:2])

    if setuptools_version() >= (77,):  # a Python whose venv brings a new setuptools (3.12+: none at all)
        subprocess.run([python, "-m", "pip", "install", "-q", "setuptools<70"], check=True, timeout=300)
        assert setuptools_version() < (77,)
    before = subprocess.run([python, "-c", READ_PYPROJECT], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert before.returncode != 0 and "license" in before.stderr  # the failure the set-up must prevent

    r = subprocess.run([python, str(SCRIPT), "require", "setuptools>=77", "wheel"], capture_output=True, text=True,
                       timeout=600)
    if r.returncode != 0 and re.search(r"No matching distribution|Could not find a version|NewConnectionError",
                                       r.stderr):
        pytest.skip(f"no package registry reachable to upgrade setuptools: {r.stderr.strip().splitlines()[-1]}")
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"setuptools>=77 is needed and \d+\.\d+[.\d]* installed .*upgrading", r.stdout), r.stdout
    assert setuptools_version() >= (77,)
    located = subprocess.run([python, "-c", "import setuptools; print(setuptools.__file__)"], capture_output=True,
                             text=True, check=True, timeout=60).stdout
    assert Path(located.strip()).is_relative_to(venv)  # upgraded in the venv, not in the interpreter it sees
    after = subprocess.run([python, "-c", READ_PYPROJECT], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert after.returncode == 0 and after.stdout.strip() == "MIT", after.stderr

    again = subprocess.run([python, str(SCRIPT), "require", "setuptools>=77", "wheel"], capture_output=True,
                           text=True, timeout=120)
    assert again.returncode == 0 and "installing" not in again.stdout, again.stdout  # met now: nothing reinstalled


def _project(root: Path, setup_body: str) -> Path:
    """A package whose setup.py prints build stages the way fastqa's does, among other output."""
    project = root / "probe"
    project.mkdir()
    (project / "pyproject.toml").write_text('[build-system]\nrequires = ["setuptools"]\n'
                                            'build-backend = "setuptools.build_meta"\n\n'
                                            '[project]\nname = "fastqa-probe"\nversion = "1.0"\n')
    # Only while building the wheel (the metadata step runs setup.py too), as build_ext prints fastqa's.
    (project / "setup.py").write_text("import sys\nfrom setuptools import setup\n"
                                      "if 'bdist_wheel' in sys.argv:\n"
                                      "    print('configure chatter', flush=True)\n"
                                      "    print('fastqa build: configure', flush=True)\n"
                                      "    print('fastqa build: [1/1] compile probe.cpp', flush=True)\n"
                                      f"    {setup_body}\nsetup(py_modules=[])\n")
    return project


def test_pip_build_shows_the_stages_and_nothing_else(tmp_path):
    project = _project(tmp_path, "")
    r = subprocess.run([sys.executable, str(SCRIPT), "pip-build", "--no-build-isolation", "--no-deps", "--target",
                        str(tmp_path / "target"), str(project)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines() == ["fastqa build: configure", "fastqa build: [1/1] compile probe.cpp"], r.stdout


def test_pip_build_shows_everything_when_the_build_fails(tmp_path):
    project = _project(tmp_path, "sys.exit('probe: the compiler failed')")
    r = subprocess.run([sys.executable, str(SCRIPT), "pip-build", "--no-build-isolation", "--no-deps", "--target",
                        str(tmp_path / "target"), str(project)], capture_output=True, text=True, timeout=300)
    assert r.returncode != 0
    assert "configure chatter" in r.stdout and "probe: the compiler failed" in r.stdout, r.stdout
    assert "failed (exit status" in r.stderr
