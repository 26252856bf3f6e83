"""The ``fastqa`` command: ``fastqa <subcommand> ...`` (``fastqa --help`` lists them).

Thin by design: each task (``fastqa.tasks.TASKS``) registers its subcommands and calls the
library; they share one flag vocabulary (``fastqa.tasks.flags``). A user's mistake (a missing file, malformed data, a checkpoint of another model) is one
line on stderr and exit status 2; ``FASTQA_DEBUG=1`` shows the traceback instead.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
from typing import Any, Iterable, NoReturn, Sequence

from ._version import __version__
from .bounds import BOUNDS
from .serve.cli import register as register_serve
from .tasks import TASKS

__all__ = ["parse_args", "main"]


# Negative numbers, read as values, not flags: argparse's own "-5", "-.5", and also "-1e23", "-inf", "-nan", so that
# a flag given such a value reports the value against the flag's bound.
_NUMBER = re.compile(r"^-(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$|^-(inf|infinity|nan)$", re.IGNORECASE)
_ARGUMENT = re.compile(r"^argument ([^:]+): (.*)$", re.S)  # how argparse names the argument a message is about


def _closest(word: str, candidates: Iterable[str]) -> str | None:
    """The candidate ``word`` most likely misspells (difflib), or None. Leading dashes are left out of the
    comparison, so that "--" alone does not make "--foo" look like "--out"."""
    import difflib

    by_key: dict[str, str] = {}
    for candidate in candidates:
        by_key.setdefault(candidate.lstrip("-") or candidate, candidate)
    match = difflib.get_close_matches(word.lstrip("-") or word, list(by_key), n=1, cutoff=0.6)
    return by_key[match[0]] if match else None


class _Parser(argparse.ArgumentParser):
    """The top ``fastqa`` parser: a mistyped flag or subcommand names itself and the closest right spelling.

    argparse leaves a subcommand's unknown flags to the top parser, which reports them with its own usage and
    only after the subcommand's missing required arguments; here each parser checks its own flags first
    (``_CommandParser``), so ``fastqa ask --contxt x`` is reported by ``ask``, with ``ask``'s usage line.
    """

    #: check every argument (a subcommand), or only those before the first positional (the top parser, whose
    #: own flags take no value, so that positional is the subcommand)
    _checks_all_args = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = _NUMBER

    def parse_known_args(self, args: Sequence[str] | None = None,
                         namespace: argparse.Namespace | None = None) -> tuple[argparse.Namespace, list[str]]:
        strings = list(sys.argv[1:] if args is None else args)
        unknown = self._unknown_flags(strings)
        if unknown:
            self._report_unrecognized(unknown)
        namespace, extras = super().parse_known_args(strings, namespace)
        if extras and self._checks_all_args:  # stray positionals: this subcommand reports them too
            self._report_unrecognized(extras)
        return namespace, extras

    def _unknown_flags(self, strings: Sequence[str]) -> list[str]:
        known = self._option_string_actions
        unknown = []
        for s in strings:
            if s == "--":
                break
            if not (len(s) > 1 and s[0] in self.prefix_chars) or " " in s or _NUMBER.match(s):
                if not self._checks_all_args:
                    break
                continue
            name = s.split("=", 1)[0] if s.startswith("--") else s
            if name in known:
                continue
            if s.startswith("--") and self.allow_abbrev and any(o.startswith(name) for o in known):
                continue  # an abbreviation: argparse resolves it, or says it is ambiguous
            if not s.startswith("--") and s[:2] in known:
                continue  # a short flag with its value attached (-n3)
            unknown.append(name)
        return unknown

    def _report_unrecognized(self, strings: Sequence[str]) -> None:
        described = []
        for s in strings:
            close = _closest(s, self._option_string_actions) if s[:1] in self.prefix_chars else None
            described.append(f"{s} (did you mean {close}?)" if close else s)
        self.error(f"unrecognized argument{'s' if len(strings) > 1 else ''} {', '.join(described)}")

    def error(self, message: str) -> NoReturn:
        """One line on stderr and exit status 2: "fastqa ask: --beam must be ... (got 0): ...; see fastqa ask
        --help" -- the mistake and where the help is, without argparse's usage block above it."""
        found = _ARGUMENT.match(message)
        if found:  # "argument -n/--nbest: must be..." -> "--nbest must be..." (the long flag)
            name, rest = found.group(1).split("/")[-1], found.group(2)
            message = f"{name} {rest}" if rest.startswith("must be ") else f"{name}: {rest}"
        self.exit(2, f"{self.prog}: {' '.join(message.split())}; see {self.prog} --help\n")

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        # An invalid choice (a subcommand, --precision...) names the closest valid one.
        if action.choices is None or value in action.choices or not isinstance(value, str):
            return super()._check_value(action, value)
        choices = [str(c) for c in action.choices]
        close = _closest(value, choices)
        if action.nargs == argparse.PARSER:
            hint = f"did you mean {close}?" if close else f"commands: {', '.join(choices)}"
            raise argparse.ArgumentError(None, f"unknown command {value!r} ({hint})")
        hint = f"did you mean {close!r}? " if close else ""
        raise argparse.ArgumentError(action, f"invalid choice: {value!r} ({hint}choose from "
                                     f"{', '.join(map(repr, choices))})")


class _CommandParser(_Parser):
    """A subcommand's parser: reports its own unknown flags and stray arguments, with its own usage."""

    _checks_all_args = True


def _run_info(args: argparse.Namespace) -> int:
    from . import info
    from .pretrained import shipped
    from .tasks import task_of

    # The shipped models are added here, not in fastqa.info(): the backends' floor may not import pretrained.
    print(json.dumps({**info(), "shipped_models": shipped(task_of)}, indent=2, default=str))
    return 0


def _run_export(args: argparse.Namespace) -> int:
    from .export import export_run

    out = export_run(args.run, args.out, half=args.half)
    print(json.dumps({"export": str(out), "files": sorted(p.name for p in out.iterdir() if not p.name.startswith("."))}))
    return 0


def _add_export(sub) -> None:
    p = sub.add_parser("export", help="write a slim, shippable copy of a trained model (safetensors + config)",
                       description="Write OUT/model.safetensors (the EMA weights when the run kept them), "
                       "OUT/config.json (kind, config, vocabularies, limits) and a model card OUT/README.md from "
                       "a run folder of any task; `--model OUT` and Model.load(OUT) read it as they read the run.")
    p.add_argument("run", metavar="RUN", help="a run folder (or its checkpoint.pt, or another export)")
    p.add_argument("out", metavar="OUT", help="the export folder (new, empty, or an earlier export to replace)")
    p.add_argument("--half", action="store_true", help="store the weights in float16 (half the size)")
    p.set_defaults(func=_run_export)


def _run_download(args: argparse.Namespace) -> int:
    from .data.download import download, recipe_lines

    written = download(args.datasets, args.to, force=args.force, progress=False if args.no_progress else None)
    print(recipe_lines(written))
    return 0


def _add_download(sub) -> None:
    from .data.download import datasets  # the catalogue alone: no network code is imported for --help

    names = datasets()
    p = sub.add_parser("download", help=f"fetch the public data the recipes use ({', '.join(names)})",
                       description="Fetch datasets from their publishers into DIR/NAME/, each file checked by its "
                       "sha256; an interrupted download resumes, files already there and verified are kept. "
                       "Prints the folders to give the recipes (SQUAD=..., GLOVE=..., MULTI30K=...). "
                       "FASTQA_DOWNLOAD_BASE=URL fetches URL/NAME/FILE instead (a mirror).")
    p.add_argument("datasets", nargs="+", choices=names, metavar="NAME",
                   help=f"one or more of {', '.join(names)}")
    p.add_argument("--to", default="data", metavar="DIR", help="the folder to download into (default: data)")
    p.add_argument("--force", action="store_true", help="fetch files again even when present and verified")
    p.add_argument("--no-progress", action="store_true", help="no progress bars (the default when not a terminal)")
    p.set_defaults(func=_run_download)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="fastqa", description="Train, evaluate and use QANet (SQuAD) and "
                     "ConvS2S (translation) built from fastqa's fused layers.")
    parser.add_argument("--version", action="version", version=f"fastqa {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True, parser_class=_CommandParser)
    p = sub.add_parser("info", help="what is built and usable here (backends, versions, threads) and the shipped models' scores")
    p.set_defaults(func=_run_info)
    for task in TASKS:
        task.register(sub)
    register_serve(sub)  # not a task: it serves the tasks' models (fastqa/serve/)
    _add_export(sub)  # not a task either: any task's run folder -> a slim export (fastqa/export.py)
    _add_download(sub)  # the public data the recipes read (fastqa/data/download.py)
    for command in sub.choices.values():
        _show_bounds(command)
    return parser


def _show_bounds(parser: argparse.ArgumentParser) -> None:
    """Each bounded flag's --help ends with its declared range (``fastqa.bounds``), e.g. "(in [1, 16])"."""
    for action in parser._actions:
        declared = BOUNDS.get(getattr(action.type, "__name__", ""))
        if declared is not None and action.help != argparse.SUPPRESS:
            action.help = f"{action.help} " if action.help else ""
            action.help += f"({declared.expected.split(' ', 2)[2]})"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one subcommand; returns the exit status (0 ok, 2 a user error, 130/143 a run stopped by SIGINT/SIGTERM)."""
    args = parse_args(argv)
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        if not hasattr(args, "threads"):  # a command that runs no model (and may not need torch)
            return int(args.func(args) or 0)
        from .tasks.loading import cpu_threads

        # --threads for the command's length; a caller running commands in-process gets its own count back.
        with cpu_threads(args.threads):
            return int(args.func(args) or 0)
    except KeyboardInterrupt as e:
        # fastqa.train.TrainingInterrupted carries the checkpoint it wrote and the signal's exit status (not
        # imported here: that would load torch before --help).
        print(f"fastqa: {e}" if str(e) else "fastqa: interrupted", file=sys.stderr)
        return int(getattr(e, "exit_status", 130))
    except (ValueError, TypeError, OSError, KeyError) as e:
        # UserError is a ValueError; OSError covers missing/unreadable files. Anything else is a bug and
        # keeps its traceback.
        if os.environ.get("FASTQA_DEBUG"):
            raise
        message = str(e) if not isinstance(e, KeyError) else f"missing key {e}"
        if isinstance(e, OSError) and e.filename is not None and str(e.filename) not in message:
            message = f"{e.filename}: {message}"
        print(f"fastqa: error: {' '.join(message.split())}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # python -m fastqa.cli
    sys.exit(main())
