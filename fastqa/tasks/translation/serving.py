"""The translator behind ``fastqa serve`` (``fastqa.tasks.spec.Serving``): ``POST /translate``, its request and
response schemas, and how a batch of requests is answered. Imported by the server only (needs pydantic)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ...bounds import BOUNDS
from ..spec import Serving, weights_dtype

__all__ = ["SERVING", "TranslateItem", "TranslateResponse", "request_schema"]


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


def request_schema(limits: Any) -> type:
    """The request schema with the server's bounds (``ServeLimits``; they appear in the OpenAPI description)."""

    class TranslateRequest(BaseModel):
        model_config = ConfigDict(extra="forbid", strict=True)
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

    return TranslateRequest


@dataclass(frozen=True)
class TranslateItem:
    sentences: tuple[str, ...]
    beam: int = 5
    nbest: int = 1
    attention: bool = False


def _sentences(request: Any) -> list[str]:
    return [request.text] if request.text is not None else list(request.sentences)


def _item(request: Any) -> TranslateItem:
    return TranslateItem(tuple(_sentences(request)), request.beam, request.nbest, request.attention)


def _run(model: Any, group: list[TranslateItem]) -> list[Any]:
    """Each request's ``Translation`` per sentence: the sentences of every request of the group decode as one
    batch, then go back to their requests."""
    first = group[0]
    found = model.translate([s for it in group for s in it.sentences], beam=first.beam, nbest=first.nbest,
                            attention=first.attention)
    out, at = [], 0
    for it in group:
        out.append(found[at:at + len(it.sentences)])
        at += len(it.sentences)
    return out


def _translation_json(source: str, translation: Any) -> dict[str, Any]:
    out = {"source": source, **translation.to_dict()}
    out["alternatives"] = [{"text": t.text, "score": t.score, "unsure": t.unsure} for t in translation.alternatives]
    return out


def _respond(request: Any, found: list[Any]) -> dict[str, Any]:
    return {"translations": [_translation_json(s, t) for s, t in zip(_sentences(request), found)]}


def _describe(model: Any) -> dict[str, Any]:
    return {"device": str(model.device), "dtype": weights_dtype(model.model), "vocab": model.vocab_kind,
            "max_positions": model.config.max_positions}


def _warm_up(model: Any) -> None:
    model.translate(["words"], beam=1)


SERVING = Serving(route="/translate", name="translate",
                  summary="The translation of one sentence (``text``) or of several (``sentences``).",
                  request_schema=request_schema, response_schema=TranslateResponse, item=_item,
                  key=lambda it: (it.beam, it.nbest, it.attention), run=_run, respond=_respond,
                  describe=_describe, warm_up=_warm_up)
