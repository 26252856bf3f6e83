"""The trained models that ship with the package, by name.

Each is a slim export (``fastqa export RUN fastqa/pretrained/NAME --half``, see ``fastqa.export``) in a
folder beside this file; the wheel carries the folders as package data. A model's ``load()`` with no
argument reads its task's default here, and ``load("NAME")`` any of them::

    from fastqa.pretrained import resolve, load_payload
    resolve("qanet-small-squad")          # -> .../fastqa/pretrained/qanet-small-squad
    payload, where = load_payload("convs2s-small-multi30k")   # what Translator.load consumes
    payload, where = load_payload("runs/my-run")              # a path that exists always wins

This module imports no torch until a payload is read, so a command line can resolve names cheaply.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import UserError

if TYPE_CHECKING:
    import torch

__all__ = ["NAMES", "DEFAULTS", "FOLDER", "resolve", "load_payload", "available"]

#: shipped model name -> its folder under ``FOLDER``
NAMES: dict[str, str] = {
    "qanet-small-squad": "qanet-small-squad",
    "convs2s-small-multi30k": "convs2s-small-multi30k",
}
#: the model each task's ``load()`` reads when given no name or path
DEFAULTS: dict[str, str] = {"qa": "qanet-small-squad", "translation": "convs2s-small-multi30k"}
#: where the shipped folders live (tests point it at a temporary folder)
FOLDER: Path = Path(__file__).resolve().parent

_MARKER = "config.json"  # an export is present when its config is (fastqa.export checks the rest on load)


def available() -> list[str]:
    """The names whose files are present in this installation."""
    return [name for name, sub in NAMES.items() if (FOLDER / sub / _MARKER).is_file()]


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
