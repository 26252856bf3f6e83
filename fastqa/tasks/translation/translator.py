"""``Translator``: a trained ConvS2S model with its vocabularies, translating text.

``Translator.load(DIR)``: the checkpoint carries the model config, both vocabularies and how the text was
tokenized (a SentencePiece model's bytes for a subword model), so a run folder is all a translator needs.
Checkpoints from before subword models (no ``vocab`` entry in their meta) load as word models.

A subword model reads any text (unseen characters are spelled with byte pieces) and never writes
``<unk>`` (the search may not pick it), so its output is cased, readable text. ``translate()`` is the one
entry point: a ``Translation`` per sentence (text, score, tokens), with the next best hypotheses
(``nbest=N``) and the attention map of the search that produced it (``attention=True``) on request, as the
``translate --nbest`` / ``--json`` / ``--plot-attention`` command prints and draws them.

Unsure translations: a model with a fitted ``ConfidenceFloor`` marks each translation it is unsure of
(``Translation.unsure``): one whose log-probability per token is under the floor's ``score``, or whose mean
next-token entropy is over the floor's ``entropy`` (both fitted on a validation set: the scores all but a
``quantile`` of its sentences reach). A sentence unlike the training data tends to come out as fluent-looking
nonsense: the search finds a likely path (its log-probability per token can look ordinary), while the model
spreads its probability over many next tokens at every step (its entropy is high).
"""
from __future__ import annotations

import logging
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
import torch.nn.functional as F

from ..._checks import check_int, check_text
from ...bounds import check_fits, checked
from ...data.batching import pad
from ...data.vocab import EOS, SOS, Vocab
from ...errors import UserError
from ...models.convs2s import ConvS2S, ConvS2SConfig, Hypothesis, beam_search
from ...train.distributed import default_device
from ..loading import cpu_threads, inference_dtype, load_weights, open_model, unreadable_meta
from .parallel import TextCodec, encode_source
from .spec import SPEC

__all__ = ["AttentionMap", "ConfidenceFloor", "DecodeStats", "Translation", "Translator"]


log = logging.getLogger("fastqa.mt")


@dataclass
class AttentionMap:
    """The attention of one translation: weights[t, s] = attention of output step t (predicting
    ``target[t]``, the last one ``<eos>``) on source position s (``source`` ends with ``<eos>``)."""
    source: list[str]
    target: list[str]
    weights: torch.Tensor  # [T, S]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: ``source``, ``target`` (tokens, each ending in ``<eos>``) and ``weights`` (T rows of S)."""
        return {"source": list(self.source), "target": list(self.target),
                "weights": [[round(float(w), 6) for w in row] for row in self.weights.tolist()]}


@dataclass
class Translation:
    """The translation of one sentence. text: detokenized; tokens: the model's target tokens (words or
    pieces, no <sos>/<eos>); score: the beam search's score, log_prob / (len(tokens) + 1) ** len_penalty;
    log_prob: the model's log-probability of tokens + <eos>; attention: the map of the search that produced it,
    when asked; alternatives: the next best hypotheses (``nbest`` > 1), best first; unsure: the model is unsure
    of it (``ConfidenceFloor.unsure``; always False for a model without a fitted floor); entropy: the mean
    entropy (nats) of the model's next-token distribution over its steps, when the floor needs it (else None)."""
    text: str
    tokens: list[str]
    score: float
    log_prob: float
    attention: AttentionMap | None = None
    alternatives: list["Translation"] = field(default_factory=list)
    unsure: bool = False
    entropy: float | None = None

    @property
    def token_log_prob(self) -> float:
        """The log-probability per token (its tokens and <eos>): the score at length penalty 1."""
        return self.log_prob / (len(self.tokens) + 1)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: ``text``, ``score``, ``tokens``, ``log_prob``, ``unsure``, ``entropy``, ``attention``
        (None unless asked for) and ``alternatives`` (their dicts; [] unless nbest > 1)."""
        return {"text": self.text, "score": self.score, "tokens": list(self.tokens), "log_prob": self.log_prob,
                "unsure": self.unsure, "entropy": self.entropy,
                "attention": None if self.attention is None else self.attention.to_dict(),
                "alternatives": [a.to_dict() for a in self.alternatives]}


def _quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass(frozen=True)
class ConfidenceFloor:
    """When a translation counts as unsure (``unsure``): its log-probability per token (``score`` at length
    penalty 1, whatever penalty the search used) under ``score``, or its mean next-token entropy over
    ``entropy``. ``score`` is the ``quantile`` of the per-token log-probabilities the model gives the sentences
    of a validation set (``fitted_on``) at beam ``beam``, ``entropy`` the 1 - ``quantile`` quantile of their
    entropies (None in a floor fitted before entropies were: the score alone decides). A sentence unlike the
    training data (another domain, another language) scores under the sentences it was trained for, or comes out
    fluent-looking with a high entropy (module docstring)."""

    score: float
    quantile: float
    fitted_on: str
    beam: int
    entropy: float | None = None

    @classmethod
    def fit(cls, scores: Sequence[float], *, quantile: float, fitted_on: str, beam: int,
            entropies: Sequence[float] | None = None) -> "ConfidenceFloor":
        """From a validation set's per-token log-probabilities (``Translation.token_log_prob``) and, optionally,
        its entropies (``Translation.entropy``), one per sentence."""
        if not scores:
            raise UserError(f"{fitted_on}: no sentence to fit a confidence floor on")
        if not 0.0 < quantile < 1.0:
            raise ValueError(f"quantile must be in (0, 1), got {quantile!r}")
        if entropies is not None and len(entropies) != len(scores):
            raise ValueError(f"entropies and scores differ in length ({len(entropies)} vs {len(scores)})")
        return cls(_quantile(scores, quantile), quantile, fitted_on, beam,
                   None if entropies is None else _quantile(entropies, 1.0 - quantile))

    def unsure(self, translation: "Translation") -> bool:
        """Whether the model is unsure of ``translation`` (an empty one never is)."""
        if not translation.tokens and not translation.log_prob:
            return False
        if translation.token_log_prob < self.score:
            return True
        return self.entropy is not None and translation.entropy is not None and translation.entropy > self.entropy

    def to_dict(self) -> dict[str, Any]:
        return {"score": self.score, "entropy": self.entropy, "quantile": self.quantile, "fitted_on": self.fitted_on,
                "beam": self.beam}

    @classmethod
    def from_dict(cls, obj: Any) -> "ConfidenceFloor":
        if not isinstance(obj, dict):
            raise TypeError(f"confidence: expected an object, got {type(obj).__name__}")
        entropy = obj.get("entropy")
        return cls(float(obj["score"]), float(obj["quantile"]), str(obj.get("fitted_on", "")), int(obj["beam"]),
                   None if entropy is None else float(entropy))


@dataclass
class DecodeStats:
    sentences: int = 0
    tokens: int = 0       # output tokens, <eos> not counted
    seconds: float = 0.0

    def add(self, other: "DecodeStats") -> None:
        """Accumulate ``other`` (line-by-line translation sums its calls)."""
        self.sentences += other.sentences
        self.tokens += other.tokens
        self.seconds += other.seconds


def _sentence_bar(total: int, enabled: bool):
    """A tqdm bar over ``total`` sentences (None when disabled or for a single sentence)."""
    if not enabled or total < 2:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="translating", unit=" sentences", mininterval=1.0, dynamic_ncols=True)


class Translator:
    """A trained ConvS2S with its vocabularies: ``Translator.load(DIR).translate(["Ein Satz."], beam=5)``.

    codec: how text becomes tokens and back (:class:`~.parallel.TextCodec`); without one, a word codec of
    ``src_lang``, ``tgt_lang`` and ``lowercase`` (the constructor of word models before subword ones).
    """

    def __init__(self, model: ConvS2S, src_vocab: Vocab, tgt_vocab: Vocab, *, codec: TextCodec | None = None,
                 src_lang: str | None = None, tgt_lang: str | None = None, lowercase: bool = True,
                 restore_case: bool = True) -> None:
        if codec is None:
            codec = TextCodec("word", src_lang=src_lang, tgt_lang=tgt_lang, lowercase=lowercase)
        self.model = model.eval()
        self.src_vocab, self.tgt_vocab = src_vocab, tgt_vocab
        self.codec = codec
        self.src_lang, self.tgt_lang, self.lowercase = codec.src_lang, codec.tgt_lang, codec.lowercase
        self.config: ConvS2SConfig = model.config
        self.last_stats = DecodeStats()
        #: read a sentence typed all in lower case with its case restored (a cased subword model only: it
        #: learned from cased text, and lower-cased German loses what marks its nouns)
        self.restore_case = bool(restore_case)
        #: the score (log-probability per token) under which a translation is one the model is unsure of:
        #: ``ConfidenceFloor`` fitted on a validation set (``fastqa mt-eval --fit-confidence``); None: not fitted
        self.confidence_floor: ConfidenceFloor | None = None

    @property
    def vocab_kind(self) -> str:
        """"subword" or "word"."""
        return self.codec.kind

    @classmethod
    def load(cls, name_or_path: str | os.PathLike | None = None, *, device: str | torch.device | None = None,
             layers: str | None = None, threads: int | None = None, precision: str | None = None,
             restore_case: bool = True) -> "Translator":
        """The translator ``name_or_path`` names: a run folder (its ``checkpoint.pt``; the EMA weights if the
        run kept them), a slim export (``fastqa export``), or a shipped model's name; None: the shipped
        translator (``SPEC.shipped``, ``.spec``). The ``Predictor`` contract
        (``fastqa.tasks.loading``): device None picks a CUDA GPU when there is one; layers: "fast" (default) or
        "reference"; threads: CPU threads; precision: "fp32", "bf16" or None (float32;
        ``fastqa.tasks.loading.inference_dtype``). ``restore_case``: see the attribute."""
        cpu_threads(threads)
        device = default_device(device)
        dtype = inference_dtype(precision, device)
        layers = layers or "fast"
        payload, path, meta = open_model(name_or_path, SPEC.shipped, SPEC.kinds, "a translation model",
                                         map_location=device)
        with unreadable_meta(path):
            src_vocab, tgt_vocab = Vocab.from_dict(meta["src_vocab"]), Vocab.from_dict(meta["tgt_vocab"])
            config = ConvS2SConfig.from_dict({**meta["config"], "layers": layers})
            codec = TextCodec.from_meta(meta)
        if codec.subword is not None and not src_vocab == tgt_vocab == codec.subword.to_vocab():
            raise UserError(f"{path}: the vocabularies are not the pieces of the checkpoint's SentencePiece model: "
                            f"the checkpoint mixes two vocabularies")
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
        load_weights(model, payload, path)
        with unreadable_meta(path):
            floor = ConfidenceFloor.from_dict(meta["confidence"]) if meta.get("confidence") is not None else None
        model.to(device, dtype)
        translator = cls(model, src_vocab, tgt_vocab, codec=codec, restore_case=restore_case)
        translator.confidence_floor = floor
        return translator

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    # -- text <-> ids ------------------------------------------------------------------------------------
    def source_tokens(self, sentence: str) -> list[str]:
        """The tokens the model reads for ``sentence`` (pieces, or words lowercased as in training; no <eos>)."""
        if not isinstance(sentence, str):
            raise TypeError(f"sentences must be str, got {type(sentence).__name__}")
        return self.codec.source_tokens(sentence, restore_case=self.restore_case)

    def detokenize(self, tokens: Sequence[str]) -> str:
        """Target tokens (a ``Translation``'s ``tokens``) -> text."""
        return self.codec.detokenize(tokens)

    def _encode(self, tokens: list[str], where: str) -> list[int]:
        limit = self.config.max_positions - 1  # room for <eos>
        if len(tokens) > limit:
            print(f"fastqa: warning: {where}: {len(tokens)} tokens, translating the first {limit} "
                  f"(the model's max_positions is {self.config.max_positions})", file=sys.stderr)
            tokens = tokens[:limit]
        return encode_source(tokens, self.src_vocab)

    def _sources(self, sentences: Sequence[str], beam: int, batch_size: int) -> list[tuple[int, list[int]]]:
        """Checked arguments; (index, source ids + <eos>) of the non-empty sentences, shortest first."""
        if isinstance(sentences, str):
            raise TypeError("sentences must be a list of str, not a single str")
        check_int("beam", beam, low=1)
        check_int("batch_size", batch_size, low=1)
        encoded: list[tuple[int, list[int]]] = []
        for i, s in enumerate(sentences):
            if isinstance(s, str):
                check_text(f"sentence {i + 1}", s)
            toks = self.source_tokens(s)
            if toks:
                encoded.append((i, self._encode(toks, f"sentence {i + 1}")))
        encoded.sort(key=lambda p: len(p[1]))  # similar lengths together: less padding
        return encoded

    # -- translation -------------------------------------------------------------------------------------
    def _batches(self, encoded: list[tuple[int, list[int]]], batch_size: int, progress: bool):
        """(chunk, src [B, S] padded ids on the model's device) per ``batch_size`` sentences of ``encoded``,
        with a bar over the sentences (``progress``)."""
        bar = _sentence_bar(len(encoded), progress)
        try:
            for start in range(0, len(encoded), batch_size):
                chunk = encoded[start:start + batch_size]
                yield chunk, pad([ids for _, ids in chunk], self.config.pad_id).to(self.device)
                if bar is not None:
                    bar.update(len(chunk))
        finally:
            if bar is not None:
                bar.close()

    @torch.no_grad()
    def translate(self, sentences: Sequence[str], *, beam: int = 5, nbest: int = 1, attention: bool = False,
                  incremental: bool = True, len_penalty: float = 1.0, max_len_a: float = 1.2, max_len_b: int = 10,
                  batch_size: int = 64, progress: bool = False, entropy: bool | None = None) -> list[Translation]:
        """One :class:`Translation` per sentence, in order: the best hypothesis of a beam search of ``beam``
        (beam 1 picks the tokens greedy decoding picks), with its ``score`` (log-probability per token,
        length-normalised) and target ``tokens``; an empty (or whitespace-only) sentence gives an empty one.

        nbest (<= beam): the next best hypotheses in ``alternatives``, best first. attention: the best hypothesis
        carries its attention map, the one the search computed (``AttentionMap``: target x source weights).
        ``self.last_stats`` records the sentences, output tokens and seconds of the decoding itself;
        ``progress``: a bar over the sentences (stderr). Each translation's ``unsure`` says whether the model is
        unsure of it (``confidence_floor``); ``entropy``: measure every translation's mean next-token entropy
        (one teacher-forced pass over the translations; None: when the floor needs it, as fitting one does)."""
        beam, nbest, batch_size, max_len_a, max_len_b, len_penalty = checked(
            beam=beam, nbest=nbest, batch_size=batch_size, max_len_a=max_len_a, max_len_b=max_len_b,
            len_penalty=len_penalty)
        encoded = self._sources(sentences, beam, batch_size)
        if nbest > beam:
            raise ValueError(f"nbest must be <= beam, got nbest={nbest} and beam={beam}")
        self._check_memory(encoded, beam=beam, batch_size=batch_size, max_len_a=max_len_a, max_len_b=max_len_b,
                           incremental=incremental)
        out = [Translation(text="", tokens=[], score=0.0, log_prob=0.0) for _ in sentences]
        stats = DecodeStats(sentences=len(encoded))
        floor = self.confidence_floor
        if entropy is None:
            entropy = floor is not None and floor.entropy is not None
        measured: list[tuple[Translation, list[int], list[int]]] = []   # (translation, source ids, target ids)
        t0 = time.perf_counter()
        for chunk, src in self._batches(encoded, batch_size, progress):
            hyps = beam_search(self.model, src, beam=beam, len_penalty=len_penalty, max_len_a=max_len_a,
                               max_len_b=max_len_b, nbest=nbest, incremental=incremental,
                               forbid=self.codec.forbid_ids)
            for (i, src_ids), sentence_hyps in zip(chunk, hyps):
                found = [self._translation(h, src_ids if attention and rank == 0 else None)
                         for rank, h in enumerate(sentence_hyps)]
                if entropy:
                    measured += [(t, src_ids, h.tokens) for t, h in zip(found, sentence_hyps)]
                best, *rest = found
                best.alternatives = rest
                out[i] = best
                stats.tokens += len(best.tokens)
        stats.seconds = time.perf_counter() - t0   # the search alone: what the speed figures compare
        for start in range(0, len(measured), batch_size):
            part = measured[start:start + batch_size]
            for (t, _, _), value in zip(part, self._entropies([(s, ids) for _, s, ids in part])):
                t.entropy = value
        if floor is not None:
            for best in out:
                for t in (best, *best.alternatives):
                    t.unsure = floor.unsure(t)
        self.last_stats = stats
        return out

    def _check_memory(self, encoded: list[tuple[int, list[int]]], *, beam: int, batch_size: int, max_len_a: float,
                      max_len_b: int, incremental: bool) -> None:
        """Refuse, with one line, a search whose largest batch cannot fit in the free memory. Its biggest
        tensors, per row (a sentence's beam): the next-token scores (vocabulary), the attention kept for every
        step over the source (the live rows and 2 x beam + 1 finished slots), the source's encoding, and the
        decoder's states (every step's, without ``incremental``). ``encoded`` is sorted shortest first."""
        if not encoded:
            return
        cfg = self.config
        sentences, src = min(batch_size, len(encoded)), len(encoded[-1][1])
        steps = min(int(max_len_a * src + max_len_b), cfg.max_positions - 1) + 1
        rows = sentences * beam
        layers = cfg.decoder_layers * (steps if not incremental else cfg.kernel_size)
        per_row = (3 * len(self.tgt_vocab) + 2 * steps * src + 2 * src * cfg.embed_dim
                   + layers * cfg.hidden_dim * 2)
        need = 4 * (rows * per_row + sentences * (2 * beam + 1) * steps * (src + 2))
        check_fits(f"translating {sentences} sentences of up to {src} tokens with beam {beam} (batch_size "
                   f"{batch_size})", need, device=self.device, advice="lower the beam (--beam) or batch_size "
                   "(--batch-size)")

    def _entropies(self, pairs: list[tuple[list[int], list[int]]]) -> list[float]:
        """The mean entropy (nats) of the model's next-token distribution over the steps of each (source ids with
        <eos>, target ids) pair: every target token and <eos>, teacher-forced in one batch."""
        cfg = self.config
        src = pad([s for s, _ in pairs], cfg.pad_id).to(self.device)
        tgt_in = pad([[cfg.sos_id, *t] for _, t in pairs], cfg.pad_id).to(self.device)
        logits, _ = self.model(src, tgt_in)                                     # [B, T, V]
        logp = F.log_softmax(logits.float(), dim=-1)
        per_step = -(logp.exp() * logp).sum(-1)                                 # [B, T]
        steps = torch.tensor([len(t) + 1 for _, t in pairs], device=per_step.device)
        mask = torch.arange(per_step.shape[1], device=per_step.device)[None] < steps[:, None]
        return ((per_step * mask).sum(1) / steps).tolist()

    def _translation(self, hyp: Hypothesis, src_ids: list[int] | None) -> Translation:
        """A search's hypothesis as a Translation; with ``src_ids``, its attention map over those tokens."""
        tokens = self.tgt_vocab.decode(hyp.tokens)
        amap = None
        if src_ids is not None:
            # The search's attention covers the sentence's real source positions: its tokens and <eos>.
            amap = AttentionMap(source=self.src_vocab.decode(src_ids), target=[*tokens, EOS],
                                weights=hyp.attention.float().cpu())
        return Translation(text=self.codec.detokenize(tokens), tokens=tokens, score=float(hyp.score),
                           log_prob=float(hyp.log_prob), attention=amap)
