"""Readers on SQuAD as a training task for ``fastqa.train.fit``, and prediction over a SQuAD set.

Training follows the paper: Adam(β 0.8, 0.999, ε 1e-7) with L2 3e-7 (as Adam's coupled weight decay, the
gradient of 3e-7·||w||²/2, like TensorFlow's l2_regularizer), learning rate warmed up as log(t)/log(1000)
to 1e-3, gradient norm clipped at 5, an EMA (0.9999) of the weights for evaluation and prediction. The loss
is NLL(start) + NLL(end), each the mean over the batch. Answers are sliced from the original context by the
tokens' character offsets.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import os
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ...data.vectors import check_vectors_file, lookup_variants, read_vectors, vectors_for_vocab
from ...data.vocab import Vocab
from ...errors import UserError
from .metric import evaluate as squad_evaluate
from .spec import SPEC
from .readers import MODELS, answer_len, build_model, make_config, meta_config, model_kind
from .squad import NO_TARGET, EncodedSquad, Limits, SquadSet, build_vocabs, collate, encode_squad, load_squad
from .inference import DEFAULT_STRIDE, Passage, Query, ReadOptions, inference_autocast, read_windows

__all__ = ["SquadData", "prepare_squad", "Recipe", "span_loss", "inference_autocast", "PredictOutput", "predict", "score_predictions", "QATask"]


log = logging.getLogger("fastqa.qa")


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


@dataclass
class PredictOutput:
    predictions: dict[str, str]        # question id -> answer text ("" = no answer)
    na_probs: dict[str, float]         # question id -> probability of no answer
    scores: dict[str, float]           # question id -> p1·p2 of the answer
    loss: float                        # mean span loss over the examples with a target (nan if none)
    n_loss: int


@torch.no_grad()
def predict(model: nn.Module, data: SquadSet, enc: EncodedSquad, *, batch_size: int = 32,
            max_answer_len: int = 30, device: torch.device | str | None = None, progress: bool = False,
            max_context: int | None = None, stride: int = DEFAULT_STRIDE) -> PredictOutput:
    """Answer every encoded question of ``data`` (model in eval mode).

    max_context None reads every context whole (the evaluation during training); a number reads contexts
    longer than that in overlapping windows (``fastqa.tasks.qa.inference``; ``stride`` tokens of overlap).
    The loss is over the questions with a target whose context was read in one window (a window of a longer
    context may not hold the answer)."""
    max_answer_len = answer_len(model.config, max_answer_len)
    device = torch.device(device) if device is not None else next(model.parameters()).device
    contexts = [Passage(words, chars, ctx.tokens, ctx.text, ctx.offsets)
                for words, chars, ctx in zip(enc.ctx_words, enc.ctx_chars, data.contexts, strict=True)]
    questions = [Query(enc.q_words[i], enc.q_chars[i], enc.example_ctx[i], data.questions[enc.examples[i]].tokens)
                 for i in range(len(enc))]
    options = ReadOptions(max_answer_len=max_answer_len, max_context=max_context, stride=stride,
                          batch_size=batch_size, word_pad=enc.word_pad, char_pad=enc.char_pad, device=device)
    out = PredictOutput({}, {}, {}, math.nan, 0)
    loss_sum = 0.0

    def add_loss(units: list[tuple[int, int]], inputs: tuple[torch.Tensor, ...], lp1: torch.Tensor,
                 lp2: torch.Tensor) -> None:
        nonlocal loss_sum
        rows = [qi for qi, _ in units]
        whole = torch.tensor([len(enc.ctx_words[enc.example_ctx[i]]) <= (max_context or math.inf) for i in rows])
        starts = torch.tensor([enc.starts[i] for i in rows]).masked_fill(~whole, NO_TARGET).to(lp1.device)
        ends = torch.tensor([enc.ends[i] for i in rows]).masked_fill(~whole, NO_TARGET).to(lp1.device)
        starts, ends = model.training_targets(inputs[0], starts, ends)
        loss_sum += float(span_loss(lp1, lp2, starts, ends, reduction="sum"))
        out.n_loss += int((starts != NO_TARGET).sum())

    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=len(enc), desc="predicting", unit=" questions", mininterval=1.0)
    try:
        readings = read_windows(model, contexts, questions, options, on_batch=add_loss,
                                progress=bar.update if bar is not None else None)
    finally:
        if bar is not None:
            bar.close()
    for i, reading in enumerate(readings):
        q = data.questions[enc.examples[i]]
        ctx = data.contexts[q.context]
        best = reading.best
        null = reading.is_null
        out.predictions[q.qid] = "" if null else ctx.text[ctx.offsets[best.start][0]:ctx.offsets[best.end][1]]
        out.na_probs[q.qid] = reading.na_prob
        out.scores[q.qid] = reading.null_score if null else best.score
    if out.n_loss:
        out.loss = loss_sum / out.n_loss
    return out


def score_predictions(data: SquadSet, out: PredictOutput) -> dict[str, float]:
    """Official EM/F1 of ``out`` on ``data`` (v2.0 semantics with the na-probs when the data is v2.0)."""
    if data.v2:
        return squad_evaluate(data.dataset, out.predictions, out.na_probs, version="2.0")
    return squad_evaluate(data.dataset, out.predictions, version="1.1")


@dataclass
class SquadData:
    """A training and a dev SQuAD set, read, tokenised and encoded (``prepare_squad``).

    words / chars: the vocabularies (built on the training set; with vectors, dev words that have one are kept
    too); vectors: {word variant: vector} found in the vectors file (None without one) and word_dim their size;
    no_answer: whether the examples carry the no-answer option (SQuAD v2.0).
    """
    train_set: SquadSet
    dev_set: SquadSet
    words: Vocab
    chars: Vocab
    train: EncodedSquad
    dev: EncodedSquad
    vectors: dict | None
    word_dim: int | None
    no_answer: bool


def prepare_squad(train_path: str | os.PathLike, dev_path: str | os.PathLike, *, vectors: str | None = None,
                  train_articles: str | None = None, dev_articles: str | None = None, no_answer: bool | None = None,
                  limits: Limits = Limits(), cache_dir: str | os.PathLike | None = None,
                  progress: bool = True) -> SquadData:
    """Everything a reader trains and evaluates on, in one call: read and tokenise both files (cached), read
    the vectors of their words, build the vocabularies, encode the examples. no_answer: None follows the
    training data (a v2.0 file gets the no-answer option)."""
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
    no_answer = train_set.v2 if no_answer is None else bool(no_answer)
    train = encode_squad(train_set, words, chars, train=True, no_answer=no_answer, limits=limits, cache_dir=cache_dir)
    if not len(train):
        raise UserError(f"{train_path}: no training question is left after the limits (see the log above)")
    dev = encode_squad(dev_set, words, chars, train=False, no_answer=no_answer, limits=limits, cache_dir=cache_dir)
    return SquadData(train_set, dev_set, words, chars, train, dev, vec, dim, no_answer)


class QATask:
    """A reader on SQuAD for ``fastqa.train.fit`` (see ``fastqa.train.loop.Task``)."""

    command = "qa-train"
    headline_metrics = ("EM", "F1")

    def __init__(self, config: Any, words: Vocab, chars: Vocab, train: EncodedSquad, dev_set: SquadSet,
                 dev: EncodedSquad, *, recipe: Recipe = Recipe(), limits: Limits = Limits(),
                 word_vectors: torch.Tensor | None = None, preset: str | None = None) -> None:
        """config: QANetConfig or LSTMReaderConfig; words/chars: the vocabularies; train: the encoded training
        examples; dev_set/dev: the evaluation data; word_vectors: [len(words), word_dim] to load into the model;
        preset: the config's preset, which picks the documented run the run can expect (``reference_run``)."""
        sizes = (config.word_vocab_size, getattr(config, "char_vocab_size", len(chars)))
        if sizes != (len(words), len(chars)):
            raise ValueError(f"config vocabulary sizes {sizes} differ from the vocabularies' ({len(words)}, {len(chars)})")
        self.kind = model_kind(config)
        self.config, self.words, self.chars = config, words, chars
        self.train_data, self.dev_set, self.dev_data = train, dev_set, dev
        self.recipe, self.limits, self.preset = recipe, limits, preset
        self.model = build_model(config)
        if word_vectors is not None:
            self.model.load_word_vectors(word_vectors)

    @property
    def reference_run(self) -> Any:
        """The documented run of this reader and preset, which the expectation line quotes (None: none)."""
        return SPEC.reference_run(self.kind, self.preset)

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
        from ...train.loop import seed_everything

        if model not in MODELS:
            raise UserError(f"unknown model {model!r}; known: {', '.join(MODELS)}")
        if layers is not None and model != "qanet":
            raise UserError(f"--layers chooses QANet's layers; the {model} reader has none")
        fields = dict(overrides or {})
        if layers is not None:
            fields["layers"] = layers
        # The preset and the fields are checked before minutes of reading (placeholder vocabularies).
        placeholder = Vocab(["<pad>", "<unk>"])
        make_config(model, preset, placeholder, placeholder, limits, bool(no_answer), fields)
        if vectors is not None:
            check_vectors_file(vectors)
        data = prepare_squad(train_path, dev_path, vectors=vectors, train_articles=train_articles,
                             dev_articles=dev_articles, no_answer=no_answer, limits=limits, cache_dir=cache_dir,
                             progress=progress)
        if data.word_dim is not None:
            if "word_dim" in fields and fields["word_dim"] != data.word_dim:
                raise UserError(f"word_dim={fields['word_dim']} but the vectors in {vectors} have {data.word_dim} "
                                "dimensions")
            fields["word_dim"] = data.word_dim
        config = make_config(model, preset, data.words, data.chars, limits, data.no_answer, fields)
        seed_everything(recipe.seed)
        matrix, _ = vectors_for_vocab(data.words, data.vectors, config.word_dim, seed=recipe.seed)
        words, chars, train, dev_set, dev = data.words, data.chars, data.train, data.dev_set, data.dev
        return cls(config, words, chars, train, dev_set, dev, recipe=recipe, limits=limits, word_vectors=matrix,
                   preset=preset)

    @property
    def eval_size(self) -> int:
        """The questions an evaluation reads (the time budget's estimate before one is timed)."""
        return len(self.dev_data)

    # -- Task protocol
    def train_batches(self, epoch: int) -> list[list[int]]:
        return self.train_data.batches(self.recipe.batch_size, seed=self.recipe.seed, epoch=epoch)

    def collate(self, indices: list[int], device: torch.device):
        return collate(self.train_data, indices).to(device)

    def graph_lengths(self, indices: list[int]) -> tuple[int, int]:
        """(context, question) lengths of the batch ``collate`` makes of ``indices`` (the graphed step's buckets)."""
        enc = self.train_data
        return (max(len(enc.ctx_words[enc.example_ctx[i]]) for i in indices), max(len(enc.q_words[i]) for i in indices))

    def pad_batch(self, batch, lengths: tuple[int, int]):
        """``batch`` padded to (context, question) ``lengths`` words and ``Limits.chars`` characters per word: the
        masks keep the padding out of every real position and out of the loss."""
        from ...train.cuda_graphs import pad_dim

        n, m = lengths
        enc, w = self.train_data, self.limits.chars
        return dataclasses.replace(
            batch, context_words=pad_dim(batch.context_words, 1, n, enc.word_pad),
            context_chars=pad_dim(pad_dim(batch.context_chars, 1, n, enc.char_pad), 2, w, enc.char_pad),
            question_words=pad_dim(batch.question_words, 1, m, enc.word_pad),
            question_chars=pad_dim(pad_dim(batch.question_chars, 1, m, enc.char_pad), 2, w, enc.char_pad))

    def loss(self, model: nn.Module, batch) -> torch.Tensor:
        log_p1, log_p2 = model(*batch.inputs())  # ``model`` may be DDP-wrapped; ``self.model`` never is
        starts, ends = self.model.training_targets(batch.context_words, batch.starts, batch.ends)
        return span_loss(log_p1, log_p2, starts, ends)

    def configure_optimizer(self, model: nn.Module):
        from ...train.schedules import log_warmup

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
        return {"config": meta_config(self.config), "words": self.words.to_dict(), "chars": self.chars.to_dict(),
                "limits": asdict(self.limits), "max_answer_len": self.recipe.max_answer_len}


def _all_tokens(s: SquadSet):
    yield from (c.tokens for c in s.contexts)
    yield from (q.tokens for q in s.questions)
