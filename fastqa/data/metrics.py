"""A training run's log: ``metrics.jsonl`` in the run folder, one JSON object per line, written by the training
loop (``fastqa.train``) and read back by it on resume and by :func:`fastqa.plots.plot_learning_curve` (which draws
``curve.png`` from it): a file format below both, so that neither imports the other's package."""
from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

from .files import atomic_write_text, no_room_error
from ..errors import UserError

__all__ = ["MetricsLog", "read_metrics"]


def read_metrics(path: str | os.PathLike) -> list[dict]:
    """The rows of a ``metrics.jsonl``. A last line that is not a whole JSON object -- what a crash in the
    middle of appending one leaves -- is dropped with a warning naming the file and line; a bad line
    anywhere else is a ``UserError`` (the file was edited or damaged, and guessing would hide it)."""
    path = Path(path)
    if not path.exists():
        return []
    # The rows are written with ASCII escapes, so only a torn last line can hold a cut multi-byte character.
    lines = path.read_bytes().decode("utf-8", errors="replace").splitlines()
    numbered = [(i, line) for i, line in enumerate(lines, 1) if line.strip()]
    rows = []
    for i, line in numbered:
        try:
            row = json.loads(line)
            if not isinstance(row, dict):
                raise ValueError("not a JSON object")
        except ValueError as e:
            if i == numbered[-1][0]:
                warnings.warn(f"{path}: line {i}: dropped an incomplete last line (a run stopped while writing "
                              "it)", RuntimeWarning, stacklevel=2)
                break
            raise UserError(f"{path}: line {i}: not a JSON object ({e})") from None
        rows.append(row)
    return rows


class MetricsLog:
    """Appends rows to ``out_dir/metrics.jsonl``. On resume, rows logged after the checkpoint's step by the
    interrupted run are dropped, so the file reads as one uninterrupted run."""

    def __init__(self, out_dir: str | os.PathLike, *, resume_step: int | None = None) -> None:
        self.path = Path(out_dir) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        rows = read_metrics(self.path) if resume_step is not None else []
        kept = [r for r in rows if r.get("step", 0) <= resume_step] if resume_step is not None else []
        atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in kept))

    def write(self, row: dict) -> None:
        try:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps(row) + "\n")
        except OSError as e:  # a full disk: one line naming the file
            raise no_room_error(self.path, e, what="a metrics row",
                                kept="the rows before it are kept (a cut last line is dropped when read)") or e from None
