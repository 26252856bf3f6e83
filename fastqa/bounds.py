"""The one declaration of every count a user gives (top-k, beam, batch sizes, lengths, threads, windows...):
its lowest and highest value and why, used by the command line (``Bound.arg``), the Python API
(``Bound.check``) and the server (its request schemas and ``fastqa.serve.limits``). An absurd number (1e9, a
negative one, NaN, a float where an int is needed) is then one message naming the argument, the value and the
bound, before anything is allocated for it.

Within the bounds a request can still ask for more memory than the machine has free (a wide beam over a large
batch of long sentences): ``check_fits`` compares a computation's estimated size with the free memory and
refuses it with one line.

No torch at import time: ``fastqa --help`` and the server's limits read this table without loading it.
docs/models.md carries the table as ``markdown_table()`` writes it (a test keeps the two equal).
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any, Callable

__all__ = ["Bound", "BOUNDS", "bound", "checked", "available_memory", "free_memory", "check_fits", "markdown_table"]


@dataclass(frozen=True)
class Bound:
    """A count (``integer``) or a number a user gives, in [low, high]. name: the Python argument's name; uses:
    where it is given (flags, arguments, request fields), for the docs; why: the reason for the high end."""

    name: str
    low: float
    high: float
    why: str
    uses: str
    integer: bool = True

    @property
    def expected(self) -> str:
        """The bound in words: "an int in [1, 16]", "a number in [0, 100]"."""
        return f"{'an int' if self.integer else 'a number'} in [{_fmt(self.low)}, {_fmt(self.high)}]"

    def message(self, label: str, shown: str) -> str:
        """"LABEL must be an int in [1, 16] (got SHOWN): WHY": the one wording of a value out of its bound."""
        return f"{label} must be {self.expected} (got {shown}): {self.why}"

    def check(self, value: Any, label: str | None = None, *, error: type[Exception] | None = None) -> Any:
        """``value`` (an int for a count, else a float) if it is within the bound; a TypeError for a wrong type
        (a bool, a float for a count, a str), a ValueError for a value out of range or NaN (``error``: the class
        to raise for either instead). ``label``: the argument's name in the message (default ``name``)."""
        label = label or self.name
        if self.integer:
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise (error or TypeError)(self.message(label, _shown(value)))
            value = int(value)
            if not self.low <= value <= self.high:
                raise (error or ValueError)(self.message(label, _int_text(value)))
            return value
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise (error or TypeError)(self.message(label, _shown(value)))
        value = float(value)
        if not self.low <= value <= self.high:  # NaN fails both comparisons
            raise (error or ValueError)(self.message(label, _fmt(value)))
        return value

    def parse(self, text: str, label: str = "") -> Any:
        """``text`` from the command line as the value it stands for, or a ValueError with the message (the
        text as given, the bound; after ``label``): "1e9" is no int, "nan" no number in range."""
        try:
            value = int(text) if self.integer else float(text)
        except ValueError:  # also a number of more digits than Python converts
            raise ValueError(self.message(label, _cut(repr(text))).lstrip()) from None
        if not self.low <= value <= self.high:
            raise ValueError(self.message(label, _cut(text.strip())).lstrip())
        return value

    def arg(self) -> Callable[[str], Any]:
        """An argparse ``type=`` for this bound: its error is "must be ... (got ...): ...", which the command's
        parser reports after the flag's name as its one line (``fastqa.cli``)."""
        import argparse

        def parse(text: str) -> Any:
            try:
                return self.parse(text)
            except ValueError as e:
                raise argparse.ArgumentTypeError(str(e)) from None
        parse.__name__ = self.name
        return parse


def _fmt(x: float) -> str:
    """A bound or a value as a person reads it: 4096, 1_048_576 -> 1048576, 0.5, 1e+30."""
    if isinstance(x, float) and x.is_integer() and abs(x) < 1e15:
        return str(int(x))
    return str(x)


def _cut(text: str, most: int = 40) -> str:
    """``text`` cut to ``most`` characters for a message (a value of 5,000 digits is not repeated whole)."""
    return text if len(text) <= most else text[:most - 3] + "..."


def _int_text(value: int) -> str:
    """An int in a message, cut short; one of more digits than Python writes out by its size."""
    try:
        return _cut(str(value))
    except ValueError:  # past sys.get_int_max_str_digits()
        return f"an int of {value.bit_length()} bits"


def _shown(value: Any) -> str:
    """A value of the wrong type in a message: its repr (cut short) and its type."""
    return f"{_cut(repr(value))}, a {type(value).__name__}"


_WINDOW = 2048
_BATCH = 4096

def _served(name: str, low: float, high: float, why: str) -> Bound:
    """A bound of ``fastqa serve`` given by the flag of its name (``max_batch`` -> ``--max-batch``)."""
    return Bound(name, low, high, why, f"serve --{name.replace('_', '-')}")


#: Every bounded count and number, by its Python name.
BOUNDS: dict[str, Bound] = {b.name: b for b in (
    # answering questions
    Bound("top_k", 1, 20, "the distinct answers one question returns; each one costs candidate spans read from "
          "every window", "ask --top-k, QAModel.answer(top_k=), POST /answer top_k"),
    Bound("max_answer_len", 0, _WINDOW, "an answer lies within one window, so a longer bound changes nothing",
          "ask --max-answer-len, QAModel.answer(max_answer_len=), POST /answer max_answer_len"),
    Bound("max_context", 1, _WINDOW, "context tokens read at once; the reader's attention grows with its square",
          "ask/qa-predict/qa-calibrate --max-context, QAModel.answer(max_context=)"),
    Bound("stride", 0, _WINDOW - 1, "the overlap of two windows is shorter than a window",
          "ask/qa-predict/qa-calibrate --stride, QAModel.answer(stride=)"),
    Bound("batch_size", 1, _BATCH, "windows or sentences computed together; memory grows with it",
          "ask/qa-predict/qa-calibrate/translate/mt-eval --batch-size, qa-train --eval-batch-size, "
          "QAModel.answer_many(batch_size=), Translator.translate(batch_size=)"),
    # translating
    Bound("beam", 1, 16, "a wider search seldom finds a better translation and costs beam times the memory",
          "translate/mt-eval --beam, Translator.translate(beam=), POST /translate beam"),
    Bound("nbest", 1, 16, "the translations kept per sentence, at most the beam",
          "translate --nbest, Translator.translate(nbest=), POST /translate nbest"),
    Bound("max_len_a", 0, 100, "output tokens per source token (the model's positions cap the length anyway)",
          "translate/mt-eval --max-len-a, Translator.translate(max_len_a=)", integer=False),
    Bound("max_len_b", 0, 1024, "output tokens beyond a times the source's (the model's positions cap them anyway)",
          "translate/mt-eval --max-len-b, Translator.translate(max_len_b=)"),
    Bound("len_penalty", 0, 10, "the exponent of the length that divides a hypothesis's log-probability",
          "translate/mt-eval --len-penalty, Translator.translate(len_penalty=)", integer=False),
    # training
    Bound("train_batch_size", 1, 65536, "examples per optimizer step, all ranks together",
          "qa-train/mt-train --batch-size"),
    Bound("max_steps", 1, 10**9, "optimizer steps in all", "qa-train/mt-train --max-steps"),
    Bound("epochs", 1, 10**6, "passes over the training data", "qa-train/mt-train --epochs"),
    Bound("warmup", 1, 10**9, "steps of learning-rate warm-up", "qa-train --warmup"),
    Bound("log_every", 1, 10**9, "steps between logged losses", "qa-train/mt-train --log-every"),
    Bound("eval_every", 0, 10**9, "steps between evaluations (0: the task's default moments)",
          "qa-train/mt-train --eval-every"),
    Bound("seed", 0, 2**32 - 1, "NumPy's generators take 32-bit seeds", "qa-train/mt-train --seed"),
    Bound("vocab_size", 1, 1_000_000, "SentencePiece pieces; the embeddings grow with them", "mt-train --vocab-size"),
    Bound("min_freq", 1, 10**9, "occurrences a word needs to enter the vocabulary", "mt-train --min-freq"),
    Bound("max_len", 1, 100_000, "tokens of the longest training pair kept", "mt-train --max-len"),
    Bound("valid_bleu", 0, 10**6, "validation pairs translated for BLEU at each evaluation", "mt-train --valid-bleu"),
    # running
    Bound("threads", 1, 1024, "CPU threads for torch; more than the cores only wait for them",
          "every command's --threads, .load(threads=)"),
    # serving
    _served("workers", 1, 64, "server processes, each with its own copy of the models"),
    _served("max_body_bytes", 1, 1 << 30, "the largest request body the server reads into memory"),
    _served("max_context_chars", 1, 10_000_000, "the longest context of one /answer request"),
    Bound("max_question_chars", 1, 100_000, "the longest question of one /answer request",
          "ServeLimits.max_question_chars"),
    _served("max_sentence_chars", 1, 1_000_000, "the longest sentence of one /translate request"),
    _served("max_sentences", 1, _BATCH, "sentences in one /translate request (one batch)"),
    _served("max_pending", 1, 1_000_000, "requests waiting for one model"),
    _served("max_batch", 1, _BATCH, "requests one model call answers"),
)}


def bound(name: str) -> Bound:
    """The declared bound of ``name`` (a KeyError names an undeclared one)."""
    return BOUNDS[name]


def checked(**values: Any) -> tuple:
    """The values given by name, each checked against its declared bound (``Bound.check``; None stays None), in
    the order given: the first lines of a public method taking counts."""
    return tuple(None if value is None else BOUNDS[name].check(value) for name, value in values.items())


# ------------------------------------------------------------------------------ memory


def available_memory() -> int | None:
    """Bytes of memory free for a new allocation on this machine (psutil's ``available`` when installed, else
    /proc/meminfo's MemAvailable), or None where neither says."""
    try:
        import psutil
    except ImportError:
        pass
    else:
        return int(psutil.virtual_memory().available)
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def free_memory(device: Any = None) -> int | None:
    """Bytes free on ``device`` (a torch device or its name; None: the CPU): a GPU's free memory, else
    ``available_memory()``."""
    if device is not None and getattr(device, "type", str(device).split(":")[0]) == "cuda":
        import torch

        return int(torch.cuda.mem_get_info(device)[0])
    return available_memory()


def check_fits(what: str, need: float, *, device: Any = None, free: int | None = None, advice: str = "") -> None:
    """Refuse, with one UserError, a computation estimated at ``need`` bytes when less is free on ``device``
    (``free``: the free bytes, when the caller knows them; unknown: no refusal). ``what`` names the computation
    and the values that size it; ``advice`` says which to lower."""
    from .errors import UserError

    if free is None:
        free = free_memory(device)
    if free is None or need <= free:
        return
    raise UserError(f"{what} needs about {_size(need)} of memory and {_size(free)} is free"
                    + (f": {advice}" if advice else ""))


def _size(n: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} bytes" if math.isfinite(n) else "unbounded memory"


# ------------------------------------------------------------------------------ docs


def markdown_table() -> str:
    """The bounds as the Markdown table docs/models.md carries."""
    rows = ["| argument | range | where | why |", "|---|---|---|---|"]
    for b in BOUNDS.values():
        rows.append(f"| `{b.name}` | {b.expected.split(' in ')[1]}{'' if b.integer else ' (a number)'} | {b.uses} | "
                    f"{b.why} |")
    return "\n".join(rows) + "\n"
