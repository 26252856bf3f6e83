"""``fastqa serve``: the QA reader and the translator behind an HTTP JSON API, with a page to try them.

    fastqa serve --qa-model runs/qanet --mt-model runs/convs2s [--host 127.0.0.1] [--port 8000] [--workers N]

    GET  /            the page: a question about a text (answer highlighted, top-k list) and a sentence
                      to translate (with its attention as a heat map)
    GET  /health      {"status", "version", "models": {...}, "limits": {...}, "queue": {...}}
    GET  /metrics     Prometheus text
    POST /answer      {"context", "question", "top_k"?, "max_answer_len"?, "min_score"?} -> {"answer", "answers"}
    POST /translate   {"text" | "sentences", "beam"?, "attention"?, "nbest"?} -> {"translations": [...]}

Each task of ``fastqa.tasks.TASKS`` brings its model flag, its route and its schemas (``TaskSpec``, ``Serving``):
the server names no task. The modules: ``limits`` (request bounds and batching, no dependencies), ``batcher``
(dynamic batching on a thread per model), ``engines`` (a task's model behind its batcher), ``app`` (the FastAPI
application, its routes as module-level functions, errors and metrics; needs the ``serve`` extra: fastapi,
uvicorn, prometheus-client) and ``cli`` (the subcommand).
Importing this package imports none of them, so ``fastqa --help`` stays light.
"""
from __future__ import annotations

__all__: list[str] = []
