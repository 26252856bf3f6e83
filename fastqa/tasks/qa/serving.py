"""The reader behind ``fastqa serve`` (``fastqa.tasks.spec.Serving``): ``POST /answer``, its request and
response schemas, and how a batch of requests is answered. Imported by the server only (needs pydantic)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..._checks import check_text
from ...bounds import BOUNDS
from ..spec import Serving, weights_dtype

__all__ = ["SERVING", "AnswerItem", "AnswerOut", "AnswerResponse", "request_schema"]


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


def request_schema(limits: Any) -> type:
    """The request schema with the server's bounds (``ServeLimits``; they appear in the OpenAPI description)."""

    class AnswerRequest(BaseModel):
        model_config = ConfigDict(extra="forbid", strict=True)
        context: str = Field(max_length=limits.max_context_chars)
        question: str = Field(max_length=limits.max_question_chars)
        top_k: int = Field(1, ge=BOUNDS["top_k"].low, le=limits.max_top_k)
        max_answer_len: int | None = Field(None, ge=BOUNDS["max_answer_len"].low, le=limits.max_answer_len)
        min_score: float | None = Field(None, ge=0.0, le=1.0, description="below it: no confident answer")

        @field_validator("context", "question")
        @classmethod
        def not_blank(cls, value: str, info: Any) -> str:
            return check_text(f"the {info.field_name}", value, blank=True)

    return AnswerRequest


@dataclass(frozen=True)
class AnswerItem:
    context: str
    question: str
    top_k: int = 1
    max_answer_len: int | None = None
    min_score: float | None = None


def _item(request: Any) -> AnswerItem:
    return AnswerItem(request.context, request.question, request.top_k, request.max_answer_len, request.min_score)


def _run(model: Any, group: list[AnswerItem]) -> list[Any]:
    """Each request's answers (``list[Answer]``, best first); the group shares its options."""
    first = group[0]
    return model.answer_many([it.context for it in group], [it.question for it in group], top_k=first.top_k,
                             max_answer_len=first.max_answer_len, min_score=first.min_score,
                             batch_size=max(32, len(group)))


def _respond(request: Any, found: list[Any]) -> dict[str, Any]:
    return {"answer": found[0].to_dict(), "answers": [a.to_dict() for a in found]}


def _describe(model: Any) -> dict[str, Any]:
    return {"model": type(model.model).__name__, "device": str(model.device), "dtype": weights_dtype(model.model),
            "no_answer": bool(model.config.no_answer), "max_answer_len": int(model.max_answer_len),
            "calibrated": model.calibration is not None}


def _warm_up(model: Any) -> None:
    model.answer("Words to read.", "What is read?")


SERVING = Serving(route="/answer", name="answer", summary="The answers to a question about a context, best first.",
                  request_schema=request_schema, response_schema=AnswerResponse, item=_item,
                  key=lambda it: (it.top_k, it.max_answer_len, it.min_score), run=_run, respond=_respond,
                  describe=_describe, warm_up=_warm_up)
