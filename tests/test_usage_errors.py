"""Every subcommand's usage mistake -- a misspelt flag, a bad value, a missing argument -- is one line on stderr
and exit status 2: the command, the mistake naming the flag, and where the help is; no usage block. The
subcommands and their flags are read from the parser itself, so a new one is covered as soon as it exists."""
from __future__ import annotations

import argparse

import pytest

from fastqa.bounds import BOUNDS
from fastqa.cli import build_parser
from fastqa.tasks.flags import nonnegative_int, positive_int


def _commands() -> dict[str, argparse.ArgumentParser]:
    return dict(next(a for a in build_parser()._actions if a.dest == "command").choices)


COMMANDS = sorted(_commands())


def _refused(capsys, args: list[str]) -> str:
    """The one stderr line of ``fastqa ARGS``, which must exit with status 2 and print nothing else."""
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(args)
    assert e.value.code == 2
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert out == "" and len(lines) == 1, err
    assert "usage:" not in err and "Traceback" not in err
    assert lines[0].startswith(f"fastqa {args[0]}: ") and lines[0].endswith(f"; see fastqa {args[0]} --help")
    return lines[0]


def _flags(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if any(o.startswith("--") for o in a.option_strings)]


def _long(action: argparse.Action) -> str:
    return [o for o in action.option_strings if o.startswith("--")][-1]


def _takes_value(action: argparse.Action) -> bool:
    return action.nargs != 0 and action.nargs != "?" and not isinstance(action, argparse._HelpAction)


def test_the_subcommands_are_enumerated_from_the_parser():
    # A sanity check on the enumeration itself: the commands every release had are there.
    assert {"info", "ask", "translate", "qa-train", "mt-train", "serve", "export", "download"} <= set(COMMANDS)


@pytest.mark.parametrize("command", COMMANDS)
def test_a_misspelt_flag_is_one_line_with_the_closest_flag(capsys, command):
    for action in _flags(_commands()[command]):
        flag = _long(action)
        typo = flag[:3] + flag[3] + flag[3:]  # a letter typed twice: --ttop-k
        line = _refused(capsys, [command, typo])
        assert f"unrecognized argument {typo} (did you mean --" in line, line


def _refuses(kind, text: str) -> bool:
    try:
        kind(text)
    except (argparse.ArgumentTypeError, ValueError, TypeError):
        return True
    return False


@pytest.mark.parametrize("command", COMMANDS)
def test_a_bad_value_is_one_line_naming_the_flag(capsys, command):
    tried = 0
    for action in _flags(_commands()[command]):
        flag = _long(action)
        if action.choices is not None:
            bad = "zz-not-a-choice"
        elif action.type is not None and action.type is not str:
            bad = next(text for text in ("zz", " ", "-1e23") if _refuses(action.type, text))
        elif action.nargs == 0:
            bad = None  # a switch: a value given to it is the mistake
        else:
            continue  # a free-text value (a path, a name): any text is a value
        line = _refused(capsys, [command, f"{flag}=zz" if bad is None else flag,
                                 *([] if bad is None else [bad])])
        assert flag in line, line
        tried += 1
    assert tried, f"{command}: no flag to try"


@pytest.mark.parametrize("command", COMMANDS)
def test_a_missing_argument_is_one_line_naming_it(capsys, command):
    parser = _commands()[command]
    required = [a for a in parser._actions if a.required]
    groups = [g for g in parser._mutually_exclusive_groups if g.required]
    if required or groups:
        line = _refused(capsys, [command])
        for action in required:
            assert (_long(action) if action.option_strings else action.metavar or action.dest) in line, line
        for group in groups:
            assert _long(group._group_actions[0]) in line, line
    valued = [a for a in _flags(parser) if _takes_value(a)]
    for action in valued:  # a flag at the end of the line, its value missing
        line = _refused(capsys, [command, _long(action)])
        assert f"{_long(action)}: expected one argument" in line, line
    if not (required or groups or valued):
        assert [a for a in parser._actions if not isinstance(a, argparse._HelpAction)] == [], command


@pytest.mark.parametrize("args,line", [
    (["translate", "--beam", "0"], "fastqa translate: --beam must be an int in [1, 16] (got 0): "),
    (["ask", "--min-score", "1.5"], "fastqa ask: --min-score must be a probability in [0, 1] (got 1.5); "),
    (["ask", "--contxt", "x"], "fastqa ask: unrecognized argument --contxt (did you mean --context?); "),
    (["tranlsate"], "fastqa: unknown command 'tranlsate' (did you mean translate?); see fastqa --help"),
])
def test_the_examples_people_meet(capsys, args, line):
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(args)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and err.startswith(line), err


def test_every_count_a_command_takes_has_a_declared_bound():
    # A count typed as a bare int (or the unbounded positive/non-negative ints) would let 1e23 through.
    for name, parser in _commands().items():
        for action in parser._actions:
            assert action.type not in (int, positive_int, nonnegative_int), f"{name} {action.option_strings}"
    counted = {getattr(a.type, "__name__", None) for p in _commands().values() for a in p._actions}
    assert {"top_k", "beam", "nbest", "batch_size", "max_context", "stride", "threads", "workers"} <= counted
    assert counted & set(BOUNDS) <= set(BOUNDS)
