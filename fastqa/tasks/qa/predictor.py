"""``QAModel``: a trained reader with its vocabularies, answering questions about a text.

Python use::

    qa = QAModel.load("runs/qanet-small")
    qa.answer("The Broncos won Super Bowl 50.", "Who won Super Bowl 50?")
    # {'text': 'The Broncos', 'score': 0.71, 'start': 0, 'end': 11}
"""
from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence

import torch
from torch import nn

from ...data.batching import bucket_batches, pad
from ...data.tokenize import tokenize
from ...data.vocab import Vocab
from ...errors import UserError
from .decode import decode_spans
from .readers import MODELS, answer_len, build_model, config_type
from .squad import Limits, SquadSet, encode_squad, encode_tokens, load_squad, pad_chars
from .task import PredictOutput, inference_autocast, predict

__all__ = ["QAModel"]


class QAModel:
    """A trained reader (QANet or a recurrent baseline) with its vocabularies: answers questions about a context
    (EMA weights)."""

    def __init__(self, model: nn.Module, words: Vocab, chars: Vocab, *, max_answer_len: int = 30,
                 limits: Limits = Limits(), device: torch.device | str | None = None) -> None:
        self.device = torch.device(device) if device is not None else next(model.parameters()).device
        self.model = model.to(self.device).eval()
        self.config = model.config
        self.words, self.chars = words, chars
        self.max_answer_len = max_answer_len
        self.limits = limits

    @classmethod
    def load(cls, path: str | os.PathLike, *, layers: str | None = None, device: str | torch.device | None = None
             ) -> "QAModel":
        """The model in ``path`` (a run folder or its checkpoint.pt): config and vocabularies from the
        checkpoint, the EMA weights when the run kept them. layers: QANet's "fast" (default), "reference", "naive"."""
        from ...train.checkpoint import inference_weights, load_checkpoint

        payload = load_checkpoint(path)
        where = Path(path)
        kind = payload.get("kind")
        if kind not in MODELS:
            raise UserError(f"{where}: a {kind!r} checkpoint, not a reader's (one of {', '.join(MODELS)})")
        if layers is not None and kind != "qanet":
            raise UserError(f"--layers chooses QANet's layers; the {kind} reader in {where} has none")
        meta = payload.get("meta") or {}
        try:
            extra = {"layers": layers or "fast"} if kind == "qanet" else {}
            config = config_type(kind).from_dict({**meta["config"], **extra})
            words, chars = Vocab.from_dict(meta["words"]), Vocab.from_dict(meta["chars"])
        except (KeyError, TypeError, ValueError) as e:
            raise UserError(f"{where}: the checkpoint's config or vocabulary is unreadable ({e})") from None
        sizes = (config.word_vocab_size, getattr(config, "char_vocab_size", len(chars)))
        if sizes != (len(words), len(chars)):
            raise UserError(f"{where}: the checkpoint's vocabularies ({len(words)} words, {len(chars)} chars) do not "
                            f"match its config {sizes}")
        model = build_model(config)
        try:
            model.load_state_dict(inference_weights(payload))
        except RuntimeError as e:
            first = str(e).strip().splitlines()
            raise UserError(f"{where}: the weights do not fit the checkpoint's config ({first[1].strip() if len(first) > 1 else first[0]})") from None
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        limits = Limits(**meta["limits"]) if "limits" in meta else Limits()
        return cls(model, words, chars, max_answer_len=int(meta.get("max_answer_len", 30)), limits=limits,
                   device=device)

    @property
    def char_limit(self) -> int:
        """Characters kept per word: the window the character CNN was trained on (QANet's ``max_word_len``;
        the training limits for a reader that has none)."""
        return int(getattr(self.config, "max_word_len", self.limits.chars))

    # -- free text
    def _encode_pair(self, context: str, question: str, index: int | None = None):
        where = "" if index is None else f" (pair {index})"
        if not isinstance(context, str) or not isinstance(question, str):
            raise TypeError(f"context and question must be str{where}")
        for name, text in (("context", context), ("question", question)):
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as e:  # lone surrogates: bytes that were not UTF-8, decoded leniently
                raise UserError(f"the {name} is not valid Unicode text (a lone surrogate at character "
                                f"{e.start}){where}") from None
        ctx = tokenize(context)
        q = tokenize(question)
        if not ctx:
            raise UserError(f"the context is empty{where}")
        if not q:
            raise UserError(f"the question is empty{where}")
        cw, cc = encode_tokens([t for t, _ in ctx], self.words, self.chars, self.char_limit)
        qw, qc = encode_tokens([t for t, _ in q], self.words, self.chars, self.char_limit)
        offsets = [(s, s + len(t)) for t, s in ctx]
        return cw, cc, qw, qc, offsets, [t for t, _ in ctx]

    @torch.no_grad()
    def _forward(self, items: Sequence[tuple]) -> tuple[torch.Tensor, torch.Tensor]:
        cw = pad([it[0].tolist() for it in items], self.words.pad_id).to(self.device)
        cc = pad_chars([it[1] for it in items], self.chars.pad_id).to(self.device)
        qw = pad([it[2].tolist() for it in items], self.words.pad_id).to(self.device)
        qc = pad_chars([it[3] for it in items], self.chars.pad_id).to(self.device)
        with inference_autocast(self.device):
            lp1, lp2 = self.model(cw, cc, qw, qc)
        return lp1.float(), lp2.float()

    def answer_many(self, contexts: Sequence[str], questions: Sequence[str], *, batch_size: int = 32,
                    max_answer_len: int | None = None) -> list[dict[str, Any]]:
        """``answer`` for every (context, question) pair, batched by context length."""
        if len(contexts) != len(questions):
            raise ValueError(f"contexts and questions differ in length ({len(contexts)} vs {len(questions)})")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        items = [self._encode_pair(c, q, i if len(contexts) > 1 else None) for i, (c, q) in enumerate(zip(contexts, questions))]
        results: list[dict[str, Any]] = [{} for _ in items]
        order = bucket_batches([len(it[0]) for it in items], batch_size, seed=0, shuffle=False)
        mal = answer_len(self.config, self.max_answer_len if max_answer_len is None else max_answer_len)
        for indices in order:
            lp1, lp2 = self._forward([items[i] for i in indices])
            spans = {k: v.cpu() for k, v in decode_spans(lp1, lp2, max_answer_len=mal,
                                                         no_answer=self.config.no_answer).items()}
            for row, i in enumerate(indices):
                offsets = items[i][4]
                if spans["is_null"][row]:
                    start = end = 0
                    text = ""
                else:
                    start, end = offsets[int(spans["start"][row])][0], offsets[int(spans["end"][row])][1]
                    text = contexts[i][start:end]
                res = {"text": text, "score": float(spans["score"][row]), "start": start, "end": end}
                if self.config.no_answer:
                    res["no_answer_prob"] = float(spans["na_prob"][row])
                results[i] = res
        return results

    def answer(self, context: str, question: str, *, max_answer_len: int | None = None) -> dict[str, Any]:
        """The answer to ``question`` in ``context``: ``{"text", "score", "start", "end"}`` where
        ``context[start:end] == text`` and score = p_start·p_end (``text`` "" when a v2.0 model says
        there is no answer; it then also gives ``no_answer_prob``)."""
        return self.answer_many([context], [question], max_answer_len=max_answer_len)[0]

    def probabilities(self, context: str, question: str) -> dict[str, Any]:
        """Start/end probabilities over the context tokens: ``tokens``, ``offsets``, ``p_start`` and
        ``p_end`` (lists of n floats; ``p_end`` None for a single-word reader, whose answer ends where it
        starts), and ``p_null`` (start·end of "no answer", v2.0 models)."""
        item = self._encode_pair(context, question)
        lp1, lp2 = self._forward([item])
        p1, p2 = lp1[0].exp(), lp2[0].exp()
        out = {"tokens": item[5], "offsets": item[4], "p_null": None}
        if self.config.no_answer:
            out["p_null"] = float(p1[0] * p2[0])
            p1, p2 = p1[1:], p2[1:]
        out["p_start"], out["p_end"] = p1.tolist(), None if self.config.single_word else p2.tolist()
        return out

    # -- files
    def predict_file(self, path: str | os.PathLike, *, articles: str | None = None, batch_size: int = 32,
                     cache_dir: str | os.PathLike | None = None, progress: bool = True) -> tuple[SquadSet, PredictOutput]:
        """Answer every question of a SQuAD file (optionally some articles): (the data, PredictOutput).

        Paragraphs with an empty or whitespace-only context are skipped with a logged count (see
        ``fastqa.tasks.qa.squad``): their questions get no prediction."""
        data = load_squad(path, articles, cache_dir=cache_dir, progress=progress)
        limits = replace(self.limits, chars=self.char_limit)
        enc = encode_squad(data, self.words, self.chars, train=False, no_answer=self.config.no_answer,
                           limits=limits, cache_dir=cache_dir)
        out = predict(self.model, data, enc, batch_size=batch_size, max_answer_len=self.max_answer_len,
                      device=self.device, progress=progress)
        return data, out
