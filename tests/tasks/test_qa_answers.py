"""What a reader's answers look like to a user: whole hyphenated words, distinct top-k answers (none overlapping a
better one), and the one JSON shape of ``ask`` and the server."""
import json

import pytest
from cli_helpers import assert_user_error, run_cli
from helpers import SEED_ARGS
from squad_fixtures import make_squad

from fastqa.cli import main
from fastqa.data.tokenize import tokenize
from fastqa.tasks.qa import QAModel
from fastqa.tasks.qa.predictor import answers_json, whole_words

TINY = ["--set", "d_model=32", "--set", "heads=2", "--set", "char_dim=16", "--set", "char_channels=32",
        "--set", "word_dim=32", "--set", "emb_conv_layers=1", "--set", "model_blocks=1", "--set", "dropout=0",
        "--set", "char_dropout=0", "--set", "layer_dropout=0"]


def _span(text: str, start: int, end: int) -> str:
    toks = tokenize(text)
    tokens, offsets = [t for t, _ in toks], [(s, s + len(t)) for t, s in toks]
    i, j = whole_words(tokens, offsets, start, end)
    return text[offsets[i][0]:offsets[j][1]]


@pytest.mark.parametrize("text,start,end,want", [
    ("Octave Delamarre-Fontclaire won.", 0, 1, "Octave Delamarre-Fontclaire"),   # cut at the hyphen: widened
    ("the Jean-Paul Sartre prize", 3, 4, "Jean-Paul Sartre"),                    # widened to the left
    ("a state-of-the-art design", 1, 1, "state-of-the-art"),
    ("from 1990 - 1991 on", 1, 1, "1990"),                                       # a spaced dash joins nothing
    ("Beyoncé's album", 0, 0, "Beyoncé"),                                        # the possessive stays out
])
def test_whole_words(text, start, end, want):
    assert _span(text, start, end) == want


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A tiny QANet trained for a few steps: answers to look at, not good ones."""
    root = tmp_path_factory.mktemp("qa-answers")
    make_squad(root / "train.json", articles=1, paragraphs=4, people=2, seed=5)
    assert main(["qa-train", "--train", str(root / "train.json"), "--dev", str(root / "train.json"), "--out",
                 str(root / "run"), "--cache-dir", str(root / "cache"), "--no-progress", "--lr", "3e-3", "--warmup",
                 "20", "--batch-size", "16", "--threads", "1", *TINY, "--max-steps", "30", "--eval-every", "0",
                 *SEED_ARGS]) == 0
    return root / "run"


def test_top_k_answers_are_distinct_and_best_first(run):
    reader = QAModel.load(run, device="cpu")
    context = ("Ada Lovelace was born in London in 1815. She worked with Charles Babbage on the Analytical Engine, "
               "and in 1843 she published the first algorithm meant for such a machine. She died in London in 1852.")
    for question in ("Where was Ada born?", "When did she publish the algorithm?", "Who did she work with?"):
        answers = reader.answer(context, question, top_k=5)
        assert 1 <= len(answers) <= 5
        assert [a.score for a in answers] == sorted((a.score for a in answers), reverse=True)
        spans = [(a.start, a.end) for a in answers]
        assert all(not (s1 < e2 and s2 < e1) for i, (s1, e1) in enumerate(spans) for s2, e2 in spans[i + 1:])
        assert all(context[a.start:a.end] == a.text for a in answers)
        assert reader.answer(context, question) == answers[0]       # the best answer is the top-k's first
        shape = answers_json(answers)
        assert shape["answer"] == shape["answers"][0] == answers[0].to_dict()
        assert set(shape["answer"]) == {"text", "start", "end", "score", "no_answer_prob", "abstained"}


def test_ask_input_reports_bad_lines_and_answers_the_rest(run, tmp_path, capsys):
    lines = ['{"id": "a", "context": "Ada was born in London.", "question": "Where?"}', "not json",
             '{"id": "b", "question": "Where?"}', '{"id": 7, "context": "Ada was born in 1815.", "question": "When?"}',
             "[1, 2]"]
    path = tmp_path / "q.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    ask = ["ask", "--model", str(run), "--threads", "1"]
    assert_user_error(capsys, [*ask, "--input", path], r"q\.jsonl: line 2: malformed JSON")
    rc, out, err = run_cli(capsys, [*ask, "--input", path, "--skip-bad-lines"])
    assert rc == 0
    rows = [json.loads(line) for line in out.splitlines()]
    assert [r["id"] for r in rows] == ["a", 7] and all(set(r) == {"id", "answer", "answers"} for r in rows)
    assert "line 2: malformed JSON" in err and "line 3: 'context' must be a string (missing)" in err
    assert "line 5: expected a JSON object" in err and "skipped 3 bad lines" in err
    assert_user_error(capsys, [*ask, "--context", "Ada was born.", "--question", "Who?", "--skip-bad-lines"],
                      "--skip-bad-lines skips lines of --input")
