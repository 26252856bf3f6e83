"""Talking to ``fastqa serve`` in the tests: a small JSON client over urllib, the command started as a
subprocess on a free port, and an application served from a thread of the test process."""
from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Iterator

from cli_helpers import launch_serve

# Headless, offline and quiet: no sandbox (root in a container), no GPU, no network of its own, no updates.
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def run_chromium(chromium: str, url: str, profile: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Chromium on ``url`` with a fresh profile folder; ``args`` says what to do (--dump-dom, --screenshot=...).
    The virtual-time budget lets the page's script finish its requests before the DOM is dumped or drawn."""
    return subprocess.run([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--virtual-time-budget=30000",
                           *args, url], capture_output=True, text=True, timeout=timeout)


class Client:
    """JSON requests to one server; 4xx/5xx answers are returned, not raised."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")

    def request(self, method: str, path: str, body: Any = None, *, raw: bytes | None = None,
                timeout: float = 60) -> tuple[int, Any, dict[str, str]]:
        """(status, decoded JSON body (text when not JSON), headers) of one request."""
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode("utf-8"))
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"} if data is not None else {})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as response:
                status, payload, headers = response.status, response.read(), dict(response.headers)
        except urllib.error.HTTPError as e:
            status, payload, headers = e.code, e.read(), dict(e.headers)
        text = payload.decode("utf-8")
        try:
            return status, json.loads(text), headers
        except json.JSONDecodeError:
            return status, text, headers

    def post(self, path: str, body: Any = None, **kwargs: Any) -> tuple[int, Any]:
        status, payload, _ = self.request("POST", path, body, **kwargs)
        return status, payload

    def get(self, path: str) -> tuple[int, Any]:
        status, payload, _ = self.request("GET", path)
        return status, payload


class Server(Client):
    """A running ``fastqa serve`` subprocess."""

    def __init__(self, process: subprocess.Popen, url: str, log: Path) -> None:
        super().__init__(url)
        self.process, self.log = process, log

def start_server(args: list[str], log: Path, timeout: float = 180) -> Server:
    """``python -m fastqa serve ARGS --port 0 ...``; returns once the address line is printed and /health answers."""
    # On the CPU even where there is a GPU: the tests compare the server's answers with the Python API's on the CPU.
    flags = [*args, "--port", "0", "--device", "cpu", "--threads", "1", "--log-level", "warning"]
    process, url = launch_serve(flags, log, timeout=timeout)
    if url is None:
        process.kill()
        process.wait()
        raise AssertionError(f"fastqa serve did not start (fastqa serve {' '.join(flags)}):\n{log.read_text()[-3000:]}")
    server = Server(process, url, log)
    deadline = time.monotonic() + 30
    try:
        while True:
            try:
                if server.get("/health")[0] == 200:
                    return server
            except OSError:
                pass  # not accepting yet
            if time.monotonic() > deadline:
                raise AssertionError(f"fastqa serve printed its address but /health does not answer:\n"
                                     f"{log.read_text()[-3000:]}")
            time.sleep(0.2)
    except BaseException:
        stop_server(server)  # whatever went wrong, no server is left running after the test
        raise


def stop_server(server: Server) -> None:
    """SIGTERM (uvicorn's graceful stop), then kill if it lingers."""
    server.process.terminate()
    try:
        server.process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        server.process.kill()
        server.process.wait()


@contextlib.contextmanager
def serve_in_thread(app: Any) -> Iterator[Client]:
    """``app`` served by uvicorn from a thread of this process on a free port of 127.0.0.1."""
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the in-process server did not start"
        time.sleep(0.05)
    try:
        yield Client(f"http://127.0.0.1:{sock.getsockname()[1]}")
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()
