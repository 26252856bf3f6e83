"""The HTTP application: routes, request checking and JSON errors, on Starlette (served by uvicorn).

Routes (every response is JSON except the page; every error is ``{"error": MESSAGE, "status": CODE}`` plus
``"field"`` when one field is at fault):

    GET  /           the page (``page.html``: inline script and style, nothing fetched from elsewhere)
    GET  /health     {"status": "ok", "version", "models": {"qa": {...} | null, "translation": {...} | null},
                      "limits": {...}}
    POST /answer     {"context": str, "question": str, "top_k"?: int = 1, "max_answer_len"?: int}
                     -> {"answer": {"text", "score", "start", "end", ...}, "top_k": [{"text", "score",
                        "start", "end"}, ...]}          (start/end: character offsets, context[start:end] == text)
    POST /translate  {"text": str | "sentences": [str], "beam"?: int = 5, "attention"?: bool = false,
                      "nbest"?: int}
                     -> {"translations": [{"source", "text", "attention"?: {"source", "target", "weights"},
                        "nbest"?: [{"text", "score"}]}]}

Status codes: 400 malformed JSON; 413 a body over ``max_body_bytes``; 422 a missing, unknown or mistyped
field, a value out of bounds, or text the model cannot read; 503 no such model loaded, or too many requests
waiting for it (with Retry-After); 404/405 unknown route or method.
"""
from __future__ import annotations

import contextlib
import json
from importlib import resources
from typing import Any, AsyncIterator

from .._version import __version__
from ..errors import UserError
from .engines import Busy, QAEngine, TranslationEngine
from .limits import ServeLimits

try:  # the serve extra; without it this module still imports (create_app then says what to install)
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.requests import ClientDisconnect, Request
    from starlette.responses import HTMLResponse, JSONResponse, Response
    from starlette.routing import Route
except ImportError as e:  # pragma: no cover - exercised only where the extra is missing
    _MISSING: ImportError | None = e
else:
    _MISSING = None

__all__ = ["create_app", "RequestError", "INSTALL_HINT"]

INSTALL_HINT = "fastqa serve needs the serve extra: pip install 'fastqa[serve]' (starlette and uvicorn)"

# How much of an oversized body is still read (and thrown away) before the 413 goes out: a client that
# sends its whole body before reading the response then gets the 413 instead of a reset connection. Past
# this the server answers at once and closes the connection.
_DRAIN_FACTOR = 8


class RequestError(Exception):
    """A request the server refuses: its HTTP status, a message for the client and the field at fault."""

    def __init__(self, status: int, message: str, field: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.field, self.headers = status, message, field, headers

    def response(self) -> "JSONResponse":
        body: dict[str, Any] = {"error": self.message, "status": self.status}
        if self.field is not None:
            body["field"] = self.field
        return JSONResponse(body, status_code=self.status, headers=self.headers)


# ------------------------------------------------------------------------------------------ reading requests

async def read_json(request: "Request", max_bytes: int) -> dict[str, Any]:
    """The request's body as a JSON object, at most ``max_bytes`` long (413 beyond, 400 if not JSON, 422 if
    not an object)."""
    too_big = RequestError(413, f"the request body is larger than {max_bytes} bytes (the server's limit)")
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > _DRAIN_FACTOR * max_bytes:
        raise too_big
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size <= max_bytes:
                chunks.append(chunk)
            elif size > _DRAIN_FACTOR * max_bytes:
                break  # stop reading: the connection is closed after the response
    except ClientDisconnect:  # nobody is left to answer; a 400 keeps it out of the log's tracebacks
        raise RequestError(400, "the client closed the connection before sending the whole body") from None
    if size > max_bytes:
        raise too_big
    body = b"".join(chunks)
    if not body.strip():
        raise RequestError(400, "the request body is empty: send a JSON object")
    try:
        # JSON between systems is UTF-8 (RFC 8259); json.loads would also guess UTF-16/32 from the bytes.
        data = json.loads(body.decode("utf-8-sig"))
    except UnicodeDecodeError:
        raise RequestError(400, "the request body is not UTF-8 text") from None
    except json.JSONDecodeError as e:
        raise RequestError(400, f"malformed JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    if not isinstance(data, dict):
        raise RequestError(422, f"expected a JSON object, got a JSON {_json_type(data)}")
    return data


def _json_type(value: Any) -> str:
    """The JSON name of a decoded value's type, for error messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    return {str: "string", list: "array", dict: "object"}.get(type(value), type(value).__name__)


def check_fields(data: dict[str, Any], allowed: tuple[str, ...]) -> None:
    """422 for a field the route does not know (a misspelt "questoin" would otherwise be silently ignored)."""
    unknown = [name for name in data if name not in allowed]
    if unknown:
        raise RequestError(422, f"unknown field {unknown[0]!r} (expected: {', '.join(allowed)})", unknown[0])


def text_field(data: dict[str, Any], name: str, max_chars: int) -> str:
    """A required non-empty string of at most ``max_chars`` characters."""
    if name not in data:
        raise RequestError(422, f"missing field {name!r}", name)
    value = data[name]
    if not isinstance(value, str):
        raise RequestError(422, f"{name}: expected a string, got a JSON {_json_type(value)}", name)
    if not value.strip():
        raise RequestError(422, f"{name}: the text is empty", name)
    if len(value) > max_chars:
        raise RequestError(422, f"{name}: {len(value)} characters, more than the server's limit of {max_chars}", name)
    return value


def int_field(data: dict[str, Any], name: str, default: int | None, low: int, high: int) -> int | None:
    """An optional integer in [low, high] (a JSON boolean or a fraction is refused, not rounded)."""
    value = data.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(422, f"{name}: expected an integer, got a JSON {_json_type(value)}", name)
    if not low <= value <= high:
        raise RequestError(422, f"{name}: {value} is out of range (expected {low} to {high})", name)
    return value


def bool_field(data: dict[str, Any], name: str, default: bool) -> bool:
    value = data.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise RequestError(422, f"{name}: expected true or false, got a JSON {_json_type(value)}", name)
    return value


def sentences_field(data: dict[str, Any], limits: ServeLimits) -> list[str]:
    """``text`` (one sentence) or ``sentences`` (a list of them), exactly one of the two."""
    if ("text" in data) == ("sentences" in data):
        raise RequestError(422, "send either 'text' (a sentence) or 'sentences' (a list of sentences)",
                           None if "text" in data else "text")
    if "text" in data:
        return [text_field(data, "text", limits.max_sentence_chars)]
    value = data["sentences"]
    if not isinstance(value, list):
        raise RequestError(422, f"sentences: expected an array of strings, got a JSON {_json_type(value)}",
                           "sentences")
    if not value:
        raise RequestError(422, "sentences: the list is empty", "sentences")
    if len(value) > limits.max_sentences:
        raise RequestError(422, f"sentences: {len(value)} sentences, more than the server's limit of "
                           f"{limits.max_sentences} per request", "sentences")
    for i, sentence in enumerate(value):
        if not isinstance(sentence, str):
            raise RequestError(422, f"sentences[{i}]: expected a string, got a JSON {_json_type(sentence)}",
                               "sentences")
        if len(sentence) > limits.max_sentence_chars:
            raise RequestError(422, f"sentences[{i}]: {len(sentence)} characters, more than the server's limit "
                               f"of {limits.max_sentence_chars}", "sentences")
    return value


# ------------------------------------------------------------------------------------------------ the app

def create_app(*, qa: QAEngine | None = None, translation: TranslationEngine | None = None,
               limits: ServeLimits = ServeLimits()) -> "Starlette":
    """The application serving ``qa`` and/or ``translation`` (already loaded: a request never waits for a
    model to load). The engines' threads stop when the application shuts down."""
    if _MISSING is not None:
        raise UserError(f"{INSTALL_HINT} ({_MISSING})")
    if qa is None and translation is None:
        raise UserError("fastqa serve needs a model: --qa-model DIR, --mt-model DIR or both")
    for engine in (qa, translation):
        if engine is not None:
            engine.max_pending = limits.max_pending
    page = resources.files(__package__).joinpath("page.html").read_text(encoding="utf-8")

    async def call(engine: QAEngine | TranslationEngine, function: Any, *args: Any, **kwargs: Any) -> Any:
        """Run a model call on its engine's thread, turning what the model says about the input into 422."""
        try:
            return await engine.run(function, *args, **kwargs)
        except Busy as e:
            raise RequestError(503, str(e), headers={"Retry-After": "1"}) from None
        except UserError as e:  # the model's own word on its input (a lone surrogate, nothing to read)
            raise RequestError(422, " ".join(str(e).split())) from None

    async def home(request: Request) -> Response:
        return HTMLResponse(page)

    async def health(request: Request) -> Response:
        return JSONResponse({
            "status": "ok", "version": __version__,
            "models": {"qa": qa.describe() if qa else None,
                       "translation": translation.describe() if translation else None},
            "limits": limits.to_dict()})

    async def answer(request: Request) -> Response:
        if qa is None:
            raise RequestError(503, "no QA model is loaded here (start the server with --qa-model DIR)")
        data = await read_json(request, limits.max_body_bytes)
        check_fields(data, ("context", "question", "top_k", "max_answer_len"))
        context = text_field(data, "context", limits.max_context_chars)
        question = text_field(data, "question", limits.max_question_chars)
        top_k = int_field(data, "top_k", 1, 1, limits.max_top_k)
        max_answer_len = int_field(data, "max_answer_len", None, 0, limits.max_answer_len)
        result = await call(qa, qa.answer, context, question, top_k=top_k, max_answer_len=max_answer_len)
        return JSONResponse(result)

    async def translate(request: Request) -> Response:
        if translation is None:
            raise RequestError(503, "no translation model is loaded here (start the server with --mt-model DIR)")
        data = await read_json(request, limits.max_body_bytes)
        check_fields(data, ("text", "sentences", "beam", "attention", "nbest"))
        sentences = sentences_field(data, limits)
        beam = int_field(data, "beam", 5, 1, limits.max_beam)
        attention = bool_field(data, "attention", False)
        nbest = int_field(data, "nbest", None, 1, beam)
        rows = await call(translation, translation.translate, sentences, beam=beam, attention=attention,
                          nbest=nbest)
        return JSONResponse({"translations": rows})

    async def refused(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestError)
        return exc.response()

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        if exc.status_code == 404:
            message = f"no route {request.url.path} (routes: GET /, GET /health, POST /answer, POST /translate)"
        elif exc.status_code == 405:
            message = f"{request.method} is not allowed on {request.url.path}"
        else:
            message = str(exc.detail)
        return JSONResponse({"error": message, "status": exc.status_code}, status_code=exc.status_code,
                            headers=exc.headers)

    async def crashed(request: Request, exc: Exception) -> Response:
        # Starlette logs the traceback after this answer; the client gets no internals.
        return JSONResponse({"error": "internal server error (see the server's log)", "status": 500},
                            status_code=500)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        for engine in (qa, translation):
            if engine is not None:
                engine.close()

    routes = [Route("/", home, methods=["GET"]), Route("/health", health, methods=["GET"]),
              Route("/answer", answer, methods=["POST"]), Route("/translate", translate, methods=["POST"])]
    return Starlette(routes=routes, lifespan=lifespan,
                     exception_handlers={RequestError: refused, HTTPException: http_error, Exception: crashed})
