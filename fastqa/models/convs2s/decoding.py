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

No host read inside the step loop: which sentences are finished, their tokens and (beam search) their
finished hypotheses are kept on the device, and the host looks at them only every ``sync_every`` steps,
to stop once every sentence is done and to drop the finished ones from the batch. On a GPU each such read
waits for the device; on the CPU it costs nothing, so there the default is every step.

On CUDA (``graphs``, by default there) each incremental step runs through static buffers as a CUDA graph
per row bucket (``graphed``): the host issues one replay per step instead of every layer's launches, and the
tokens are the same.
"""
from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

import torch
from torch.nn.utils import parametrize

from ..._checks import arguments_checked, check_int, check_number
from .graphed import StaticDecoding
from .modeling import ConvS2S
from .state import DecoderState, EncoderOut

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

@contextlib.contextmanager
def _inference(model: ConvS2S, cache: bool = True) -> Iterator[None]:
    """Eval mode (no dropout), no autograd, weight-normalised weights computed once for the whole search
    (``cache``; not while CUDA graphs are captured: a graph must not read values freed after the search), and
    the ops' argument checks skipped: a search checks its arguments, and ``encode`` the source, before the
    steps, whose every op argument the search builds from them."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), parametrize.cached() if cache else contextlib.nullcontext(), arguments_checked():
            yield
    finally:
        model.train(was_training)


def _max_lengths(model: ConvS2S, src: torch.Tensor, a: float, b: float) -> torch.Tensor:
    """[B] int64: most output tokens (before EOS) per sentence; the EOS step must still have a position."""
    src_len = src.ne(model.config.pad_id).sum(1).double()
    return (src_len * a + b).floor().long().clamp_(0, model.config.max_positions - 1)


def _sync_interval(device: torch.device, sync_every: int | None) -> int:
    """Steps between the host's looks at which sentences are finished: ``sync_every``, or by default every
    step on the CPU (a read costs nothing there, and finished sentences leave the batch at once) and every
    8 steps on an accelerator (each read stalls the launch queue)."""
    if sync_every is None:
        return 1 if device.type == "cpu" else 8
    return check_int("sync_every", sync_every, low=1)


def _stepper(model: ConvS2S, incremental: bool
             ) -> Callable[[torch.Tensor, DecoderState], tuple[torch.Tensor, torch.Tensor, DecoderState]]:
    """(tokens so far [N, t+1], state) -> (logits [N, V], attention [N, S], state) for the next token."""
    if incremental:
        return lambda tokens, state: model.decode_step(tokens[:, -1], state)

    def full(tokens: torch.Tensor, state: DecoderState):
        logits, attn = model.decode(tokens, state.encoder, last_only=True)
        return logits[:, 0], attn[:, 0], dataclasses.replace(state, step=state.step + 1)
    return full


def _use_graphs(device: torch.device, incremental: bool, graphs: bool | None) -> bool:
    """Whether the search steps through static buffers (``graphed``): ``graphs``, by default on CUDA (captured
    there; on the CPU the same buffers run eagerly). Incremental decoding only."""
    if graphs is None:
        return incremental and device.type == "cuda"
    if graphs and not incremental:
        raise ValueError("graphs=True needs incremental decoding (incremental=True)")
    return bool(graphs)


def _static_greedy(model: ConvS2S, state: DecoderState, never: tuple[int, ...]):
    """(the static state, its greedy stepper) for a search starting at ``state``."""
    static = StaticDecoding.of(model).start(state, argmax_exclude=never)
    return static, lambda tokens, st: (st.step(tokens[:, -1])[0], st)


def _static_stepper(model: ConvS2S, state: DecoderState):
    """(the static state, its stepper returning logits and attention) for a search starting at ``state``."""
    static = StaticDecoding.of(model).start(state, argmax_exclude=None)
    return static, lambda tokens, st: (*st.step(tokens[:, -1]), st)


def _check_forbid(model: ConvS2S, forbid: Sequence[int]) -> tuple[int, ...]:
    """``forbid`` as a tuple of target ids; never EOS (every search must be able to end)."""
    if isinstance(forbid, (str, bytes)) or not isinstance(forbid, Sequence):
        raise TypeError(f"forbid must be a sequence of token ids, got {type(forbid).__name__}")
    ids = []
    for i in forbid:
        i = check_int("forbid ids", i, low=0)
        if i >= model.config.tgt_vocab_size:
            raise ValueError(f"forbid holds {i}, outside the target vocabulary of {model.config.tgt_vocab_size}")
        if i == model.config.eos_id:
            raise ValueError("forbid must not hold the eos id: every translation has to be able to end")
        ids.append(i)
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
                  incremental: bool = True, forbid: Sequence[int] = (), sync_every: int | None = None,
                  graphs: bool | None = None) -> list[list[int]]:
    """Greedy translation of src [B, S] (padded with pad_id) -> per sentence its output ids without
    sos/eos. incremental=False re-runs the decoder over the whole prefix at each step (slow; for checks).
    ``forbid``: target ids never generated (besides pad and sos). ``sync_every``: steps between the host's
    looks at which sentences are finished (module docstring). ``graphs``: each step through static buffers,
    a CUDA graph per row bucket (``graphed``; default: on CUDA), the same tokens."""
    max_len_a = check_number("max_len_a", max_len_a, low=0)
    max_len_b = check_number("max_len_b", max_len_b, low=0)
    forbid = _check_forbid(model, forbid)
    cfg = model.config
    check = _sync_interval(src.device, sync_every)
    static = _use_graphs(src.device, incremental, graphs)
    with _inference(model, cache=not (static and src.device.type == "cuda")):
        enc = model.encode(src)
        batch, device = src.shape[0], src.device
        max_len = _max_lengths(model, src, max_len_a, max_len_b)
        steps = int(max_len.max()) + 1
        # Row b of out holds sentence b's tokens up to its first EOS (later entries are never read).
        out = torch.full((batch, steps), cfg.eos_id, dtype=torch.long, device=device)
        live = torch.arange(batch, device=device)        # original index of each remaining sentence
        done = torch.zeros(batch, dtype=torch.bool, device=device)
        tokens = torch.full((batch, 1), cfg.sos_id, dtype=torch.long, device=device)
        state = model.initial_state(enc, 1, incremental=incremental)
        step = _greedy_stepper(model, incremental, forbid)
        if static:
            state, step = _static_greedy(model, state, (cfg.pad_id, cfg.sos_id, *forbid))
        for t in range(steps):
            nxt, state = step(tokens, state)                                                  # [N]
            nxt = torch.where(max_len.eq(t), cfg.eos_id, nxt)     # at its max length a sentence may only end
            out[live, t] = nxt
            tokens = torch.cat([tokens, nxt.unsqueeze(1)], dim=1)
            done = done | nxt.eq(cfg.eos_id)
            if (t + 1) % check == 0 and t + 1 < steps:
                keep = (~done).nonzero().squeeze(1)                                   # the host read
                if keep.numel() == 0:
                    break
                if keep.numel() < live.numel():
                    live, tokens, max_len, done = live[keep], tokens[keep], max_len[keep], done[keep]
                    state = state.select(keep)
        rows = out.tolist()
    # Every sentence holds an EOS: it is forced at the sentence's max length, which is below ``steps``.
    return [row[:row.index(cfg.eos_id)] for row in rows]


# --- beam search ---------------------------------------------------------------------------------------------------

def beam_search(model: ConvS2S, src: torch.Tensor, *, beam: int = 5, len_penalty: float = 1.0,
                max_len_a: float = 1.2, max_len_b: float = 10, nbest: int = 1,
                incremental: bool = True, forbid: Sequence[int] = (), sync_every: int | None = None,
                graphs: bool | None = None) -> list[list[Hypothesis]]:
    """Beam search over src [B, S] (padded with pad_id), all sentences batched.

    At each step the 2*beam best continuations of a sentence are taken over all its beams; EOS among the
    best ``beam`` of them finishes a hypothesis, the best ``beam`` others go on. A sentence is done once
    it has ``beam`` finished hypotheses (or reached its max length). Returns per sentence its ``nbest``
    best finished hypotheses, best normalised score first. ``forbid``: target ids never generated
    (besides pad and sos). ``sync_every``: steps between the host's looks at which sentences are done
    (module docstring). ``graphs``: each step through static buffers, a CUDA graph per row bucket
    (``graphed``; default: on CUDA), the same hypotheses.
    """
    beam = check_int("beam", beam, low=1)
    nbest = check_int("nbest", nbest, low=1)
    if nbest > beam:
        raise ValueError(f"nbest must be <= beam, got nbest={nbest} and beam={beam}")
    len_penalty = check_number("len_penalty", len_penalty)
    max_len_a = check_number("max_len_a", max_len_a, low=0)
    max_len_b = check_number("max_len_b", max_len_b, low=0)
    forbid = _check_forbid(model, forbid)
    k = int(beam)
    check = _sync_interval(src.device, sync_every)
    static = _use_graphs(src.device, incremental, graphs)
    with _inference(model, cache=not (static and src.device.type == "cuda")):
        enc = model.encode(src)
        max_len = _max_lengths(model, src, max_len_a, max_len_b)
        steps = int(max_len.max()) + 1
        finished = _FinishedHypotheses(src.shape[0], k, steps, src.shape[1], enc.keys.dtype, src.device)
        beams = _Beams.start(model, enc, src, k, max_len, incremental=incremental)
        step = _stepper(model, incremental)
        if static:
            beams.state, step = _static_stepper(model, beams.state)
        for t in range(steps):
            logits, attn, beams.state = step(beams.tokens, beams.state)                   # [N, V], [N, S]
            logp = torch.log_softmax(logits.float(), dim=1)
            _forbid(logp, model, beams.max_len.eq(t).repeat_interleave(k), forbid)
            beams.advance(logp, attn, t, finished, model.config.eos_id)
            if (t + 1) % check == 0 and t + 1 < steps:
                keep = (~beams.done).nonzero().squeeze(1)                                   # the host read
                if keep.numel() == 0:
                    break
                if keep.numel() < beams.live.numel():
                    beams.select(keep)
        return finished.best(nbest, len_penalty, enc.mask)


@dataclass
class _Beams:
    """The beams of the sentences a beam search still holds (B' of them, k beams each: N = B' * k rows).

    live [B']: each remaining sentence's original index; max_len, done [B']; tokens [N, t + 1] (sos first);
    attn_hist [N, t, S]: each step's attention; scores [B', k]: each beam's log-probability; state: the
    decoder's, per row."""

    k: int
    live: torch.Tensor
    max_len: torch.Tensor
    done: torch.Tensor
    tokens: torch.Tensor
    attn_hist: torch.Tensor
    scores: torch.Tensor
    state: DecoderState

    @classmethod
    def start(cls, model: ConvS2S, enc: EncoderOut, src: torch.Tensor, k: int, max_len: torch.Tensor, *,
              incremental: bool) -> "_Beams":
        """Every sentence's k beams holding sos; only the first of each is alive (the others score -inf)."""
        batch, device, src_len = src.shape[0], src.device, src.shape[1]
        scores = torch.full((batch, k), float("-inf"), dtype=torch.float32, device=device)
        scores[:, 0] = 0.0
        return cls(k, live=torch.arange(batch, device=device), max_len=max_len,
                   done=torch.zeros(batch, dtype=torch.bool, device=device),
                   tokens=torch.full((batch * k, 1), model.config.sos_id, dtype=torch.long, device=device),
                   attn_hist=enc.keys.new_zeros((batch * k, 0, src_len)), scores=scores,
                   state=model.initial_state(enc, k, incremental=incremental))

    def advance(self, logp: torch.Tensor, attn: torch.Tensor, t: int, finished: "_FinishedHypotheses",
                eos_id: int) -> None:
        """Step t: logp [N, V] (consumed: scores are added in place, [N, V] is big), attn [N, S]. The EOS
        candidates among the best k finish; the best k others go on."""
        k, n_live, device = self.k, self.live.numel(), logp.device
        vocab = logp.shape[1]
        cand = logp.add_(self.scores.reshape(-1, 1)).reshape(n_live, k * vocab)
        top_scores, top_idx = cand.topk(min(2 * k, k * vocab), dim=1)   # [B', 2k], best first
        top_beam = top_idx.div(vocab, rounding_mode="floor")
        top_tok = top_idx - top_beam * vocab
        is_eos = top_tok.eq(eos_id)

        # Finish the EOS candidates among the best k (finite: -inf ones come from dead beams) of the
        # sentences not done yet (a done sentence stays in the batch until the host next looks).
        fin = is_eos[:, :k] & top_scores[:, :k].isfinite() & ~self.done.unsqueeze(1)
        rows = torch.arange(n_live, device=device).unsqueeze(1) * k + top_beam[:, :k]        # [B', k]
        attn_hist = torch.cat([self.attn_hist, attn.unsqueeze(1)], dim=1)               # [N, t+1, S]
        finished.add(self.live, fin, top_scores[:, :k], self.tokens[:, 1:], rows, attn_hist)
        self.done = self.done | finished.count[self.live].ge(k) | self.max_len.le(t)

        # The best k non-EOS candidates go on (there are at least k among the 2k: one EOS per beam).
        order_key = is_eos.long() * top_scores.shape[1] + torch.arange(top_scores.shape[1], device=device)
        pick = order_key.topk(k, dim=1, largest=False).indices       # [B', k], best first
        new_beam = top_beam.gather(1, pick)
        order = (torch.arange(n_live, device=device).unsqueeze(1) * k + new_beam).reshape(-1)
        self.tokens = torch.cat([self.tokens.index_select(0, order), top_tok.gather(1, pick).reshape(-1, 1)], dim=1)
        self.attn_hist = attn_hist.index_select(0, order)
        self.scores = top_scores.gather(1, pick)
        self.state = self.state.reorder(order, check=False)      # each row's new beam is one of its own sentence's

    def select(self, keep: torch.Tensor) -> None:
        """Keep the sentences ``keep`` [B''] (indices into the live ones) and their beams."""
        rows = (keep.unsqueeze(1) * self.k + torch.arange(self.k, device=keep.device)).reshape(-1)
        self.live, self.max_len, self.scores, self.done = (self.live[keep], self.max_len[keep], self.scores[keep],
                                                           self.done[keep])
        self.tokens, self.attn_hist = self.tokens[rows], self.attn_hist[rows]
        self.state = self.state.select(keep)


class _FinishedHypotheses:
    """The finished hypotheses of a beam search, on the device: per sentence up to 2k slots (a sentence
    with fewer than k finishes gains at most k in its last step), filled in the order they finish, and one
    spare slot that takes the writes of candidates that did not finish (so no step needs the host to know
    which did). Slot s of sentence b: its log-probability, its length (tokens before EOS), its tokens and its
    attention rows (the EOS step's included)."""

    def __init__(self, batch: int, k: int, steps: int, src_len: int, attn_dtype: torch.dtype,
                 device: torch.device) -> None:
        self.spare = 2 * k
        slots = 2 * k + 1
        self.log_prob = torch.full((batch, slots), float("-inf"), dtype=torch.float32, device=device)
        self.length = torch.zeros((batch, slots), dtype=torch.long, device=device)
        self.tokens = torch.zeros((batch, slots, steps), dtype=torch.long, device=device)
        self.attention = torch.zeros((batch, slots, steps, src_len), dtype=attn_dtype, device=device)
        self.count = torch.zeros(batch, dtype=torch.long, device=device)

    def add(self, live: torch.Tensor, fin: torch.Tensor, log_prob: torch.Tensor, prefixes: torch.Tensor,
            rows: torch.Tensor, attention: torch.Tensor) -> None:
        """Record the candidates ``fin`` [B', k] (bool) of the live sentences ``live`` [B']: their
        log-probabilities [B', k], and the tokens ([N, t] prefixes) and attention ([N, t+1, S]) of the
        beam rows ``rows`` [B', k] they extend."""
        n_live, k = fin.shape
        t = prefixes.shape[1]
        slot = torch.where(fin, self.count[live].unsqueeze(1) + fin.long().cumsum(1) - 1, self.spare).reshape(-1)
        sentence = live.unsqueeze(1).expand(n_live, k).reshape(-1)
        flat_rows = rows.reshape(-1)
        self.log_prob.index_put_((sentence, slot), log_prob.reshape(-1))
        self.length.index_put_((sentence, slot), torch.full_like(slot, t))
        self.tokens[:, :, :t].index_put_((sentence, slot), prefixes.index_select(0, flat_rows))
        self.attention[:, :, :t + 1].index_put_((sentence, slot), attention.index_select(0, flat_rows))
        self.count.index_add_(0, live, fin.sum(1))

    def best(self, nbest: int, len_penalty: float, src_mask: torch.Tensor) -> list[list[Hypothesis]]:
        """Per sentence its ``nbest`` best hypotheses by normalised score (ties: the earlier finished);
        attention over the sentence's real source positions (``src_mask`` [B, S])."""
        counts = self.count.clamp(max=self.spare).tolist()
        log_probs, lengths, tokens = self.log_prob.tolist(), self.length.tolist(), self.tokens.tolist()
        attention, src_mask = self.attention.cpu(), src_mask.cpu()
        results = []
        for b, n in enumerate(counts):
            hyps = [Hypothesis(tokens=tokens[b][s][:lengths[b][s]],
                               score=log_probs[b][s] / (lengths[b][s] + 1) ** len_penalty, log_prob=log_probs[b][s],
                               attention=attention[b, s, :lengths[b][s] + 1][:, src_mask[b]])
                    for s in range(n)]
            hyps.sort(key=lambda h: h.score, reverse=True)
            results.append(hyps[:nbest])
        return results
