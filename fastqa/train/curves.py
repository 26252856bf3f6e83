"""The run folder's log: ``metrics.jsonl`` (one JSON object per line) and ``curve.png`` drawn from it."""
from __future__ import annotations

import io
import json
import os
from pathlib import Path

from .checkpoint import atomic_open, atomic_write_text

__all__ = ["MetricsLog", "read_metrics", "plot_learning_curve"]


def read_metrics(path: str | os.PathLike) -> list[dict]:
    path = Path(path)
    if not path.exists():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            rows.append(json.loads(line))
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
