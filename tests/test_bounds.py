"""The one declaration of the bounded counts (``fastqa.bounds``): every bounded flag of every command refuses
absurd numbers in one line naming the flag, the value and the bound; the Python checks raise a TypeError or a
ValueError saying the same; the server's limits are the declared bounds; a computation that cannot fit in the
free memory is refused; docs/models.md carries the table as declared."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from fastqa.bounds import BOUNDS, Bound, available_memory, check_fits, checked, markdown_table
from fastqa.cli import build_parser, main
from fastqa.errors import UserError
from fastqa.serve.limits import ServeLimits

ROOT = Path(__file__).resolve().parents[1]
ABSURD = ["1e9", "1e23", "99999999999999999999999", "-1", "-99999999999999999999999", "nan", "inf", "-inf", "2.5",
          "0x10", ""]
HUGE = "9" * 5000  # more digits than Python converts to an int


def _bounded_flags() -> list[tuple[str, str, Bound, Callable[[str], object]]]:
    """(command, flag, bound, the flag's argparse type) of every flag whose type is a declared bound's."""
    commands = next(a for a in build_parser()._actions if a.dest == "command").choices
    found = []
    for name, parser in sorted(commands.items()):
        for action in parser._actions:
            kind = getattr(action.type, "__name__", None)
            if kind in BOUNDS and action.option_strings:
                found.append((name, action.option_strings[-1], BOUNDS[kind], action.type))
    return found


def _outside(b: Bound, text: str) -> bool:
    try:
        value = int(text) if b.integer else float(text)
    except ValueError:
        return True
    return not b.low <= value <= b.high


def test_every_bounded_flag_refuses_absurd_numbers_in_one_line(capsys):
    flags = _bounded_flags()
    assert len(flags) >= 40  # every command's counts (a sanity check on the enumeration)
    for command, flag, b, _ in flags:
        for text in [*ABSURD, str(b.high + 1), str(b.low - 1)]:
            if not _outside(b, text):
                continue
            with pytest.raises(SystemExit) as e:
                build_parser().parse_args([command, flag, text])
            err = capsys.readouterr().err
            assert e.value.code == 2 and err.count("\n") == 1, err
            shown = text.strip() if _parses(b, text) else repr(text)
            assert err.startswith(f"fastqa {command}: {flag} must be {b.expected} (got {shown}): {b.why}; "), err


def _parses(b: Bound, text: str) -> bool:
    try:
        int(text) if b.integer else float(text)
    except ValueError:
        return False
    return True


def test_a_value_at_each_end_of_a_bound_is_taken():
    for command, flag, b, kind in _bounded_flags():
        for value in (b.low, b.high):
            assert kind(f" {value} ") == value and type(kind(str(value))) is (int if b.integer else float)


@pytest.mark.parametrize("args", [["ask", "--top-k", "1000000000", "--context", "x", "--question", "y"],
                                  ["ask", "--top-k", "99999999999999999999999", "--context", "x", "--question", "y"],
                                  ["translate", "--beam", "100000"]])
def test_the_commands_that_took_the_machine_down_are_one_line(capsys, args):
    # Through main, as a user runs them: refused before any model loads.
    with pytest.raises(SystemExit) as e:
        main(args)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and args[2] in err and "Traceback" not in err


@pytest.mark.parametrize("name", sorted(BOUNDS))
def test_the_python_check_names_the_argument_the_value_and_the_bound(name):
    b = BOUNDS[name]
    too_big = b.high * 10 + 1 if b.integer else float(b.high) * 10 + 1
    for value, error in ((too_big, ValueError), (b.low - 1, ValueError), ("5", TypeError), (True, TypeError),
                         (None, TypeError)):
        with pytest.raises(error) as e:
            b.check(value)
        assert str(e.value).startswith(f"{name} must be {b.expected} (got ") and b.why in str(e.value)
    if b.integer:
        for value in (2.5, 1e9, math.nan, 1e23):  # a float where an int is needed, whatever its size
            with pytest.raises(TypeError, match=f"^{name} must be an int in .* a float\\)"):
                b.check(value)
        assert b.check(np.int64(b.low)) == b.low and type(b.check(np.int64(b.low))) is int
        with pytest.raises(ValueError, match=str(10**23)):
            b.check(10**23)
        with pytest.raises(ValueError, match=r"\(got an int of 16610 bits\)"):  # more digits than str() writes
            b.check(10**5000)
        with pytest.raises(ValueError, match=r"\(got 9{37}\.\.\.\)"):
            b.check(10**100 - 1)
    else:
        for value in (math.nan, math.inf, -math.inf):
            with pytest.raises(ValueError, match=f"got {value}"):
                b.check(value)
    assert b.check(b.high) == b.high and b.check(b.low) == b.low
    with pytest.raises(UserError):  # the class a caller asks for
        b.check(too_big, error=UserError)


def test_checked_checks_each_by_name_and_leaves_none():
    assert checked(top_k=3, stride=None, beam=2) == (3, None, 2)
    with pytest.raises(ValueError, match=r"^beam must be an int in \[1, 16\] \(got 17\)"):
        checked(top_k=3, beam=17)
    with pytest.raises(KeyError):
        checked(undeclared=1)


def test_the_server_limits_are_the_declared_bounds():
    limits = ServeLimits()
    assert (limits.max_top_k, limits.max_beam, limits.max_answer_len) == \
        (BOUNDS["top_k"].high, BOUNDS["beam"].high, BOUNDS["max_answer_len"].high)
    assert ServeLimits(max_top_k=5).max_top_k == 5  # a server may lower a bound
    for field, value in (("max_top_k", BOUNDS["top_k"].high + 1), ("max_beam", 10**9), ("max_batch", 10**23),
                         ("max_pending", 0), ("max_body_bytes", 2.5), ("max_sentences", -1)):
        with pytest.raises(ValueError, match=f"^ServeLimits.{field} must be an int in "):
            ServeLimits(**{field: value})
    for field in ("timeout_s", "max_wait_ms", "idle_ms"):  # durations: any finite number
        for value in (math.inf, math.nan, -1.0):
            with pytest.raises(ValueError, match=f"^ServeLimits.{field} must be a number "):
                ServeLimits(**{field: value})


@pytest.mark.parametrize("flag", ["--timeout-s", "--max-wait-ms", "--idle-ms"])
def test_a_duration_flag_refuses_infinity_and_nan(capsys, flag):
    for text in ("inf", "nan", "1e999"):
        with pytest.raises(SystemExit) as e:
            build_parser().parse_args(["serve", flag, text])
        err = capsys.readouterr().err
        assert e.value.code == 2 and err.startswith(f"fastqa serve: {flag} must be a finite number ") and \
            err.count("\n") == 1, err


def test_a_computation_that_cannot_fit_in_the_free_memory_is_refused_in_one_line():
    free = available_memory()
    assert free is not None and free > 0  # /proc/meminfo (or psutil) says, on every Linux
    with pytest.raises(UserError) as e:
        check_fits("translating 64 sentences with beam 16", free * 4 + (1 << 30), advice="lower the beam")
    message = str(e.value)
    assert message.startswith("translating 64 sentences with beam 16 needs about ") and "\n" not in message
    assert message.endswith(" is free: lower the beam") and "GiB" in message
    check_fits("a small computation", 1 << 20)  # fits: no error
    check_fits("with the free memory given", 10, free=100)
    with pytest.raises(UserError, match="needs about 1.0 KiB of memory and 100 bytes is free"):
        check_fits("with the free memory given", 1024, free=100)


def test_the_free_memory_falls_back_to_proc_meminfo(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "psutil", None)  # psutil absent: import raises ImportError
    with open("/proc/meminfo", encoding="ascii") as f:
        listed = next(int(line.split()[1]) for line in f if line.startswith("MemAvailable:")) * 1024
    assert abs(available_memory() - listed) < (1 << 30)  # memory moves a little between the two reads


def test_the_docs_carry_the_declared_table():
    text = (ROOT / "docs" / "models.md").read_text(encoding="utf-8")
    assert markdown_table() in text
    assert len(markdown_table().splitlines()) == len(BOUNDS) + 2


def test_the_bounds_module_loads_no_torch():
    import subprocess
    import sys

    code = "import sys, fastqa.bounds; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_every_bounded_flag_shows_its_range_in_its_help():
    commands = next(a for a in build_parser()._actions if a.dest == "command").choices
    for command, flag, b, _ in _bounded_flags():
        help_text = " ".join(commands[command].format_help().split())
        assert f"({b.expected.split(' ', 2)[2]})" in help_text, (command, flag)
    assert "beam size; 1 decodes greedily (default 5) (in [1, 16])" in " ".join(
        commands["translate"].format_help().split())


def test_a_number_of_thousands_of_digits_is_one_short_line(capsys):
    for command, flag, b, _ in _bounded_flags()[:5]:
        with pytest.raises(SystemExit) as e:
            build_parser().parse_args([command, flag, HUGE])
        err = capsys.readouterr().err
        assert e.value.code == 2 and err.count("\n") == 1 and len(err) < 400, err
        assert err.startswith(f"fastqa {command}: {flag} must be {b.expected} (got ") and "...)" in err, err
