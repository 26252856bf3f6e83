"""Running ``fastqa`` subcommands in-process for the model tests (``fastqa.cli.main``, output captured)."""
from __future__ import annotations

import re

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
