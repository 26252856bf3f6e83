"""The page of ``fastqa serve`` in headless Chromium: the query string fills both forms and submits them, the
script asks the server, and the DOM then holds the answer highlighted in the context, the top-k list, the
translation and its attention table; a screenshot of it is drawn too."""
from __future__ import annotations

import html
import re
import urllib.parse

from serve_helpers import run_chromium

# An emoji before the answer: the server counts code points, JavaScript UTF-16 units; a page that mixed the
# two would highlight a span shifted by one character.
CONTEXT = "🎻 Notes: Ada Lovelace was born in Zürich in 1815. Later, Ada Lovelace played the cello every evening."
QUESTION = "Where was Ada Lovelace born?"
SENTENCE = "ka lo mi nu"


def _text_of(dom: str, pattern: str) -> list[str]:
    """The unescaped texts of the elements matched by ``pattern`` (a regex with one group)."""
    return [html.unescape(m) for m in re.findall(pattern, dom, flags=re.S)]


def test_page_answers_and_translates_in_chromium(server, chromium, tmp_path):
    status, want = server.post("/answer", {"context": CONTEXT, "question": QUESTION, "top_k": 3})
    assert status == 200, want
    status, translated = server.post("/translate", {"text": SENTENCE, "beam": 5, "attention": True})
    assert status == 200, translated
    query = urllib.parse.urlencode({"context": CONTEXT, "question": QUESTION, "top_k": 3, "sentence": SENTENCE,
                                    "run": 1})
    url = f"{server.url}/?{query}"

    result = run_chromium(chromium, url, tmp_path / "profile-dom", "--dump-dom")
    assert result.returncode == 0, result.stderr[-2000:]
    dom = result.stdout
    assert 'data-state="done"' in dom, dom[-3000:]
    # The answer, highlighted where the server says it is.
    best = want["answer"]
    assert _text_of(dom, r'<span id="answer-text">(.*?)</span>') == [best["text"]]
    (context_html,) = re.findall(r'<div class="context" id="qa-context">(.*?)</div>', dom, flags=re.S)
    before, marked, after = re.split(r"<mark>(.*?)</mark>", context_html, flags=re.S)
    assert (html.unescape(before), html.unescape(marked)) == (CONTEXT[:best["start"]], best["text"])
    assert html.unescape(before + marked + after) == CONTEXT
    # The top-k list, best first.
    items = _text_of(dom, r'<li[^>]*><span>(.*?)</span><span class="score">')
    assert items == [span["text"] for span in want["answers"]]
    # The translation and its attention: a row per target token, a column per source token, labelled axes.
    (row,) = translated["translations"]
    assert _text_of(dom, r'<span id="translation-text">(.*?)</span>') == [row["text"]]
    assert "source tokens" in dom and "translation" in dom
    assert _text_of(dom, r'<th class="src">(.*?)</th>') == row["attention"]["source"]
    assert _text_of(dom, r"<tr><th>(.*?)</th>") == row["attention"]["target"]
    assert dom.count("<td ") == len(row["attention"]["source"]) * len(row["attention"]["target"])
    for box in ("qa-error", "mt-error"):  # no error shown
        assert re.search(rf'<div class="out error" id="{box}" hidden', dom), box

    shot = tmp_path / "page.png"
    result = run_chromium(chromium, url, tmp_path / "profile-shot", "--window-size=1280,1000", f"--screenshot={shot}")
    assert result.returncode == 0, result.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000


def test_page_says_no_confident_answer_under_min_score(server, chromium, tmp_path):
    query = urllib.parse.urlencode({"context": CONTEXT, "question": QUESTION, "top_k": 3, "min_score": 1, "run": 1})
    result = run_chromium(chromium, f"{server.url}/?{query}", tmp_path / "profile", "--dump-dom")
    assert result.returncode == 0, result.stderr[-2000:]
    dom = result.stdout
    assert 'data-state="done"' in dom, dom[-3000:]
    assert _text_of(dom, r'<span id="answer-text">(.*?)</span>') == ["no confident answer"]
    assert re.search(r'id="answer-score">best score [0-9.]+ &lt; 1<', dom), dom[-2000:]
    assert _text_of(dom, r'<li[^>]*><span>(.*?)</span><span class="score">') == ["(no confident answer)"]
