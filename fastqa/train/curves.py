"""The run folder's log: ``metrics.jsonl`` (one JSON object per line) and ``curve.png`` drawn from it."""
from __future__ import annotations

import io
import json
import os
import warnings
from pathlib import Path

from ..data.files import atomic_open, atomic_write_text
from ..errors import UserError

__all__ = ["MetricsLog", "read_metrics", "plot_learning_curve"]


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
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")


def plot_learning_curve(metrics_path: str | os.PathLike, out_png: str | os.PathLike, title: str = "") -> None:
    """Train loss (left) and every evaluation metric (right) against the step; written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(metrics_path)
    train = [r for r in rows if r.get("kind") == "train"]
    evals = [r for r in rows if r.get("kind") == "eval"]
    skip = {"kind", "step", "epoch", "time", "lr", "steps_per_s"}
    eval_keys = sorted({k for r in evals for k, v in r.items() if k not in skip and isinstance(v, (int, float))})
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    if train:
        axes[0].plot([r["step"] for r in train], [r["loss"] for r in train], lw=1, label="train loss")
    loss_keys = [k for k in eval_keys if "loss" in k]
    for k in loss_keys:
        axes[0].plot([r["step"] for r in evals if k in r], [r[k] for r in evals if k in r], "o-", label=k)
    axes[0].set_xlabel("step")
    axes[0].set_ylabel("loss")
    axes[0].legend()
    for k in eval_keys:
        if k not in loss_keys:
            axes[1].plot([r["step"] for r in evals if k in r], [r[k] for r in evals if k in r], "o-", label=k)
    axes[1].set_xlabel("step")
    axes[1].set_ylabel("evaluation")
    if any(k not in loss_keys for k in eval_keys):
        axes[1].legend()
    fig.suptitle(title)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    with atomic_open(out_png, "wb") as f:
        f.write(buf.getvalue())
