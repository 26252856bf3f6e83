"""The run folder's log: ``metrics.jsonl`` (one JSON object per line) and ``curve.png`` drawn from it."""
from __future__ import annotations

import io
import json
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from ..data.files import atomic_open, atomic_write_text
from ..errors import UserError

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["MetricsLog", "read_metrics", "figure_format", "learning_curve_figure", "plot_learning_curve"]


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


# A series with at most this many points gets a marker on each: few evaluations read as points joined by
# lines, and a single one is visible at all; a dense series (the train loss) stays a plain line.
MARKER_MAX_POINTS = 30

# Row fields that describe the row rather than measure the model.
_NOT_METRICS = frozenset({"kind", "step", "epoch", "time", "lr", "steps_per_s"})

# Words of metric names spelled out for legends ("val_ppl" -> "validation perplexity").
_WORDS = {"val": "validation", "ppl": "perplexity", "bleu": "BLEU", "f1": "F1", "em": "EM",
          "exact": "EM", "hasans": "HasAns", "noans": "NoAns"}


@dataclass
class _Panel:
    """One subplot: the metrics that share its y axis (so share a scale and a unit) and the axis label."""
    ylabel: str
    log_scale_ok: bool = False
    series: list[tuple[str, list[float], list[float]]] = field(default_factory=list)  # (label, steps, values)


def figure_format(path: str | os.PathLike) -> str:
    """The image format of ``path`` by its suffix (png, pdf, svg...); a ``UserError`` if matplotlib cannot
    write it, so a caller can check an output path before any work is done."""
    from matplotlib.backend_bases import FigureCanvasBase

    fmt = Path(path).suffix.lstrip(".").lower()
    supported = FigureCanvasBase.get_supported_filetypes()
    if fmt not in supported:
        raise UserError(f"{path}: cannot write a plot in format {fmt or '(no suffix)'!r}; "
                        f"use one of .{', .'.join(sorted(supported))}")
    return fmt


def _panel_key(metric: str) -> str:
    """Which subplot a metric belongs on. Metrics of different scales never share one: BLEU (0-100) and
    perplexity (1 to thousands) on one axis would flatten each other."""
    low = metric.lower()
    if low.endswith("loss"):
        return "loss"
    if low.endswith(("_f1", "_exact", "_em")) or low in ("em", "f1", "exact", "exact_match"):
        return "percent"
    if "bleu" in low:
        return "bleu"
    if low.endswith("ppl") or "perplexity" in low:
        return "perplexity"
    return metric  # an unknown metric gets a subplot of its own, labelled with its name


def _series_label(metric: str, kind: str) -> str:
    """A legend entry: the train rows' ``loss`` is "train loss"; eval names are spelled out."""
    if kind == "train":
        return f"train {metric.replace('_', ' ')}"
    return " ".join(_WORDS.get(word.lower(), word) for word in metric.split("_"))


def _panels(rows: Sequence[dict]) -> list[_Panel]:
    """Group the numeric metrics of ``rows`` into subplots, in reading order: loss, EM/F1, BLEU,
    perplexity, then any other metric alone."""
    series: dict[tuple[str, str], tuple[list[float], list[float]]] = {}
    for row in sorted((r for r in rows if _is_number(r.get("step"))), key=lambda r: r["step"]):
        kind = row.get("kind", "")
        for key, value in row.items():
            if key not in _NOT_METRICS and _is_number(value):
                steps, values = series.setdefault((kind, key), ([], []))
                steps.append(row["step"])
                values.append(value)
    # A perplexity is exp(loss per token), so its presence says the loss is a per-token cross-entropy in nats.
    per_token = any(_panel_key(key) == "perplexity" for _, key in series)
    fixed = {"loss": _Panel("loss (nats/token)" if per_token else "loss"),
             "percent": _Panel("EM / F1 (%)"), "bleu": _Panel("BLEU"),
             "perplexity": _Panel("perplexity", log_scale_ok=True)}
    others: dict[str, _Panel] = {}
    # Train rows first, so the train loss takes the first colour of the loss subplot in every run.
    for (kind, key), (steps, values) in sorted(series.items(), key=lambda item: (item[0][0] != "train", item[0])):
        where = _panel_key(key)
        panel = fixed.get(where) or others.setdefault(where, _Panel(key.replace("_", " ")))
        panel.series.append((_series_label(key, kind), steps, values))
    used = [p for p in fixed.values() if p.series] + [others[k] for k in sorted(others)]
    return used or [fixed["loss"]]  # no rows yet: an empty loss subplot rather than no figure


def _is_number(value: object) -> bool:
    # bool is an int subclass, and a flag logged in a row is not a curve
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def learning_curve_figure(rows: Sequence[dict], title: str = "") -> "Figure":
    """The learning-curve figure of ``metrics.jsonl`` rows: one subplot per scale (loss, EM/F1 in %,
    BLEU, perplexity, any other metric alone) against the optimizer step, one figure title, a legend
    where a subplot holds more than one series, and markers on series of at most
    ``MARKER_MAX_POINTS`` points.

    The figure is not registered with pyplot (nothing to close, and no backend is switched in the caller's
    process); draw it with ``fig.savefig``.
    """
    from matplotlib.figure import Figure

    panels = _panels(rows)
    fig = Figure(figsize=(0.6 + 4.0 * len(panels), 3.6))
    axes = fig.subplots(1, len(panels), sharex=True, squeeze=False)[0]
    for ax, panel in zip(axes, panels):
        for label, steps, values in panel.series:
            dense = len(steps) > MARKER_MAX_POINTS
            ax.plot(steps, values, label=label, lw=1.0 if dense else 1.5,
                    marker=None if dense else "o", markersize=4)
        values = [v for _, _, vs in panel.series for v in vs if v > 0]
        # A perplexity falls from hundreds to single digits; a log axis keeps the late, small changes visible.
        if panel.log_scale_ok and values and max(values) / min(values) > 20:
            ax.set_yscale("log")
        ax.set_xlabel("optimizer step")
        ax.set_ylabel(panel.ylabel)
        ax.grid(True, alpha=0.3)
        if len(panel.series) > 2:
            # Many series (SQuAD v2's EM, F1, HasAns, NoAns, best) fill the plot: the legend goes beside it.
            ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)
        elif len(panel.series) > 1:
            ax.legend(fontsize="small")
        if not panel.series:
            ax.text(0.5, 0.5, "no metrics logged yet", ha="center", va="center", transform=ax.transAxes)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_learning_curve(metrics_path: str | os.PathLike, out_path: str | os.PathLike, title: str = "") -> "Figure":
    """Draw ``metrics_path``'s learning curves (see :func:`learning_curve_figure`) into ``out_path``, in the
    format its suffix names (``curve.png``, ``curve.pdf``, ``curve.svg``...); written atomically, so a
    reader never sees half a picture. Returns the figure."""
    fmt = figure_format(out_path)
    fig = learning_curve_figure(read_metrics(metrics_path), title)
    # Rendered in memory first: a drawing error leaves the previous picture in place.
    buf = io.BytesIO()
    fig.savefig(buf, format=fmt, dpi=100)
    with atomic_open(out_path, "wb") as f:
        f.write(buf.getvalue())
    return fig

