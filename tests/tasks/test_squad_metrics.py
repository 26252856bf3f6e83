"""Official SQuAD EM/F1 (v1.1 and v2.0 semantics) against hand-computed values; missing, unknown, int and
duplicate question ids."""
import json
import logging
import subprocess
import sys

import pytest

from fastqa.tasks.qa.metric import (evaluate, evaluate_v1, evaluate_v2, exact_match, f1, format_result, is_v2,
                                  normalize_answer)


@pytest.mark.parametrize("text, expected", [
    ("The  Quick, brown fox!", "quick brown fox"),
    ("an apple a day", "apple day"),
    ("Theater", "theater"),                 # articles only as whole words
    ("A-ha", "aha"),                        # punctuation goes before the articles: "a-ha" -> "aha"
    ("¿Qué?", "¿qué"),                      # only ASCII punctuation is dropped
    ("don't\tstop\n", "dont stop"),
    ("the", ""),
    ("", ""),
    ("ÉCOLE   Normale", "école normale"),
])
def test_normalize_answer(text, expected):
    assert normalize_answer(text) == expected


def test_exact_match_and_f1_by_hand():
    assert exact_match("The Denver Broncos.", "denver broncos") == 1
    assert exact_match("Denver", "Denver Broncos") == 0
    # "cat sat on mat" vs "cat on mat": 3 common tokens, P = 3/4, R = 1 -> 6/7
    assert f1("the cat sat on the mat", "a cat on a mat") == pytest.approx(6 / 7, abs=1e-15)
    # multiset overlap: [x y y] vs [y y y z] share y twice -> P = 2/3, R = 1/2 -> 4/7
    assert f1("x y y", "y y y z") == pytest.approx(4 / 7, abs=1e-15)
    assert f1("nothing shared", "at all") == 0
    # v1.1: an empty side gives 0; v2.0: 1 when both are empty
    assert f1("", "") == 0
    assert f1("", "", v2=True) == 1
    assert f1("the", ".", v2=True) == 1      # both normalise to no tokens
    assert f1("", "Paris", v2=True) == 0


def _v1_data():
    return {"version": "1.1", "data": [{"title": "t", "paragraphs": [{"context": "...", "qas": [
        {"id": "q1", "question": "?", "answers": [{"text": "Denver Broncos", "answer_start": 0},
                                                  {"text": "The Denver Broncos", "answer_start": 0}]},
        {"id": "q2", "question": "?", "answers": [{"text": "1990s", "answer_start": 0}]},
        {"id": "q3", "question": "?", "answers": [{"text": "x", "answer_start": 0}]},
    ]}]}]}


def test_v1_counts_every_question_missing_prediction_scores_zero():
    preds = {"q1": "denver broncos.", "q2": "in the 1990s"}   # q3 unanswered
    result = evaluate_v1(_v1_data(), preds)
    # q1: EM 1, F1 1. q2: "in 1990s" vs "1990s": EM 0, P = 1/2, R = 1 -> F1 2/3. q3: 0.
    f1_q2 = (2 * 0.5 * 1.0) / (0.5 + 1.0)
    assert result == {"exact_match": 100.0 * 1 / 3, "f1": 100.0 * (1 + f1_q2) / 3}
    assert result["exact_match"] == 33.333333333333336
    assert result["f1"] == 55.55555555555555
    assert list(result) == ["exact_match", "f1"]
    assert format_result(result) == '{"exact_match": 33.333333333333336, "f1": 55.55555555555555}'


def _v2_data():
    qas = [
        {"id": "A", "question": "?", "answers": [{"text": "Paris", "answer_start": 0}]},
        {"id": "B", "question": "?", "answers": [{"text": "the", "answer_start": 0}]},   # normalises to ""
        {"id": "C", "question": "?", "answers": [], "is_impossible": True},
        {"id": "D", "question": "?", "answers": [], "is_impossible": True},
        {"id": "E", "question": "?", "answers": [{"text": "big red dog", "answer_start": 0}]},
        {"id": "F", "question": "?", "answers": [{"text": "blue", "answer_start": 0}]},
    ]
    return {"version": "v2.0", "data": [{"title": "t", "paragraphs": [{"context": "...", "qas": qas}]}]}


V2_PREDS = {"A": "Paris", "B": "the", "C": "", "D": "something", "E": "red dog", "F": ""}
F1_E = (2 * 1.0 * (2 / 3)) / (1.0 + 2 / 3)   # "red dog" vs "big red dog": P = 1, R = 2/3


def test_v2_edge_cases_by_hand():
    result = evaluate_v2(_v2_data(), V2_PREDS)
    # A right; B's only gold answer normalises to "" so "the" (also "") is right; C right (""); D wrong;
    # E partial; F wrong (empty prediction for an answerable question).
    assert result["exact"] == 100.0 * 3 / 6 == 50.0
    assert result["f1"] == 100.0 * (1 + 1 + 1 + 0 + F1_E + 0) / 6
    assert result["total"] == 6
    # B has an answer in the file, so it counts as HasAns even though its gold normalises to "".
    assert (result["HasAns_exact"], result["HasAns_total"]) == (50.0, 4)
    assert result["HasAns_f1"] == 100.0 * (1 + 1 + F1_E + 0) / 4
    assert (result["NoAns_exact"], result["NoAns_f1"], result["NoAns_total"]) == (50.0, 50.0, 2)
    assert list(result) == ["exact", "f1", "total", "HasAns_exact", "HasAns_f1", "HasAns_total",
                            "NoAns_exact", "NoAns_f1", "NoAns_total"]


def test_v2_best_thresholds_by_hand():
    na = {"A": 0.1, "B": 0.2, "C": 0.9, "D": 0.6, "E": 0.3, "F": 0.7}
    result = evaluate_v2(_v2_data(), V2_PREDS, na)
    # Start: all answered "" -> the 2 NoAns right. By na_prob: A +1 (3, t .1), B +1 (4, t .2), E +0 / +0.8,
    # D -1 (a non-empty answer to an unanswerable question), F +0, C 0.
    assert (result["best_exact"], result["best_exact_thresh"]) == (100.0 * 4 / 6, 0.2)
    assert (result["best_f1"], result["best_f1_thresh"]) == (100.0 * (2 + 1 + 1 + F1_E) / 6, 0.3)
    assert list(result)[-4:] == ["best_exact", "best_exact_thresh", "best_f1", "best_f1_thresh"]
    # The na-probs do not change the plain scores at the default threshold 1.0 ...
    assert result["exact"] == 50.0
    # ... but at 0.5, D (0.6), F (0.7), C (0.9) become "": D and C right, F wrong.
    cut = evaluate_v2(_v2_data(), V2_PREDS, na, na_prob_thresh=0.5)
    assert cut["exact"] == 100.0 * 4 / 6
    assert cut["f1"] == 100.0 * (1 + 1 + 1.0 + 1.0 + F1_E + 0.0) / 6
    text = format_result(result)
    assert json.loads(text) == result and text.startswith('{\n  "exact": 50.0,')


def test_v2_threshold_ties_keep_the_na_prob_file_order():
    # D (wrong non-empty answer, -1) and A (right, +1) tie at 0.5: the file's order decides, as official.
    preds = dict(V2_PREDS)
    first_a = evaluate_v2(_v2_data(), preds, {"A": 0.5, "D": 0.5, "B": 0.9, "C": 0.9, "E": 0.9, "F": 0.9})
    first_d = evaluate_v2(_v2_data(), preds, {"D": 0.5, "A": 0.5, "B": 0.9, "C": 0.9, "E": 0.9, "F": 0.9})
    assert (first_a["best_exact"], first_a["best_exact_thresh"]) == (100.0 * 3 / 6, 0.5)
    # D first: 2 -> 1 -> 2, never above the start, then B +1 at 0.9 -> 3 (C, E, F add nothing).
    assert (first_d["best_exact"], first_d["best_exact_thresh"]) == (100.0 * 3 / 6, 0.9)


def test_v2_needs_every_prediction_and_na_prob():
    preds = dict(V2_PREDS)
    del preds["E"]
    with pytest.raises(ValueError, match="no prediction for 1 of 6 questions.*'E'"):
        evaluate_v2(_v2_data(), preds)
    with pytest.raises(ValueError, match="no no-answer probability.*'A'"):
        evaluate_v2(_v2_data(), V2_PREDS, {"B": 0.1})


def test_version_dispatch():
    assert not is_v2(_v1_data()) and is_v2(_v2_data())
    assert "exact_match" in evaluate(_v1_data(), {"q1": "x"})
    assert "HasAns_exact" in evaluate(_v2_data(), V2_PREDS)
    # v2.0 semantics on a v1.1 file: no unanswerable questions, so no NoAns keys
    assert "NoAns_total" not in evaluate(_v1_data(), {"q1": "a", "q2": "b", "q3": "c"}, version="2.0")
    with pytest.raises(ValueError, match="version"):
        evaluate(_v1_data(), {}, version="3")
    with pytest.raises(ValueError, match="needs v2.0"):
        evaluate(_v1_data(), {}, {"q1": 0.5})
    with pytest.raises(ValueError, match="no gold answer"):
        evaluate_v1(_v2_data(), V2_PREDS)


# ------------------------------------------------------------------------- ids: missing, unknown, int, twice

def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and r.name == "fastqa.qa"]


def _many_questions(n: int = 10) -> dict:
    qas = [{"id": f"q{i}", "question": "?", "answers": [{"text": f"a{i}", "answer_start": 0}]} for i in range(n)]
    return {"version": "1.1", "data": [{"title": "t", "paragraphs": [{"context": "...", "qas": qas}]}]}


def test_missing_and_unknown_ids_are_one_warning_each_with_counts(caplog):
    data = _many_questions(10)
    preds = {f"q{i}": f"a{i}" for i in range(5)}               # q5..q9 unanswered
    preds.update({f"zz{i}": "x" for i in range(4)})          # 4 ids the data does not have
    with caplog.at_level(logging.WARNING, logger="fastqa.qa"):
        result = evaluate(data, preds, source="pred.json")
    assert result == {"exact_match": 50.0, "f1": 50.0}       # the missing score 0, the unknown are ignored
    messages = _warnings(caplog)
    assert len(messages) == 2, messages                       # counts, never one line per id
    assert messages[0] == "pred.json: no prediction for 5 of 10 questions (e.g. 'q5', 'q6', 'q7', ...); they score 0"
    assert messages[1] == ("pred.json: 4 predictions are for question ids the data does not have "
                           "(e.g. 'zz0', 'zz1', 'zz2', ...); they are not scored")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="fastqa.qa"):
        evaluate(data, {f"q{i}": "" for i in range(10)})
    assert _warnings(caplog) == []                           # nothing to say when the ids line up


def test_strict_refuses_missing_or_unknown_ids_in_one_message():
    data = _many_questions(4)
    full = {f"q{i}": "x" for i in range(4)}
    assert evaluate(data, full, strict=True)["exact_match"] == 0.0
    with pytest.raises(ValueError, match=r"^p\.json: no prediction for 1 of 4 questions \(e\.g\. 'q3'\) \(strict"):
        evaluate(data, {k: v for k, v in full.items() if k != "q3"}, strict=True, source="p.json")
    with pytest.raises(ValueError, match=r"1 prediction is for question ids the data does not have \(e\.g\. 'nope'\)"):
        evaluate(data, {**full, "nope": "x"}, strict=True)
    with pytest.raises(ValueError, match=r"no prediction for 1 of 4.*; .*1 prediction is for question ids") as e:
        evaluate(data, {"q0": "x", "q1": "x", "q2": "x", "nope": "x"}, strict=True)
    assert "\n" not in str(e.value)
    # v2.0: unknown ids warn (strict: refuse); a missing prediction is always an error
    with pytest.raises(ValueError, match="does not have"):
        evaluate_v2(_v2_data(), {**V2_PREDS, "Z": "x"}, strict=True)
    assert evaluate_v2(_v2_data(), {**V2_PREDS, "Z": "x"}) == evaluate_v2(_v2_data(), V2_PREDS)


def test_ids_are_strings_and_duplicates_are_refused():
    data = _many_questions(3)
    for qa in data["data"][0]["paragraphs"][0]["qas"]:
        qa["id"] = int(qa["id"][1:]) + 100                   # int ids, as some files have them
    by_str = {"100": "a0", "101": "a1", "102": "a2"}
    assert evaluate(data, by_str, strict=True)["exact_match"] == 100.0
    assert evaluate(data, {100: "a0", 101: "a1", 102: "a2"}, strict=True)["exact_match"] == 100.0
    with pytest.raises(ValueError, match="question id '101' is given twice"):
        evaluate(data, {101: "a1", "101": "a1"})
    data["data"][0]["paragraphs"][0]["qas"][2]["id"] = "101"  # 101 and "101" are one id
    with pytest.raises(ValueError, match="question id '101' appears twice in the data"):
        evaluate(data, by_str)
    with pytest.raises(TypeError, match="question 'q1': expected a str, got int"):
        evaluate(_many_questions(2), {"q0": "a", "q1": 3})
    with pytest.raises(TypeError, match="mapping"):
        evaluate(_many_questions(2), ["q0"])


def test_python_api_warnings_reach_stderr_without_logging_setup():
    # A user's script with no logging configured still sees the warning (logging's last-resort handler).
    code = ("from fastqa.tasks.qa.metric import evaluate\n"
            "qas = [{'id': f'q{i}', 'question': '?', 'answers': [{'text': 'a', 'answer_start': 0}]} for i in range(3)]\n"
            "data = {'version': '1.1', 'data': [{'paragraphs': [{'context': 'a', 'qas': qas}]}]}\n"
            "print(evaluate(data, {'q0': 'a', 'other': 'b'}))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "no prediction for 2 of 3 questions (e.g. 'q1', 'q2'); they score 0" in proc.stderr
    assert "1 prediction is for question ids the data does not have (e.g. 'other')" in proc.stderr
    assert "exact_match" in proc.stdout
