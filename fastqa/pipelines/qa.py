"""Readers on SQuAD: the training task for ``fastqa.train.fit``, span decoding, prediction, and ``QAModel``.

Readers (``MODELS``): ``qanet`` (fastqa.models.qanet) and the attention tutorial's recurrent baselines ``lstm``,
``lstm-attention`` and ``lstm-pointer`` (fastqa.models.lstm_readers). Every reader takes the same batch and
returns start/end log-probabilities over the context positions, so one task, one decoder, one metric and one
checkpoint format serve them all; a checkpoint's ``kind`` is the reader's name.

Training follows the paper: Adam(β 0.8, 0.999, ε 1e-7) with L2 3e-7 (as Adam's coupled weight decay, the
gradient of 3e-7·||w||²/2, like TensorFlow's l2_regularizer), learning rate warmed up as log(t)/log(1000)
to 1e-3, gradient norm clipped at 5, an EMA (0.9999) of the weights for evaluation and prediction, bf16
autocast on a GPU. The loss is NLL(start) + NLL(end), each the mean over the batch.

Decoding takes argmax p1(i)·p2(j) over i ≤ j ≤ i + max_answer_len for the whole batch at once; with a
no-answer option (SQuAD v2.0) the null score p1(0)·p2(0) wins when it is larger than the best span's, and
the no-answer probability is null / (null + best span). Answers are sliced from the original context by
the tokens' character offsets.

Python use::

    qa = QAModel.load("runs/qanet-small")
    qa.answer("The Broncos won Super Bowl 50.", "Who won Super Bowl 50?")
    # {'text': 'The Broncos', 'score': 0.71, 'start': 0, 'end': 11}
"""
from __future__ import annotations

import logging
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..data.batching import bucket_batches, pad
from ..data.squad import (NO_TARGET, EncodedSquad, Limits, SquadSet, build_vocabs, collate, encode_squad,
                          encode_tokens, load_squad, pad_chars)
from ..data.tokenize import tokenize
from ..data.vectors import lookup_variants, read_vectors, vectors_for_vocab
from ..data.vocab import Vocab
from ..errors import UserError
from ..metrics.squad import evaluate as squad_evaluate

__all__ = ["MODELS", "Recipe", "QATask", "QAModel", "decode_spans", "span_loss", "predict", "PredictOutput"]

log = logging.getLogger("fastqa.qa")

MODELS = ("qanet", "lstm", "lstm-attention", "lstm-pointer")


@dataclass
class Recipe:
    """The paper's optimisation settings (the loop's clip/EMA come from TrainSettings: 5 and 0.9999)."""

    lr: float = 1e-3
    betas: tuple[float, float] = (0.8, 0.999)
    eps: float = 1e-7
    weight_decay: float = 3e-7
    warmup_steps: int = 1000
    batch_size: int = 32
    eval_batch_size: int = 32
    max_answer_len: int = 30
    seed: int = 0


# ------------------------------------------------------------------------------------------------ decoding

def decode_spans(log_p1: torch.Tensor, log_p2: torch.Tensor, *, max_answer_len: int = 30,
                 no_answer: bool = False) -> dict[str, torch.Tensor]:
    """The best span of every row: argmax p1(i)·p2(j) over i ≤ j ≤ i + max_answer_len.

    log_p1, log_p2: [B, n] log-probabilities ([B, 1 + n] when ``no_answer``: index 0 is "no answer").
    Returns ``start``, ``end`` [B] (context token indices, inclusive), ``score`` [B] (the probability
    p1·p2 of the chosen answer, the null one when it wins), ``is_null`` [B] bool and ``na_prob`` [B]
    (null / (null + best span); 0 without a no-answer option).
    """
    if max_answer_len < 0:
        raise ValueError(f"max_answer_len must be >= 0, got {max_answer_len}")
    lp1, lp2 = log_p1.float(), log_p2.float()
    if no_answer:
        null = lp1[:, 0] + lp2[:, 0]
        lp1, lp2 = lp1[:, 1:], lp2[:, 1:]
    B, n = lp1.shape
    width = max_answer_len + 1
    # band[b, i, k] = log p2(b, i + k): the end candidates of start i (-inf past the context).
    band = F.pad(lp2, (0, width - 1), value=-math.inf).unfold(1, width, 1)  # [B, n, width]
    scores = (lp1.unsqueeze(2) + band).reshape(B, n * width)
    best, flat = scores.max(dim=1)
    start = torch.div(flat, width, rounding_mode="floor")
    end = start + flat % width
    if no_answer:
        is_null = null > best
        na_prob = torch.sigmoid(null - best)
        score = torch.where(is_null, null, best).exp()
    else:
        is_null = torch.zeros(B, dtype=torch.bool, device=lp1.device)
        na_prob = torch.zeros(B, device=lp1.device)
        score = best.exp()
    return {"start": start, "end": end, "score": score, "is_null": is_null, "na_prob": na_prob}


def span_loss(log_p1: torch.Tensor, log_p2: torch.Tensor, starts: torch.Tensor, ends: torch.Tensor,
              reduction: str = "mean") -> torch.Tensor:
    """NLL(start) + NLL(end), summed, or averaged over the rows with a start target (``starts >= 0``; 0 when
    there is none). An end target may be NO_TARGET alone (a single-word reader learns no end).

    log_p1, log_p2: [B, n'] log-probabilities; starts, ends: [B] target positions or NO_TARGET.
    """
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}")
    total = (F.nll_loss(log_p1.float(), starts, ignore_index=NO_TARGET, reduction="sum")
             + F.nll_loss(log_p2.float(), ends, ignore_index=NO_TARGET, reduction="sum"))
    if reduction == "sum":
        return total
    return total / (starts != NO_TARGET).sum().clamp(min=1)


def _autocast(device: torch.device):
    # bf16 on a GPU (the paper recipe's speed); the CPU runs fp32.
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")


@dataclass
class PredictOutput:
    predictions: dict[str, str]        # question id -> answer text ("" = no answer)
    na_probs: dict[str, float]         # question id -> probability of no answer
    scores: dict[str, float]           # question id -> p1·p2 of the answer
    loss: float                        # mean span loss over the examples with a target (nan if none)
    n_loss: int


@torch.no_grad()
def predict(model: nn.Module, data: SquadSet, enc: EncodedSquad, *, batch_size: int = 32,
            max_answer_len: int = 30, device: torch.device | str | None = None, progress: bool = False
            ) -> PredictOutput:
    """Answer every encoded question of ``data`` (model in eval mode, full contexts)."""
    no_answer = model.config.no_answer
    max_answer_len = _answer_len(model.config, max_answer_len)
    device = torch.device(device) if device is not None else next(model.parameters()).device
    was_training = model.training
    model.eval()
    batches = bucket_batches(enc.lengths(), batch_size, seed=0, shuffle=False)
    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=len(enc), desc="predicting", unit=" questions", mininterval=1.0)
    out = PredictOutput({}, {}, {}, math.nan, 0)
    loss_sum = 0.0
    try:
        for indices in batches:
            batch = collate(enc, indices).to(device)
            with _autocast(device):
                lp1, lp2 = model(*batch.inputs())
            starts, ends = model.training_targets(batch.context_words, batch.starts, batch.ends)
            loss_sum += float(span_loss(lp1, lp2, starts, ends, reduction="sum"))
            out.n_loss += int((starts != NO_TARGET).sum())
            spans = {k: v.cpu() for k, v in decode_spans(lp1, lp2, max_answer_len=max_answer_len,
                                                         no_answer=no_answer).items()}
            for row, i in enumerate(indices):
                q = data.questions[enc.examples[i]]
                ctx = data.contexts[q.context]
                if spans["is_null"][row]:
                    text = ""
                else:
                    text = ctx.text[ctx.offsets[int(spans["start"][row])][0]:ctx.offsets[int(spans["end"][row])][1]]
                out.predictions[q.qid] = text
                out.na_probs[q.qid] = float(spans["na_prob"][row])
                out.scores[q.qid] = float(spans["score"][row])
            if bar is not None:
                bar.update(len(indices))
    finally:
        if bar is not None:
            bar.close()
        model.train(was_training)
    if out.n_loss:
        out.loss = loss_sum / out.n_loss
    return out


def score_predictions(data: SquadSet, out: PredictOutput) -> dict[str, float]:
    """Official EM/F1 of ``out`` on ``data`` (v2.0 semantics with the na-probs when the data is v2.0)."""
    if data.v2:
        return squad_evaluate(data.dataset, out.predictions, out.na_probs, version="2.0")
    return squad_evaluate(data.dataset, out.predictions, version="1.1")


# ---------------------------------------------------------------------------------------------- the task

def _answer_len(config: Any, max_answer_len: int) -> int:
    """The longest answer (last - first token) a reader can give: 0 for a single-word reader."""
    return 0 if config.single_word else max_answer_len


def _config_type(kind: str) -> type:
    from ..models.lstm_readers import LSTMReaderConfig
    from ..models.qanet import QANetConfig

    return QANetConfig if kind == "qanet" else LSTMReaderConfig


def _build_model(config: Any) -> nn.Module:
    from ..models.lstm_readers import LSTMReader, LSTMReaderConfig
    from ..models.qanet import QANet

    return LSTMReader(config) if isinstance(config, LSTMReaderConfig) else QANet(config)


def model_kind(config: Any) -> str:
    """The reader's name (one of ``MODELS``), which is also its checkpoints' ``kind``."""
    return getattr(config, "variant", "qanet")


def _meta_config(config: Any) -> dict:
    # The layer backend is not part of a model's identity: one state_dict serves all three.
    d = config.to_dict()
    d.pop("layers", None)
    return d


def _make_config(model: str, preset: str, words: Vocab, chars: Vocab, limits: Limits, no_answer: bool,
                 fields: dict) -> Any:
    """The reader's config: the preset, the vocabularies' sizes and ids, and ``fields`` over them."""
    common = dict(word_vocab_size=len(words), pad_id=words.pad_id, unk_id=words.unk_id, no_answer=no_answer)
    if model == "qanet":
        common.update(char_vocab_size=len(chars), max_word_len=limits.chars)
    else:
        common.update(variant=model)
    try:
        return _config_type(model).from_preset(preset, **common, **fields)
    except (TypeError, ValueError) as e:
        raise UserError(f"model config: {e}") from None


class QATask:
    """A reader on SQuAD for ``fastqa.train.fit`` (see ``fastqa.train.loop.Task``)."""

    def __init__(self, config: Any, words: Vocab, chars: Vocab, train: EncodedSquad, dev_set: SquadSet,
                 dev: EncodedSquad, *, recipe: Recipe = Recipe(), limits: Limits = Limits(),
                 word_vectors: torch.Tensor | None = None) -> None:
        """config: QANetConfig or LSTMReaderConfig; words/chars: the vocabularies; train: the encoded training
        examples; dev_set/dev: the evaluation data; word_vectors: [len(words), word_dim] to load into the model."""
        sizes = (config.word_vocab_size, getattr(config, "char_vocab_size", len(chars)))
        if sizes != (len(words), len(chars)):
            raise ValueError(f"config vocabulary sizes {sizes} differ from the vocabularies' ({len(words)}, {len(chars)})")
        self.kind = model_kind(config)
        self.config, self.words, self.chars = config, words, chars
        self.train_data, self.dev_set, self.dev_data = train, dev_set, dev
        self.recipe, self.limits = recipe, limits
        self.model = _build_model(config)
        if word_vectors is not None:
            self.model.load_word_vectors(word_vectors)

    @classmethod
    def from_files(cls, train_path: str, dev_path: str, *, model: str = "qanet", vectors: str | None = None,
                   preset: str = "small", layers: str | None = None, train_articles: str | None = None, dev_articles: str | None = None,
                   no_answer: bool | None = None, overrides: dict | None = None, recipe: Recipe = Recipe(),
                   limits: Limits = Limits(), cache_dir: str | os.PathLike | None = None,
                   progress: bool = True) -> "QATask":
        """Read, tokenise and encode the data, build the vocabularies and the model.

        model: one of ``MODELS``. layers: QANet's layer backend (QANet only).
        no_answer: None follows the training data (a v2.0 file gets the no-answer option).
        overrides: config fields to change from the preset (e.g. {"d_model": 96}).
        The model's initial weights and random word vectors come from ``recipe.seed``.
        """
        from ..train.loop import seed_everything

        if model not in MODELS:
            raise UserError(f"unknown model {model!r}; known: {', '.join(MODELS)}")
        if layers is not None and model != "qanet":
            raise UserError(f"--layers chooses QANet's layers; the {model} reader has none")
        train_set = load_squad(train_path, train_articles, cache_dir=cache_dir, progress=progress)
        dev_set = load_squad(dev_path, dev_articles, cache_dir=cache_dir, progress=progress)
        vec, dim = None, None
        if vectors is not None:
            wanted = {v for s in (train_set, dev_set) for tokens in _all_tokens(s) for t in tokens
                      for v in lookup_variants(t)}
            vec, dim = read_vectors(vectors, words=wanted, progress=progress)
            if not vec:
                raise UserError(f"{vectors}: none of the data's words has a vector (wrong file or language?)")
            present = set(vec)
            words, chars = build_vocabs(train_set, others=[dev_set],
                                        has_vector=lambda t: any(v in present for v in lookup_variants(t)))
        else:
            words, chars = build_vocabs(train_set)
        fields = dict(overrides or {})
        if dim is not None:
            if "word_dim" in fields and fields["word_dim"] != dim:
                raise UserError(f"word_dim={fields['word_dim']} but the vectors in {vectors} have {dim} dimensions")
            fields["word_dim"] = dim
        if no_answer is None:
            no_answer = train_set.v2
        if layers is not None:
            fields["layers"] = layers
        config = _make_config(model, preset, words, chars, limits, bool(no_answer), fields)
        seed_everything(recipe.seed)
        matrix, _ = vectors_for_vocab(words, vec, config.word_dim, seed=recipe.seed)
        train = encode_squad(train_set, words, chars, train=True, no_answer=config.no_answer, limits=limits,
                             cache_dir=cache_dir)
        if not len(train):
            raise UserError(f"{train_path}: no training question is left after the limits (see the log above)")
        dev = encode_squad(dev_set, words, chars, train=False, no_answer=config.no_answer, limits=limits,
                           cache_dir=cache_dir)
        return cls(config, words, chars, train, dev_set, dev, recipe=recipe, limits=limits, word_vectors=matrix)

    # -- Task protocol
    def train_batches(self, epoch: int) -> list[list[int]]:
        return self.train_data.batches(self.recipe.batch_size, seed=self.recipe.seed, epoch=epoch)

    def collate(self, indices: list[int], device: torch.device):
        return collate(self.train_data, indices).to(device)

    def loss(self, model: nn.Module, batch) -> torch.Tensor:
        log_p1, log_p2 = model(*batch.inputs())  # ``model`` may be DDP-wrapped; ``self.model`` never is
        starts, ends = self.model.training_targets(batch.context_words, batch.starts, batch.ends)
        return span_loss(log_p1, log_p2, starts, ends)

    def configure_optimizer(self, model: nn.Module):
        from ..train.schedules import log_warmup

        params = [p for p in model.parameters() if p.requires_grad]  # frozen word vectors stay out
        r = self.recipe
        optimizer = torch.optim.Adam(params, lr=r.lr, betas=r.betas, eps=r.eps, weight_decay=r.weight_decay)
        return optimizer, log_warmup(optimizer, r.warmup_steps)

    def evaluate(self, model: nn.Module) -> dict[str, float]:
        out = predict(model, self.dev_set, self.dev_data, batch_size=self.recipe.eval_batch_size,
                      max_answer_len=self.recipe.max_answer_len)
        scores = score_predictions(self.dev_set, out)
        metrics = {"dev_loss": out.loss}
        if "exact_match" in scores:
            metrics.update(EM=scores["exact_match"], F1=scores["f1"])
        else:
            metrics.update(EM=scores["exact"], F1=scores["f1"])
            for key in ("HasAns_f1", "NoAns_f1", "best_f1"):
                if key in scores:
                    metrics[key] = scores[key]
        return metrics

    def checkpoint_meta(self) -> dict:
        return {"config": _meta_config(self.config), "words": self.words.to_dict(), "chars": self.chars.to_dict(),
                "limits": asdict(self.limits), "max_answer_len": self.recipe.max_answer_len}


def _all_tokens(s: SquadSet):
    yield from (c.tokens for c in s.contexts)
    yield from (q.tokens for q in s.questions)


# ----------------------------------------------------------------------------------------------- QAModel

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
        from ..train.checkpoint import inference_weights, load_checkpoint

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
            config = _config_type(kind).from_dict({**meta["config"], **extra})
            words, chars = Vocab.from_dict(meta["words"]), Vocab.from_dict(meta["chars"])
        except (KeyError, TypeError, ValueError) as e:
            raise UserError(f"{where}: the checkpoint's config or vocabulary is unreadable ({e})") from None
        sizes = (config.word_vocab_size, getattr(config, "char_vocab_size", len(chars)))
        if sizes != (len(words), len(chars)):
            raise UserError(f"{where}: the checkpoint's vocabularies ({len(words)} words, {len(chars)} chars) do not "
                            f"match its config {sizes}")
        model = _build_model(config)
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

    # -- free text
    def _encode_pair(self, context: str, question: str, index: int | None = None):
        where = "" if index is None else f" (pair {index})"
        if not isinstance(context, str) or not isinstance(question, str):
            raise TypeError(f"context and question must be str{where}")
        ctx = tokenize(context)
        q = tokenize(question)
        if not ctx:
            raise UserError(f"the context is empty{where}")
        if not q:
            raise UserError(f"the question is empty{where}")
        cw, cc = encode_tokens([t for t, _ in ctx], self.words, self.chars)
        qw, qc = encode_tokens([t for t, _ in q], self.words, self.chars)
        offsets = [(s, s + len(t)) for t, s in ctx]
        return cw, cc, qw, qc, offsets, [t for t, _ in ctx]

    @torch.no_grad()
    def _forward(self, items: Sequence[tuple]) -> tuple[torch.Tensor, torch.Tensor]:
        cw = pad([it[0].tolist() for it in items], self.words.pad_id).to(self.device)
        cc = pad_chars([it[1] for it in items], self.chars.pad_id).to(self.device)
        qw = pad([it[2].tolist() for it in items], self.words.pad_id).to(self.device)
        qc = pad_chars([it[3] for it in items], self.chars.pad_id).to(self.device)
        with _autocast(self.device):
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
        mal = _answer_len(self.config, self.max_answer_len if max_answer_len is None else max_answer_len)
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
        """Answer every question of a SQuAD file (optionally some articles): (the data, PredictOutput)."""
        data = load_squad(path, articles, cache_dir=cache_dir, progress=progress)
        enc = encode_squad(data, self.words, self.chars, train=False, no_answer=self.config.no_answer,
                           limits=self.limits, cache_dir=cache_dir)
        out = predict(self.model, data, enc, batch_size=batch_size, max_answer_len=self.max_answer_len,
                      device=self.device, progress=progress)
        return data, out
