"""The HTTP application, on FastAPI: requests and responses declared once as pydantic schemas (validation, 422
errors naming the field, and the OpenAPI description at /openapi.json and /docs), each model's requests batched.

Routes (every response is JSON except the page and /metrics; every error is ``{"error": MESSAGE, "status":
CODE}`` plus ``"field"`` when one field is at fault):

    GET  /            the page (``page.html``: inline script and style, nothing fetched from elsewhere)
    GET  /health      {"status": "ok" | "draining", "version", "models": {...}, "limits": {...}, "queue": {...}}
    GET  /metrics     Prometheus text: requests by route and status, latency histogram, batch sizes, queue depth
    POST /answer      AnswerRequest -> {"answer": Answer, "answers": [Answer, ...]}      (fastqa/tasks/qa/serving.py)
    POST /translate   TranslateRequest -> {"translations": [Translation, ...]}  (fastqa/tasks/translation/serving.py)

Each task's route comes from its spec (``fastqa.tasks.TASKS``); ``create_app`` builds the one application: the
routes and error handlers below are module-level functions, the state they share is ``app.state``.

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

from .._version import __version__
from ..errors import UserError
from .batcher import Busy, Closed
from ..tasks import TASKS, TaskSpec, add_tasks_of
from .engines import Engine
from .limits import ServeLimits

try:  # the serve extra; without it this module still imports (create_app then says what to install)
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import HTMLResponse, JSONResponse, Response
    from starlette.exceptions import HTTPException
except ImportError as e:  # pragma: no cover - exercised only where the extra is missing
    _MISSING: ImportError | None = e
    FastAPI = Request = Response = HTMLResponse = Any  # type: ignore[assignment,misc]
else:
    _MISSING = None

__all__ = ["create_app", "app_from_environment", "INSTALL_HINT", "SETTINGS_ENV"]

INSTALL_HINT = "fastqa serve needs the serve extra: pip install 'fastqa[serve]' (fastapi, uvicorn, prometheus-client)"
#: the environment variable through which ``fastqa serve --workers N`` hands its settings to each worker process
SETTINGS_ENV = "FASTQA_SERVE_SETTINGS"
#: the routes of every server; each served task adds its own (``Serving.route``)
ROUTES = ("/", "/health", "/metrics", "/docs", "/openapi.json")
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

    def __init__(self, app: Any, metrics: Metrics, max_bytes: int, routes: tuple[str, ...]) -> None:
        self.app, self.metrics, self.max_bytes, self.routes = app, metrics, max_bytes, routes

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        route = scope["path"] if scope["path"] in self.routes else "other"
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

def create_app(*, limits: ServeLimits = ServeLimits(), paths: dict[str, str | None] | None = None,
               **models: Any) -> "FastAPI":
    """The application serving ``models`` (task name -> its loaded predictor, e.g. ``qa=QAModel``,
    ``translation=Translator``; a request never waits for a model to load) on each task's route (``TASKS``),
    their requests batched within ``limits``; ``paths``: task name -> where its model came from (``/health``).
    Shutting the application down answers the requests already queued, then stops the models' threads."""
    if _MISSING is not None:
        raise UserError(f"{INSTALL_HINT} ({_MISSING})")
    served = [task for task in TASKS if task.serving is not None]
    unknown = sorted(set(models) - {task.name for task in served})
    if unknown:
        raise TypeError(f"create_app: no served task is named {unknown[0]!r} (tasks: "
                        f"{', '.join(task.name for task in served)})")
    if all(models.get(task.name) is None for task in served):
        raise UserError(f"fastqa serve needs a model: {model_flags(served)}")
    app = FastAPI(title="fastqa", version=__version__, lifespan=_lifespan,
                  description="Question answering and translation with the models of fastqa.")
    state, metrics = app.state, Metrics()
    state.limits, state.metrics, state.draining, state.schemas, state.flags = limits, metrics, False, {}, {}
    state.page = resources.files(__package__).joinpath("page.html").read_text(encoding="utf-8")
    state.engines = {}
    batching = {"max_batch": limits.max_batch, "max_wait_ms": limits.max_wait_ms, "idle_ms": limits.idle_ms,
                "max_pending": limits.max_pending}
    app.add_api_route("/", home, methods=["GET"], response_class=HTMLResponse, include_in_schema=False)
    app.add_api_route("/health", health, methods=["GET"])
    app.add_api_route("/metrics", prometheus, methods=["GET"], include_in_schema=False)
    for task in served:
        serving, model = task.load_serving(), models.get(task.name)
        state.engines[task.name] = None if model is None else Engine(
            task.name, model, serving, path=(paths or {}).get(task.name), on_batch=metrics.on_batch(task.name),
            **batching)
        schema = state.schemas[serving.route] = serving.request_schema(limits)
        state.flags[task.name] = task.serve_flag
        app.add_api_route(serving.route, _task_route(task.name, schema), methods=["POST"], name=serving.name,
                          response_model=serving.response_schema, description=serving.summary)
    app.add_exception_handler(RequestError, refused)
    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(Exception, crashed)
    app.add_middleware(_Observe, metrics=metrics, max_bytes=limits.max_body_bytes,
                       routes=ROUTES + tuple(state.schemas))
    return app


def model_flags(tasks: list[TaskSpec]) -> str:
    """"--qa-model DIR, --mt-model DIR or both": the flags that give ``fastqa serve`` its models."""
    flags = [f"{task.serve_flag} DIR" for task in tasks if task.serve_flag]
    return ", ".join(flags) + (f" or {'both' if len(flags) == 2 else 'several'}" if len(flags) > 1 else "")


@contextlib.asynccontextmanager
async def _lifespan(app: "FastAPI") -> AsyncIterator[None]:
    yield
    app.state.draining = True
    loop = asyncio.get_running_loop()
    for engine in app.state.engines.values():
        if engine is not None:  # the thread finishes the queued requests first
            await loop.run_in_executor(None, engine.batcher.close)


# ----------------------------------------------------------------------------------------------- the routes

async def home(request: Request) -> HTMLResponse:
    return HTMLResponse(request.app.state.page)


async def health(request: Request) -> dict[str, Any]:
    """Whether the server answers, its models and bounds, and how many requests each model has queued."""
    state = request.app.state
    return {"status": "draining" if state.draining else "ok", "version": __version__,
            "models": {name: e.describe() if e else None for name, e in state.engines.items()},
            "limits": state.limits.to_dict(),
            "queue": {name: e.batcher.depth for name, e in state.engines.items() if e}}


async def prometheus(request: Request) -> Response:
    state = request.app.state
    for name, engine in state.engines.items():
        if engine is not None:
            state.metrics.queue.labels(name).set(engine.batcher.depth)
    return Response(state.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")


def _task_route(name: str, schema: type) -> Any:
    """The endpoint of a task's route: its body is the task's request schema (validated by FastAPI)."""
    async def endpoint(request: Request, body: schema) -> dict[str, Any]:  # type: ignore[valid-type]
        return await answer_task(request, name, body)
    return endpoint


async def answer_task(request: Request, name: str, body: Any) -> dict[str, Any]:
    """A request of the task ``name``: its item through the model's batcher, its result as the response."""
    state = request.app.state
    engine = state.engines[name]
    if engine is None:
        raise RequestError(503, f"no {name} model is loaded here (start the server with {state.flags[name]} DIR)")
    timeout = state.limits.timeout_s
    try:
        found = await engine.batcher.submit(engine.serving.item(body), timeout=timeout)
    except Busy as e:
        raise RequestError(503, str(e), headers={"Retry-After": "1"}) from None
    except Closed as e:
        raise RequestError(503, str(e), headers={"Retry-After": "5"}) from None
    except asyncio.TimeoutError:
        raise RequestError(504, f"the {name} model did not answer within {timeout:g} s") from None
    except UserError as e:  # the model's own word on its input (a lone surrogate, nothing to read)
        raise RequestError(422, " ".join(str(e).split())) from None
    return engine.serving.respond(body, found)


# ----------------------------------------------------------------------------------------------- the errors

async def refused(request: Request, exc: RequestError) -> Response:
    return _error(exc.status, exc.message, exc.field, exc.headers)


async def invalid(request: Request, exc: "RequestValidationError") -> Response:
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
        schema = request.app.state.schemas.get(request.url.path)
        message = "unknown field" + (f" (expected: {', '.join(schema.model_fields)})" if schema else "")
    return _error(422, f"{'.'.join(where)}: {message}" if where else message, field)


async def http_error(request: Request, exc: "HTTPException") -> Response:
    if exc.status_code == 404:
        posts = ", ".join(f"POST {route}" for route in request.app.state.schemas)
        message = f"no route {request.url.path} (routes: GET /, GET /health, GET /metrics, {posts}, GET /docs)"
    elif exc.status_code == 405:
        message = f"{request.method} is not allowed on {request.url.path}"
    else:
        message = str(exc.detail)
    return _error(exc.status_code, message, headers=getattr(exc, "headers", None))


async def crashed(request: Request, exc: Exception) -> Response:
    # The traceback goes to the server's log; the client gets no internals.
    return _error(500, "internal server error (see the server's log)")


def app_from_environment() -> "FastAPI":
    """The application ``fastqa serve`` describes in ``SETTINGS_ENV`` (a JSON object: the model paths, device,
    threads and limits): what each worker process of ``--workers N`` builds."""
    from ..tasks.loading import cpu_threads

    settings = json.loads(os.environ[SETTINGS_ENV])
    if settings.get("added_tasks"):
        add_tasks_of(settings["added_tasks"])  # a worker process starts with the built-in tasks only
    cpu_threads(settings.get("threads"))  # for the worker's life
    served = [task for task in TASKS if task.serving is not None]
    paths = {task.name: settings.get(task.serve_dest) for task in served}
    models = {task.name: None if paths[task.name] is None else task.load(
        paths[task.name], device=settings.get("device"), precision=settings.get("precision")) for task in served}
    app = create_app(limits=ServeLimits(**settings.get("limits", {})), paths=paths, **models)
    for engine in app.state.engines.values():
        if engine is not None:
            engine.warm_up()
    # What is loaded by now (the models, the tokenizer's vocabulary, the libraries) lives as long as the process:
    # frozen, it is left out of the collector's full passes, each of which otherwise walks all of it while
    # holding the GIL -- a pause of every request in flight, a hundred milliseconds and more with spaCy loaded.
    gc.collect()
    gc.freeze()
    return app
