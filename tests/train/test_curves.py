"""The learning-curve figure drawn from ``metrics.jsonl``: one subplot per scale (loss, EM/F1, BLEU,
perplexity), axis labels with units, markers on sparse series, one title, legends only where series share
an axis, and the output format taken from the file's suffix."""
from __future__ import annotations

import math

import pytest

pytest.importorskip("matplotlib")

from fastqa.errors import UserError  # noqa: E402
from fastqa.plots import MARKER_MAX_POINTS, learning_curve_figure, plot_learning_curve  # noqa: E402
from fastqa.data.metrics import MetricsLog  # noqa: E402


def _rows(evals: list[dict], *, train_steps: int = 100, every: int = 20) -> list[dict]:
    """Train rows at every step 1..train_steps (a dense series) and one eval row per dict of ``evals``,
    ``every`` steps apart, as the training loop logs them."""
    rows = [{"kind": "train", "step": s, "epoch": 0, "loss": 5.0 / s, "lr": 1e-3, "steps_per_s": 2.0,
             "time": s * 0.5} for s in range(1, train_steps + 1)]
    rows += [{"kind": "eval", "step": every * (i + 1), "epoch": i, "time": 1.0, **m} for i, m in enumerate(evals)]
    return rows


def _mt_rows(n: int = 5, **kw) -> list[dict]:
    return _rows([{"val_loss": 3.0 - 0.2 * i, "val_ppl": math.exp(3.0 - 0.2 * i), "val_bleu": 10.0 + 3 * i}
                  for i in range(n)], **kw)


def _qa_rows(n: int = 5, *, v2: bool = False) -> list[dict]:
    def metrics(i: int) -> dict:
        m = {"dev_loss": 7.0 - 0.3 * i, "EM": 20.0 + 2 * i, "F1": 30.0 + 2 * i}
        if v2:
            m.update(HasAns_f1=10.0 + i, NoAns_f1=90.0 - i, best_f1=55.0)
        return m
    return _rows([metrics(i) for i in range(n)])


def _lines(fig) -> dict:
    """Every plotted series of ``fig`` by its legend label, with the Axes it is on."""
    return {line.get_label(): (ax, line) for ax in fig.axes for line in ax.get_lines()}


def test_sparse_series_get_markers_and_dense_ones_do_not():
    fig = learning_curve_figure(_mt_rows(5))
    lines = _lines(fig)
    assert lines["train loss"][1].get_marker() in (None, "None", "")
    for label in ("validation loss", "validation BLEU", "validation perplexity"):
        assert lines[label][1].get_marker() == "o", label
    # Past the bound, an eval series is dense too: a line without markers.
    dense = learning_curve_figure(_mt_rows(MARKER_MAX_POINTS + 1, train_steps=10, every=1))
    assert _lines(dense)["validation BLEU"][1].get_marker() in (None, "None", "")
    # A single evaluation is a visible point, not a line of length zero.
    assert _lines(learning_curve_figure(_mt_rows(1)))["validation BLEU"][1].get_marker() == "o"


def test_translation_metrics_each_on_an_axis_with_its_unit():
    fig = learning_curve_figure(_mt_rows())
    assert [ax.get_ylabel() for ax in fig.axes] == ["loss (nats/token)", "BLEU", "perplexity"]
    assert {ax.get_xlabel() for ax in fig.axes} == {"optimizer step"}
    lines = _lines(fig)
    assert lines["train loss"][0] is lines["validation loss"][0]
    # BLEU (tens) and perplexity (from thousands down to single digits) never share a y axis.
    assert lines["validation BLEU"][0] is not lines["validation perplexity"][0]
    assert lines["validation BLEU"][0].get_ylabel() == "BLEU"
    assert lines["validation perplexity"][0].get_ylabel() == "perplexity"


def test_qa_metrics_on_a_loss_axis_and_a_percent_axis():
    fig = learning_curve_figure(_qa_rows(v2=True))
    assert [ax.get_ylabel() for ax in fig.axes] == ["loss", "EM / F1 (%)"]
    lines = _lines(fig)
    assert lines["dev loss"][0].get_ylabel() == "loss"
    for label in ("EM", "F1", "HasAns F1", "NoAns F1", "best F1"):
        assert lines[label][0].get_ylabel() == "EM / F1 (%)", label


def test_one_figure_title_and_legends_only_where_series_share_an_axis():
    fig = learning_curve_figure(_mt_rows(), title="convs2s: run-a")
    assert fig._suptitle is not None and fig._suptitle.get_text() == "convs2s: run-a"
    assert all(ax.get_title() == "" for ax in fig.axes)  # the subplots do not repeat it
    loss_ax, bleu_ax, ppl_ax = fig.axes
    legend = loss_ax.get_legend()
    assert legend is not None and [t.get_text() for t in legend.get_texts()] == ["train loss", "validation loss"]
    assert bleu_ax.get_legend() is None and ppl_ax.get_legend() is None  # the y label names the one series
    assert learning_curve_figure(_mt_rows())._suptitle is None


def test_other_metrics_alone_and_non_metrics_ignored():
    rows = _rows([{"val_loss": 1.0, "accuracy": 0.5, "converged": True}])
    fig = learning_curve_figure(rows)
    assert [ax.get_ylabel() for ax in fig.axes] == ["loss", "accuracy"]
    labels = set(_lines(fig))
    assert labels == {"train loss", "validation loss", "accuracy"}  # no lr, steps_per_s, time, epoch, flag


def test_perplexity_spanning_decades_is_on_a_log_axis():
    rows = _rows([{"val_ppl": p} for p in (900.0, 60.0, 12.0, 8.0)])
    assert learning_curve_figure(rows).axes[-1].get_yscale() == "log"
    assert learning_curve_figure(_mt_rows(2)).axes[-1].get_yscale() == "linear"


def test_no_rows_yet_gives_an_empty_loss_axis():
    fig = learning_curve_figure([])
    assert [ax.get_ylabel() for ax in fig.axes] == ["loss"]


@pytest.mark.parametrize("name, magic", [("curve.png", b"\x89PNG"), ("curve.pdf", b"%PDF"),
                                         ("CURVE.SVG", b"<?xml")])
def test_plot_learning_curve_writes_the_suffix_format(tmp_path, name, magic):
    log = MetricsLog(tmp_path)
    for row in _mt_rows(3):
        log.write(row)
    fig = plot_learning_curve(log.path, tmp_path / name, title="convs2s: run")
    assert (tmp_path / name).read_bytes().startswith(magic)
    assert [ax.get_ylabel() for ax in fig.axes] == ["loss (nats/token)", "BLEU", "perplexity"]
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_unknown_suffix_is_a_user_error_before_writing(tmp_path):
    MetricsLog(tmp_path).write(_qa_rows(1)[-1])
    with pytest.raises(UserError, match=r"curve\.notaformat: unknown figure format '\.notaformat'"):
        plot_learning_curve(tmp_path / "metrics.jsonl", tmp_path / "curve.notaformat")
    with pytest.raises(UserError, match="no suffix"):
        plot_learning_curve(tmp_path / "metrics.jsonl", tmp_path / "curve")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]
