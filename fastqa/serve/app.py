"""The HTTP application, on FastAPI: requests and responses declared once as pydantic schemas (validation, 422
errors naming the field, and the OpenAPI description at /openapi.json and /docs), each model's requests batched.

Routes (every response is JSON except the page and /metrics; every error is ``{"error": MESSAGE, "status":
CODE}`` plus ``"field"`` when one field is at fault):

    GET  /            the page (``page.html``: inline script and style, nothing fetched from elsewhere)
    GET  /health      {"status": "ok" | "draining", "version", "models": {...}, "limits": {...}, "queue": {...}}
    GET  /metrics     Prometheus text: requests by route and status, latency histogram, batch sizes, queue depth
    POST /answer      AnswerRequest -> {"answer": Answer, "answers": [Answer, ...]}
    POST /translate   TranslateRequest -> {"translations": [Translation, ...]}

Status codes: 400 malformed JSON; 413 a body over ``max_body_bytes``; 422 a missing, unknown or mistyped field, a
value out of bounds, or text the model cannot read; 503 no such model loaded, too many requests waiting for it
(with Retry-After), or the server is shutting down; 504 not answered within ``timeout_s``.
"""

import asyncio
import contextlib
import gc
import json
import os
import time
from importlib import resources
from typing import Any, AsyncIterator

from .._checks import check_text
from .._version import __version__
from ..bounds import BOUNDS
from ..errors import UserError
from .batcher import Busy, Closed
from .engines import AnswerItem, QAEngine, TranslateItem, TranslationEngine
from .limits import ServeLimits

try:  # the serve extra; without it this module still imports (create_app then says what to install)
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import HTMLResponse, JSONResponse, Response
    from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
    from starlette.exceptions import HTTPException
except ImportError as e:  # pragma: no cover - exercised only where the extra is missing
    _MISSING: ImportError | None = e
    BaseModel = object  # type: ignore[assignment,misc]
    FastAPI = Request = Response = Any  # type: ignore[assignment,misc]
else:
    _MISSING = None

__all__ = ["create_app", "app_from_environment", "INSTALL_HINT", "SETTINGS_ENV"]

INSTALL_HINT = "fastqa serve needs the serve extra: pip install 'fastqa[serve]' (fastapi, uvicorn, prometheus-client)"
#: the environment variable through which ``fastqa serve --workers N`` hands its settings to each worker process
SETTINGS_ENV = "FASTQA_SERVE_SETTINGS"
ROUTES = ("/", "/health", "/metrics", "/answer", "/translate", "/docs", "/openapi.json")
# How much of an oversized body is still read before the 413 goes out (``_Observe._bounded_body``).
_DRAIN_FACTOR = 8


class RequestError(Exception):
    """A request the server refuses: its HTTP status, a message for the client and the field at fault."""

    def __init__(self, status: int, message: str, field: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.field, self.headers = status, message, field, headers


def _error(status: int, message: str, field: str | None = None, headers: dict[str, str] | None = None) -> Response:
    body: dict[str, Any] = {"error": message, "status": status}
    if field is not None:
        body["field"] = field
    return JSONResponse(body, status_code=status, headers=headers)


# ------------------------------------------------------------------------------------------------- schemas

if _MISSING is None:
    class AnswerOut(BaseModel):
        """An answer: ``context[start:end] == text`` (character offsets)."""
        text: str
        start: int
        end: int
        score: float = Field(description="probability that the answer is right (a calibrated reader), else the "
                             "span's probability")
        no_answer_prob: float | None = Field(None, description="a SQuAD v2.0 reader's probability of no answer")
        abstained: bool = Field(False, description="no answer scored min_score or more: text is empty")

    class AnswerResponse(BaseModel):
        answer: AnswerOut
        answers: list[AnswerOut] = Field(description="the top_k answers, best first")

    class AttentionOut(BaseModel):
        source: list[str]
        target: list[str]
        weights: list[list[float]] = Field(description="one row per target token, one column per source token")

    class Hypothesis(BaseModel):
        text: str
        score: float
        unsure: bool = False

    class TranslationOut(BaseModel):
        source: str
        text: str
        score: float = Field(description="the search's score: log-probability per token (length-normalised)")
        unsure: bool = Field(False, description="the model is unsure of this translation: its log-probability per "
                             "token is under the model's fitted confidence floor, or its next-token entropy over "
                             "it (always false for a model without a fitted floor)")
        tokens: list[str]
        attention: AttentionOut | None = None
        alternatives: list[Hypothesis] = Field(default_factory=list, description="the next best (nbest > 1)")

    class TranslateResponse(BaseModel):
        translations: list[TranslationOut]


def request_schemas(limits: ServeLimits) -> tuple[type, type]:
    """The request schemas with this server's bounds (they appear in the OpenAPI description)."""
    strict = ConfigDict(extra="forbid", strict=True)

    class AnswerRequest(BaseModel):
        model_config = strict
        context: str = Field(max_length=limits.max_context_chars)
        question: str = Field(max_length=limits.max_question_chars)
        top_k: int = Field(1, ge=BOUNDS["top_k"].low, le=limits.max_top_k)
        max_answer_len: int | None = Field(None, ge=BOUNDS["max_answer_len"].low, le=limits.max_answer_len)
        min_score: float | None = Field(None, ge=0.0, le=1.0, description="below it: no confident answer")

        @field_validator("context", "question")
        @classmethod
        def not_blank(cls, value: str, info: Any) -> str:
            return check_text(f"the {info.field_name}", value, blank=True)

    class TranslateRequest(BaseModel):
        model_config = strict
        text: str | None = Field(None, max_length=limits.max_sentence_chars, description="one sentence")
        sentences: list[str] | None = Field(None, min_length=1, max_length=limits.max_sentences)
        beam: int = Field(5, ge=BOUNDS["beam"].low, le=limits.max_beam)
        nbest: int = Field(1, ge=BOUNDS["nbest"].low, le=min(limits.max_beam, BOUNDS["nbest"].high))
        attention: bool = False

        @field_validator("sentences")
        @classmethod
        def bounded(cls, value: list[str] | None) -> list[str] | None:
            for i, sentence in enumerate(value or []):
                if len(sentence) > limits.max_sentence_chars:
                    raise ValueError(f"sentence {i}: {len(sentence)} characters, more than the server's limit of "
                                     f"{limits.max_sentence_chars}")
            return value

        @model_validator(mode="after")
        def one_source(self) -> "TranslateRequest":
            if (self.text is None) == (self.sentences is None):
                raise ValueError("send either 'text' (a sentence) or 'sentences' (a list of sentences)")
            if self.nbest > self.beam:
                raise ValueError(f"nbest ({self.nbest}) must be at most beam ({self.beam})")
            return self

    return AnswerRequest, TranslateRequest


# ------------------------------------------------------------------------------------------------- metrics

class Metrics:
    """The server's Prometheus metrics (prometheus-client): in a registry of their own, or, with several worker
    processes (``PROMETHEUS_MULTIPROC_DIR`` set), gathered from all of them at each scrape."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
        self.multiprocess = bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
        self.registry = CollectorRegistry()
        self.requests = Counter("fastqa_requests", "HTTP requests by route and status", ["route", "status"],
                                registry=self.registry)
        self.latency = Histogram("fastqa_request_seconds", "HTTP request latency", ["route"], registry=self.registry,
                                 buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
        self.batch = Histogram("fastqa_batch_size", "requests answered by one model call", ["model"],
                               registry=self.registry, buckets=(1, 2, 4, 8, 16, 32, 64, 128))
        self.batch_seconds = Histogram("fastqa_batch_seconds", "seconds of one model call", ["model"],
                                       registry=self.registry)
        self.queue = Gauge("fastqa_queue_depth", "requests queued or being answered", ["model"],
                           registry=self.registry, multiprocess_mode="livesum")

    def on_batch(self, model: str):
        def record(size: int, seconds: float) -> None:
            self.batch.labels(model).observe(size)
            self.batch_seconds.labels(model).observe(seconds)
        return record

    def render(self) -> bytes:
        from prometheus_client import generate_latest
        if self.multiprocess:
            from prometheus_client import CollectorRegistry, multiprocess
            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)
            return generate_latest(registry)
        return generate_latest(self.registry)


class _Observe:
    """ASGI middleware: every HTTP request counted by route and status and timed; a body over ``max_bytes`` is
    answered 413 before the application reads it; a POST body is read as JSON whatever its Content-Type says."""

    def __init__(self, app: Any, metrics: Metrics, max_bytes: int) -> None:
        self.app, self.metrics, self.max_bytes = app, metrics, max_bytes

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        route = scope["path"] if scope["path"] in ROUTES else "other"
        status = 500
        t0 = time.perf_counter()

        async def send_and_note(message: dict) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)
        try:
            if scope["method"] == "POST":
                receive = await self._bounded_body(scope, receive, send_and_note)
                if receive is None:
                    return
                scope = _as_json(scope)
            await self.app(scope, receive, send_and_note)
        finally:
            self.metrics.requests.labels(route, str(status)).inc()
            self.metrics.latency.labels(route).observe(time.perf_counter() - t0)

    async def _bounded_body(self, scope: dict, receive: Any, send: Any) -> Any:
        """A ``receive`` that replays the whole body, read here; None when the answer (413) went out already.

        An oversized body is still read (and thrown away) up to ``_DRAIN_FACTOR`` times the limit before the 413
        goes out, so that a client that sends its whole body before reading the response gets the 413 instead of
        a reset connection; past that the answer goes at once and the connection closes."""
        declared = dict(scope["headers"]).get(b"content-length")
        size = 0 if declared is None or not declared.isdigit() else int(declared)
        chunks: list[bytes] = []
        if size <= _DRAIN_FACTOR * self.max_bytes:
            size, more = 0, True
            while more:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return None
                size += len(message.get("body", b""))
                if size <= self.max_bytes:
                    chunks.append(message.get("body", b""))
                more = message.get("more_body", False) and size <= _DRAIN_FACTOR * self.max_bytes
        if size > self.max_bytes:
            response = _error(413, f"the request body is larger than {self.max_bytes} bytes (the server's limit)")
            await response(scope, receive, send)
            return None
        body, replayed = b"".join(chunks), False

        async def replay() -> dict:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}
        return replay


def _as_json(scope: dict) -> dict:
    """``scope`` with its Content-Type set to application/json. Every POST route takes a JSON object, and
    ``curl -d`` labels its body a form: FastAPI would hand such a body to the schema as bytes and refuse it,
    although it is the JSON the route expects. A body that is not JSON still gets 400 malformed JSON."""
    headers = [(k, v) for k, v in scope["headers"] if k.lower() != b"content-type"]
    return {**scope, "headers": [*headers, (b"content-type", b"application/json")]}


# ------------------------------------------------------------------------------------------------ the app

def create_app(*, qa: Any = None, translation: Any = None, limits: ServeLimits = ServeLimits(),
               qa_path: str | None = None, mt_path: str | None = None) -> "FastAPI":
    """The application serving the ``QAModel`` ``qa`` and/or the ``Translator`` ``translation`` (already loaded:
    a request never waits for a model to load), their requests batched within ``limits``. Shutting the
    application down answers the requests already queued, then stops the models' threads."""
    if _MISSING is not None:
        raise UserError(f"{INSTALL_HINT} ({_MISSING})")
    if qa is None and translation is None:
        raise UserError("fastqa serve needs a model: --qa-model DIR, --mt-model DIR or both")
    metrics = Metrics()
    batching = {"max_batch": limits.max_batch, "max_wait_ms": limits.max_wait_ms, "idle_ms": limits.idle_ms,
                "max_pending": limits.max_pending}
    qa_engine = QAEngine(qa, path=qa_path, on_batch=metrics.on_batch("qa"), **batching) if qa is not None else None
    mt_engine = (TranslationEngine(translation, path=mt_path, on_batch=metrics.on_batch("translation"), **batching)
                 if translation is not None else None)
    engines = {"qa": qa_engine, "translation": mt_engine}
    page = resources.files(__package__).joinpath("page.html").read_text(encoding="utf-8")
    AnswerRequest, TranslateRequest = request_schemas(limits)
    draining = False

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        nonlocal draining
        yield
        draining = True
        loop = asyncio.get_running_loop()
        for engine in engines.values():
            if engine is not None:  # the thread finishes the queued requests first
                await loop.run_in_executor(None, engine.batcher.close)

    app = FastAPI(title="fastqa", version=__version__, lifespan=lifespan,
                  description="Question answering and translation with the models of fastqa.")
    app.state.engines = engines

    async def submit(name: str, item: Any) -> Any:
        engine = engines[name]
        if engine is None:
            flag = "--qa-model" if name == "qa" else "--mt-model"
            raise RequestError(503, f"no {name} model is loaded here (start the server with {flag} DIR)")
        try:
            return await engine.batcher.submit(item, timeout=limits.timeout_s)
        except Busy as e:
            raise RequestError(503, str(e), headers={"Retry-After": "1"}) from None
        except Closed as e:
            raise RequestError(503, str(e), headers={"Retry-After": "5"}) from None
        except asyncio.TimeoutError:
            raise RequestError(504, f"the {name} model did not answer within {limits.timeout_s:g} s") from None
        except UserError as e:  # the model's own word on its input (a lone surrogate, nothing to read)
            raise RequestError(422, " ".join(str(e).split())) from None

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def home() -> HTMLResponse:
        return HTMLResponse(page)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        """Whether the server answers, its models and bounds, and how many requests each model has queued."""
        return {"status": "draining" if draining else "ok", "version": __version__,
                "models": {name: e.describe() if e else None for name, e in engines.items()},
                "limits": limits.to_dict(),
                "queue": {name: e.batcher.depth for name, e in engines.items() if e}}

    @app.get("/metrics", include_in_schema=False)
    async def prometheus() -> Response:
        for name, engine in engines.items():
            if engine is not None:
                metrics.queue.labels(name).set(engine.batcher.depth)
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.post("/answer", response_model=AnswerResponse)
    async def answer(request: AnswerRequest) -> dict[str, Any]:  # type: ignore[valid-type]
        """The answers to a question about a context, best first."""
        found = await submit("qa", AnswerItem(request.context, request.question, request.top_k,
                                              request.max_answer_len, request.min_score))
        return {"answer": found[0].to_dict(), "answers": [a.to_dict() for a in found]}

    @app.post("/translate", response_model=TranslateResponse)
    async def translate(request: TranslateRequest) -> dict[str, Any]:  # type: ignore[valid-type]
        """The translation of one sentence (``text``) or of several (``sentences``)."""
        sentences = [request.text] if request.text is not None else list(request.sentences)
        found = await submit("translation", TranslateItem(tuple(sentences), request.beam, request.nbest,
                                                          request.attention))
        return {"translations": [_translation_json(s, t) for s, t in zip(sentences, found)]}

    @app.exception_handler(RequestError)
    async def refused(request: Request, exc: RequestError) -> Response:
        return _error(exc.status, exc.message, exc.field, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> Response:
        errors = exc.errors()
        # A misspelt field also leaves the right one missing: the misspelling is the one to report.
        first = next((e for e in errors if e.get("type") == "extra_forbidden"), errors[0])
        where = [str(part) for part in first.get("loc", ())[1:]]
        if first.get("type") == "json_invalid":
            return _error(400, f"malformed JSON: {first.get('ctx', {}).get('error', first.get('msg'))}")
        if first.get("type") == "missing" and not where:
            return _error(400, "the request body is empty: send a JSON object")
        if not where and first.get("type") in ("model_attributes_type", "dict_type", "model_type"):
            return _error(422, "expected a JSON object")
        field = where[0] if where else None
        message = first.get("msg", "invalid request").removeprefix("Value error, ")
        if first.get("type") == "extra_forbidden":
            schema = {"/answer": AnswerRequest, "/translate": TranslateRequest}.get(request.url.path)
            message = "unknown field" + (f" (expected: {', '.join(schema.model_fields)})" if schema else "")
        return _error(422, f"{'.'.join(where)}: {message}" if where else message, field)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> Response:
        if exc.status_code == 404:
            message = f"no route {request.url.path} (routes: GET /, GET /health, GET /metrics, POST /answer, " \
                      "POST /translate, GET /docs)"
        elif exc.status_code == 405:
            message = f"{request.method} is not allowed on {request.url.path}"
        else:
            message = str(exc.detail)
        return _error(exc.status_code, message, headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def crashed(request: Request, exc: Exception) -> Response:
        # The traceback goes to the server's log; the client gets no internals.
        return _error(500, "internal server error (see the server's log)")

    app.add_middleware(_Observe, metrics=metrics, max_bytes=limits.max_body_bytes)
    return app


def _translation_json(source: str, translation: Any) -> dict[str, Any]:
    out = {"source": source, **translation.to_dict()}
    out["alternatives"] = [{"text": t.text, "score": t.score, "unsure": t.unsure} for t in translation.alternatives]
    return out


def app_from_environment() -> "FastAPI":
    """The application ``fastqa serve`` describes in ``SETTINGS_ENV`` (a JSON object: the model paths, device,
    threads and limits): what each worker process of ``--workers N`` builds."""
    from ..tasks.loading import set_threads

    settings = json.loads(os.environ[SETTINGS_ENV])
    set_threads(settings.get("threads"))
    qa = translation = None
    if settings.get("qa_model") is not None:
        from ..tasks.qa import QAModel
        qa = QAModel.load(settings["qa_model"], device=settings.get("device"), precision=settings.get("precision"))
    if settings.get("mt_model") is not None:
        from ..tasks.translation import Translator
        translation = Translator.load(settings["mt_model"], device=settings.get("device"),
                                      precision=settings.get("precision"))
    app = create_app(qa=qa, translation=translation, limits=ServeLimits(**settings.get("limits", {})),
                     qa_path=settings.get("qa_model"), mt_path=settings.get("mt_model"))
    for engine in app.state.engines.values():
        if engine is not None:
            engine.warm_up()
    # What is loaded by now (the models, the tokenizer's vocabulary, the libraries) lives as long as the process:
    # frozen, it is left out of the collector's full passes, each of which otherwise walks all of it while
    # holding the GIL -- a pause of every request in flight, a hundred milliseconds and more with spaCy loaded.
    gc.collect()
    gc.freeze()
    return app
