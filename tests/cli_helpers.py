"""Running ``fastqa`` subcommands: in-process for the model tests (``fastqa.cli.main``, output captured), and
``fastqa serve`` as a subprocess (``launch_serve``)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from pathlib import Path

from fastqa.cli import main


def run_cli(capsys, args) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of ``fastqa ARGS``."""
    rc = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return rc, out, err


def assert_user_error(capsys, args, pattern: str) -> None:
    """The command fails with exit status 2 and one line "fastqa: error: ..." matching ``pattern``."""
    rc, _, err = run_cli(capsys, args)
    lines = [line for line in err.splitlines() if line.startswith("fastqa: error:")]
    assert rc == 2 and len(lines) == 1, err
    assert re.search(pattern, lines[0]), lines[0]
    assert "Traceback" not in err


def launch_serve(args: list[str], log: Path, *, timeout: float, cwd: Path | None = None,
                 env: dict[str, str] | None = None) -> tuple[subprocess.Popen, str | None]:
    """``python -m fastqa serve ARGS`` with its stderr in ``log``: (the process, the address its first line ends
    with, or None when it printed no address within ``timeout`` seconds). The rest of stdout is read and dropped,
    so that a full pipe never blocks the server."""
    with open(log, "w", encoding="utf-8") as err:
        process = subprocess.Popen([sys.executable, "-m", "fastqa", "serve", *args], cwd=cwd,
                                   env=env if env is not None else dict(os.environ), stdin=subprocess.DEVNULL,
                                   stdout=subprocess.PIPE, stderr=err, text=True)
    first: list[str] = []
    started = threading.Event()

    def read() -> None:
        for text in process.stdout:
            if not started.is_set():
                first.append(text)
                started.set()
        started.set()

    threading.Thread(target=read, daemon=True).start()
    started.wait(timeout)
    url = first[0].split()[-1].rstrip("/") if first and "http://" in first[0] else None
    return process, url

