"""The trained models that ship with the package, by name.

Each is a slim export (``fastqa export RUN fastqa/pretrained/NAME --half``, see ``fastqa.export``) in a
folder beside this file; the wheel carries the folders as package data. A model's ``load()`` with no
argument reads the one its task ships (``TaskSpec.shipped``), and ``load("NAME")`` any of them::

    from fastqa.pretrained import resolve, load_payload
    resolve("qanet-small-squad")          # -> .../fastqa/pretrained/qanet-small-squad
    payload, where = load_payload("convs2s-small-multi30k")   # what Translator.load consumes
    payload, where = load_payload("runs/my-run")              # a path that exists always wins

This module imports no torch until a payload is read, so a command line can resolve names cheaply.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from ..errors import UserError

if TYPE_CHECKING:
    import torch

__all__ = ["NAMES", "FOLDER", "resolve", "load_payload", "available", "shipped"]

#: shipped model name -> its folder under ``FOLDER``
NAMES: dict[str, str] = {
    "qanet-small-squad": "qanet-small-squad",
    "convs2s-small-multi30k": "convs2s-small-multi30k",
}
#: where the shipped folders live (tests point it at a temporary folder)
FOLDER: Path = Path(__file__).resolve().parent

_MARKER = "config.json"  # an export is present when its config is (fastqa.export checks the rest on load)


def available() -> list[str]:
    """The names whose files are present in this installation."""
    return [name for name, sub in NAMES.items() if (FOLDER / sub / _MARKER).is_file()]


_CARD = "README.md"
_SEE_CARD = "see README.md"
# In the card's "## Evaluation" section: each bold span's "METRIC NUMBER" pairs ("**EM 38.01, F1 50.91**",
# "**sacreBLEU 40.09** (signature ...)"), and the text before the first colon says on what.
_SECTION = re.compile(r"^## Evaluation[^\n]*\n(.*?)(?=^## |\Z)", re.M | re.S)
_BOLD = re.compile(r"\*\*(.+?)\*\*", re.S)
_FIGURE = re.compile(r"([A-Za-z][\w-]*)\s+(-?\d+(?:\.\d+)?)\b")


def _numbers(mapping: Any) -> dict[str, float] | None:
    """``mapping`` as {metric: number} when it is one (a config's "scores" entry), else None."""
    if not isinstance(mapping, dict) or not mapping:
        return None
    if not all(isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool)
               for k, v in mapping.items()):
        return None
    return {k: float(v) for k, v in mapping.items()}


def _card_scores(text: str) -> tuple[dict[str, float], str | None]:
    """({metric: number}, what they were measured on) from a model card's "## Evaluation" section."""
    section = _SECTION.search(text)
    if section is None:
        return {}, None
    body = section.group(1)
    scores = {name: float(number) for span in _BOLD.findall(body) for name, number in _FIGURE.findall(span)}
    first = body.strip().split("\n\n", 1)[0]
    on = " ".join(first.split(":", 1)[0].split()) if ":" in first else None
    return scores, on


def shipped(task_of: Callable[[str, str | None], str | None] | None = None) -> dict[str, dict[str, Any]]:
    """Each shipped model's folder, task, whether its files are installed, and the scores its model card
    reports: ``{name: {"path", "task", "kind", "installed", "scores", "evaluated_on", "card"}}``. The task is
    ``task_of(name, kind)`` (the tasks know which ships what: ``fastqa.tasks.task_of``; None without it).

    ``scores`` is ``{metric: number}`` from the folder's config.json ``"scores"`` entry when it has one (with
    ``"evaluated_on"`` beside it), else
    from the bold figures of its README.md's "## Evaluation" section (``evaluated_on``: that section's words
    before its first colon); "see README.md" when neither gives a figure. Reads two small files per model and
    imports no torch."""
    out: dict[str, dict[str, Any]] = {}
    for name, sub in NAMES.items():
        folder = FOLDER / sub
        try:
            config = json.loads((folder / _MARKER).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            config = None
        config = config if isinstance(config, dict) else {}
        kind = config.get("kind") if isinstance(config.get("kind"), str) else None
        scores: dict[str, float] | None = _numbers(config.get("scores"))
        evaluated_on = config.get("evaluated_on") if isinstance(config.get("evaluated_on"), str) else None
        card = folder / _CARD
        if scores is None:
            try:
                scores, evaluated_on = _card_scores(card.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError):
                scores = {}
        out[name] = {
            "path": str(folder),
            "task": task_of(name, kind) if task_of is not None else None,
            "kind": kind,
            "installed": name in available(),
            "scores": scores or _SEE_CARD,
            "evaluated_on": evaluated_on,
            "card": str(card) if card.is_file() else None,
        }
    return out


def _looks_like_path(text: str) -> bool:
    # A name never holds a separator or a file suffix; such an argument that does not exist is a missing
    # file, best reported by the loader that names it.
    return (os.sep in text or "/" in text or (os.altsep is not None and os.altsep in text)
            or text.startswith(".") or Path(text).suffix in (".pt", ".json", ".safetensors"))


def resolve(name_or_path: str | os.PathLike) -> Path:
    """The folder or file to load for ``name_or_path``.

    A path that exists wins (a run folder named like a shipped model is read as the run); a known name gives
    its folder here; a path-like argument (with a separator or a checkpoint suffix) comes back as is, for the
    loader to report what is missing; any other name, or a known name whose files are not installed, is a
    ``UserError`` listing the known names."""
    if isinstance(name_or_path, os.PathLike):
        return Path(name_or_path)
    if not isinstance(name_or_path, str) or not name_or_path:
        raise UserError(f"a model is a shipped name ({', '.join(NAMES)}) or a path, got {name_or_path!r}")
    path = Path(name_or_path)
    if path.exists():
        return path
    known = ", ".join(NAMES)
    if name_or_path in NAMES:
        folder = FOLDER / NAMES[name_or_path]
        if not (folder / _MARKER).is_file():
            present = ", ".join(available()) or "none"
            raise UserError(f"the shipped model {name_or_path!r} is not installed ({folder / _MARKER} is missing; "
                            f"installed: {present}; known: {known}); pass --model DIR with a run folder or export")
        return folder
    if _looks_like_path(name_or_path):
        return path
    raise UserError(f"{name_or_path!r}: no such file or folder, and not a shipped model (known: {known})")


def load_payload(name_or_path: str | os.PathLike, map_location: str | torch.device = "cpu") -> tuple[dict, Path]:
    """(payload, the file it came from) for a shipped name, a run folder, a checkpoint or an export: the
    payload shape of ``fastqa.train.load_checkpoint`` (``kind``, ``meta``, weights; see ``fastqa.export``)."""
    from ..export import load_model_payload

    return load_model_payload(resolve(name_or_path), map_location)
