"""fastqa.plots: the one figure-format rule (any format matplotlib writes, by the suffix, the flag named in
the error), atomic figure files, and the reliability diagram with its calibration statistics."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from fastqa.errors import UserError
from fastqa.plots import expected_calibration_error, reliability_bins


def test_importing_plots_imports_no_matplotlib():
    code = "import sys, fastqa.plots; assert not [m for m in sys.modules if m.startswith('matplotlib')]"
    subprocess.run([sys.executable, "-c", code], check=True)


# ------------------------------------------------------------------------------------------ figure format

@pytest.mark.parametrize("name, fmt", [("a.png", "png"), ("a.PDF", "pdf"), ("a.Svg", "svg"), ("a.eps", "eps"),
                                       ("dir.v2/a.b.EPS", "eps"), ("a.ps", "ps")])
def test_figure_format_by_suffix_case_insensitive(name, fmt):
    pytest.importorskip("matplotlib")
    from fastqa.plots import figure_format

    assert figure_format(name) == fmt
    assert figure_format(name, "--plot") == fmt


def test_unknown_or_missing_suffix_names_the_flag_or_the_path():
    pytest.importorskip("matplotlib")
    from fastqa.plots import figure_format

    with pytest.raises(UserError, match=r"^--plot x\.foo: unknown figure format '\.foo'; use \.png, \.pdf, \.svg, "
                                        r"\.eps, "):
        figure_format("x.foo", "--plot")
    with pytest.raises(UserError, match=r"^out/x\.foo: unknown figure format '\.foo'; use \.png"):
        figure_format("out/x.foo")
    with pytest.raises(UserError, match=r"^--plot-attention attn: no suffix to tell the figure format; use \.png"):
        figure_format("attn", "--plot-attention")


def test_eps_for_both_command_line_figures(tmp_path):
    """``.eps`` was refused by ``ask --plot`` and accepted by ``translate --plot-attention``: now both draw it."""
    pytest.importorskip("matplotlib")
    import torch

    from fastqa.plots import plot_attention_map, plot_span_probabilities
    from fastqa.tasks.translation.translator import AttentionMap

    amap = AttentionMap(source=["a", "b", "<eos>"], target=["x", "<eos>"], weights=torch.full((2, 3), 1 / 3))
    plot_attention_map(amap, tmp_path / "attn.eps")
    tokens = ["The", "cat", "sat", "."]
    probs = {"tokens": tokens, "offsets": [(0, 3), (4, 7), (8, 11), (11, 12)],
             "p_start": [0.1, 0.7, 0.1, 0.1], "p_end": [0.05, 0.8, 0.1, 0.05]}
    answer = {"text": "cat", "score": 0.56, "start": 4, "end": 7}
    plot_span_probabilities(probs, answer, "Who sat?", tmp_path / "span.EPS")
    for name in ("attn.eps", "span.EPS"):
        assert (tmp_path / name).read_bytes().startswith(b"%!PS-Adobe")


def test_span_probabilities_take_an_answer_object(tmp_path):
    pytest.importorskip("matplotlib")
    from types import SimpleNamespace

    from fastqa.plots import span_probability_figure
    from fastqa.tasks.qa.predictor import Answer

    probs = {"tokens": ["a", "b", "c"], "offsets": [(0, 1), (2, 3), (4, 5)],
             "p_start": [0.2, 0.6, 0.2], "p_end": [0.1, 0.3, 0.6], "p_null": 0.05}
    as_dict = span_probability_figure(probs, {"text": "b c", "score": 0.36, "start": 2, "end": 5}, "Q?")
    as_obj = span_probability_figure(probs, SimpleNamespace(text="b c", score=0.36, start=2, end=5), "Q?")
    # what QAModel.answer returns (a calibrated reader's score is no longer p_start·p_end: "score")
    as_answer = span_probability_figure(probs, Answer("b c", 2, 5, 0.36, 0.05), "Q?")
    assert as_dict.axes[0].get_title() == as_obj.axes[0].get_title() == as_answer.axes[0].get_title() == \
        "A: 'b c'   score 0.360, p(no answer) = 0.050"
    # no answer: no start / end needed
    none = span_probability_figure(probs, SimpleNamespace(text="", score=0.05), "Q?")
    assert none.axes[0].get_title().startswith("A: (no answer)")


# ------------------------------------------------------------------------------------------ save_figure

def test_save_figure_writes_the_suffix_format_atomically(tmp_path):
    pytest.importorskip("matplotlib")
    from matplotlib.artist import Artist
    from matplotlib.figure import Figure

    from fastqa.plots import save_figure

    fig = Figure()
    fig.subplots().plot([0, 1], [1, 0])
    out = tmp_path / "fig.png"
    save_figure(fig, out)
    before = out.read_bytes()
    assert before.startswith(b"\x89PNG")

    class Broken(Artist):
        def draw(self, renderer):
            raise RuntimeError("cannot draw")

    broken = Figure()
    broken.subplots().add_artist(Broken())
    with pytest.raises(RuntimeError, match="cannot draw"):
        save_figure(broken, out)
    assert out.read_bytes() == before  # the previous picture stays, whole
    with pytest.raises(UserError, match=r"--out .*fig\.txt: unknown figure format '\.txt'"):
        save_figure(fig, tmp_path / "fig.txt", "--out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fig.png"]  # no temporary or partial file left


def test_figures_are_not_registered_with_pyplot(tmp_path):
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from fastqa.plots import learning_curve_figure, reliability_figure

    open_before = plt.get_fignums()
    learning_curve_figure([{"kind": "train", "step": 1, "loss": 1.0}])
    reliability_figure([0.2, 0.9], [False, True])
    assert plt.get_fignums() == open_before


# ------------------------------------------------------------------------------------------ calibration

def _calibrated(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Confidences uniform on [0, 1], each prediction right with exactly that probability."""
    rng = np.random.default_rng(seed)
    conf = rng.uniform(0.0, 1.0, n)
    return conf, rng.uniform(0.0, 1.0, n) < conf


def test_ece_of_a_calibrated_predictor_is_near_zero():
    conf, right = _calibrated(200_000)
    assert expected_calibration_error(conf, right) < 0.01
    assert expected_calibration_error(conf, right, bins=20) < 0.01


def test_ece_of_an_overconfident_predictor_is_large():
    rng = np.random.default_rng(1)
    conf = rng.uniform(0.9, 1.0, 10_000)        # says 90-100 %
    right = rng.uniform(0.0, 1.0, 10_000) < 0.5  # right half the time
    ece = expected_calibration_error(conf, right)
    assert ece == pytest.approx(0.95 - 0.5, abs=0.02)


def test_ece_by_hand():
    # bins of 0.5: [0, 0.5) holds 0.2, 0.4 (mean 0.3, accuracy 0.5); [0.5, 1] holds 0.5, 1.0 (mean 0.75, acc 1)
    ece = expected_calibration_error([0.2, 0.4, 0.5, 1.0], [True, False, True, True], bins=2)
    assert ece == pytest.approx(0.5 * abs(0.5 - 0.3) + 0.5 * abs(1.0 - 0.75))
    assert expected_calibration_error([1.0, 0.0], [1, 0], bins=1) == pytest.approx(0.0)


def test_reliability_bins_cover_zero_to_one_and_add_up():
    conf, right = _calibrated(1_000, seed=2)
    table = reliability_bins(conf, right, bins=7)
    assert len(table) == 7
    assert sum(count for _, _, count, _, _ in table) == 1_000
    assert table[0][0] == 0.0 and table[-1][1] == 1.0
    assert all(a[1] == b[0] for a, b in zip(table, table[1:]))  # contiguous
    for lo, hi, count, mean_conf, accuracy in table:
        in_bin = (conf >= lo) & ((conf < hi) if hi < 1.0 else (conf <= hi))
        assert count == in_bin.sum()
        assert mean_conf == pytest.approx(conf[in_bin].mean()) and accuracy == pytest.approx(right[in_bin].mean())


def test_edges_and_empty_bins():
    table = reliability_bins([0.0, 0.5, 1.0, 1.0], [False, True, True, False], bins=4)
    assert [row[2] for row in table] == [1, 0, 1, 2]  # 1.0 falls in the last bin, 0.5 opens the third
    assert np.isnan(table[1][3]) and np.isnan(table[1][4])
    assert table[3][3:] == (1.0, 0.5)


@pytest.mark.parametrize("conf, right, bins, argument", [
    ([0.5, 0.6], [True], 10, "correct"),
    ([], [], 10, "confidences"),
    ([0.5, 1.2], [True, False], 10, "confidences"),
    ([-0.1], [True], 10, "confidences"),
    ([float("nan")], [True], 10, "confidences"),
    ([[0.5]], [[True]], 10, "confidences"),
    ([0.5], [2], 10, "correct"),
    ([0.5], ["yes"], 10, "correct"),
    ([0.5], [True], 0, "bins"),
    ([0.5], [True], 2.5, "bins"),
])
def test_bad_inputs_are_value_errors_naming_the_argument(conf, right, bins, argument):
    with pytest.raises(ValueError, match=rf"^{argument}:"):
        reliability_bins(conf, right, bins=bins)
    with pytest.raises(ValueError, match=rf"^{argument}:"):
        expected_calibration_error(conf, right, bins=bins)


def test_reliability_figure_has_the_diagonal_the_bars_and_the_counts(tmp_path):
    pytest.importorskip("matplotlib")
    from fastqa.plots import plot_reliability, reliability_figure

    conf, right = _calibrated(2_000, seed=3)
    fig = reliability_figure(conf, right, bins=10, title="dev set")
    top, bottom = fig.axes
    (diagonal,) = [line for line in top.get_lines() if line.get_label() == "perfect calibration"]
    assert list(diagonal.get_xdata()) == [0.0, 1.0] and list(diagonal.get_ydata()) == [0.0, 1.0]
    table = reliability_bins(conf, right, bins=10)
    heights = [bar.get_height() for bar in top.patches]
    assert heights == pytest.approx([acc for *_, acc in table])
    assert [bar.get_x() for bar in top.patches] == pytest.approx([lo for lo, *_ in table])
    assert [bar.get_height() for bar in bottom.patches] == [count for _, _, count, _, _ in table]
    assert bottom.get_ylabel() == "count" and bottom.get_xlabel() == "predicted confidence"
    ece = expected_calibration_error(conf, right, bins=10)
    assert top.get_title().startswith("dev set\n") and f"ECE = {ece:.3f}" in top.get_title()

    # empty bins get no accuracy bar; the file is written in the suffix's format
    fig = plot_reliability([0.95, 0.97, 0.15], [True, False, False], tmp_path / "rel.svg", bins=5)
    assert len(fig.axes[0].patches) == 2 and "ECE = " in fig.axes[0].get_title()
    assert b"<svg" in (tmp_path / "rel.svg").read_bytes()[:1000]
    with pytest.raises(UserError, match="unknown figure format"):
        plot_reliability([0.5], [True], tmp_path / "rel.nope")
