"""``Translator``: a trained ConvS2S model with its vocabularies, translating text.

``Translator.load(DIR)``: the checkpoint carries the model config, both vocabularies and how the text was
tokenized, so a run folder is all a translator needs.
"""
from __future__ import annotations

import logging
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch

from ...data.tokenize import detokenize
from ...data.vocab import EOS, SOS, Vocab
from ...errors import UserError
from ...models.convs2s import ConvS2S, ConvS2SConfig, beam_search, greedy_decode
from ...train.checkpoint import inference_weights, load_checkpoint
from .parallel import encode_source, tokenize_line
from .task import KIND, pad_source

__all__ = ["AttentionMap", "DecodeStats", "Translator", "plot_format", "plot_attention_map"]


log = logging.getLogger("fastqa.mt")


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
            src = pad_source([ids for _, ids in chunk], self.config.pad_id, self.device)
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

    from ...data.files import atomic_open

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
