"""Every figure of the package, and the one rule for where and how a figure is written.

* :func:`figure_format`: the format by the path's suffix (any format matplotlib writes: .png, .pdf, .svg,
  .eps...); a ``UserError`` naming the flag or the path otherwise, so a command checks its output path
  before any work is done.
* :func:`save_figure`: rendered in memory, then written atomically (a drawing error leaves the previous
  file in place), at 100 dpi.
* The figures: :func:`span_probability_figure` (a reader's start/end probabilities around its answer),
  :func:`attention_figure` (a translation's attention map), :func:`learning_curve_figure` (a run's
  ``metrics.jsonl``) and :func:`reliability_figure` (a reliability diagram of predicted confidences), each
  with a ``plot_*`` twin that draws it into a file.
* :func:`reliability_bins` and :func:`expected_calibration_error`: the calibration statistics behind the
  reliability diagram (numpy only).

Figures are ``matplotlib.figure.Figure`` objects, never registered with pyplot: nothing to close, and the
caller's backend is untouched. matplotlib is imported only when a figure is drawn or a format checked.
"""
from __future__ import annotations

import io
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from .data.files import atomic_open
from .data.metrics import read_metrics
from .errors import UserError

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["figure_format", "save_figure",
           "span_probability_figure", "plot_span_probabilities",
           "attention_figure", "plot_attention_map",
           "learning_curve_figure", "plot_learning_curve",
           "reliability_bins", "expected_calibration_error", "reliability_figure", "plot_reliability"]

# Named first in the error message; the rest of what matplotlib writes follows in alphabetical order.
_COMMON_FORMATS = ("png", "pdf", "svg", "eps")


# ------------------------------------------------------------------------------------------ format and file

def figure_format(path: str | os.PathLike, flag: str | None = None) -> str:
    """The figure format of ``path`` by its suffix, case-insensitive: any format matplotlib can write
    (png, pdf, svg, eps, ps, jpg...). An unknown or missing suffix is a ``UserError`` that names ``flag``
    with the path (``--plot x.foo: unknown figure format '.foo'; use .png, .pdf, ...``), or the path alone."""
    from matplotlib.backend_bases import FigureCanvasBase

    supported = FigureCanvasBase.get_supported_filetypes()
    suffix = Path(path).suffix
    fmt = suffix[1:].lower()
    if fmt in supported:
        return fmt
    where = f"{flag} {os.fspath(path)}" if flag else os.fspath(path)
    names = [f for f in _COMMON_FORMATS if f in supported] + sorted(set(supported) - set(_COMMON_FORMATS))
    what = f"unknown figure format {suffix!r}" if suffix else "no suffix to tell the figure format"
    raise UserError(f"{where}: {what}; use .{', .'.join(names)}")


def save_figure(fig: "Figure", path: str | os.PathLike, flag: str | None = None) -> None:
    """Write ``fig`` to ``path`` in the format of its suffix (see :func:`figure_format`; ``flag`` names the
    option in its error), at 100 dpi. The figure is rendered in memory first and the file replaced
    atomically: a drawing error, or a crash, leaves the previous file in place and no partial one."""
    fmt = figure_format(path, flag)
    buf = io.BytesIO()
    fig.savefig(buf, format=fmt, dpi=100)
    with atomic_open(path, "wb") as f:
        f.write(buf.getvalue())


def _short(text: str, limit: int) -> str:
    """``text`` on one line, cut to ``limit`` characters with an ellipsis (figure labels stay legible)."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


# ------------------------------------------------------------------------------ a reader's span probabilities

def _answer_field(answer: Any, name: str) -> Any:
    """``answer[name]`` of an answer dict, or ``answer.name`` of an answer object."""
    return answer[name] if isinstance(answer, dict) else getattr(answer, name)


def span_probability_figure(probs: dict, answer: Any, question: str, *, around: int = 40) -> "Figure":
    """p_start and p_end over the context tokens around the answer.

    Only the answer's tokens and ``around`` tokens on each side are drawn (the figure's width is bounded
    whatever the context's length); a note says how many tokens are hidden. probs: ``QAModel.probabilities``
    (possibly one window of a long context); answer: the answer drawn, a dict or an object with ``text``,
    ``score``, ``start`` and ``end``."""
    from matplotlib.figure import Figure

    text, score = _answer_field(answer, "text"), _answer_field(answer, "score")
    offsets, n = probs["offsets"], len(probs["tokens"])
    first_token, total = probs.get("window", (0, n))[0], probs.get("n_tokens", n)
    p_start, p_end = probs["p_start"], probs["p_end"]
    if text:
        start, end = _answer_field(answer, "start"), _answer_field(answer, "end")
        first = next(i for i, (s, e) in enumerate(offsets) if e > start)
        last = max(i for i, (s, e) in enumerate(offsets) if s < end)
    else:  # no answer: centre on the likeliest start
        first = last = max(range(n), key=p_start.__getitem__)
    lo, hi = max(0, first - around), min(n, last + around + 1)
    xs = list(range(first_token + lo, first_token + hi))      # positions in the whole context
    shown = hi - lo
    fig = Figure(figsize=(min(4.0 + 0.16 * shown, 18.0), 4.8))
    ax = fig.subplots()
    if p_end is None:  # a single-word reader: the answer ends where it starts
        ax.plot(xs, p_start[lo:hi], marker="o", markersize=4, linewidth=1, color="tab:blue", label="p(answer word)")
    else:
        # Hollow start markers drawn larger than the end's: where both peak on one token, both stay visible.
        ax.plot(xs, p_start[lo:hi], marker="o", markersize=7, markerfacecolor="none", linewidth=1, color="tab:blue",
                label="p(start)")
        ax.plot(xs, p_end[lo:hi], marker="s", markersize=3, linewidth=1, color="tab:orange", label="p(end)")
    if text:
        ax.axvspan(first_token + first - 0.5, first_token + last + 0.5, color="tab:green", alpha=0.15,
                   label="answer")
    ax.set_xticks(xs)
    ax.set_xticklabels([_short(t, 16) for t in probs["tokens"][lo:hi]], rotation=90, fontsize=7)
    ax.set_xlim(xs[0] - 0.5, xs[-1] + 0.5)
    ax.set_ylim(0, 1.05)
    ax.set_xlabel(f"context token (positions {xs[0]}–{xs[-1]} of 0–{total - 1})")
    ax.set_ylabel("probability")
    fig.suptitle(f"Q: {_short(question, 100)}", fontsize=10)
    shown_answer = f"A: {_short(text, 60)!r}" if text else "A: (no answer)"
    detail = f"score {score:.3f}"
    if probs.get("p_null") is not None:
        detail += f", p(no answer) = {probs['p_null']:.3f}"
    ax.set_title(f"{shown_answer}   {detail}", fontsize=9)
    hidden_before, hidden_after = first_token + lo, total - (first_token + hi)
    if hidden_before or hidden_after:
        fig.text(0.01, 0.01, f"{hidden_before + hidden_after} tokens not shown ({hidden_before} before, "
                 f"{hidden_after} after)", fontsize=8, color="0.35")
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    return fig


def plot_span_probabilities(probs: dict, answer: Any, question: str, path: str | os.PathLike) -> "Figure":
    """Draw :func:`span_probability_figure` into ``path`` (see :func:`save_figure`). Returns the figure."""
    figure_format(path)  # a bad suffix fails before the drawing
    fig = span_probability_figure(probs, answer, question)
    save_figure(fig, path)
    return fig


# ---------------------------------------------------------------------------- a translation's attention map

def attention_figure(amap: Any) -> "Figure":
    """Heat map of an attention map (``.source`` and ``.target`` tokens, ``.weights`` [T, S]): source tokens
    along the x axis, target tokens down the y axis, a colour bar of the attention weight.

    The figure grows with the sentences up to a bound (a 100-token sentence gives a page, not a poster);
    the tick labels shrink with the cells down to a legible size, then label every k-th token.
    """
    from matplotlib.figure import Figure

    def tick_labels(tokens: Sequence[str], span_in: float) -> tuple[list[int], list[str], float]:
        """Where to put the tick labels of ``tokens`` along an axis ``span_in`` inches long, what they say, and
        their font size: the size follows the cell (bounded, so a short sentence is not shouted and a long one
        stays readable), and when even the smallest size would overlap, every k-th token is labelled."""
        smallest, largest = 6.0, 10.0
        cell_pt = 72.0 * span_in / max(len(tokens), 1)
        size = min(largest, max(smallest, 0.8 * cell_pt))
        every = max(1, math.ceil(1.2 * size / cell_pt))
        # A long piece (a URL, a compound) would push the heat map aside: it is cut to a bounded width.
        shown = [t if len(t) <= 18 else t[:17] + "\u2026" for t in tokens]
        where = list(range(0, len(tokens), every))
        return where, [shown[i] for i in where], size

    weights = amap.weights
    weights = weights.float().numpy() if hasattr(weights, "float") else np.asarray(weights, dtype=np.float32)
    n_src, n_tgt = len(amap.source), len(amap.target)
    # About a third of an inch a cell, within bounds; the margins hold the labels and the colour bar.
    width = min(14.0, max(4.5, 0.32 * n_src + 2.5))
    height = min(11.0, max(3.5, 0.32 * n_tgt + 1.8))
    fig = Figure(figsize=(width, height))
    ax = fig.subplots()
    im = ax.imshow(weights, cmap="bone", aspect="auto", vmin=0.0, interpolation="nearest")
    x_at, x_text, x_size = tick_labels(amap.source, width - 2.5)
    y_at, y_text, y_size = tick_labels(amap.target, height - 1.8)
    # Slanted labels read left to right while a few fit; past that only upright ones keep clear of each other.
    if n_src <= 16:
        ax.set_xticks(x_at, x_text, fontsize=x_size, rotation=45, ha="right", rotation_mode="anchor")
    else:
        ax.set_xticks(x_at, x_text, fontsize=x_size, rotation=90)
    ax.set_yticks(y_at, y_text, fontsize=y_size)
    ax.set_xlabel("source token")
    ax.set_ylabel("target token")
    bar = fig.colorbar(im, ax=ax, fraction=0.05, pad=0.02)
    bar.set_label("attention weight")
    fig.tight_layout()
    return fig


def plot_attention_map(amap: Any, path: str | os.PathLike) -> "Figure":
    """Draw :func:`attention_figure` into ``path`` (see :func:`save_figure`). Returns the figure."""
    figure_format(path)  # a bad suffix fails before the drawing
    fig = attention_figure(amap)
    save_figure(fig, path)
    return fig


# ----------------------------------------------------------------------------------- a run's learning curves

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
    ``MARKER_MAX_POINTS`` points."""
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
    """Draw the learning curves of the ``metrics.jsonl`` at ``metrics_path`` (see :func:`learning_curve_figure`)
    into ``out_path`` (see :func:`save_figure`: ``curve.png``, ``curve.pdf``...). Returns the figure."""

    figure_format(out_path)  # a bad suffix fails before the file is read
    fig = learning_curve_figure(read_metrics(metrics_path), title)
    save_figure(fig, out_path)
    return fig


# --------------------------------------------------------------------------------------------- calibration

def _calibration_inputs(confidences: Any, correct: Any, bins: int) -> tuple[np.ndarray, np.ndarray]:
    """``confidences`` and ``correct`` as float and bool vectors, checked; a ValueError names the argument."""
    if isinstance(bins, bool) or not isinstance(bins, (int, np.integer)) or bins < 1:
        raise ValueError(f"bins: expected an integer >= 1, got {bins!r}")
    try:
        conf = np.asarray(confidences, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError("confidences: expected numbers in [0, 1]") from None
    try:
        raw = np.asarray(correct)
        hits = raw.astype(np.float64)
    except (TypeError, ValueError):
        raise ValueError("correct: expected booleans (or 0 / 1)") from None
    if conf.ndim != 1:
        raise ValueError(f"confidences: expected a flat sequence, got shape {conf.shape}")
    if hits.ndim != 1:
        raise ValueError(f"correct: expected a flat sequence, got shape {hits.shape}")
    if len(conf) != len(hits):
        raise ValueError(f"correct: {len(hits)} items for {len(conf)} confidences; expected one per confidence")
    if len(conf) == 0:
        raise ValueError("confidences: no items; a calibration needs at least one")
    bad = ~((conf >= 0.0) & (conf <= 1.0))  # NaN too
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(f"confidences: item {i} is {conf[i]!r}, outside [0, 1]")
    not_bool = (hits != 0.0) & (hits != 1.0)
    if not_bool.any():
        i = int(np.argmax(not_bool))
        raise ValueError(f"correct: item {i} is {raw[i]!r}; expected booleans (or 0 / 1)")
    return conf, hits.astype(bool)


def reliability_bins(confidences: Any, correct: Any, bins: int = 10) -> list[tuple[float, float, int, float, float]]:
    """The reliability table of predictions with confidence ``confidences[i]`` in [0, 1], right when
    ``correct[i]``: for each of ``bins`` equal-width bins over [0, 1], in order, ``(lo, hi, count,
    mean_confidence, accuracy)`` -- accuracy the fraction of the bin's predictions that are correct. A bin
    holds the confidences in [lo, hi), the last one [lo, 1]; an empty bin has count 0 and NaN mean
    confidence and accuracy. The counts add up to the number of predictions.

    ValueError (naming the argument) for: lengths that differ, no items, a confidence outside [0, 1] or NaN,
    a ``correct`` value other than a boolean or 0 / 1, ``bins`` < 1."""
    conf, hits = _calibration_inputs(confidences, correct, bins)
    edges = np.linspace(0.0, 1.0, bins + 1)
    which = np.clip(np.searchsorted(edges, conf, side="right") - 1, 0, bins - 1)
    counts = np.bincount(which, minlength=bins)
    conf_sums = np.bincount(which, weights=conf, minlength=bins)
    hit_sums = np.bincount(which, weights=hits.astype(np.float64), minlength=bins)
    table = []
    for b in range(bins):
        n = int(counts[b])
        mean_conf, accuracy = (float(conf_sums[b] / n), float(hit_sums[b] / n)) if n else (math.nan, math.nan)
        table.append((float(edges[b]), float(edges[b + 1]), n, mean_conf, accuracy))
    return table


def _ece(table: Sequence[tuple[float, float, int, float, float]]) -> float:
    total = sum(count for _, _, count, _, _ in table)
    return float(sum(count / total * abs(acc - conf) for _, _, count, conf, acc in table if count))


def expected_calibration_error(confidences: Any, correct: Any, bins: int = 10) -> float:
    """The expected calibration error over ``bins`` equal-width confidence bins (see
    :func:`reliability_bins`): the sum over bins of (n_bin / N) * |accuracy - mean confidence|. 0 for a
    perfectly calibrated predictor; at most 1. Same arguments and errors as :func:`reliability_bins`."""
    return _ece(reliability_bins(confidences, correct, bins))


def reliability_figure(confidences: Any, correct: Any, *, bins: int = 10, title: str = "") -> "Figure":
    """A reliability diagram: above, the observed accuracy of each confidence bin as a bar (labelled
    "accuracy") against the diagonal of perfect calibration (labelled "perfect calibration"), and each
    bin's (mean confidence, accuracy) as a point, on the diagonal where the bin is calibrated; below, the
    number of predictions per bin. The title gives the expected calibration error (after ``title`` when
    given). Arguments as :func:`reliability_bins`; empty bins get no bar."""
    from matplotlib.figure import Figure

    table = reliability_bins(confidences, correct, bins)
    ece = _ece(table)
    total = sum(row[2] for row in table)
    filled = [row for row in table if row[2]]
    width = 1.0 / bins
    fig = Figure(figsize=(5.0, 6.0))
    top, bottom = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": (3, 1)})
    top.bar([lo for lo, *_ in filled], [acc for *_, acc in filled], width=width, align="edge",
            color="tab:blue", edgecolor="white", alpha=0.85, label="accuracy")
    top.plot([0.0, 1.0], [0.0, 1.0], linestyle="--", color="0.3", linewidth=1, label="perfect calibration")
    top.plot([conf for *_, conf, _ in filled], [acc for *_, acc in filled], linestyle="none", marker="o",
             markersize=4, color="tab:red", label="bin (mean confidence, accuracy)")
    top.set_xlim(0.0, 1.0)
    top.set_ylim(0.0, 1.0)
    top.set_ylabel("accuracy")
    top.grid(True, alpha=0.3)
    top.legend(fontsize="small", loc="upper left")
    summary = f"ECE = {ece:.3f} ({total} predictions, {bins} bins)"
    top.set_title(f"{title}\n{summary}" if title else summary, fontsize=10)
    bottom.bar([lo for lo, *_ in table], [row[2] for row in table], width=width, align="edge",
               color="0.5", edgecolor="white")
    bottom.set_xlabel("predicted confidence")
    bottom.set_ylabel("count")
    bottom.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def plot_reliability(confidences: Any, correct: Any, path: str | os.PathLike, *, bins: int = 10,
                     title: str = "") -> "Figure":
    """Draw :func:`reliability_figure` into ``path`` (see :func:`save_figure`). Returns the figure."""
    figure_format(path)  # a bad suffix fails before the drawing
    fig = reliability_figure(confidences, correct, bins=bins, title=title)
    save_figure(fig, path)
    return fig
