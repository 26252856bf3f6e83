"""ConvS2S translation end to end: the training task for ``fastqa.train.fit``, and ``Translator``.

Training (``train_translation``): parallel text -> spaCy tokens -> vocabularies (``<pad> <unk> <sos> <eos>``
first, the model's ids) -> numericalised pairs -> length-bucketed batches -> ``MTTask`` -> ``fit`` (the shared
loop: clipping, checkpoints, exact resume, DDP, ``metrics.jsonl``, ``curve.png``).

Use (``Translator.load(DIR)``): the checkpoint carries the model config, both vocabularies and how the text
was tokenized, so a run folder is all a translator needs.
"""
from __future__ import annotations

import logging
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..data.batching import bucket_batches
from ..data.translation import (MTBatch, ParallelData, build_vocabs, encode_source, guess_lang, read_parallel,
                                tokenize_line, tokenize_lines)
from ..data.vocab import EOS, SOS, Vocab
from ..errors import UserError
from ..metrics.bleu import detokenize, tokenized_bleu
from ..models.convs2s import ConvS2S, ConvS2SConfig, beam_search, greedy_decode
from ..train.checkpoint import inference_weights, load_checkpoint
from ..train.loop import TrainSettings, fit, seed_everything

__all__ = ["MTOptions", "MTTask", "build_task", "train_translation", "Translator", "AttentionMap",
           "plot_attention_map", "plot_format"]

log = logging.getLogger("fastqa.mt")

KIND = "convs2s"
OPTIMIZERS = ("adam", "nag")
# fairseq's fconv recipe: NAG at lr 0.25 (momentum 0.99); the tutorial: Adam at its default lr 1e-3.
DEFAULT_LR = {"adam": 1e-3, "nag": 0.25}


@dataclass
class MTOptions:
    """What to train on and how to build the task (the loop's own settings are ``TrainSettings``).

    preset: ConvS2S preset ("small" | "tutorial"); config_overrides: ConvS2SConfig fields over the preset.
    max_len: training pairs whose source or target (+<eos>) is longer are dropped (never in evaluation);
    None: the model's ``max_positions``. valid_bleu: greedy tokenized BLEU on the first N validation pairs
    at every evaluation (0: off).
    """
    src: str
    tgt: str
    valid_src: str
    valid_tgt: str
    src_lang: str | None = None
    tgt_lang: str | None = None
    lowercase: bool = True
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

    def __init__(self, config: ConvS2SConfig, src_vocab: Vocab, tgt_vocab: Vocab, train: ParallelData,
                 valid: ParallelData, *, opts: MTOptions, src_lang: str, tgt_lang: str,
                 valid_ref_tokens: Sequence[Sequence[str]] = ()) -> None:
        self.config, self.src_vocab, self.tgt_vocab = config, src_vocab, tgt_vocab
        self.train_data, self.valid_data = train, valid
        self.opts, self.src_lang, self.tgt_lang = opts, src_lang, tgt_lang
        self.valid_ref_tokens = list(valid_ref_tokens)
        self._lengths = train.lengths()
        self.model = ConvS2S(config, layers=opts.layers)

    # -- Task protocol ---------------------------------------------------------------------------------
    def train_batches(self, epoch: int) -> list[list[int]]:
        return bucket_batches(self._lengths, self.opts.batch_size, seed=self.opts.seed, epoch=epoch)

    def collate(self, indices: list[int], device: torch.device) -> MTBatch:
        return self.train_data.collate(indices).to(device)

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
        n = min(self.opts.valid_bleu, len(self.valid_ref_tokens), len(self.valid_data))
        if n:
            hyps: list[list[str]] = []
            for start in range(0, n, self.opts.batch_size):
                src = [self.valid_data.src[i] for i in range(start, min(start + self.opts.batch_size, n))]
                out = greedy_decode(model, _pad_src(src, self.config.pad_id, device))
                hyps += [self.tgt_vocab.decode(ids) for ids in out]
            metrics["val_bleu"] = tokenized_bleu(hyps, self.valid_ref_tokens[:n]).score
        return metrics

    def checkpoint_meta(self) -> dict:
        # The layer backend is left out: fast and reference share their weights, so a run may resume or be
        # used on either.
        config = {k: v for k, v in self.config.to_dict().items() if k != "layers"}
        return {"config": config, "src_vocab": self.src_vocab.to_dict(), "tgt_vocab": self.tgt_vocab.to_dict(),
                "text": {"src_lang": self.src_lang, "tgt_lang": self.tgt_lang, "lowercase": self.opts.lowercase}}


def _pad_src(src: Sequence[Sequence[int]], pad_id: int, device: torch.device) -> torch.Tensor:
    from ..data.batching import pad

    return pad(src, pad_id).to(device)


def build_task(opts: MTOptions) -> MTTask:
    """Read, tokenize, build vocabularies and the model (seeded by ``opts.seed``)."""
    src_lang = opts.src_lang or guess_lang(opts.src, "--src-lang")
    tgt_lang = opts.tgt_lang or guess_lang(opts.tgt, "--tgt-lang")
    src_lines, tgt_lines = read_parallel(opts.src, opts.tgt)
    valid_src_lines, valid_tgt_lines = read_parallel(opts.valid_src, opts.valid_tgt)
    src_tok = tokenize_lines(src_lines, src_lang, lowercase=opts.lowercase)
    tgt_tok = tokenize_lines(tgt_lines, tgt_lang, lowercase=opts.lowercase)
    src_vocab, tgt_vocab = build_vocabs(src_tok, tgt_tok, min_freq=opts.min_freq)
    try:
        config = ConvS2SConfig.from_preset(opts.preset, src_vocab_size=len(src_vocab), tgt_vocab_size=len(tgt_vocab),
                                           layers=opts.layers, **opts.config_overrides)
    except (TypeError, ValueError) as e:
        raise UserError(f"model config: {e}") from None
    max_len = min(opts.max_len or config.max_positions, config.max_positions)
    train = ParallelData.from_tokens(src_tok, tgt_tok, src_vocab, tgt_vocab, max_len=max_len)
    if len(train) == 0:
        raise UserError(f"{opts.src}: no training pair left (every pair is empty on one side or longer than "
                        f"{max_len} tokens)")
    dropped = len(src_lines) - len(train)
    if dropped:
        log.info("training on %d of %d pairs (%d empty on one side or longer than %d tokens)",
                 len(train), len(src_lines), dropped, max_len)
    v_src = tokenize_lines(valid_src_lines, src_lang, lowercase=opts.lowercase)
    v_tgt = tokenize_lines(valid_tgt_lines, tgt_lang, lowercase=opts.lowercase)
    keep = [i for i, (s, t) in enumerate(zip(v_src, v_tgt)) if s and t]
    if not keep:
        raise UserError(f"{opts.valid_src}: no validation pair with text on both sides")
    valid = ParallelData.from_tokens([v_src[i] for i in keep], [v_tgt[i] for i in keep], src_vocab, tgt_vocab)
    valid = _clip_to_positions(valid, config.max_positions)
    # BLEU references keep their real tokens (unknown words too): the score is not flattered by <unk>.
    ref_tokens = [[t.lower() for t in v_tgt[i]] for i in keep]
    seed_everything(opts.seed)  # fixed initial weights
    return MTTask(config, src_vocab, tgt_vocab, train, valid, opts=opts, src_lang=src_lang, tgt_lang=tgt_lang,
                  valid_ref_tokens=ref_tokens)


def train_translation(opts: MTOptions, settings: TrainSettings) -> dict[str, float]:
    """Build the task and train it with the shared loop; returns the last evaluation's metrics."""
    task = build_task(opts)
    if os.environ.get("RANK", "0") == "0":  # under torchrun every rank builds the task; one reports it
        log.info("ConvS2S %s: %d parameters; vocabularies %s %d, %s %d; %d training pairs, %d validation pairs",
                 opts.preset, sum(p.numel() for p in task.model.parameters()), task.src_lang, len(task.src_vocab),
                 task.tgt_lang, len(task.tgt_vocab), len(task.train_data), len(task.valid_data))
    return fit(task, settings)


# ------------------------------------------------------------------------------------------------------------
# Using a trained model
# ------------------------------------------------------------------------------------------------------------
@dataclass
class AttentionMap:
    """The attention of one translation: weights[t, s] = attention of output step t (predicting
    ``target[t]``, the last one ``<eos>``) on source position s (``source`` ends with ``<eos>``)."""
    source: list[str]
    target: list[str]
    weights: torch.Tensor  # [T, S]


@dataclass
class DecodeStats:
    sentences: int = 0
    tokens: int = 0       # output tokens, <eos> not counted
    seconds: float = 0.0


class Translator:
    """A trained ConvS2S with its vocabularies: ``Translator.load(DIR).translate(["ein satz ."], beam=5)``."""

    def __init__(self, model: ConvS2S, src_vocab: Vocab, tgt_vocab: Vocab, *, src_lang: str, tgt_lang: str,
                 lowercase: bool) -> None:
        self.model = model.eval()
        self.src_vocab, self.tgt_vocab = src_vocab, tgt_vocab
        self.src_lang, self.tgt_lang, self.lowercase = src_lang, tgt_lang, lowercase
        self.config: ConvS2SConfig = model.config
        self.last_stats = DecodeStats()

    @classmethod
    def load(cls, model_dir: str | os.PathLike, *, layers: str = "fast", device: str | torch.device = "cpu") -> "Translator":
        """The model trained into ``model_dir`` (its ``checkpoint.pt``; the EMA weights if the run kept them)."""
        payload = load_checkpoint(model_dir, map_location=device)
        path = Path(model_dir) / "checkpoint.pt" if Path(model_dir).is_dir() else Path(model_dir)
        if payload.get("kind") != KIND:
            raise UserError(f"{path}: a {payload.get('kind')!r} checkpoint, not a translation model ({KIND!r})")
        meta = payload.get("meta") or {}
        try:
            src_vocab, tgt_vocab = Vocab.from_dict(meta["src_vocab"]), Vocab.from_dict(meta["tgt_vocab"])
            config = ConvS2SConfig.from_dict({**meta["config"], "layers": layers})
            text = meta["text"]
        except (KeyError, TypeError, ValueError) as e:
            raise UserError(f"{path}: the checkpoint's config or vocabularies are missing or invalid ({e})") from None
        for side, vocab, size in (("source", src_vocab, config.src_vocab_size),
                                  ("target", tgt_vocab, config.tgt_vocab_size)):
            if len(vocab) != size:
                raise UserError(f"{path}: the {side} vocabulary has {len(vocab)} tokens but the model was built "
                                f"for {size}: the checkpoint mixes two vocabularies")
            ids = {name: vocab.stoi.get(tok) for name, tok in
                   (("pad_id", "<pad>"), ("unk_id", "<unk>"), ("sos_id", SOS), ("eos_id", EOS))}
            want = {name: getattr(config, name) for name in ids}
            if ids != want:
                raise UserError(f"{path}: the {side} vocabulary's special ids {ids} are not the model's {want}")
        model = ConvS2S(config, layers=layers)
        try:
            model.load_state_dict(inference_weights(payload))
        except RuntimeError as e:
            first = str(e).strip().splitlines()
            raise UserError(f"{path}: the weights do not fit the checkpoint's config "
                            f"({first[1].strip() if len(first) > 1 else first[0]})") from None
        model.to(device)
        return cls(model, src_vocab, tgt_vocab, src_lang=text["src_lang"], tgt_lang=text["tgt_lang"],
                   lowercase=text["lowercase"])

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    # -- text <-> ids ------------------------------------------------------------------------------------
    def source_tokens(self, sentence: str) -> list[str]:
        """The tokens the model reads for ``sentence`` (lowercased as in training; no <eos>)."""
        if not isinstance(sentence, str):
            raise TypeError(f"sentences must be str, got {type(sentence).__name__}")
        return tokenize_line(sentence, self.src_lang, lowercase=self.lowercase)

    def _encode(self, tokens: list[str], where: str) -> list[int]:
        limit = self.config.max_positions - 1  # room for <eos>
        if len(tokens) > limit:
            print(f"fastqa: warning: {where}: {len(tokens)} tokens, translating the first {limit} "
                  f"(the model's max_positions is {self.config.max_positions})", file=sys.stderr)
            tokens = tokens[:limit]
        return encode_source(tokens, self.src_vocab)

    # -- translation -------------------------------------------------------------------------------------
    @torch.no_grad()
    def translate_tokens(self, sentences: Sequence[str], *, beam: int = 5, incremental: bool = True,
                         len_penalty: float = 1.0, max_len_a: float = 1.2, max_len_b: int = 10,
                         batch_size: int = 64) -> list[list[str]]:
        """Each sentence's translation as target tokens (no <sos>/<eos>). Empty (or whitespace-only)
        sentences give []; unknown source words are read as <unk>. ``beam`` 1 decodes greedily.
        ``self.last_stats`` records the sentences, output tokens and seconds of the decoding itself."""
        if isinstance(sentences, str):
            raise TypeError("sentences must be a list of str, not a single str")
        if isinstance(beam, bool) or not isinstance(beam, int) or beam < 1:
            raise ValueError(f"beam must be an int >= 1, got {beam!r}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        encoded: list[tuple[int, list[int]]] = []
        for i, s in enumerate(sentences):
            toks = self.source_tokens(s)
            if toks:
                encoded.append((i, self._encode(toks, f"sentence {i + 1}")))
        out: list[list[str]] = [[] for _ in sentences]
        encoded.sort(key=lambda p: len(p[1]))  # similar lengths together: less padding
        stats = DecodeStats(sentences=len(encoded))
        t0 = time.perf_counter()
        for start in range(0, len(encoded), batch_size):
            chunk = encoded[start:start + batch_size]
            src = _pad_src([ids for _, ids in chunk], self.config.pad_id, self.device)
            if beam == 1:
                ids_list = greedy_decode(self.model, src, max_len_a=max_len_a, max_len_b=max_len_b,
                                         incremental=incremental)
            else:
                hyps = beam_search(self.model, src, beam=beam, len_penalty=len_penalty, max_len_a=max_len_a,
                                   max_len_b=max_len_b, nbest=1, incremental=incremental)
                ids_list = [h[0].tokens for h in hyps]
            for (i, _), ids in zip(chunk, ids_list):
                ids = [int(t) for t in ids]
                out[i] = self.tgt_vocab.decode(ids)
                stats.tokens += len(ids)
        stats.seconds = time.perf_counter() - t0
        self.last_stats = stats
        return out

    def translate(self, sentences: Sequence[str], *, beam: int = 5, incremental: bool = True, **kwargs: Any) -> list[str]:
        """Each sentence's translation as text (target tokens joined by sacremoses' detokenizer); empty
        sentences give ""."""
        return [detokenize(toks, self.tgt_lang)
                for toks in self.translate_tokens(sentences, beam=beam, incremental=incremental, **kwargs)]

    # -- attention ---------------------------------------------------------------------------------------
    @torch.no_grad()
    def attention(self, sentence: str, *, beam: int = 1, **kwargs: Any) -> AttentionMap:
        """Translate ``sentence`` and return the attention the model pays while producing that translation:
        the decoder re-run over <sos> + translation gives, for every output step, its attention over the
        source (the same weights the decoding computed step by step)."""
        toks = self.source_tokens(sentence)
        if not toks:
            raise UserError("attention: the sentence is empty, there is nothing to attend to")
        out = self.translate_tokens([sentence], beam=beam, **kwargs)[0]
        src_ids = self._encode(toks, "attention sentence")
        src = torch.tensor([src_ids], dtype=torch.long, device=self.device)
        tgt_ids = self.tgt_vocab.encode(out)
        tgt_in = torch.tensor([[self.config.sos_id, *tgt_ids]], dtype=torch.long, device=self.device)
        _, attn = self.model(src, tgt_in)
        source = self.src_vocab.decode(src_ids)  # what the model saw: unknown words show as <unk>
        return AttentionMap(source=source, target=[*out, EOS], weights=attn[0].float().cpu())

    def plot_attention(self, sentence: str, path: str | os.PathLike, **kwargs: Any) -> AttentionMap:
        """Draw the source x target attention map of ``sentence``'s translation into ``path`` (PNG...)."""
        amap = self.attention(sentence, **kwargs)
        plot_attention_map(amap, path)
        return amap


def plot_format(path: str | os.PathLike) -> str:
    """The image format of ``path`` by its suffix (png, pdf, svg...); UserError if matplotlib cannot write it
    (checked before any work is done)."""
    from matplotlib.backend_bases import FigureCanvasBase

    fmt = Path(path).suffix.lstrip(".").lower()
    supported = FigureCanvasBase.get_supported_filetypes()
    if fmt not in supported:
        raise UserError(f"{path}: cannot write a plot in format {fmt or '(no suffix)'!r}; "
                        f"use one of .{', .'.join(sorted(supported))}")
    return fmt


def plot_attention_map(amap: AttentionMap, path: str | os.PathLike) -> None:
    """Heat map: source tokens on the x axis, output tokens on the y axis (written atomically)."""
    fmt = plot_format(path)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..train.checkpoint import atomic_open

    weights = amap.weights.numpy()
    fig, ax = plt.subplots(figsize=(max(4.0, 0.45 * len(amap.source) + 1.5), max(3.0, 0.45 * len(amap.target) + 1.0)))
    im = ax.imshow(weights, cmap="bone", aspect="auto", vmin=0.0)
    ax.set_xticks(range(len(amap.source)), amap.source, rotation=45, ha="right")
    ax.set_yticks(range(len(amap.target)), amap.target)
    ax.set_xlabel("source")
    ax.set_ylabel("translation")
    fig.colorbar(im, ax=ax, fraction=0.04)
    fig.tight_layout()
    try:
        with atomic_open(path, "wb") as f:
            fig.savefig(f, format=fmt)
    finally:
        plt.close(fig)
