"""The flag vocabulary every task command shares: argument types (argparse turns their errors into one line,
``fastqa.cli``; every count's bound is declared once in ``fastqa.bounds``), the training and runtime flags with
one meaning and one default each, and their resolution."""
from __future__ import annotations

import argparse
import inspect
import json
import math
import os
from typing import Callable, Sequence

from ..bounds import bound

__all__ = ["Command", "add_commands", "counted", "positive_int", "nonnegative_int", "positive_float", "field_value", "PRECISIONS", "INFERENCE_PRECISIONS", "add_runtime_flags", "add_training_flags",
           "check_training_flags", "amp_of", "cuda_graphs_of", "resolve_device"]


def _int_at_least(text: str, minimum: int, expected: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {expected} (got {text!r})") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"must be {expected} (got {value})")
    return value


def counted(name: str) -> Callable[[str], object]:
    """The argparse type of the bounded count (or number) ``name``: its one declaration, ``fastqa.bounds``."""
    return bound(name).arg()


def positive_int(text: str) -> int:
    return _int_at_least(text, 1, "a positive integer")


def nonnegative_int(text: str) -> int:
    return _int_at_least(text, 0, "an integer >= 0")


def _float_where(text: str, ok: Callable[[float], bool], expected: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {expected} (got {text!r})") from None
    if not ok(value):  # NaN fails every comparison, so it is refused too
        raise argparse.ArgumentTypeError(f"must be {expected} (got {text.strip()})")
    return value


def positive_float(text: str) -> float:
    return _float_where(text, lambda v: 0 < v < math.inf, "a finite number > 0")


def nonnegative_float(text: str) -> float:
    return _float_where(text, lambda v: 0 <= v < math.inf, "a finite number >= 0")


def probability(text: str) -> float:
    return _float_where(text, lambda v: 0.0 <= v <= 1.0, "a probability in [0, 1]")


def field_value(text: str) -> tuple[str, object]:
    """"FIELD=VALUE" -> (field, value): a config override; the value is read as JSON (numbers, true/false),
    else kept a str (e.g. layers=reference)."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected FIELD=VALUE, got {text!r}")
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    return key.strip(), value


# ------------------------------------------------------------------------------ declaring subcommands

#: A subcommand as data: (name, the function adding its flags, whose docstring is the command's ``--help``
#: description, the function running it, the one-line help ``fastqa --help`` lists).
Command = tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int], str]


def add_commands(subparsers: argparse._SubParsersAction, commands: Sequence[Command]) -> None:
    """Add each command's parser to ``subparsers``, in order. The description is the flags function's docstring
    (argparse re-wraps it to the terminal), so a command's text stands once, next to its flags."""
    for name, add_flags, run, one_line in commands:
        p = subparsers.add_parser(name, help=one_line, description=inspect.getdoc(add_flags))
        add_flags(p)
        p.set_defaults(func=run)


# ------------------------------------------------------------------------------ the shared flag vocabulary

PRECISIONS = ("fp32", "bf16", "fp16")


def device_arg(text: str) -> str:
    """A torch device string (``cpu``, ``cuda``, ``cuda:1``); whether it is usable here is checked when the
    command runs (``resolve_device``), so ``--help`` needs no torch."""
    if not text or not text.strip():
        raise argparse.ArgumentTypeError("expected a device such as cpu, cuda or cuda:1")
    return text.strip()


INFERENCE_PRECISIONS = ("fp32", "bf16")


def add_runtime_flags(p: argparse.ArgumentParser, *, precision: bool = True) -> None:
    """``--device`` and ``--threads``: every subcommand that runs a model takes them, with these defaults; and
    for the commands that only run one (``precision``), ``--precision`` (the train commands have their own)."""
    p.add_argument("--device", type=device_arg, default=None, metavar="DEV",
                   help="cpu, cuda, cuda:1 ... (default: cuda when available, else cpu)")
    p.add_argument("--threads", type=counted("threads"), default=None, metavar="N",
                   help="CPU threads for torch (default: torch's; on a busy machine 1 can be much faster)")
    if precision:
        p.add_argument("--precision", choices=INFERENCE_PRECISIONS, default=None,
                       help="the dtype the model computes in: bf16 casts its weights to bfloat16 (on the CPU: "
                       "processors with AMX or AVX512-BF16 only); default fp32 (a reader on a GPU: bf16 autocast)")


def add_skip_bad_lines_flag(p: argparse.ArgumentParser, *, what: str) -> None:
    """``--skip-bad-lines``, for the commands that read a file of lines: ``what`` they do with a line they cannot
    read instead of stopping there."""
    p.add_argument("--skip-bad-lines", action="store_true",
                   help=f"{what} (default: stop at the first bad line, naming it); each skipped line is reported on "
                   "stderr")


def add_training_flags(p: argparse.ArgumentParser, *, clip: float, eval_every: int, batch_size: int,
                       layers: Sequence[str], eval_every_help: str) -> None:
    """The flags both train commands share, with the task's defaults where its recipe differs."""
    p.add_argument("--out", required=True, metavar="DIR", help="run folder: checkpoint.pt, metrics.jsonl, curve.png")
    p.add_argument("--layers", choices=tuple(layers), default=None,
                   help="layer backend: fast (fastqa's fused kernels, default) or the pure-PyTorch reference")
    p.add_argument("--set", dest="overrides", action="append", type=field_value, default=[], metavar="FIELD=VALUE",
                   help="change a field of the preset's model config (repeatable), e.g. --set dropout=0.2")
    p.add_argument("--batch-size", type=counted("train_batch_size"), default=batch_size,
                   help=f"global batch size, all ranks together (default {batch_size})")
    p.add_argument("--clip", type=float, default=clip, help=f"max gradient norm (default {clip}; 0: off)")
    p.add_argument("--max-steps", type=counted("max_steps"), metavar="N", help="stop after N optimizer steps in all")
    p.add_argument("--epochs", type=counted("epochs"), metavar="N", help="stop after N passes over the training data")
    p.add_argument("--max-minutes", type=positive_float, metavar="M",
                   help="wall-clock budget, the final evaluation and checkpoint included: training stops "
                   "early enough for them to fit")
    p.add_argument("--eval-every", type=counted("eval_every"), default=eval_every, metavar="N", help=eval_every_help)
    p.add_argument("--log-every", type=counted("log_every"), default=50, metavar="N", help="steps between logged losses")
    p.add_argument("--save-every-minutes", type=float, default=10.0, metavar="M",
                   help="also checkpoint this often, at a step boundary (default 10; 0: only at evaluations and "
                   "the end); Ctrl-C and SIGTERM always checkpoint before exiting")
    p.add_argument("--precision", choices=PRECISIONS, default=None,
                   help="autocast dtype of the forward and backward (default: bf16 on a GPU, fp32 on the CPU; "
                   "bf16 on the CPU needs a processor with AMX or AVX512-BF16, fp16 a GPU)")
    p.add_argument("--seed", type=counted("seed"), default=0)
    p.add_argument("--resume", action="store_true", help="continue the run in --out exactly where it stopped")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=None,
                   help="run the train step as CUDA graphs, one per length bucket (default: on on a CUDA device; "
                   "--no-cuda-graphs: the eager step)")
    add_runtime_flags(p, precision=False)


def check_training_flags(args: argparse.Namespace) -> None:
    """Value checks argparse's types cannot express, before any data is read."""
    from ..errors import UserError

    if args.save_every_minutes < 0:
        raise UserError(f"--save-every-minutes must be >= 0, got {args.save_every_minutes}")
    if args.clip < 0:
        raise UserError(f"--clip must be >= 0, got {args.clip}")
    for name, value in args.overrides:
        if name == "layers":
            raise UserError("--set layers=...: the layer backend is chosen with --layers")
    # The run folder's state is known before minutes of data loading: say so now.
    checkpoint = os.path.join(args.out, "checkpoint.pt")
    if args.resume and not os.path.isfile(checkpoint):
        raise UserError(f"--resume: {checkpoint}: no such checkpoint (train a model into that folder first)")
    if not args.resume and os.path.exists(checkpoint):
        raise UserError(f"{checkpoint} exists: pass --resume to continue that run, or choose another --out")
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        raise UserError(f"--out {args.out}: is a file, expected a folder")


def amp_of(precision: str | None, device: str) -> str | None:
    """The training loop's ``amp`` setting for ``--precision`` on ``device`` (None: fp32)."""
    if precision is None:
        precision = "bf16" if device.startswith("cuda") else "fp32"
    if precision != "fp32" and not device.startswith("cuda"):
        from .._backend import cpu_bf16_refusal
        from ..errors import UserError

        # fp16 needs loss scaling and the CPU kernels have no fp16; bf16 only where the processor multiplies it.
        if precision == "fp16":
            raise UserError("--precision fp16 needs a CUDA device; on the CPU use bf16 or fp32")
        refusal = cpu_bf16_refusal(f"--precision {precision}")
        if refusal is not None:
            raise UserError(refusal)
    return None if precision == "fp32" else precision


def cuda_graphs_of(wanted: bool | None, device: str) -> bool | None:
    """The training loop's ``cuda_graphs`` setting for ``--cuda-graphs``/``--no-cuda-graphs`` on ``device``
    (None: the loop's default, on on CUDA); ``--cuda-graphs`` on the CPU is refused."""
    if wanted and not device.startswith("cuda"):
        from ..errors import UserError

        raise UserError(f"--cuda-graphs needs a CUDA device, got --device {device} (the CPU step runs eagerly)")
    return wanted


def resolve_device(text: str | None) -> str:
    """``--device`` checked against this machine: the device rule's choice (``default_device``), or a UserError
    naming the flag."""
    import torch

    from ..errors import UserError
    from ..train.distributed import default_device

    try:
        device = default_device(text)
    except (RuntimeError, ValueError):
        raise UserError(f"--device: {text!r} is not a device (expected cpu, cuda or cuda:N)") from None
    if text is None:
        return str(device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise UserError(f"--device {text}: this torch has no usable CUDA device")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise UserError(f"--device {text}: only {torch.cuda.device_count()} CUDA device(s) here")
    elif device.type != "cpu":
        raise UserError(f"--device {text}: only cpu and cuda devices are supported")
    return str(device)
