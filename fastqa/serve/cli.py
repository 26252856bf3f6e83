"""``fastqa serve``: the HTTP JSON API and its page, on 127.0.0.1 unless told otherwise.

    fastqa serve --qa-model runs/qanet --mt-model runs/convs2s [--host 127.0.0.1] [--port 8000]

Each task of ``fastqa.tasks.TASKS`` with a ``serve_flag`` adds its model flag (``--qa-model``, ``--mt-model``).

Only argparse and the shared flags are imported here; torch, the models and the server library load when the
command runs, so ``fastqa --help`` stays quick.
"""
from __future__ import annotations

import argparse
import socket

from ..tasks import TASKS, added_tasks
from ..tasks.flags import add_runtime_flags, counted, nonnegative_float, positive_float, resolve_device
from .limits import ServeLimits

__all__ = ["register", "run_serve"]

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number 0..65535, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port number 0..65535, got {text!r}")
    return value


def register(subparsers) -> None:
    """Add ``serve`` to the ``fastqa`` command."""
    defaults = ServeLimits()
    p = subparsers.add_parser(
        "serve", help="serve the QA reader and/or the translator over HTTP (JSON API and a page)",
        description="An HTTP JSON API (POST /answer, POST /translate, GET /health) and a page at / to try the "
        "models. The models load once, before the server listens. Binds 127.0.0.1 unless --host says otherwise: "
        "there is no authentication, so expose it only behind something that has.")
    for task in TASKS:  # each served task's model flag: --qa-model, --mt-model
        if task.serve_flag is not None:
            p.add_argument(task.serve_flag, metavar="DIR", help=task.serve_help)
    p.add_argument("--host", default=DEFAULT_HOST, help=f"address to listen on (default {DEFAULT_HOST})")
    p.add_argument("--port", type=_port, default=DEFAULT_PORT,
                   help=f"port to listen on (default {DEFAULT_PORT}; 0: a free one, printed at start)")
    p.add_argument("--max-body-bytes", type=counted("max_body_bytes"), default=defaults.max_body_bytes, metavar="N",
                   help=f"largest request body; beyond it 413 (default {defaults.max_body_bytes})")
    p.add_argument("--max-context-chars", type=counted("max_context_chars"), default=defaults.max_context_chars, metavar="N",
                   help=f"longest context of /answer; beyond it 422 (default {defaults.max_context_chars})")
    p.add_argument("--max-sentence-chars", type=counted("max_sentence_chars"), default=defaults.max_sentence_chars, metavar="N",
                   help=f"longest sentence of /translate; beyond it 422 (default {defaults.max_sentence_chars})")
    p.add_argument("--max-sentences", type=counted("max_sentences"), default=defaults.max_sentences, metavar="N",
                   help=f"most sentences in one /translate request (default {defaults.max_sentences})")
    p.add_argument("--max-pending", type=counted("max_pending"), default=defaults.max_pending, metavar="N",
                   help="requests that may wait for one model; beyond it 503 with Retry-After "
                   f"(default {defaults.max_pending})")
    p.add_argument("--max-batch", type=counted("max_batch"), default=defaults.max_batch, metavar="N",
                   help=f"most concurrent requests one model call answers (default {defaults.max_batch})")
    p.add_argument("--max-wait-ms", type=nonnegative_float, default=defaults.max_wait_ms, metavar="MS",
                   help="the longest a request waits for others to join its batch, milliseconds "
                   f"(default {defaults.max_wait_ms:g})")
    p.add_argument("--idle-ms", type=nonnegative_float, default=defaults.idle_ms, metavar="MS",
                   help="a batch goes to the model once no request has joined it for MS milliseconds "
                   f"(default {defaults.idle_ms:g}): a lone request waits no longer")
    p.add_argument("--timeout-s", type=positive_float, default=defaults.timeout_s, metavar="S",
                   help=f"a request not answered within S seconds gets 504 (default {defaults.timeout_s:g})")
    p.add_argument("--workers", type=counted("workers"), default=1, metavar="N",
                   help="server processes, each with its own copy of the models (default 1)")
    p.add_argument("--log-level", choices=("critical", "error", "warning", "info", "debug"), default="info",
                   help="the server's log level (default info: one line per request)")
    add_runtime_flags(p)
    p.set_defaults(func=run_serve)


def _listen(host: str, port: int) -> socket.socket:
    """A listening socket on host:port, bound here so that a port in use is one line, not a traceback, and
    so that port 0 gives a free port whose number is known before the server starts."""
    from ..errors import UserError

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise UserError(f"--host {host}: cannot listen there ({e.strerror})") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as e:
        sock.close()
        raise UserError(f"--host {host} --port {port}: cannot listen there ({e.strerror})") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def run_serve(args: argparse.Namespace) -> int:
    import json
    import os
    import tempfile

    from ..errors import UserError
    from .app import INSTALL_HINT, SETTINGS_ENV, model_flags

    served = [task for task in TASKS if task.serve_flag is not None]
    if all(getattr(args, task.serve_dest) is None for task in served):
        # No model flag: serve the models shipped with the package (those installed here).
        from .. import pretrained

        shipped = pretrained.available()
        for task in served:
            setattr(args, task.serve_dest, task.shipped if task.shipped in shipped else None)
        if all(getattr(args, task.serve_dest) is None for task in served):
            raise UserError(f"serve: no shipped model is installed here; give {model_flags(served)}")
    try:
        import uvicorn
    except ImportError:
        raise UserError(INSTALL_HINT) from None
    limits = ServeLimits(max_body_bytes=args.max_body_bytes, max_context_chars=args.max_context_chars,
                         max_sentence_chars=args.max_sentence_chars, max_sentences=args.max_sentences,
                         max_pending=args.max_pending, max_batch=args.max_batch, max_wait_ms=args.max_wait_ms,
                         idle_ms=args.idle_ms, timeout_s=args.timeout_s)
    models = {task.serve_dest: getattr(args, task.serve_dest) for task in served}
    settings = {**{dest: None if path is None else str(path) for dest, path in models.items()},
                "device": resolve_device(args.device), "threads": args.threads, "precision": args.precision,
                "limits": limits.to_dict(), "added_tasks": added_tasks()}
    # One description of the app for this process and every worker process (they read it from the environment).
    os.environ[SETTINGS_ENV] = json.dumps(settings)
    # Bind before loading: a port in use is reported before the models spend seconds loading.
    sock = _listen(args.host, args.port)
    try:
        from .app import app_from_environment

        # Built here in every case: a model that does not load is one line before anything listens.
        app = app_from_environment()
        host, port = sock.getsockname()[:2]
        shown = f"[{host}]" if ":" in host else host
        loaded = ", ".join(task.name for task in served if settings[task.serve_dest])
        workers = f" ({args.workers} worker processes)" if args.workers > 1 else ""
        # One line on stdout ending with the address (scripts and tests read the port from it when --port is 0).
        print(f"fastqa serve: {loaded}{workers} on http://{shown}:{port}/", flush=True)
        if args.workers == 1:
            config = uvicorn.Config(app, log_level=args.log_level, timeout_graceful_shutdown=int(args.timeout_s) + 5)
            uvicorn.Server(config).run(sockets=[sock])
            return 0
        del app
        from uvicorn.supervisors import Multiprocess

        with tempfile.TemporaryDirectory(prefix="fastqa-metrics-") as metrics_dir:
            # prometheus-client adds up the workers' metrics from files here (set before a worker imports it).
            os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
            config = uvicorn.Config("fastqa.serve.app:app_from_environment", factory=True, workers=args.workers,
                                    log_level=args.log_level, timeout_graceful_shutdown=int(args.timeout_s) + 5)
            Multiprocess(config, sockets=[sock]).run()
    finally:
        sock.close()
    return 0
