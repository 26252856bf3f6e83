"""The wheel built the README's way (``pip install --no-build-isolation .``, here as ``pip wheel``), installed
into a fresh virtualenv that sees the installed torch, and used from there: the command, every public
module, and a few training steps of both models on generated data. An editable install cannot show a
package missing from the wheel; this can."""
from __future__ import annotations

import json
import os
import pkgutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest
from squad_fixtures import make_squad

import fastqa

ROOT = Path(__file__).resolve().parents[1]


def _run(cmd: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    # Outside the repository, so that ./fastqa cannot shadow the installed copy.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TRITON_INTERPRET")}
    result = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{' '.join(cmd)}\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
    return result


def public_modules() -> list[str]:
    """Every module of the package, by walking the source tree."""
    names = ["fastqa"]
    for info in pkgutil.walk_packages(fastqa.__path__, "fastqa."):
        if not info.name.rsplit(".", 1)[-1].startswith("_") and info.name != "fastqa.__main__":
            names.append(info.name)
    return names


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict:
    """A fresh venv with the wheel installed (no dependencies: they come from the environment running the
    tests, made visible to the venv through a .pth file, as `make` does for a preinstalled torch)."""
    tmp = tmp_path_factory.mktemp("wheel")
    _run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-q", "-w", str(tmp / "dist"),
          str(ROOT)], cwd=tmp)
    (wheel,) = (tmp / "dist").glob("fastqa-*.whl")
    env_dir = tmp / "venv"
    venv.create(env_dir, with_pip=False)
    py = env_dir / "bin" / "python"
    purelib = _run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=tmp).stdout.strip()
    import site

    host = [p for p in site.getsitepackages() if Path(p).is_dir()]
    (Path(purelib) / "host_site.pth").write_text("".join(p + "\n" for p in host))
    _run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "-q", str(wheel)], cwd=tmp)
    return {"tmp": tmp, "wheel": wheel, "python": str(py), "fastqa": str(env_dir / "bin" / "fastqa")}


def test_wheel_holds_every_package_and_the_extension(installed):
    names = set(zipfile.ZipFile(installed["wheel"]).namelist())
    inits = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "fastqa").rglob("__init__.py"))
    assert inits and all(i in names for i in inits), sorted(set(inits) - names)
    assert "fastqa/triton_kernels/__init__.py" in names
    assert any(n.startswith("fastqa/_C") and n.endswith(".so") for n in names)


def test_command_and_modules_from_the_installed_copy(installed):
    tmp = installed["tmp"]
    assert _run([installed["fastqa"], "--version"], cwd=tmp).stdout.strip() == f"fastqa {fastqa.__version__}"
    assert "qa-train" in _run([installed["fastqa"], "--help"], cwd=tmp).stdout
    code = ("import importlib, sys, warnings; warnings.simplefilter('ignore', DeprecationWarning)\n"
            f"for name in {public_modules()!r}: importlib.import_module(name)\n"
            "import fastqa; print(fastqa.__file__); print(fastqa.info()['cpu_extension_error'])")
    out = _run([installed["python"], "-c", code], cwd=tmp).stdout.split("\n")
    assert Path(out[0]).is_relative_to(Path(installed["python"]).parents[1]), out[0]
    assert out[1] == "None", out[1]  # the installed copy's C++ extension loads


def test_both_models_train_from_the_installed_copy(installed):
    tmp = installed["tmp"]
    squad = tmp / "squad.json"
    make_squad(squad, articles=2, paragraphs=3)
    _run([installed["fastqa"], "qa-train", "--train", str(squad), "--dev", str(squad), "--out", str(tmp / "qa"),
          "--max-steps", "3", "--batch-size", "4", "--set", "d_model=32", "--set", "heads=2", "--threads", "1",
          "--no-progress", "--no-cache"], cwd=tmp)
    assert (tmp / "qa" / "checkpoint.pt").is_file()
    words = ["ka", "lo", "mi", "nu", "po", "ra", "se", "tu"]
    lines = [" ".join(words[(i + j) % len(words)] for j in range(3 + i % 4)) for i in range(64)]
    for name in ("train.de", "train.en", "valid.de", "valid.en"):
        (tmp / name).write_text("".join(ln + "\n" for ln in lines), encoding="utf-8")
    _run([installed["fastqa"], "mt-train", "--src", str(tmp / "train.de"), "--tgt", str(tmp / "train.en"),
          "--valid-src", str(tmp / "valid.de"), "--valid-tgt", str(tmp / "valid.en"), "--out", str(tmp / "mt"),
          "--max-steps", "3", "--batch-size", "8", "--vocab-size", "300", "--set", "embed_dim=16",
          "--set", "hidden_dim=16", "--threads", "1", "--no-progress"], cwd=tmp)
    assert (tmp / "mt" / "checkpoint.pt").is_file()


def test_the_shipped_reader_answers_from_the_installed_copy(installed):
    from fastqa import pretrained
    from fastqa.tasks.qa.spec import SPEC as QA_SPEC

    if QA_SPEC.shipped not in pretrained.available():
        pytest.fail("the shipped reader is missing from fastqa/pretrained (fastqa export RUN ... --half)")
    context = "The Eiffel Tower was completed in 1889 for the World's Fair in Paris."
    out = _run([installed["fastqa"], "ask", "--context", context, "--question", "When was the tower completed?",
                "--threads", "1", "--device", "cpu"], cwd=installed["tmp"]).stdout
    printed = json.loads(out)
    answer = printed["answer"]
    assert context[answer["start"]:answer["end"]] == answer["text"] and answer["text"]
    assert printed["answers"] == [answer] and answer["abstained"] is False and 0.0 < answer["score"] <= 1.0
