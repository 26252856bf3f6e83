"""ConvS2S on parallel text as a training task for ``fastqa.train.fit``.

Training (``train_translation``): parallel text -> a :class:`~.parallel.TextCodec` (by default a SentencePiece
model learned on the training text; ``vocab="word"``: the tutorial's spaCy words) -> tokens -> vocabularies
(``<pad> <unk> <sos> <eos>`` first, the model's ids) -> numericalised pairs -> length-bucketed batches ->
``MTTask`` -> ``fit`` (the shared loop: clipping, checkpoints, exact resume, DDP, ``metrics.jsonl``,
``curve.png``). The checkpoint carries the codec (the SentencePiece model's bytes included), so a run
folder is all ``Translator.load`` needs.
"""
from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..._checks import check_int
from ...data.batching import bucket_batches, pad
from ...data.vocab import Vocab
from ...errors import UserError
from ...models.convs2s import ConvS2S, ConvS2SConfig, greedy_decode
from ...train.loop import TrainSettings, fit, seed_everything
from .bleu import tokenized_bleu
from .parallel import VOCABS, MTBatch, ParallelData, TextCodec, guess_lang, read_parallel, tokenize_line
from .spec import SPEC

__all__ = ["KIND", "OPTIMIZERS", "DEFAULT_LR", "MTOptions", "MTTask", "build_codec", "ParallelCorpus", "prepare_parallel", "build_task", "train_translation"]


log = logging.getLogger("fastqa.mt")


KIND = SPEC.kinds[0]  # the checkpoint kind of a ConvS2S run


OPTIMIZERS = ("adam", "nag")


# fairseq's fconv recipe: NAG at lr 0.25 (momentum 0.99); the tutorial: Adam at its default lr 1e-3.
DEFAULT_LR = {"adam": 1e-3, "nag": 0.25}


@dataclass
class MTOptions:
    """What to train on and how to build the task (the loop's own settings are ``TrainSettings``).

    vocab: "subword" (one SentencePiece unigram model of at most ``vocab_size`` pieces, learned on the source
    and target training text together, cased) or "word" (spaCy tokens, a vocabulary per side of the tokens
    seen ``min_freq`` times, lowercased: the tutorial's). lowercase: None = the vocabulary's default (word:
    lowercased, subword: cased). src_lang / tgt_lang: spaCy languages (default: from the file names; a
    subword model needs them only for the tutorial's tokenized BLEU and works without).
    preset: ConvS2S preset ("small" | "tutorial"); config_overrides: ConvS2SConfig fields over the preset.
    max_len: training pairs whose source or target (+<eos>) is longer, in the vocabulary's tokens (pieces for
    a subword model), are dropped (never in evaluation); None: the model's ``max_positions``. valid_bleu:
    greedy tokenized BLEU on the first N validation pairs at every evaluation (0: off).
    """
    src: str
    tgt: str
    valid_src: str
    valid_tgt: str
    src_lang: str | None = None
    tgt_lang: str | None = None
    vocab: str = "subword"
    vocab_size: int = 8000
    lowercase: bool | None = None
    min_freq: int = 2
    preset: str = "small"
    config_overrides: dict[str, Any] = field(default_factory=dict)
    layers: str = "fast"
    max_len: int | None = None
    batch_size: int = 64
    optimizer: str = "adam"
    lr: float | None = None
    label_smoothing: float = 0.0
    valid_bleu: int = 0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.vocab not in VOCABS:
            raise UserError(f"--vocab must be one of {', '.join(VOCABS)}, got {self.vocab!r}")
        check_int("--vocab-size", self.vocab_size, low=5, error=UserError)
        if self.optimizer not in OPTIMIZERS:
            raise UserError(f"--optimizer must be one of {', '.join(OPTIMIZERS)}, got {self.optimizer!r}")
        if self.batch_size < 1:
            raise UserError(f"--batch-size must be >= 1, got {self.batch_size}")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise UserError(f"--label-smoothing must be in [0, 1), got {self.label_smoothing}")
        if self.lr is not None and not self.lr > 0:
            raise UserError(f"--lr must be > 0, got {self.lr}")
        if self.min_freq < 1:
            raise UserError(f"--min-freq must be >= 1, got {self.min_freq}")
        if self.valid_bleu < 0:
            raise UserError(f"--valid-bleu must be >= 0, got {self.valid_bleu}")
        if self.max_len is not None and self.max_len < 2:
            raise UserError(f"--max-len must be >= 2, got {self.max_len}")


def _clip_to_positions(data: ParallelData, max_positions: int) -> ParallelData:
    """Evaluation keeps every pair; the rare one longer than the learned positions is truncated (source keeps
    its <eos>) so it can be scored at all."""
    limit = max_positions - 1
    src = [s if len(s) <= max_positions else s[:max_positions - 1] + s[-1:] for s in data.src]
    tgt = [t[:limit] for t in data.tgt]
    return ParallelData(src, tgt, data.src_vocab, data.tgt_vocab)


class MTTask:
    """ConvS2S on parallel text as a ``fastqa.train.loop.Task``.

    Loss: token-level cross entropy (``<pad>`` ignored, optional label smoothing), mean over the batch's target
    tokens. evaluate(): validation NLL per token (``val_loss``, no smoothing) and ``val_ppl`` = exp of it;
    with ``valid_bleu`` > 0, greedy tokenized BLEU on that many validation pairs (``val_bleu``).
    """

    kind = KIND
    command = "mt-train"

    def __init__(self, config: ConvS2SConfig, src_vocab: Vocab, tgt_vocab: Vocab, train: ParallelData,
                 valid: ParallelData, *, opts: MTOptions, codec: TextCodec,
                 valid_ref_tokens: Sequence[Sequence[str]] = ()) -> None:
        self.config, self.src_vocab, self.tgt_vocab = config, src_vocab, tgt_vocab
        self.train_data, self.valid_data = train, valid
        self.opts, self.codec = opts, codec
        self.src_lang, self.tgt_lang = codec.src_lang, codec.tgt_lang
        self.valid_ref_tokens = list(valid_ref_tokens)
        self._lengths = train.lengths()
        self.model = ConvS2S(config, layers=opts.layers)
        self.preset = opts.preset

    @property
    def reference_run(self) -> Any:
        """The documented run of this preset, which the expectation line quotes (None: none)."""
        return SPEC.reference_run(self.kind, self.preset)

    @property
    def headline_metrics(self) -> tuple[str, ...]:
        """What the progress bar shows of an evaluation: BLEU when it is computed, else the perplexity."""
        return ("val_bleu",) if self._bleu_pairs() else ("val_ppl",)

    @property
    def eval_size(self) -> int:
        """An evaluation's work in validation pairs read once (the time budget's estimate before one is timed):
        every pair's loss, and each pair decoded for BLEU counted as four (a greedy search runs the decoder once
        per token, on one position each time)."""
        return len(self.valid_data) + 4 * self._bleu_pairs()

    def _bleu_pairs(self) -> int:
        return min(self.opts.valid_bleu, len(self.valid_ref_tokens), len(self.valid_data))

    # -- Task protocol ---------------------------------------------------------------------------------
    def train_batches(self, epoch: int) -> list[list[int]]:
        return bucket_batches(self._lengths, self.opts.batch_size, seed=self.opts.seed, epoch=epoch)

    def collate(self, indices: list[int], device: torch.device) -> MTBatch:
        return self.train_data.collate(indices).to(device)

    def graph_lengths(self, indices: list[int]) -> tuple[int, int]:
        """(source, target) lengths of the batch ``collate`` makes of ``indices`` (the graphed step's buckets)."""
        data = self.train_data
        return max(len(data.src[i]) for i in indices), max(len(data.tgt[i]) for i in indices) + 1

    def pad_batch(self, batch: MTBatch, lengths: tuple[int, int]) -> MTBatch:
        """``batch`` padded to (source, target) ``lengths`` with the pad id: the encoder masks it, the decoder is
        causal and the loss ignores it."""
        from ...train.cuda_graphs import pad_dim

        s, t, pad_id = *lengths, self.config.pad_id
        return MTBatch(pad_dim(batch.src, 1, s, pad_id), pad_dim(batch.tgt_in, 1, t, pad_id),
                       pad_dim(batch.tgt_out, 1, t, pad_id))

    def loss(self, model: nn.Module, batch: MTBatch) -> torch.Tensor:
        logits, _ = model(batch.src, batch.tgt_in)
        return F.cross_entropy(logits.flatten(0, 1).float(), batch.tgt_out.flatten(),
                               ignore_index=self.config.pad_id, label_smoothing=self.opts.label_smoothing)

    def configure_optimizer(self, model: nn.Module) -> tuple[torch.optim.Optimizer, None]:
        lr = self.opts.lr if self.opts.lr is not None else DEFAULT_LR[self.opts.optimizer]
        if self.opts.optimizer == "adam":
            return torch.optim.Adam(model.parameters(), lr=lr), None
        return torch.optim.SGD(model.parameters(), lr=lr, momentum=0.99, nesterov=True), None

    @torch.no_grad()
    def evaluate(self, model: nn.Module) -> dict[str, float]:
        device = next(model.parameters()).device
        total_nll, total_tokens = 0.0, 0
        batches = bucket_batches(self.valid_data.lengths(), self.opts.batch_size, seed=0, shuffle=False)
        for indices in batches:
            b = self.valid_data.collate(indices).to(device)
            logits, _ = model(b.src, b.tgt_in)
            total_nll += float(F.cross_entropy(logits.flatten(0, 1).float(), b.tgt_out.flatten(),
                                               ignore_index=self.config.pad_id, reduction="sum"))
            total_tokens += int((b.tgt_out != self.config.pad_id).sum())
        val_loss = total_nll / max(total_tokens, 1)
        metrics = {"val_loss": val_loss, "val_ppl": math.exp(min(val_loss, 50.0))}
        n = self._bleu_pairs()
        if n:
            hyps: list[list[str]] = []
            for start in range(0, n, self.opts.batch_size):
                src = [self.valid_data.src[i] for i in range(start, min(start + self.opts.batch_size, n))]
                out = greedy_decode(model, pad(src, self.config.pad_id).to(device),
                                    forbid=self.codec.forbid_ids)
                hyps += [self.codec.bleu_tokens(self.tgt_vocab.decode(ids)) for ids in out]
            metrics["val_bleu"] = tokenized_bleu(hyps, self.valid_ref_tokens[:n]).score
        return metrics

    def checkpoint_meta(self) -> dict:
        # The layer backend is left out: fast and reference share their weights, so a run may resume or be
        # used on either.
        config = {k: v for k, v in self.config.to_dict().items() if k != "layers"}
        return {"config": config, "src_vocab": self.src_vocab.to_dict(), "tgt_vocab": self.tgt_vocab.to_dict(),
                **self.codec.meta()}


def build_codec(opts: MTOptions, src_lines: Sequence[str], tgt_lines: Sequence[str]) -> TextCodec:
    """The text <-> tokens codec ``opts`` asks for; a subword model is learned on the training lines."""
    word = opts.vocab == "word"
    src_lang = opts.src_lang or guess_lang(opts.src, "--src-lang", required=word)
    tgt_lang = opts.tgt_lang or guess_lang(opts.tgt, "--tgt-lang", required=word)
    lowercase = word if opts.lowercase is None else opts.lowercase
    if word:
        return TextCodec("word", src_lang=src_lang, tgt_lang=tgt_lang, lowercase=lowercase)
    return TextCodec.train_subword(src_lines, tgt_lines, vocab_size=opts.vocab_size, src_lang=src_lang,
                                   tgt_lang=tgt_lang, lowercase=lowercase)


@dataclass
class ParallelCorpus:
    """Training and validation text, tokenized and numericalised (``prepare_parallel``).

    codec: how text becomes tokens and back (the subword model, or spaCy words); train / valid: the pairs
    (validation pairs clipped to the model's positions, never dropped); ref_tokens: the validation
    references as lowercased spaCy tokens, for the tutorial's tokenized BLEU.
    """
    codec: TextCodec
    src_vocab: Vocab
    tgt_vocab: Vocab
    train: ParallelData
    valid: ParallelData
    ref_tokens: list[list[str]]


def _model_config(opts: MTOptions, src_vocab_size: int, tgt_vocab_size: int) -> ConvS2SConfig:
    try:
        return ConvS2SConfig.from_preset(opts.preset, src_vocab_size=src_vocab_size, tgt_vocab_size=tgt_vocab_size,
                                         layers=opts.layers, **opts.config_overrides)
    except (TypeError, ValueError) as e:
        raise UserError(f"model config: {e}") from None


def prepare_parallel(opts: MTOptions, max_positions: int, *, progress: bool = False) -> ParallelCorpus:
    """Everything a translation model trains and evaluates on, in one call: read the four files, learn the
    subword model (``vocab="subword"``) or take spaCy's words, build the vocabularies, numericalise; training
    pairs longer than ``max_len`` (or ``max_positions``) are dropped, validation pairs clipped. ``progress``:
    a bar over the lines while they are tokenized (stderr)."""
    if opts.vocab == "word":  # a language the file names do not tell fails before any file is read
        for path, lang, flag in ((opts.src, opts.src_lang, "--src-lang"), (opts.tgt, opts.tgt_lang, "--tgt-lang")):
            if lang is None:
                guess_lang(path, flag)
    src_lines, tgt_lines = read_parallel(opts.src, opts.tgt)
    for path, lines in ((opts.src, src_lines), (opts.tgt, tgt_lines)):
        if not any(line.strip() for line in lines):
            raise UserError(f"{path}: every line is empty or blank: no text to learn from")
    valid_src_lines, valid_tgt_lines = read_parallel(opts.valid_src, opts.valid_tgt)
    codec = build_codec(opts, src_lines, tgt_lines)
    src_tok = [codec.source_tokens(line) for line in _lines_bar(src_lines, "tokenizing source", progress)]
    tgt_tok = [codec.target_tokens(line) for line in _lines_bar(tgt_lines, "tokenizing target", progress)]
    src_vocab, tgt_vocab = codec.vocabs(src_tok, tgt_tok, min_freq=opts.min_freq)
    max_len = min(opts.max_len or max_positions, max_positions)
    train = ParallelData.from_tokens(src_tok, tgt_tok, src_vocab, tgt_vocab, max_len=max_len)
    if len(train) == 0:
        raise UserError(f"{opts.src}: no training pair left (every pair is empty on one side or longer than "
                        f"{max_len} tokens)")
    dropped = len(src_lines) - len(train)
    if dropped:
        log.info("training on %d of %d pairs (%d empty on one side or longer than %d tokens)",
                 len(train), len(src_lines), dropped, max_len)
    v_src = [codec.source_tokens(line) for line in valid_src_lines]
    v_tgt = [codec.target_tokens(line) for line in valid_tgt_lines]
    keep = [i for i, (s, t) in enumerate(zip(v_src, v_tgt)) if s and t]
    if not keep:
        raise UserError(f"{opts.valid_src}: no validation pair with text on both sides")
    valid = ParallelData.from_tokens([v_src[i] for i in keep], [v_tgt[i] for i in keep], src_vocab, tgt_vocab)
    valid = _clip_to_positions(valid, max_positions)
    # BLEU references keep their real words (unknown ones too): the score is not flattered by <unk>.
    ref_tokens = [tokenize_line(valid_tgt_lines[i], codec.bleu_lang, lowercase=True) for i in keep]
    return ParallelCorpus(codec, src_vocab, tgt_vocab, train, valid, ref_tokens)


def _lines_bar(lines: list[str], desc: str, enabled: bool):
    if not enabled:
        return lines
    from tqdm.auto import tqdm

    return tqdm(lines, desc=desc, unit=" lines", mininterval=1.0, dynamic_ncols=True)


def build_task(opts: MTOptions, *, progress: bool = False) -> MTTask:
    """Check the model config (before any file is read), prepare the data (``prepare_parallel``) and build
    the model (seeded by ``opts.seed``)."""
    placeholder = _model_config(opts, src_vocab_size=4, tgt_vocab_size=4)
    data = prepare_parallel(opts, placeholder.max_positions, progress=progress)
    config = _model_config(opts, len(data.src_vocab), len(data.tgt_vocab))
    seed_everything(opts.seed)  # fixed initial weights
    return MTTask(config, data.src_vocab, data.tgt_vocab, data.train, data.valid, opts=opts, codec=data.codec,
                  valid_ref_tokens=data.ref_tokens)


def train_translation(opts: MTOptions, settings: TrainSettings) -> dict[str, float]:
    """Build the task and train it with the shared loop; returns the last evaluation's metrics."""
    task = build_task(opts, progress=settings.progress and os.environ.get("RANK", "0") == "0")
    if os.environ.get("RANK", "0") == "0":  # under torchrun every rank builds the task; one reports it
        log.info("ConvS2S %s: %d parameters; %s vocabularies %s %d, %s %d; %d training pairs, %d validation pairs",
                 opts.preset, sum(p.numel() for p in task.model.parameters()), task.codec.kind, task.src_lang,
                 len(task.src_vocab), task.tgt_lang, len(task.tgt_vocab), len(task.train_data), len(task.valid_data))
    return fit(task, settings)
