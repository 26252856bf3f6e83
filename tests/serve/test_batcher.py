"""Dynamic batching on its own (``fastqa.serve.batcher``, ``engines.grouped``) and the server's bounds: what
waits joins one batch, the bounds hold, errors stay with their request, a timed-out request leaves the queue,
and closing answers everything already queued."""
from __future__ import annotations

import asyncio
import threading

import pytest

from fastqa.serve.batcher import Batcher, Busy, Closed
from fastqa.serve.engines import grouped
from fastqa.serve.limits import ServeLimits


class Recorder:
    """A ``run_batch`` that records its batches, doubles its items and, while ``gate`` is clear, blocks the
    model's thread (so that a test decides what is queued when the next batch forms)."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.started = threading.Event()

    def __call__(self, items: list[int]) -> list[object]:
        self.batches.append(list(items))
        self.started.set()
        assert self.gate.wait(30)
        return [ValueError(f"bad item {i}") if i < 0 else 2 * i for i in items]


async def _until(condition, timeout: float = 10.0) -> None:
    for _ in range(int(timeout / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("timed out waiting")


def test_what_waits_while_the_model_works_joins_one_batch():
    async def main() -> None:
        run = Recorder()
        batcher = Batcher(run, name="t", max_batch=32, max_wait_ms=1000)
        run.gate.clear()
        first = asyncio.ensure_future(batcher.submit(1))
        await _until(run.started.is_set)          # the model is busy with [1]
        rest = [asyncio.ensure_future(batcher.submit(i)) for i in range(2, 12)]
        await _until(lambda: batcher.depth == 11)
        run.gate.set()
        assert await first == 2 and await asyncio.gather(*rest) == [2 * i for i in range(2, 12)]
        # They had waited longer than max_wait already: one batch at once, not a second of waiting.
        assert run.batches == [[1], list(range(2, 12))]
        batcher.close()
    asyncio.run(main())


def test_max_batch_bounds_a_batch_and_max_wait_bounds_the_wait():
    async def main() -> None:
        run = Recorder()
        batcher = Batcher(run, name="t", max_batch=4, max_wait_ms=0)
        run.gate.clear()
        first = asyncio.ensure_future(batcher.submit(0))
        await _until(run.started.is_set)
        rest = [asyncio.ensure_future(batcher.submit(i)) for i in range(1, 11)]
        await _until(lambda: batcher.depth == 11)
        run.gate.set()
        await asyncio.gather(first, *rest)
        assert [len(b) for b in run.batches] == [1, 4, 4, 2]
        # Alone, a request waits at most max_wait for company.
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        assert await batcher.submit(7) == 14 and loop.time() - t0 < 5
        batcher.close()
    asyncio.run(main())


def test_requests_arriving_one_after_another_join_one_batch_until_a_pause():
    """With the model idle, a batch keeps taking the requests that follow each other within idle_ms (a burst
    arrives one request at a time), and goes once none has come for idle_ms -- long before max_wait_ms."""
    async def main() -> None:
        run = Recorder()
        batcher = Batcher(run, name="t", max_batch=32, max_wait_ms=60_000, idle_ms=500)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        burst = []
        for i in range(5):
            burst.append(asyncio.ensure_future(batcher.submit(i)))
            await asyncio.sleep(0.02)
        assert await asyncio.gather(*burst) == [0, 2, 4, 6, 8]
        assert run.batches == [[0, 1, 2, 3, 4]]
        assert loop.time() - t0 < 30                # the pause closed it, not max_wait
        t0 = loop.time()
        assert await batcher.submit(7) == 14        # alone: it waits idle_ms for company, then goes
        assert 0.4 < loop.time() - t0 < 30 and run.batches[-1] == [7]
        batcher.close()
    asyncio.run(main())


def test_a_full_queue_is_busy_and_an_error_stays_with_its_request():
    async def main() -> None:
        run = Recorder()
        batcher = Batcher(run, name="qa", max_batch=8, max_wait_ms=0, max_pending=3)
        run.gate.clear()
        waiting = [asyncio.ensure_future(batcher.submit(i)) for i in (1, -2, 3)]
        await _until(lambda: batcher.depth == 3)
        with pytest.raises(Busy, match="the qa model has 3 requests waiting"):
            await batcher.submit(4)
        run.gate.set()
        results = await asyncio.gather(*waiting, return_exceptions=True)
        assert results[0] == 2 and results[2] == 6
        assert isinstance(results[1], ValueError) and "bad item -2" in str(results[1])
        batcher.close()
    asyncio.run(main())


def test_a_failing_batch_fails_its_requests_and_the_thread_lives_on():
    calls = []

    def run(items: list[int]) -> list[int]:
        calls.append(items)
        if len(calls) == 1:
            raise RuntimeError("the model broke")
        return items

    async def main() -> None:
        batcher = Batcher(run, name="t", max_wait_ms=0)
        with pytest.raises(RuntimeError, match="the model broke"):
            await batcher.submit(1)
        assert await batcher.submit(5) == 5
        batcher.close()
    asyncio.run(main())


def test_a_timed_out_request_leaves_the_queue():
    async def main() -> None:
        run = Recorder()
        batcher = Batcher(run, name="t", max_batch=8, max_wait_ms=0)
        run.gate.clear()
        first = asyncio.ensure_future(batcher.submit(1))
        await _until(run.started.is_set)
        with pytest.raises(asyncio.TimeoutError):
            await batcher.submit(2, timeout=0.05)
        kept = asyncio.ensure_future(batcher.submit(3))
        await _until(lambda: batcher.depth == 3)
        run.gate.set()
        assert await first == 2 and await kept == 6
        assert run.batches == [[1], [3]]          # 2 was abandoned: not run
        batcher.close()
    asyncio.run(main())


def test_close_answers_what_is_queued_then_refuses():
    async def main() -> None:
        run = Recorder()
        batcher = Batcher(run, name="t", max_batch=2, max_wait_ms=0)
        run.gate.clear()
        waiting = [asyncio.ensure_future(batcher.submit(i)) for i in range(5)]
        await _until(lambda: batcher.depth == 5)
        closing = asyncio.get_running_loop().run_in_executor(None, batcher.close)
        await asyncio.sleep(0.05)
        with pytest.raises(Closed, match="shutting down"):
            await batcher.submit(9)
        run.gate.set()
        await closing
        assert await asyncio.gather(*waiting) == [0, 2, 4, 6, 8]
    asyncio.run(main())


def test_grouped_runs_a_call_per_key_and_isolates_a_bad_item():
    calls = []

    def run(items: list[tuple[str, int]]) -> list[int]:
        calls.append([v for _, v in items])
        if any(v < 0 for _, v in items):
            raise ValueError("negative")
        return [10 * v for _, v in items]

    items = [("a", 1), ("b", 2), ("a", 3), ("b", -4), ("b", 5)]
    out = grouped(items, lambda it: it[0], run)
    assert out[:3] == [10, 20, 30] and out[4] == 50
    assert isinstance(out[3], ValueError)
    assert calls[:2] == [[1, 3], [2, -4, 5]] and calls[2:] == [[2], [-4], [5]]
    with pytest.raises(ValueError):  # a group of one raises as it is
        grouped([("a", -1)], lambda it: it[0], run)


@pytest.mark.parametrize("bad", [{"max_pending": 0}, {"max_batch": 0}, {"max_top_k": True}, {"timeout_s": 0},
                                 {"max_wait_ms": -1}, {"idle_ms": -0.5}, {"max_beam": 2.5}])
def test_limits_must_be_positive(bad):
    with pytest.raises(ValueError, match=f"ServeLimits.{next(iter(bad))}"):
        ServeLimits(**bad)
    assert ServeLimits(max_wait_ms=0, idle_ms=0, timeout_s=0.5).max_wait_ms == 0
