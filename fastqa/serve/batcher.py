"""Dynamic batching: concurrent requests for one model answered together, by one call on the model's thread.

A model call on the CPU costs about the same for one question as for a few (the matrix products are no wider
than the cores, and the call's fixed costs -- Python, dispatch, threads waking up -- are paid once), so answering
one request at a time makes every request wait for all the ones before it, each a batch of one. The ``Batcher``
collects what arrives while the model is busy, and -- the model being idle -- what keeps arriving after the first
waiting request: the batch goes once it holds ``max_batch`` requests, once no request has joined it for
``idle_ms`` (a lone request waits no longer than that), or once its first request has waited ``max_wait_ms``
(requests streaming in without a pause), and ``run_batch`` answers it in one call. Concurrent requests arrive
one after another, not at once: a batch closed after a fixed few milliseconds would answer the first few of a
burst and make the rest wait for that call, sharing the cores with their own arrival meanwhile.

* One thread per model runs the batches, so PyTorch's intra-op threads have the cores to themselves and a model
  object is only ever used by one caller (the models are written for that).
* The event loop only queues and waits: ``/health`` and the page answer at once while a batch runs.
* The queue is bounded (``max_pending``): past it a request is refused at once (``Busy``: the server says 503
  and when to retry) instead of waiting without end; a request whose caller stopped waiting (its timeout) is
  left out of the batch it would have joined.
* ``close`` lets the thread finish every request already queued, then stops it (graceful shutdown).

``run_batch`` receives the requests' items and returns one result per item, in order; an item's result may be
an exception, which that request alone raises.
"""
from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Generic, Sequence, TypeVar

from .limits import ServeLimits

__all__ = ["Batcher", "Busy", "Closed"]

_DEFAULTS = ServeLimits()  # the server's bounds are the batcher's defaults

I = TypeVar("I")  # noqa: E741 - an item of a request
R = TypeVar("R")  # its result


class Busy(RuntimeError):
    """Too many requests wait for this model already; retry later."""


class Closed(RuntimeError):
    """The batcher is shutting down and takes no new requests."""


@dataclass
class _Request(Generic[I]):
    item: I
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    arrived: float = field(default_factory=time.monotonic)
    abandoned: bool = False          # its caller stopped waiting: not worth a place in a batch


class Batcher(Generic[I, R]):
    """Gathers the items submitted concurrently into batches of at most ``max_batch``, run by ``run_batch`` on a
    thread of its own; ``on_batch(size, seconds)`` is told of each batch run (metrics)."""

    def __init__(self, run_batch: Callable[[list[I]], Sequence[R | BaseException]], *, name: str,
                 max_batch: int = _DEFAULTS.max_batch, max_wait_ms: float = _DEFAULTS.max_wait_ms,
                 idle_ms: float = _DEFAULTS.idle_ms, max_pending: int = _DEFAULTS.max_pending,
                 on_batch: Callable[[int, float], None] | None = None) -> None:
        if max_batch < 1 or max_pending < 1 or max_wait_ms < 0 or idle_ms < 0:
            raise ValueError(f"max_batch and max_pending must be >= 1, max_wait_ms and idle_ms >= 0, got {max_batch}, "
                             f"{max_pending}, {max_wait_ms}, {idle_ms}")
        self.run_batch, self.name = run_batch, name
        self.max_batch, self.max_pending = max_batch, max_pending
        self.max_wait, self.idle = max_wait_ms / 1e3, idle_ms / 1e3
        self.on_batch = on_batch
        self._queue: deque[_Request[I]] = deque()
        self._running = 0                # requests in the batch being run
        self._closing = False
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    @property
    def depth(self) -> int:
        """Requests queued or in the batch being run."""
        with self._cond:
            return len(self._queue) + self._running

    async def submit(self, item: I, timeout: float | None = None) -> R:
        """``item``'s result, once its batch has run. Busy when ``max_pending`` requests wait already; Closed
        while shutting down; ``asyncio.TimeoutError`` after ``timeout`` seconds (the item leaves the queue)."""
        loop = asyncio.get_running_loop()
        request = _Request(item, loop.create_future(), loop)
        with self._cond:
            if self._closing:
                raise Closed(f"the {self.name} model is shutting down")
            if len(self._queue) + self._running >= self.max_pending:
                raise Busy(f"the {self.name} model has {len(self._queue) + self._running} requests waiting; "
                           "retry in a moment")
            self._queue.append(request)
            if self._thread is None:     # started on first use: a batcher built and never called costs nothing
                self._thread = threading.Thread(target=self._work, name=f"fastqa-{self.name}", daemon=True)
                self._thread.start()
            self._cond.notify()
        try:
            return await asyncio.wait_for(asyncio.shield(request.future), timeout)
        except (asyncio.TimeoutError, asyncio.CancelledError):
            request.abandoned = True
            raise

    def close(self) -> None:
        """Take no new requests, finish the queued ones, stop the thread."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join()

    # -- the model's thread
    def _next_batch(self) -> list[_Request[I]] | None:
        """The next batch, once it is full, no request has joined it for ``idle`` or its first request has waited
        ``max_wait``; None when closed and drained."""
        with self._cond:
            while True:
                while not self._queue and not self._closing:
                    self._cond.wait()
                if not self._queue:
                    return None
                # Requests that arrived while the model was busy have waited already: they go at once.
                deadline = self._queue[0].arrived + self.max_wait
                while len(self._queue) < self.max_batch and not self._closing:
                    left = min(deadline, self._queue[-1].arrived + self.idle) - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
                batch: list[_Request[I]] = []
                while self._queue and len(batch) < self.max_batch:
                    request = self._queue.popleft()
                    if not request.abandoned:
                        batch.append(request)
                if batch:
                    self._running = len(batch)
                    return batch

    def _work(self) -> None:
        while (batch := self._next_batch()) is not None:
            t0 = time.perf_counter()
            try:
                results: Sequence[Any] = self.run_batch([r.item for r in batch])
                if len(results) != len(batch):
                    raise RuntimeError(f"run_batch returned {len(results)} results for {len(batch)} items")
            except BaseException as e:  # noqa: BLE001 - every request of the batch hears of it, the thread lives on
                results = [e] * len(batch)
            seconds = time.perf_counter() - t0
            if self.on_batch is not None:  # before the answers go out: a caller that reads the metrics sees it
                self.on_batch(len(batch), seconds)
            with self._cond:
                self._running = 0
            for request, result in zip(batch, results):
                request.loop.call_soon_threadsafe(_settle, request.future, result)


def _settle(future: asyncio.Future, result: Any) -> None:
    if future.done():  # its caller was cancelled
        return
    if isinstance(result, BaseException):
        future.set_exception(result)
    else:
        future.set_result(result)
