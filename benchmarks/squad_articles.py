"""``python -m benchmarks.squad_articles``: reading whole articles against reading paragraphs.

For the SQuAD v1.1 dev articles chosen (default 40-47, the held-out split of every QA figure here), every
question is answered twice by the same reader: against its own paragraph (as SQuAD asks it), and against its
whole article, the article's paragraphs joined by a blank line into one document read in overlapping windows.
Both are scored by the official SQuAD v1.1 EM/F1; the windows read per second are timed on the article pass.
Then the planted-sentence check: the contexts of the first ten dev articles cut to ``--planted-words`` words,
followed by one sentence that answers the question; the reader must rank that sentence's answer first.

    python -m benchmarks.squad_articles --squad dev-v1.1.json.gz [--model NAME|PATH] [--out FILE.json]

Needs the real SQuAD v1.1 dev file (never used by the tests) and the shipped reader (or ``--model``).
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import gzip
import json
import time
from pathlib import Path
from typing import Any, Iterator

import torch

from benchmarks.measure import device_name
from fastqa.data.tokenize import tokenize
from fastqa.tasks.qa import QAModel
from fastqa.tasks.qa.metric import exact_match, f1
from fastqa.tasks.qa.inference import paragraph_starts, plan_windows

PLANTED = "The Zorbland suspension bridge was opened to traffic in 1937 by the mayor."
PLANTED_QUESTION = "When was the Zorbland suspension bridge opened?"
PLANTED_ANSWER = "1937"


def read_squad(path: Path) -> list[dict]:
    """The articles of a SQuAD JSON file (gzipped or not), in file order."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return json.load(f)["data"]


def parse_range(text: str) -> range:
    """"40-47" -> range(40, 48); "5" -> range(5, 6)."""
    first, _, last = text.partition("-")
    return range(int(first), int(last or first) + 1)


def score(predictions: list[str], golds: list[list[str]]) -> dict[str, float]:
    """Official SQuAD v1.1 EM and F1 (best over the gold answers), in percent."""
    em = sum(max(exact_match(p, g) for g in gs) for p, gs in zip(predictions, golds))
    f = sum(max(f1(p, g) for g in gs) for p, gs in zip(predictions, golds))
    return {"em": 100.0 * em / len(golds), "f1": 100.0 * f / len(golds), "questions": len(golds)}


def article_level(qa: QAModel, articles: list[dict], batch_size: int, per_window: bool) -> dict[str, Any]:
    """Every question against its paragraph, then against its whole article: EM/F1 of both, windows/s.
    ``per_window``: the article pass once more, spans ranked by their probability within their window (how
    windows were ranked before the span logits)."""
    paragraphs, articles_text, questions, golds = [], [], [], []
    for article in articles:
        document = "\n\n".join(p["context"] for p in article["paragraphs"])
        for p in article["paragraphs"]:
            for q in p["qas"]:
                paragraphs.append(p["context"])
                articles_text.append(document)
                questions.append(q["question"])
                golds.append([a["text"] for a in q["answers"]])
    window, stride = qa.windows()
    t0 = time.perf_counter()
    by_paragraph = qa.answer_many(paragraphs, questions, batch_size=batch_size)
    paragraph_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    by_article = qa.answer_many(articles_text, questions, batch_size=batch_size)
    article_s = time.perf_counter() - t0
    plans = {}
    for doc in set(articles_text):
        toks = tokenize(doc)
        offsets = [(start, start + len(t)) for t, start in toks]
        plans[doc] = (len(toks), plan_windows(len(toks), window, stride, paragraph_starts(doc, offsets)))
    windows = sum(len(plans[doc][1]) for doc in articles_text)
    out = {"paragraph": {**score([a.text for a in by_paragraph], golds), "seconds": paragraph_s},
           "article": {**score([a.text for a in by_article], golds), "seconds": article_s,
                       "windows": windows, "windows_per_s": windows / article_s,
                       "mean_article_tokens": sum(n for n, _ in plans.values()) / len(plans)},
           "max_context": window, "stride": stride}
    if per_window:
        with per_window_ranking(qa):
            out["article_per_window"] = score([a.text for a in qa.answer_many(articles_text, questions,
                                                                                  batch_size=batch_size)], golds)
    return out


@contextlib.contextmanager
def per_window_ranking(qa: QAModel) -> Iterator[None]:
    """The reader without span logits: its spans ranked by their probability within their own window."""
    cls = type(qa.model)
    saved = cls.__dict__.get("SPAN_LOGITS", False)
    cls.SPAN_LOGITS = False
    try:
        yield
    finally:
        cls.SPAN_LOGITS = saved


def planted(qa: QAModel, data: list[dict], words: int, top_k: int = 3) -> dict[str, Any]:
    """The planted sentence after ``words`` words of the first ten dev articles' contexts (and, for comparison,
    what ranking by the per-window probabilities answers)."""
    filler = " ".join(p["context"] for a in data[:10] for p in a["paragraphs"]).split()[:words]
    text = " ".join(filler) + " " + PLANTED
    res = qa.answer(text, PLANTED_QUESTION, top_k=top_k)
    answers = [{"text": a.text, "score": round(a.score, 4)} for a in res]
    with per_window_ranking(qa):
        old = qa.answer(text, PLANTED_QUESTION, top_k=top_k)
    return {"words_before": len(filler), "top": answers, "answered": answers[0]["text"] == PLANTED_ANSWER,
            "per_window_top": [{"text": a.text, "score": round(a.score, 4)} for a in old]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], prog="python -m benchmarks.squad_articles")
    p.add_argument("--squad", type=Path, required=True, help="SQuAD v1.1 dev JSON (.json or .json.gz)")
    p.add_argument("--articles", default="40-47", help="article range, file order (default 40-47)")
    p.add_argument("--model", default=None, help="run folder, export or shipped name (default: the shipped reader)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--planted-words", type=int, nargs="*", default=[300, 1000, 3000, 10000])
    p.add_argument("--per-window", action="store_true",
                   help="also score the article pass with spans ranked by their per-window probability")
    p.add_argument("--out", type=Path, default=None, help="write the figures here as JSON")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    data = read_squad(args.squad)
    chosen = parse_range(args.articles)
    qa = QAModel.load(args.model, device="cpu")
    result: dict[str, Any] = {
        "date": datetime.date.today().isoformat(), "cpu": device_name(torch.device("cpu")),
        "threads": torch.get_num_threads(), "model": args.model or "shipped reader", "articles": args.articles,
        "reading": article_level(qa, [data[i] for i in chosen], args.batch_size, args.per_window),
        "planted": [planted(qa, data, n) for n in args.planted_words]}
    r = result["reading"]
    print(f"articles {args.articles}: paragraph EM {r['paragraph']['em']:.2f} F1 {r['paragraph']['f1']:.2f}; "
          f"article EM {r['article']['em']:.2f} F1 {r['article']['f1']:.2f} ({r['article']['windows']} windows, "
          f"{r['article']['windows_per_s']:.1f} windows/s); {r['paragraph']['questions']} questions")
    if "article_per_window" in r:
        print(f"article, ranked by per-window probability: EM {r['article_per_window']['em']:.2f} "
              f"F1 {r['article_per_window']['f1']:.2f}")
    for case in result["planted"]:
        print(f"planted after {case['words_before']} words: {'answered' if case['answered'] else 'MISSED'}; "
              f"top {', '.join(repr(a['text']) + ' ' + str(a['score']) for a in case['top'])}; per-window "
              f"ranking: {', '.join(repr(a['text']) + ' ' + str(a['score']) for a in case['per_window_top'])}")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
