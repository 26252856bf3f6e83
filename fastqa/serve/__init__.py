"""``fastqa serve``: the QA reader and the translator behind an HTTP JSON API, with a page to try them.

    fastqa serve --qa-model runs/qanet --mt-model runs/convs2s [--host 127.0.0.1] [--port 8000]

    GET  /            the page: a question about a text (answer highlighted, top-k list) and a sentence
                      to translate (with its attention as a heat map)
    GET  /health      {"status": "ok", "models": {...}, "limits": {...}}
    POST /answer      {"context", "question", "top_k"?, "max_answer_len"?} -> {"answer", "top_k"}
    POST /translate   {"text" | "sentences", "beam"?, "attention"?, "nbest"?} -> {"translations": [...]}

The modules: ``limits`` (request bounds, no dependencies), ``engines`` (the models, each on a worker thread
of its own), ``app`` (the Starlette application; needs the ``serve`` extra: starlette and uvicorn) and
``cli`` (the subcommand). Importing this package imports none of them, so ``fastqa --help`` stays light.
"""
from __future__ import annotations

__all__: list[str] = []
