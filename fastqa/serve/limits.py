"""The bounds a request must stay within: one place for the server, its command-line defaults and the page.

No dependencies (``fastqa._checks`` loads no torch), so ``fastqa --help`` can show the defaults without loading
the server library or torch.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from .._checks import check_int, check_number

__all__ = ["ServeLimits"]

_DURATIONS = ("max_wait_ms", "idle_ms", "timeout_s")  # the bounds that are durations, not counts


@dataclass(frozen=True)
class ServeLimits:
    """Request bounds. A body over ``max_body_bytes`` gets 413; a field over its bound gets 422.

    The text bounds are in characters (Unicode code points, as Python counts them). They keep one request
    from holding a model for long: QANet's attention grows with the square of the context length, and a
    translation's cost with its length times the beam."""
    max_body_bytes: int = 1 << 20
    max_context_chars: int = 20_000
    max_question_chars: int = 1_000
    max_sentence_chars: int = 2_000
    max_sentences: int = 64
    max_top_k: int = 20
    max_beam: int = 16
    max_answer_len: int = 100
    #: Requests waiting for one model beyond this get 503 (retry later) instead of queueing without end.
    max_pending: int = 256
    #: Most requests answered by one model call (dynamic batching, ``fastqa.serve.batcher``).
    max_batch: int = 128
    #: The longest the first request of a batch waits for others to join it, in milliseconds.
    max_wait_ms: float = 50.0
    #: A batch goes once no request has joined it for this many milliseconds (a lone request waits this long).
    idle_ms: float = 5.0
    #: A request not answered within this many seconds gets 504 and leaves the queue.
    timeout_s: float = 60.0

    def __post_init__(self) -> None:
        # A ValueError for any bad bound, one of a wrong type too (ServeLimits has always raised only that).
        for name, value in asdict(self).items():
            if name in _DURATIONS:
                check_number(f"ServeLimits.{name}", value, low=0, low_open=name == "timeout_s", error=ValueError)
            else:
                check_int(f"ServeLimits.{name}", value, low=1, error=ValueError)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (``/health`` reports them, and the page reads them to bound its inputs)."""
        return asdict(self)
