"""The attention-map figure of a translation: labelled axes and colour bar, tick labels of a bounded size
that stay legible for long sentences, a bounded figure, and the format taken from the file's suffix."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("matplotlib")

from fastqa.errors import UserError  # noqa: E402
from fastqa.plots import figure_format, plot_attention_map  # noqa: E402
from fastqa.tasks.translation.translator import AttentionMap  # noqa: E402


def _amap(n_src: int, n_tgt: int) -> AttentionMap:
    """Rows of attention weights (each sums to 1) over made-up tokens, mostly on the diagonal."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(n_tgt, n_src, generator=g) + 4 * torch.eye(n_tgt, n_src)
    return AttentionMap(source=[f"w{i}" for i in range(n_src - 1)] + ["<eos>"],
                        target=[f"t{i}" for i in range(n_tgt - 1)] + ["<eos>"], weights=logits.softmax(-1))


def _tick_sizes(labels) -> set[float]:
    return {label.get_fontsize() for label in labels}


def test_axes_and_colour_bar_are_labelled(tmp_path):
    fig = plot_attention_map(_amap(6, 5), tmp_path / "a.png")
    ax = fig.axes[0]
    assert ax.get_xlabel() == "source token" and ax.get_ylabel() == "target token"
    assert ax.images[0].colorbar.ax.get_ylabel() == "attention weight"
    assert [t.get_text() for t in ax.get_xticklabels()] == ["w0", "w1", "w2", "w3", "w4", "<eos>"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["t0", "t1", "t2", "t3", "<eos>"]
    assert (tmp_path / "a.png").read_bytes()[:4] == b"\x89PNG"


def test_long_sentences_keep_a_bounded_figure_and_legible_labels(tmp_path):
    short = plot_attention_map(_amap(8, 8), tmp_path / "short.png")
    long = plot_attention_map(_amap(200, 180), tmp_path / "long.png")
    width, height = long.get_size_inches()
    assert width <= 14 and height <= 11
    assert all(short.get_size_inches() < long.get_size_inches())  # it does grow with the sentence
    for fig in (short, long):
        ax = fig.axes[0]
        assert all(6 <= s <= 10 for s in _tick_sizes(ax.get_xticklabels()) | _tick_sizes(ax.get_yticklabels()))
    # A few source tokens are slanted; many stand upright, and past what fits, every k-th one is labelled.
    assert {t.get_rotation() for t in short.axes[0].get_xticklabels()} == {45.0}
    assert {t.get_rotation() for t in long.axes[0].get_xticklabels()} == {90.0}
    assert 1 < len(long.axes[0].get_xticklabels()) < 200


def test_a_very_long_token_is_cut(tmp_path):
    amap = _amap(3, 2)
    amap.source[0] = "donaudampfschifffahrtsgesellschaft"
    fig = plot_attention_map(amap, tmp_path / "a.png")
    first = fig.axes[0].get_xticklabels()[0].get_text()
    assert len(first) <= 18 and first.startswith("donaudampf") and first.endswith("\u2026")


def test_pdf_by_suffix_and_unknown_suffix_is_a_user_error(tmp_path):
    plot_attention_map(_amap(4, 4), tmp_path / "a.PDF")
    assert (tmp_path / "a.PDF").read_bytes()[:4] == b"%PDF"
    assert figure_format("x.Pdf") == "pdf" and figure_format("x.svg") == "svg"
    with pytest.raises(UserError, match=r"a\.notaformat: unknown figure format '\.notaformat'"):
        plot_attention_map(_amap(4, 4), tmp_path / "a.notaformat")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.PDF"]
