"""Atomic, self-describing checkpoints and atomic writes of anything else a user keeps.

A checkpoint is one ``torch.save`` file holding everything needed to resume exactly (weights, EMA,
optimizer, scheduler, step, position in the data order, RNG states) and to use the model without the
training data (its config and vocabularies, in ``meta``). Every write goes to a temporary file in the same
folder, is flushed to disk, then renamed over the target: a crash leaves the old file or the new one,
never half of one.
"""
from __future__ import annotations

import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, Iterator

import torch

from ..errors import UserError

__all__ = ["FORMAT", "CHECKPOINT_NAME", "save_checkpoint", "load_checkpoint", "inference_weights",
           "atomic_write_text", "atomic_write_json", "atomic_open"]

FORMAT = "fastqa-checkpoint-1"
CHECKPOINT_NAME = "checkpoint.pt"


@contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w", **kwargs: Any) -> Iterator[IO]:
    """Open a temporary file beside ``path``; on success it replaces ``path``, on error it is removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, mode, **kwargs) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        # mkstemp creates 0600; give the file the mode an ordinary open() would (0666 less the umask).
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_open(path, "w", encoding="utf-8") as f:
        f.write(text)


def atomic_write_json(path: str | os.PathLike, obj: Any, *, indent: int | None = 2) -> None:
    atomic_write_text(path, json.dumps(obj, indent=indent, ensure_ascii=False) + "\n")


def save_checkpoint(out_dir: str | os.PathLike, payload: dict, name: str = CHECKPOINT_NAME) -> Path:
    """Write ``payload`` (plus the format tag) to ``out_dir/name`` atomically; returns the path."""
    path = Path(out_dir) / name
    with atomic_open(path, "wb") as f:
        torch.save({"format": FORMAT, **payload}, f)
    return path


def load_checkpoint(path_or_dir: str | os.PathLike, map_location: str | torch.device = "cpu") -> dict:
    """The payload of a fastqa checkpoint file, or of ``DIR/checkpoint.pt`` when given a folder."""
    path = Path(path_or_dir)
    if path.is_dir():
        path = path / CHECKPOINT_NAME
    if not path.is_file():
        raise UserError(f"{path}: no such checkpoint (train a model into that folder first)")
    try:
        # weights_only=False: the payload holds plain Python objects (config dicts, vocabularies, RNG states)
        # that the loader of torch>=2.6 would refuse; only load checkpoints you trust, as with torch.load.
        payload = torch.load(path, map_location=map_location, weights_only=False)
    except Exception as e:
        raise UserError(f"{path}: not a readable checkpoint ({type(e).__name__}: {e})") from e
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise UserError(f"{path}: not a fastqa checkpoint (format {payload.get('format') if isinstance(payload, dict) else None!r})")
    return payload


def inference_weights(payload: dict) -> dict:
    """The weights to predict with: the EMA's when the run kept one (the paper evaluates with them)."""
    return payload.get("ema") or payload["model"]
