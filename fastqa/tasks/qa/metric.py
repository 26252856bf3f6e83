"""SQuAD exact match and F1 with the official v1.1 and v2.0 semantics, as pure functions.

Both official scripts normalise an answer the same way: lowercase, drop ASCII punctuation, drop the
articles a/an/the (as whole words), collapse whitespace. EM compares normalised strings; F1 counts the
multiset overlap of the normalised whitespace tokens; each question takes the max over its gold answers.
They differ in what they count:

- v1.1 (`evaluate_v1`): every question of the data file counts; a question without a prediction
  scores 0. Output keys ``exact_match``, ``f1``.
- v2.0 (`evaluate_v2`): gold answers that normalise to "" are dropped; a question with none left has
  the gold answer "", and then EM = F1 = 1 only for an empty prediction. Scores are averaged over the
  predicted questions; ``HasAns_*`` / ``NoAns_*`` split them; a no-answer-probability file turns
  predictions with probability > ``na_prob_thresh`` into "" and adds ``best_exact`` / ``best_f1`` and
  their thresholds (the best single cut over the sorted probabilities).

The sums run in the data file's order with Python floats, as the official scripts do, so the values
equal theirs to the last digit.

No number is silent about what it left out. Question ids are compared as strings (an int id in the data
is its str, as ``read_squad`` makes it), an id that appears twice in the data is an error, and the ids
that do not line up are logged as one warning each on the ``fastqa.qa`` logger (stderr unless logging
is configured otherwise) with their count and a few examples, as the official scripts warn:

- missing: questions of the data without a prediction (v1.1: they score 0; v2.0: always an error,
  since the official v2.0 script would silently shrink the total instead);
- unknown: predictions for ids the data does not have (not scored).

``strict=True`` turns either into a ValueError.
"""
from __future__ import annotations

import logging
import re
import string
from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

__all__ = [
    "normalize_answer", "exact_match", "f1", "evaluate_v1", "evaluate_v2", "evaluate", "is_v2",
    "format_result", "IdCheck", "check_ids", "exact_matches",
]

log = logging.getLogger("fastqa.qa")

_PUNCTUATION = frozenset(string.punctuation)  # ASCII only, as the official scripts use
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)


def normalize_answer(text: str) -> str:
    """Lowercase, drop ASCII punctuation, drop a/an/the, collapse whitespace (official order)."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match(prediction: str, gold: str) -> int:
    """1 if the normalised strings are equal, else 0."""
    return int(normalize_answer(prediction) == normalize_answer(gold))


def _overlap_f1(pred_tokens: list[str], gold_tokens: list[str]) -> float:
    same = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if same == 0:
        return 0
    precision = 1.0 * same / len(pred_tokens)
    recall = 1.0 * same / len(gold_tokens)
    return (2 * precision * recall) / (precision + recall)


def f1(prediction: str, gold: str, *, v2: bool = False) -> float:
    """Token-overlap F1 of the normalised answers.

    v2=True adds the v2.0 rule: if either side has no tokens, 1 when both have none, else 0.
    (v1.1 returns 0 for an empty side, through the zero overlap.)
    """
    pred_tokens = normalize_answer(prediction).split() if prediction else []
    gold_tokens = normalize_answer(gold).split() if gold else []
    if v2 and (not pred_tokens or not gold_tokens):
        return int(pred_tokens == gold_tokens)
    return _overlap_f1(pred_tokens, gold_tokens)


def _questions(dataset: Any) -> Iterator[dict]:
    """The question dicts of a SQuAD ``data`` list (or the whole JSON object), in file order."""
    articles = dataset["data"] if isinstance(dataset, Mapping) else dataset
    for article in articles:
        for paragraph in article["paragraphs"]:
            yield from paragraph["qas"]


def _qid(qa: Mapping) -> str:
    # The data may come straight from json.load with int ids; predictions' keys are JSON strings.
    return str(qa["id"])


def exact_matches(dataset: Any, predictions: Mapping[str, str]) -> dict[str, bool]:
    """{question id: whether its prediction equals a gold answer after normalisation} for every question of
    ``dataset`` that ``predictions`` answers (a question without answers, v2.0: right when the prediction is
    empty). What a calibrated score estimates the probability of."""
    out: dict[str, bool] = {}
    for qa in _questions(dataset):
        qid = _qid(qa)
        if qid in predictions:
            golds = [a["text"] for a in qa.get("answers", [])] or [""]
            out[qid] = any(exact_match(predictions[qid], g) for g in golds)
    return out


def _str_keys(mapping: Mapping, what: str, value_type: type | tuple[type, ...]) -> dict[str, Any]:
    """``mapping`` with str keys (an int key 57 becomes "57"), its values checked against ``value_type``."""
    if not isinstance(mapping, Mapping):
        raise TypeError(f"{what} must be a mapping {{question id: value}}, got {type(mapping).__name__}")
    out: dict[str, Any] = {}
    for key, value in mapping.items():
        name = str(key)
        if name in out:
            raise ValueError(f"{what}: question id {name!r} is given twice (as {key!r} and as {name!r})")
        if isinstance(value, bool) or not isinstance(value, value_type):
            kind = value_type.__name__ if isinstance(value_type, type) else "number"
            raise TypeError(f"{what}: question {name!r}: expected a {kind}, got {type(value).__name__}")
        out[name] = value
    return out


@dataclass(frozen=True)
class IdCheck:
    """How the ids of a predictions mapping line up with the questions of the data."""

    total: int            # questions in the data
    missing: list[str]    # data ids without a prediction, in file order
    unknown: list[str]    # prediction ids the data does not have, in the predictions' order


def check_ids(dataset: Any, predictions: Mapping[str, Any]) -> IdCheck:
    """Compare the question ids of ``dataset`` with the keys of ``predictions`` (both as strings).

    Raises a ValueError naming the id when the data has one question id twice: its score would be
    ambiguous.
    """
    seen: set[str] = set()
    missing = []
    for qa in _questions(dataset):
        qid = _qid(qa)
        if qid in seen:
            raise ValueError(f"question id {qid!r} appears twice in the data")
        seen.add(qid)
        if qid not in predictions:
            missing.append(qid)
    unknown = [str(k) for k in predictions if str(k) not in seen]
    return IdCheck(len(seen), missing, unknown)


def _examples(ids: list[str], k: int = 3) -> str:
    return ", ".join(repr(i) for i in ids[:k]) + (", ..." if len(ids) > k else "")


def _missing_message(check: IdCheck, source: str) -> str:
    return (f"{source}: no prediction for {len(check.missing)} of {check.total} questions "
            f"(e.g. {_examples(check.missing)})")


def _unknown_message(check: IdCheck, source: str) -> str:
    n = len(check.unknown)
    return (f"{source}: {n} prediction{'s are' if n != 1 else ' is'} for question ids the data does not have "
            f"(e.g. {_examples(check.unknown)})")


def _report_ids(check: IdCheck, *, strict: bool, source: str, missing_is_error: bool) -> None:
    """Warn about (or, when strict, refuse) predictions that do not line up with the data."""
    problems = []
    if check.missing:
        problems.append(_missing_message(check, source))
    if check.unknown:
        problems.append(_unknown_message(check, source))
    if strict and problems:
        raise ValueError("; ".join(problems) + " (strict scoring needs exactly one prediction per question)")
    if check.missing and missing_is_error:
        raise ValueError(f"{_missing_message(check, source)}; v2.0 scoring needs all of them")
    if check.missing:
        log.warning("%s; they score 0", _missing_message(check, source))
    if check.unknown:
        log.warning("%s; they are not scored", _unknown_message(check, source))


def is_v2(dataset: Any) -> bool:
    """Whether a SQuAD JSON object uses v2.0 semantics (its version string, or unanswerable questions)."""
    if isinstance(dataset, Mapping) and "version" in dataset:
        return str(dataset["version"]).lstrip("v").startswith("2")
    return any(qa.get("is_impossible", False) or not qa.get("answers") for qa in _questions(dataset))


def evaluate_v1(dataset: Any, predictions: Mapping[str, str], *, strict: bool = False,
                source: str = "predictions") -> dict[str, float]:
    """Official v1.1: ``{"exact_match", "f1"}`` in percent over every question of the data.

    dataset: the SQuAD JSON object (or its ``data`` list). predictions: question id -> answer text.
    A question without a prediction scores 0 and a prediction for an id the data lacks is ignored, each
    with a logged warning (count and examples; ``strict``: a ValueError instead); ``source`` names the
    predictions in those messages (e.g. the file). A question without gold answers is an error (the
    official v1.1 script fails on it too: use `evaluate_v2` for such data).
    """
    predictions = _str_keys(predictions, source, str)
    _report_ids(check_ids(dataset, predictions), strict=strict, source=source, missing_is_error=False)
    total = 0
    em_sum = 0
    f1_sum = 0.0
    for qa in _questions(dataset):
        total += 1
        qid = _qid(qa)
        if qid not in predictions:
            continue
        golds = [answer["text"] for answer in qa["answers"]]
        if not golds:
            raise ValueError(f"question {qid!r} has no gold answer: v1.1 scoring needs one (use v2.0)")
        prediction = predictions[qid]
        em_sum += max(exact_match(prediction, gold) for gold in golds)
        f1_sum += max(f1(prediction, gold) for gold in golds)
    if total == 0:
        raise ValueError("the data has no questions to score")
    return {"exact_match": 100.0 * em_sum / total, "f1": 100.0 * f1_sum / total}


def _mean_dict(exact: Mapping[str, float], f1s: Mapping[str, float], qids: list[str] | None = None) -> dict:
    keys = list(exact) if qids is None else qids
    total = len(keys)
    return {
        "exact": 100.0 * sum(exact[k] for k in keys) / total,
        "f1": 100.0 * sum(f1s[k] for k in keys) / total,
        "total": total,
    }


def _best_threshold(predictions: Mapping[str, str], scores: Mapping[str, float],
                    na_probs: Mapping[str, float], has_answer: Mapping[str, bool]) -> tuple[float, float]:
    """Best score (percent) over the cuts "answer '' when na_prob > t" and the t that reaches it.

    Start from "every question answered ''" (all unanswerable ones right), then walk the questions by
    increasing na_prob (stable: ties keep the na-prob file's order), switching each to its prediction.
    """
    current = sum(1 for has in has_answer.values() if not has)
    best, best_thresh = current, 0.0
    for qid in sorted(na_probs, key=lambda k: na_probs[k]):
        if qid not in scores:
            continue
        if has_answer[qid]:
            current += scores[qid]
        elif predictions[qid]:
            current -= 1
        if current > best:
            best, best_thresh = current, na_probs[qid]
    return 100.0 * best / len(scores), best_thresh


def evaluate_v2(dataset: Any, predictions: Mapping[str, str], na_probs: Mapping[str, float] | None = None,
                *, na_prob_thresh: float = 1.0, strict: bool = False, source: str = "predictions"
                ) -> dict[str, float | int]:
    """Official v2.0: ``exact, f1, total, HasAns_*, NoAns_*`` (+ ``best_*`` when na_probs is given).

    dataset: the SQuAD JSON object (or its ``data`` list); predictions: question id -> answer text
    ("" = no answer); na_probs: question id -> probability of no answer.
    Every question needs a prediction (and a na-prob when na_probs is given): the official script
    would leave a missing one out of the total, this raises a ValueError with the count and examples.
    A prediction for an id the data lacks is ignored with a logged warning (``strict``: a ValueError);
    ``source`` names the predictions in the messages.
    """
    predictions = _str_keys(predictions, source, str)
    if na_probs is not None:
        na_probs = _str_keys(na_probs, "no-answer probabilities", (int, float))
    _report_ids(check_ids(dataset, predictions), strict=strict, source=source, missing_is_error=True)
    has_answer: dict[str, bool] = {}
    exact_raw: dict[str, float] = {}
    f1_raw: dict[str, float] = {}
    for qa in _questions(dataset):
        qid = _qid(qa)
        has_answer[qid] = bool(qa["answers"])
        golds = [a["text"] for a in qa["answers"] if normalize_answer(a["text"])] or [""]
        prediction = predictions[qid]
        exact_raw[qid] = max(exact_match(prediction, gold) for gold in golds)
        f1_raw[qid] = max(f1(prediction, gold, v2=True) for gold in golds)
    if not has_answer:
        raise ValueError("the data has no questions to score")
    given_na = na_probs is not None
    if na_probs is None:
        na_probs = {qid: 0.0 for qid in predictions}
    else:
        lacking = [qid for qid in exact_raw if qid not in na_probs]
        if lacking:
            raise ValueError(f"no no-answer probability for {len(lacking)} questions (first: {lacking[0]!r})")

    def thresholded(raw: Mapping[str, float]) -> dict[str, float]:
        # A question whose na_prob exceeds the threshold counts as answered "".
        return {qid: (float(not has_answer[qid]) if na_probs[qid] > na_prob_thresh else score)
                for qid, score in raw.items()}

    exact_t, f1_t = thresholded(exact_raw), thresholded(f1_raw)
    result: dict[str, float | int] = dict(_mean_dict(exact_t, f1_t))
    for prefix, want in (("HasAns", True), ("NoAns", False)):
        qids = [qid for qid, has in has_answer.items() if has == want]
        if qids:
            for key, value in _mean_dict(exact_t, f1_t, qids).items():
                result[f"{prefix}_{key}"] = value
    if given_na:
        result["best_exact"], result["best_exact_thresh"] = _best_threshold(predictions, exact_raw, na_probs, has_answer)
        result["best_f1"], result["best_f1_thresh"] = _best_threshold(predictions, f1_raw, na_probs, has_answer)
    return result


def evaluate(dataset: Any, predictions: Mapping[str, str], na_probs: Mapping[str, float] | None = None,
             *, version: str | None = None, na_prob_thresh: float = 1.0, strict: bool = False,
             source: str = "predictions") -> dict[str, float | int]:
    """v1.1 or v2.0 scoring, chosen by ``version`` ("1.1" / "2.0") or else by the data's version string.

    Missing and unknown prediction ids are warned about (counts and examples) or, with ``strict``, refused
    with a ValueError; ``source`` (e.g. the predictions file) names them in the messages. See the module
    docstring.
    """
    if version is None:
        v2 = is_v2(dataset)
    elif version.lstrip("v") in ("1.1", "1"):
        v2 = False
    elif version.lstrip("v") in ("2.0", "2"):
        v2 = True
    else:
        raise ValueError(f"version must be '1.1' or '2.0', got {version!r}")
    if v2:
        return evaluate_v2(dataset, predictions, na_probs, na_prob_thresh=na_prob_thresh, strict=strict,
                           source=source)
    if na_probs is not None:
        raise ValueError("a no-answer probability file needs v2.0 scoring (the data says v1.1)")
    return evaluate_v1(dataset, predictions, strict=strict, source=source)


def format_result(result: Mapping[str, Any]) -> str:
    """The JSON text the official script prints: v1.1 on one line, v2.0 indented by 2."""
    import json

    if "exact_match" in result:
        return json.dumps(dict(result))
    return json.dumps(dict(result), indent=2)
