"""``fastqa serve`` on the command line: its flags and defaults, a help that loads neither torch nor the server
library, and the mistakes a user can make, each one line and exit status 2 before anything is served."""
from __future__ import annotations

import socket
import subprocess
import sys

import pytest
from cli_helpers import assert_user_error

from fastqa.cli import build_parser


def _options() -> dict:
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return {opt: action for action in sub.choices["serve"]._actions for opt in action.option_strings}


def test_serve_flags_and_defaults():
    options = _options()
    assert options["--host"].default == "127.0.0.1" and options["--port"].default == 8000
    assert options["--qa-model"].default is None and options["--mt-model"].default is None
    assert options["--device"].default is None and options["--threads"].default is None


def test_help_loads_neither_torch_nor_the_server_library():
    code = ("import sys; from fastqa.cli import build_parser; build_parser().format_help(); "
            "print(sorted(m for m in ('torch', 'starlette', 'uvicorn', 'fastapi', 'pydantic') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_serve_without_a_model_flag_and_no_shipped_model(capsys, tmp_path, monkeypatch):
    from fastqa import pretrained

    monkeypatch.setattr(pretrained, "FOLDER", tmp_path)  # an installation without the shipped models
    assert_user_error(capsys, ["serve"], "no shipped model is installed here; give --qa-model DIR, --mt-model DIR")


def test_serve_a_folder_without_a_checkpoint(capsys, tmp_path):
    assert_user_error(capsys, ["serve", "--qa-model", tmp_path / "nothing", "--port", "0"], "nothing")


def test_serve_on_a_port_in_use(capsys, tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        assert_user_error(capsys, ["serve", "--mt-model", tmp_path, "--port", port], f"--port {port}: cannot listen there")


def test_serve_needs_the_serve_extra(capsys, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "uvicorn", None)  # import uvicorn now raises ImportError
    assert_user_error(capsys, ["serve", "--qa-model", tmp_path], r"pip install 'fastqa\[serve\]'")


@pytest.mark.parametrize("port", ["70000", "-1", "http"])
def test_a_port_that_is_not_one(capsys, port):
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(["serve", "--qa-model", "x", "--port", port])
    assert e.value.code == 2 and "expected a port number" in capsys.readouterr().err
