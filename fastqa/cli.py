"""The ``fastqa`` command: ``fastqa <subcommand> ...`` (``fastqa --help`` lists them).

Thin by design: each task's command module (``fastqa.tasks.TASKS``) registers its subcommands and calls the
library; they share one flag vocabulary (``fastqa.tasks.flags``). A user's mistake (a missing file, malformed data, a checkpoint of another model) is one
line on stderr and exit status 2; ``FASTQA_DEBUG=1`` shows the traceback instead.
"""
from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import sys
from typing import Sequence

from ._version import __version__
from .serve.cli import register as register_serve
from .tasks import TASKS

__all__ = ["parse_args", "main"]


def _run_info(args: argparse.Namespace) -> int:
    from . import info

    print(json.dumps(info(), indent=2, default=str))
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
    parser = argparse.ArgumentParser(prog="fastqa", description="Train, evaluate and use QANet (SQuAD) and "
                                     "ConvS2S (translation) built from fastqa's fused layers.")
    parser.add_argument("--version", action="version", version=f"fastqa {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    p = sub.add_parser("info", help="what is built and usable here (backends, versions, threads)")
    p.set_defaults(func=_run_info)
    for name in TASKS:
        importlib.import_module(name).register(sub)
    register_serve(sub)  # not a task: it serves the tasks' models (fastqa/serve/)
    _add_export(sub)  # not a task either: any task's run folder -> a slim export (fastqa/export.py)
    _add_download(sub)  # the public data the recipes read (fastqa/data/download.py)
    return parser


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one subcommand; returns the exit status (0 ok, 2 a user error, 130/143 a run stopped by SIGINT/SIGTERM)."""
    args = parse_args(argv)
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
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
