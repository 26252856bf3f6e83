"""The bounds a request must stay within: one place for the server, its command-line defaults and the page.
Each count is within its declared bound (``fastqa.bounds``); the request fields' caps default to those bounds.

No dependencies (``fastqa._checks`` loads no torch), so ``fastqa --help`` can show the defaults without loading
the server library or torch.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from .._checks import check_number
from ..bounds import BOUNDS

__all__ = ["ServeLimits"]


def _duration(default: float, *, zero_allowed: bool) -> Any:
    """A bound that is a duration, not a count: any number >= 0 (``zero_allowed``: 0 means "do not wait"), else > 0."""
    return field(default=default, metadata={"duration": True, "zero_allowed": zero_allowed})


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
    #: the request fields' highest values: the declared bounds (``fastqa.bounds``), which a server may lower
    max_top_k: int = field(default=BOUNDS["top_k"].high, metadata={"bound": "top_k"})
    max_beam: int = field(default=BOUNDS["beam"].high, metadata={"bound": "beam"})
    max_answer_len: int = field(default=BOUNDS["max_answer_len"].high, metadata={"bound": "max_answer_len"})
    #: Requests waiting for one model beyond this get 503 (retry later) instead of queueing without end.
    max_pending: int = 256
    #: Most requests answered by one model call (dynamic batching, ``fastqa.serve.batcher``).
    max_batch: int = 128
    #: The longest the first request of a batch waits for others to join it, in milliseconds.
    max_wait_ms: float = _duration(50.0, zero_allowed=True)
    #: A batch goes once no request has joined it for this many milliseconds (a lone request waits this long).
    idle_ms: float = _duration(5.0, zero_allowed=True)
    #: A request not answered within this many seconds gets 504 and leaves the queue.
    timeout_s: float = _duration(60.0, zero_allowed=False)

    def __post_init__(self) -> None:
        # A ValueError for any bad bound, one of a wrong type too (ServeLimits has always raised only that).
        for f in fields(self):
            name, value = f"ServeLimits.{f.name}", getattr(self, f.name)
            if f.metadata.get("duration"):
                check_number(name, value, low=0, low_open=not f.metadata["zero_allowed"], high=math.inf,
                             high_open=True, error=ValueError)
            else:  # a count: within its declared bound (the field's own name, or the request field it caps)
                BOUNDS[f.metadata.get("bound", f.name)].check(value, name, error=ValueError)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (``/health`` reports them, and the page reads them to bound its inputs)."""
        return asdict(self)
