"""Unsure translations through the server: ``/translate`` carries ``unsure`` for every translation and
alternative (declared in the OpenAPI schema), and the page marks an unsure translation visibly. The translator
is the tiny model of the serve fixtures with a confidence floor set here (every translation past it, or none)."""
from __future__ import annotations

import html
import re
import urllib.parse

from serve_helpers import run_chromium, serve_in_thread

from fastqa.serve.app import create_app
from fastqa.tasks.translation import Translator
from fastqa.tasks.translation.translator import ConfidenceFloor

SENTENCES = ["ka lo mi nu", "po ri sa"]


def _translator(serve_models, score: float, entropy: float | None = None) -> Translator:
    tr = Translator.load(serve_models["mt"], device="cpu")
    tr.confidence_floor = ConfidenceFloor(score=score, quantile=0.05, fitted_on="made", beam=5, entropy=entropy)
    return tr


def test_translate_says_which_translations_are_unsure(serve_models):
    for floor, want in (((1.0,), True), ((-1e9, 1e9), False), ((-1e9, 0.0), True)):
        tr = _translator(serve_models, *floor)
        with serve_in_thread(create_app(translation=tr, paths={"translation": "made"})) as client:
            status, body = client.post("/translate", {"sentences": SENTENCES, "beam": 3, "nbest": 2})
            assert status == 200, body
            rows = body["translations"]
            assert [r["unsure"] for r in rows] == [want, want], floor
            assert [r["unsure"] for r in rows] == [t.unsure for t in tr.translate(SENTENCES, beam=3)]
            assert all(a["unsure"] is want for r in rows for a in r["alternatives"])
            status, spec = client.get("/openapi.json")
            assert status == 200 and "unsure" in spec["components"]["schemas"]["TranslationOut"]["properties"]


def test_the_page_marks_an_unsure_translation(serve_models, chromium, tmp_path):
    for score, unsure in ((1.0, True), (-1e9, False)):
        with serve_in_thread(create_app(translation=_translator(serve_models, score), paths={"translation": "made"})) as client:
            url = f"{client.url}/?{urllib.parse.urlencode({'sentence': SENTENCES[0], 'run': 1})}"
            result = run_chromium(chromium, url, tmp_path / f"profile-{unsure}", "--dump-dom")
        assert result.returncode == 0, result.stderr[-2000:]
        dom = result.stdout
        assert 'data-state="done"' in dom, dom[-3000:]
        (tag,) = re.findall(r'<span id="translation-text"[^>]*>', dom)
        assert ('class="unsure"' in tag) is unsure
        (note,) = re.findall(r'<div class="unsure-note" id="translation-unsure"([^>]*)>(.*?)</div>', dom, flags=re.S)
        assert ("hidden" in note[0]) is not unsure
        assert "unsure" in html.unescape(note[1]).lower()
