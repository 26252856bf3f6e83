"""Decoding for ConvS2S: greedy search and beam search, batched over sentences, driving the explicit
decoder state (``state.DecoderState``).

Incremental decoding (the default) embeds only the newest token and advances every decoder layer by one
``GLUConv1d.step`` on its rolling [N, K-1, H] state; the encoder output (keys, values, mask) is computed
once per batch and shared by a sentence's beams. ``incremental=False`` re-runs the decoder over the whole
prefix at every step, as the tutorial does -- kept to check and to time the incremental decoder against.

Search rules (both searches): pad and sos are never generated, nor any id in ``forbid`` (a subword
model's ``<unk>``: its pieces spell every text, so an unknown token would only be a wrong one); a sentence of |src| real source tokens
gets at most ``floor(max_len_a * |src| + max_len_b)`` output tokens (capped by the model's positions),
after which EOS is forced; a sentence leaves the batch as soon as it is finished, so the others run on
a smaller batch. A hypothesis's ``log_prob`` is the model's log-probability of its tokens followed by
EOS, and its ``score`` is ``log_prob / (len(tokens) + 1) ** len_penalty`` (EOS counts, as in fairseq).
"""
from __future__ import annotations

import contextlib
import dataclasses
import numbers
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

import torch
from torch.nn.utils import parametrize

from .modeling import ConvS2S
from .state import DecoderState

__all__ = ["Hypothesis", "beam_search", "greedy_decode"]


@dataclass
class Hypothesis:
    """One finished translation. tokens: output ids without sos/eos; log_prob: the model's log-probability
    of tokens + [eos]; score: log_prob / (len(tokens) + 1) ** len_penalty; attention: [len(tokens) + 1, S]
    (the EOS step last) over the sentence's S real source positions, averaged over decoder layers."""
    tokens: list[int]
    score: float
    log_prob: float
    attention: torch.Tensor = field(repr=False)


# --- shared plumbing --------------------------------------------------------------------------------------------

def _check_number(name: str, value: object, *, minimum: float | None = None, integer: bool = False) -> None:
    kind = numbers.Integral if integer else numbers.Real
    if isinstance(value, bool) or not isinstance(value, kind):
        raise TypeError(f"{name} must be {'an int' if integer else 'a number'}, got {type(value).__name__}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


@contextlib.contextmanager
def _inference(model: ConvS2S) -> Iterator[None]:
    """Eval mode (no dropout), no autograd, weight-normalised weights computed once for the whole search."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), parametrize.cached():
            yield
    finally:
        model.train(was_training)


def _max_lengths(model: ConvS2S, src: torch.Tensor, a: float, b: float) -> torch.Tensor:
    """[B] int64: most output tokens (before EOS) per sentence; the EOS step must still have a position."""
    src_len = src.ne(model.config.pad_id).sum(1).double()
    return (src_len * a + b).floor().long().clamp_(0, model.config.max_positions - 1)


def _stepper(model: ConvS2S, incremental: bool
             ) -> Callable[[torch.Tensor, DecoderState], tuple[torch.Tensor, torch.Tensor, DecoderState]]:
    """(tokens so far [N, t+1], state) -> (logits [N, V], attention [N, S], state) for the next token."""
    if incremental:
        return lambda tokens, state: model.decode_step(tokens[:, -1], state)

    def full(tokens: torch.Tensor, state: DecoderState):
        logits, attn = model.decode(tokens, state.encoder, last_only=True)
        return logits[:, 0], attn[:, 0], dataclasses.replace(state, step=state.step + 1)
    return full


def _check_forbid(model: ConvS2S, forbid: Sequence[int]) -> tuple[int, ...]:
    """``forbid`` as a tuple of target ids; never EOS (every search must be able to end)."""
    if isinstance(forbid, (str, bytes)) or not isinstance(forbid, Sequence):
        raise TypeError(f"forbid must be a sequence of token ids, got {type(forbid).__name__}")
    ids = []
    for i in forbid:
        _check_number("forbid ids", i, minimum=0, integer=True)
        if i >= model.config.tgt_vocab_size:
            raise ValueError(f"forbid holds {i}, outside the target vocabulary of {model.config.tgt_vocab_size}")
        if i == model.config.eos_id:
            raise ValueError("forbid must not hold the eos id: every translation has to be able to end")
        ids.append(int(i))
    return tuple(ids)


def _greedy_stepper(model: ConvS2S, incremental: bool, forbid: tuple[int, ...] = ()
                    ) -> Callable[[torch.Tensor, DecoderState], tuple[torch.Tensor, DecoderState]]:
    """(tokens so far [N, t+1], state) -> (the likeliest next token [N], never pad, sos or one of
    ``forbid``; state)."""
    never = (model.config.pad_id, model.config.sos_id, *forbid)
    if incremental:
        def incremental_step(tokens: torch.Tensor, state: DecoderState):
            nxt, _, state = model.decode_step(tokens[:, -1], state, argmax_exclude=never)
            return nxt, state
        return incremental_step
    step = _stepper(model, incremental)

    def full(tokens: torch.Tensor, state: DecoderState):
        logits, _, state = step(tokens, state)
        return _forbid(logits, model, None, forbid).argmax(1), state
    return full


def _forbid(logits: torch.Tensor, model: ConvS2S, force_eos: torch.Tensor | None,
            forbid: tuple[int, ...] = ()) -> torch.Tensor:
    """Never pad, sos or an id of ``forbid``; rows in force_eos ([N] bool) may only end. In place on
    logits [N, V]."""
    cfg = model.config
    logits[:, cfg.pad_id] = float("-inf")
    logits[:, cfg.sos_id] = float("-inf")
    for i in forbid:
        logits[:, i] = float("-inf")
    if force_eos is not None:
        eos = logits[:, cfg.eos_id].clone()
        logits.masked_fill_(force_eos.unsqueeze(1), float("-inf"))
        logits[:, cfg.eos_id] = eos
    return logits


# --- greedy ------------------------------------------------------------------------------------------------------

def greedy_decode(model: ConvS2S, src: torch.Tensor, *, max_len_a: float = 1.2, max_len_b: float = 10,
                  incremental: bool = True, forbid: Sequence[int] = ()) -> list[list[int]]:
    """Greedy translation of src [B, S] (padded with pad_id) -> per sentence its output ids without
    sos/eos. incremental=False re-runs the decoder over the whole prefix at each step (slow; for checks).
    ``forbid``: target ids never generated (besides pad and sos)."""
    _check_number("max_len_a", max_len_a, minimum=0)
    _check_number("max_len_b", max_len_b, minimum=0)
    forbid = _check_forbid(model, forbid)
    cfg = model.config
    with _inference(model):
        enc = model.encode(src)
        batch = src.shape[0]
        max_len = _max_lengths(model, src, max_len_a, max_len_b)
        out: list[list[int] | None] = [None] * batch
        live = torch.arange(batch)                       # original index of each remaining sentence
        tokens = torch.full((batch, 1), cfg.sos_id, dtype=torch.long, device=src.device)
        state = model.initial_state(enc, 1, incremental=incremental)
        step = _greedy_stepper(model, incremental, forbid)
        for t in range(int(max_len.max()) + 1):
            nxt, state = step(tokens, state)                                                  # [N]
            nxt = torch.where(max_len.eq(t), cfg.eos_id, nxt)     # at its max length a sentence may only end
            tokens = torch.cat([tokens, nxt.unsqueeze(1)], dim=1)
            done = nxt.eq(cfg.eos_id)
            if bool(done.any()):
                for i in done.nonzero().squeeze(1).tolist():
                    out[int(live[i])] = tokens[i, 1:-1].tolist()
                keep = (~done).nonzero().squeeze(1)
                if keep.numel() == 0:
                    break
                live, tokens, max_len = live[keep.cpu()], tokens[keep], max_len[keep]
                state = state.select(keep)
    return out  # type: ignore[return-value]  (every sentence ends: EOS is forced at its max length)


# --- beam search ---------------------------------------------------------------------------------------------------

def beam_search(model: ConvS2S, src: torch.Tensor, *, beam: int = 5, len_penalty: float = 1.0,
                max_len_a: float = 1.2, max_len_b: float = 10, nbest: int = 1,
                incremental: bool = True, forbid: Sequence[int] = ()) -> list[list[Hypothesis]]:
    """Beam search over src [B, S] (padded with pad_id), all sentences batched.

    At each step the 2*beam best continuations of a sentence are taken over all its beams; EOS among the
    best ``beam`` of them finishes a hypothesis, the best ``beam`` others go on. A sentence is done once
    it has ``beam`` finished hypotheses (or reached its max length). Returns per sentence its ``nbest``
    best finished hypotheses, best normalised score first. ``forbid``: target ids never generated
    (besides pad and sos).
    """
    _check_number("beam", beam, minimum=1, integer=True)
    _check_number("nbest", nbest, minimum=1, integer=True)
    if nbest > beam:
        raise ValueError(f"nbest must be <= beam, got nbest={nbest} and beam={beam}")
    _check_number("len_penalty", len_penalty)
    _check_number("max_len_a", max_len_a, minimum=0)
    _check_number("max_len_b", max_len_b, minimum=0)
    forbid = _check_forbid(model, forbid)
    cfg = model.config
    k = int(beam)
    with _inference(model):
        enc = model.encode(src)
        batch, device = src.shape[0], src.device
        max_len = _max_lengths(model, src, max_len_a, max_len_b)
        finished: list[list[Hypothesis]] = [[] for _ in range(batch)]
        src_mask = enc.mask
        live = torch.arange(batch)
        tokens = torch.full((batch * k, 1), cfg.sos_id, dtype=torch.long, device=device)
        attn_hist = enc.keys.new_zeros((batch * k, 0, src.shape[1]))
        # Only the first beam of each sentence is alive at the start (all beams hold the same sos).
        scores = torch.full((batch, k), float("-inf"), dtype=torch.float32, device=device)
        scores[:, 0] = 0.0
        state = model.initial_state(enc, k, incremental=incremental)
        step = _stepper(model, incremental)
        beam_offsets = torch.arange(k, device=device)
        n_finished = torch.zeros(batch, dtype=torch.long, device=device)
        for t in range(int(max_len.max()) + 1):
            n_live = live.numel()
            logits, attn, state = step(tokens, state)                   # [N, V], [N, S]
            vocab = logits.shape[1]
            logp = torch.log_softmax(logits.float(), dim=1)
            force = max_len.eq(t).repeat_interleave(k)
            _forbid(logp, model, force if bool(force.any()) else None, forbid)
            cand = logp.add_(scores.reshape(-1, 1)).reshape(n_live, k * vocab)      # in place: [N, V] is big
            top_scores, top_idx = cand.topk(min(2 * k, k * vocab), dim=1)   # [B', 2k], best first
            top_beam = top_idx.div(vocab, rounding_mode="floor")
            top_tok = top_idx - top_beam * vocab
            is_eos = top_tok.eq(cfg.eos_id)

            # Finish the EOS candidates among the best k (finite: -inf ones come from dead beams).
            fin = is_eos[:, :k] & top_scores[:, :k].isfinite()
            if bool(fin.any()):
                rows = (torch.arange(n_live, device=device).unsqueeze(1) * k + top_beam[:, :k])[fin]
                fin_scores = top_scores[:, :k][fin].tolist()
                fin_sent = fin.nonzero()[:, 0].tolist()
                prefix = tokens[rows, 1:].tolist()
                fin_attn = torch.cat([attn_hist[rows], attn[rows].unsqueeze(1)], dim=1)   # [F, t+1, S]
                for j, (b, lp, toks) in enumerate(zip(fin_sent, fin_scores, prefix)):
                    orig = int(live[b])
                    finished[orig].append(Hypothesis(
                        tokens=toks, score=lp / (len(toks) + 1) ** len_penalty, log_prob=lp,
                        attention=fin_attn[j][:, src_mask[orig]]))
            n_finished += fin.sum(1)
            done = n_finished.ge(k) | max_len.le(t)
            if bool(done.all()):
                break

            # The best k non-EOS candidates go on (there are at least k among the 2k: one EOS per beam).
            order_key = is_eos.long() * top_scores.shape[1] + torch.arange(top_scores.shape[1], device=device)
            pick = order_key.topk(k, dim=1, largest=False).indices       # [B', k], best first
            new_beam = top_beam.gather(1, pick)
            order = (torch.arange(n_live, device=device).unsqueeze(1) * k + new_beam).reshape(-1)
            tokens = torch.cat([tokens.index_select(0, order), top_tok.gather(1, pick).reshape(-1, 1)], dim=1)
            attn_hist = torch.cat([attn_hist.index_select(0, order), attn.index_select(0, order).unsqueeze(1)], dim=1)
            scores = top_scores.gather(1, pick)
            state = state.reorder(order)

            if bool(done.any()):
                keep = (~done).nonzero().squeeze(1)
                rows = (keep.unsqueeze(1) * k + beam_offsets).reshape(-1)
                live, max_len, scores, n_finished = live[keep.cpu()], max_len[keep], scores[keep], n_finished[keep]
                tokens, attn_hist = tokens[rows], attn_hist[rows]
                state = state.select(keep)
    results = []
    for hyps in finished:
        hyps.sort(key=lambda h: h.score, reverse=True)
        results.append(hyps[:nbest])
    return results
