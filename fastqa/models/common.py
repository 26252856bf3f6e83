"""Blocks the models share: the config base (presets, dict round trip, field checks), the sinusoidal timing
signal, a highway network, masked log-softmax, sublayer dropout (plain PyTorch) and stochastic depth, the
initialisation of linear layers, and the packing of a padded batch's real positions into one row.

Everything here is plain ``torch.nn`` (models import ``fastqa.layers``, ``fastqa.reference``, ``torch.nn`` and the
argument checks of ``fastqa._checks`` only).
"""
from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Any, ClassVar, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from .. import reference
from .._checks import check_bool, check_choice, check_int, check_number
from ..reference.dropout_add import drop_threshold

__all__ = ["ModelConfig", "PACK_BELOW", "PackedBatch", "check_config", "check_qa_inputs", "FrozenWordVectors", "Highway",
           "dropout", "host_to_device", "init_linear", "masked_log_softmax", "reads_are_free", "should_pack",
           "StochasticDepth", "buffer_in", "survival_prob", "survival_scales", "TimingSignal", "timing_signal", "TorchDropoutAdd"]


class ModelConfig:
    """Base of the models' config dataclasses: named presets, a JSON-able dict round trip, field checks.

    A subclass is a ``@dataclass`` that sets ``PRESETS`` (name -> field values), ``REQUIRED`` (fields a preset
    cannot know, e.g. vocabulary sizes) and ``MODEL`` (the model's name in messages).
    """

    PRESETS: ClassVar[dict[str, dict[str, Any]]] = {}
    REQUIRED: ClassVar[tuple[str, ...]] = ()
    MODEL: ClassVar[str] = "model"

    @classmethod
    def from_preset(cls, name: str, **overrides: Any):
        """The preset ``name`` with ``overrides`` (at least the ``REQUIRED`` fields)."""
        if name not in cls.PRESETS:
            raise ValueError(f"unknown {cls.MODEL} preset {name!r}; known: {', '.join(cls.PRESETS)}")
        return cls.from_dict({**cls.PRESETS[name], **overrides})

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict; ``from_dict`` rebuilds the same config."""
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls, d: dict[str, Any]):
        """Inverse of ``to_dict``; unknown keys and missing ``REQUIRED`` fields raise ValueError naming them."""
        if not isinstance(d, dict):
            raise TypeError(f"{cls.__name__}.from_dict takes a dict, got {type(d).__name__}")
        unknown = sorted(set(d) - {f.name for f in dataclasses.fields(cls)})  # type: ignore[arg-type]
        if unknown:
            raise ValueError(f"unknown {cls.__name__} field(s): {', '.join(unknown)}")
        missing = [k for k in cls.REQUIRED if k not in d]
        if missing:
            raise ValueError(f"{cls.__name__} needs {', '.join(missing)}")
        return cls(**d)

    # -- field checks for __post_init__ (fastqa._checks, the field named "Config.field")
    def _check_int(self, name: str, minimum: int) -> None:
        """An int >= minimum, stored as an int."""
        setattr(self, name, check_int(f"{type(self).__name__}.{name}", getattr(self, name), low=minimum))

    def _check_prob(self, name: str) -> None:
        """A probability in [0, 1), stored as a float."""
        setattr(self, name, check_number(f"{type(self).__name__}.{name}", getattr(self, name), low=0, high=1,
                                         high_open=True))

    def _check_choice(self, name: str, choices: Sequence[str]) -> None:
        check_choice(f"{type(self).__name__}.{name}", getattr(self, name), choices)

    def _check_bool(self, name: str) -> None:
        check_bool(f"{type(self).__name__}.{name}", getattr(self, name))


def check_config(model: str, config: object, config_type: type, layers: str | None = None,
                 choices: Sequence[str] = ()) -> str | None:
    """A model constructor's argument checks: ``config`` is a ``config_type``; ``layers`` (None: the config's)
    is one of ``choices``. Returns the layer backend to use (None for a model without one)."""
    if not isinstance(config, config_type):
        raise TypeError(f"{model}: config must be a {config_type.__name__}, got {type(config).__name__}")
    if not choices:
        return None
    layers = getattr(config, "layers") if layers is None else layers
    if layers not in choices:
        raise ValueError(f"{model}: layers must be one of {tuple(choices)}, got {layers!r}")
    return layers


def _check_ids(model: str, name: str, t: object, ndim: int) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{model}.forward: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != torch.long:
        raise TypeError(f"{model}.forward: {name} must be int64 (torch.long) ids, got {t.dtype}")
    if t.dim() != ndim:
        raise ValueError(f"{model}.forward: {name} must have {ndim} dims, got shape {tuple(t.shape)}")
    return t


def check_qa_inputs(model: str, context_words: object, context_chars: object, question_words: object,
                    question_chars: object) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The checks of a QA model's inputs: context_words [B, n], context_chars [B, n, W], question_words [B, m],
    question_chars [B, m, W'], all int64. Returns them."""
    cw, cc = _check_ids(model, "context_words", context_words, 2), _check_ids(model, "context_chars", context_chars, 3)
    qw, qc = _check_ids(model, "question_words", question_words, 2), _check_ids(model, "question_chars", question_chars, 3)
    if cc.shape[:2] != cw.shape:
        raise ValueError(f"{model}.forward: context_chars {tuple(cc.shape)} must be [B, n, W] with "
                         f"[B, n] = context_words' shape {tuple(cw.shape)}")
    if qc.shape[:2] != qw.shape:
        raise ValueError(f"{model}.forward: question_chars {tuple(qc.shape)} must be [B, m, W] with "
                         f"[B, m] = question_words' shape {tuple(qw.shape)}")
    if qw.shape[0] != cw.shape[0]:
        raise ValueError(f"{model}.forward: question batch {qw.shape[0]} != context batch {cw.shape[0]}")
    return cw, cc, qw, qc


class FrozenWordVectors(nn.Module):
    """Frozen word vectors with a trainable <unk> vector, for a model that subclasses this.

    Parameters ``word_vectors`` [V, dim] (requires_grad False: pre-trained vectors stay as they are, and
    DDP broadcasts them once instead of reducing them every step; the <pad> row is zero, the <unk> row unused)
    and ``unk_vector`` [dim] (trainable: the vector of every word without a pre-trained one).
    """

    def _make_word_vectors(self, vocab_size: int, dim: int, *, pad_id: int, unk_id: int) -> None:
        self._pad_id, self._unk_id = pad_id, unk_id
        self.word_vectors = nn.Parameter(torch.empty(vocab_size, dim), requires_grad=False)
        self.unk_vector = nn.Parameter(torch.empty(dim))

    @torch.no_grad()
    def _init_word_vectors(self) -> None:
        """Random word vectors (until ``load_word_vectors``) with a zero <pad> row; a small random <unk>."""
        std = self.word_vectors.shape[1] ** -0.5
        nn.init.normal_(self.word_vectors, std=std)
        self.word_vectors[self._pad_id].zero_()
        self.word_vectors[self._unk_id].zero_()
        nn.init.normal_(self.unk_vector, std=std)

    @torch.no_grad()
    def load_word_vectors(self, vectors: torch.Tensor) -> None:
        """Copy ``vectors`` [word_vocab_size, word_dim] into the frozen table; the <pad> row stays zero and
        the <unk> row is unused (the trainable ``unk_vector`` stands for <unk>)."""
        if not isinstance(vectors, torch.Tensor) or not vectors.is_floating_point():
            raise TypeError(f"load_word_vectors: vectors must be a floating-point tensor, got "
                            f"{type(vectors).__name__ if not isinstance(vectors, torch.Tensor) else vectors.dtype}")
        expected = tuple(self.word_vectors.shape)
        if tuple(vectors.shape) != expected:
            raise ValueError(f"load_word_vectors: vectors must have shape {expected} "
                             f"[word_vocab_size, word_dim], got {tuple(vectors.shape)}")
        self.word_vectors.copy_(vectors)
        self.word_vectors[self._pad_id].zero_()
        self.word_vectors[self._unk_id].zero_()

    def embed_words(self, words: torch.Tensor) -> torch.Tensor:
        """words: [...] ids -> [..., dim] (<unk> reads ``unk_vector``)."""
        w = F.embedding(words, self.word_vectors)
        return torch.where((words == self._unk_id).unsqueeze(-1), self.unk_vector.to(w.dtype), w)


def timing_signal(length: int, channels: int, *, device: torch.device | None = None,
                  dtype: torch.dtype = torch.float32, min_timescale: float = 1.0,
                  max_timescale: float = 1.0e4) -> torch.Tensor:
    """Sinusoidal position signal (Vaswani et al. 2017, tensor2tensor layout): [length, channels].

    Channel i < C/2 is sin(pos / timescale_i), channel C/2 + i is cos(pos / timescale_i), timescales
    geometric from min to max (an odd C gets a zero last channel). Computed for any length (in float32,
    then cast), so a model evaluates contexts longer than any it was trained on.
    """
    half = channels // 2
    log_step = math.log(max_timescale / min_timescale) / max(half - 1, 1)
    inv = min_timescale * torch.exp(torch.arange(half, device=device, dtype=torch.float32) * -log_step)
    angles = torch.arange(length, device=device, dtype=torch.float32).unsqueeze(1) * inv.unsqueeze(0)
    signal = torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)
    if channels % 2:
        signal = F.pad(signal, (0, 1))
    return signal.to(dtype)


class TimingSignal(nn.Module):
    """``timing_signal`` of ``channels`` channels as a device buffer built once (non-persistent: no state_dict
    entry) and sliced per call, not rebuilt per forward: ``signal(length, dtype)`` -> [length, channels]. A
    longer length than the buffer holds regrows it (a power of two); under ``torch.compile`` such a length is
    computed for the call instead. Values as ``timing_signal``'s (float32, rounded to the model's dtype once;
    cast once under autocast: ``buffer_in``)."""

    def __init__(self, channels: int, length: int = 512) -> None:
        super().__init__()
        self.channels = channels
        self.register_buffer("table", timing_signal(length, channels), persistent=False)

    def forward(self, length: int, dtype: torch.dtype) -> torch.Tensor:
        if length > self.table.shape[0]:
            grown = timing_signal(1 << (length - 1).bit_length(), self.channels, device=self.table.device)
            if torch.compiler.is_compiling():
                return grown[:length].to(dtype)
            self.table = grown.to(self.table.dtype)
        return buffer_in(self, "table", dtype)[:length]


def masked_log_softmax(logits: torch.Tensor, mask: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """log_softmax over the entries where ``mask`` (bool, True = real) holds.

    Masked entries get the dtype's most negative finite logit, so their log-probability is finite
    (never -inf or NaN, also when multiplied by 0) and its exp is exactly 0. logits, mask: same shape.
    """
    return F.log_softmax(logits.masked_fill(~mask, torch.finfo(logits.dtype).min), dim=dim)


def survival_prob(index: int, total: int, layer_dropout: float) -> float:
    """Stochastic depth (Huang et al. 2016, as in QANet): sublayer ``index`` (1..total) survives with
    probability 1 - (index / total) * layer_dropout."""
    return 1.0 - index / total * layer_dropout


def _keep_mask(shape: torch.Size, p: float, device: torch.device,
               generator: torch.Generator | None = None) -> tuple[torch.Tensor, float]:
    """Bool [shape] dropout keep-mask, P(keep) = 1 - p quantised to 1/65536, and that probability.

    Random int64 words viewed as four int16 each: one generator draw per four elements instead of one
    per element (``bernoulli_`` costs ~10x more on the CPU, where dropout masks were a tenth of a QANet
    train step).
    """
    numel = math.prod(shape)
    drop = drop_threshold(p)
    words = torch.randint(-2 ** 63, 2 ** 63 - 1, ((numel + 3) // 4,), dtype=torch.int64, device=device,
                          generator=generator)
    keep = words.view(torch.int16)[:numel] >= drop - 32768
    return keep.view(shape), 1.0 - drop / 65536


def dropout(x: torch.Tensor, p: float, training: bool, generator: torch.Generator | None = None) -> torch.Tensor:
    """Inverted dropout (as F.dropout, with p quantised to 1/65536 and a cheaper mask, see ``_keep_mask``)."""
    if not training or p == 0.0:
        return x
    keep, q = _keep_mask(x.shape, p, x.device, generator)
    return torch.where(keep, x, 0.0).mul_(1.0 / q)  # where, not x * keep: no float copy of the mask


def survival_scales(batch: int, survival: Sequence[float], *, device: torch.device,
                    dtype: torch.dtype) -> torch.Tensor | None:
    """Stochastic depth's per-example factors of S sublayers: [S, batch], 0 where sublayer i's branch is
    dropped for that example (probability 1 - survival[i]), 1 / survival[i] where it is kept (so evaluation
    adds the branch as it is); None when every survival is 1. Per example, not per batch, so every parameter
    takes part in every step, as DistributedDataParallel needs. (A model's blocks draw theirs through a
    ``StochasticDepth``, whose constants are built once.)"""
    if all(s == 1.0 for s in survival):
        return None
    surv = host_to_device(torch.tensor(survival, dtype=torch.float32), device).view(len(survival), 1)
    return _draw_scales(batch, surv, (1.0 / surv).to(dtype))


def _draw_scales(batch: int, survival: torch.Tensor, inverse: torch.Tensor) -> torch.Tensor:
    """survival: [S, 1] float32; inverse: [S, 1], 1 / survival rounded to the scales' dtype -> [S, batch]."""
    # Drawn in float32 whatever the dtype: the same seed gives the same draws in every precision.
    keep = torch.rand(survival.shape[0], batch, device=survival.device) < survival
    return keep * inverse   # exactly the inverse or 0 (no scalar tensor for the 0, as torch.where would make)


def buffer_in(module: nn.Module, name: str, dtype: torch.dtype) -> torch.Tensor:
    """``module``'s buffer ``name`` in ``dtype`` (a model's constant under autocast): cast once and kept on the module
    while the buffer is the same (device, storage, version), not cast per call."""
    buffer = getattr(module, name)
    if buffer.dtype == dtype or torch.compiler.is_compiling():
        return buffer.to(dtype)
    key = (dtype, buffer.device, buffer.data_ptr(), buffer._version)
    kept = module.__dict__.setdefault("_buffer_casts", {})
    if name not in kept or kept[name][0] != key:
        kept[name] = (key, buffer.to(dtype))
    return kept[name][1]


class StochasticDepth(nn.Module):
    """``survival_scales`` of fixed survival probabilities, their constants built once as device buffers (not
    per call from a fresh host tensor, which a captured CUDA graph would replay stale): ``depth(batch, dtype)``
    -> [S, batch] or None when every survival is 1. Non-persistent buffers: no state_dict entry.

    The survival probabilities are kept as their float32 bit patterns (int32), out of reach of ``model.to(dtype)``:
    the draws compare with the float32 values in every precision. Their inverses follow the model's dtype as
    the factors do, cast once under autocast (``buffer_in``)."""

    def __init__(self, survival: Sequence[float]) -> None:
        super().__init__()
        self.active = any(s != 1.0 for s in survival)
        surv = torch.tensor(list(survival), dtype=torch.float32).view(-1, 1)
        self.register_buffer("survival_bits", surv.view(torch.int32), persistent=False)
        self.register_buffer("inverse", 1.0 / surv, persistent=False)

    def forward(self, batch: int, dtype: torch.dtype) -> torch.Tensor | None:
        if not self.active:
            return None
        return _draw_scales(batch, self.survival_bits.view(torch.float32), buffer_in(self, "inverse", dtype))


def host_to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A small CPU tensor built from Python values, on ``device``. To a GPU through pinned memory and a
    non-blocking copy: a plain ``.to("cuda")`` of pageable memory makes the host wait for the stream (a host
    sync per call, several per train step)."""
    if device.type != "cuda" or torch.compiler.is_compiling():
        # Under torch.compile the values are constants of the graph (and dynamo cannot trace pin_memory).
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


class TorchDropoutAdd(reference.DropoutAdd):
    """``fastqa.reference.DropoutAdd`` with its masks drawn from torch's generator (``_keep_mask``) instead of
    hashed from a seed: the models' pure-PyTorch layer sets. (The reference layer reproduces the fused
    layer's masks bit for bit, but with ~15 integer passes per call it would make a slow baseline.)"""

    def apply_dropout(self, branch: torch.Tensor, residual: torch.Tensor | None, example_scale: torch.Tensor | None,
                      generator: torch.Generator | None) -> torch.Tensor:
        branch = dropout(branch, self.p, True, generator)
        if example_scale is None:
            return branch if residual is None else residual + branch
        scale = example_scale.view(-1, *([1] * (branch.dim() - 1)))
        return branch * scale if residual is None else torch.addcmul(residual, branch, scale)


def init_linear(linear: nn.Linear) -> nn.Linear:
    """Xavier-uniform weight, zero bias (the initialisation of every nn.Linear of the models)."""
    nn.init.xavier_uniform_(linear.weight)
    if linear.bias is not None:
        nn.init.zeros_(linear.bias)
    return linear


class Highway(nn.Module):
    """Highway network (Srivastava et al. 2015) on [..., dim] data.

    Layer i: [h; g] = layers[i](x) (transform and gate in one GEMM, ``nn.Linear(dim, 2 * dim)``),
    x <- x + sigmoid(g) * (dropout(relu(h)) - x), i.e. g*h + (1-g)*x.
    """

    def __init__(self, dim: int, num_layers: int = 2, dropout: float = 0.0,
                 linear: type[nn.Linear] = nn.Linear, dropout_layer: type[nn.Module] = TorchDropoutAdd) -> None:
        super().__init__()
        self.dropout = dropout_layer(dropout)
        self.layers = nn.ModuleList(init_linear(linear(dim, 2 * dim)) for _ in range(num_layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [..., dim] -> [..., dim]."""
        for layer in self.layers:
            h, g = layer(x).chunk(2, dim=-1)
            h = self.dropout(F.relu(h))
            x = torch.addcmul(x, torch.sigmoid(g), h - x)
        return x


# The fast models pack a batch's real positions into one row when they fill less than this share of it (length-
# bucketed training batches rarely do; a batch of mixed lengths -- decoding, evaluation -- does).
PACK_BELOW = 0.875


def reads_are_free(device: torch.device) -> bool:
    """Whether the host may read a tensor's values on ``device`` (a count, ``nonzero``) without waiting for the
    device: True on the CPU, False on a GPU, where the models decide such things without reading -- and False
    while ``torch.compile`` traces, whose graph holds no host read (a read would break it in two)."""
    return device.type != "cuda" and not torch.compiler.is_compiling()


def should_pack(mask: torch.Tensor, *, every_row_real: bool = False) -> bool:
    """Whether to pack a padded batch (mask [B, L] bool, True = real) into one row: its real positions fill
    less than ``PACK_BELOW`` of it (and, with ``every_row_real``, every row has one).

    Never for CUDA tensors: the decision needs the count of real positions on the host, a device->host copy
    that stalls the host once per call (and packing needs more: the packed length, the segment lengths for
    attention). On a GPU the padded rows cost little next to those stalls, and the padded batch runs every op
    as one call, so the models keep the padding there. On the CPU the count is free and packing saves the
    padding's share of the work."""
    if not reads_are_free(mask.device):
        return False
    real = mask.sum(1)
    if every_row_real and not bool(real.all()):
        return False
    return int(real.sum()) < PACK_BELOW * mask.numel()


@dataclass(frozen=True)
class PackedBatch:
    """A padded batch's real positions packed into one row: [B, L] -> [1, P].

    Sequence b's real positions come in order, then ``gap`` masked rows before sequence b + 1 (the zeros a
    centred convolution of width 2 * gap + 1 reads past each end, so every real position sees what it sees
    padded). Position-wise work then skips the padding; attention takes ``segments``. Building one reads
    lengths on the host, so the models pack CPU batches only (``should_pack``).
    """

    rows: torch.Tensor   # [R] int64: the packed row of each real position, in the mask's row-major order
    mask: torch.Tensor   # [1, P] bool: True at the real rows, False at the gaps
    lengths: torch.Tensor  # [B] int64: real positions per sequence
    gap: int
    flat: torch.Tensor   # [R] int64: each real position's row in the padded batch flattened to [B * L]

    @classmethod
    def of(cls, mask: torch.Tensor, gap: int) -> "PackedBatch":
        """mask: [B, L] bool (True = real) -> the packing, gap masked rows between neighbours."""
        lengths = mask.sum(1)
        starts = torch.cumsum(lengths + gap, 0) - lengths - gap      # sequence b starts after b gaps
        rank = mask.cumsum(1) - 1                                    # [B, L]: index of the position in its row
        rows = (starts.unsqueeze(1) + rank)[mask]
        total = int(lengths.sum()) + gap * (mask.shape[0] - 1)
        packed_mask = torch.zeros(1, max(total, 1), dtype=torch.bool, device=mask.device)
        packed_mask[0, rows] = True
        return cls(rows, packed_mask, lengths, gap, mask.flatten().nonzero().squeeze(1))

    @functools.cached_property
    def _segment_rows(self) -> torch.Tensor:
        """[B] int64: rows of each sequence in the packed row, its trailing gap included (sums to P). Cached:
        every encoder block of a forward asks (the frozen dataclass has no __slots__, so caching works)."""
        seg = self.lengths + self.gap
        seg[-1] -= self.gap
        return seg

    @functools.cached_property
    def _segment_list(self) -> tuple[int, ...]:
        return tuple(self._segment_rows.tolist())

    def segments(self) -> list[int]:
        """Rows of each sequence in the packed row, its trailing gap included (sums to P)."""
        return list(self._segment_list)

    def per_row(self, values: torch.Tensor) -> torch.Tensor:
        """values: [..., B], one per sequence -> [..., P]: each packed row its sequence's value."""
        return values.repeat_interleave(self._segment_rows, dim=-1)

    def pack(self, x: torch.Tensor) -> torch.Tensor:
        """x: [B, L, C], the padded batch -> [1, P, C] (zeros at the gaps). Gathers by row index: boolean
        indexing (masked_select) ran single-threaded, ~38 ms on the paper model's [32, 400, 501] input."""
        real = x.reshape(-1, x.shape[-1]).index_select(0, self.flat)
        return x.new_zeros(self.mask.shape[1], x.shape[-1]).index_copy(0, self.rows, real).unsqueeze(0)

    def unpack(self, x: torch.Tensor, batch_shape: tuple[int, int]) -> torch.Tensor:
        """x: [1, P, C] -> [B, L, C] (zeros at the padding); batch_shape: (B, L)."""
        b, length = batch_shape
        out = x.new_zeros(b * length, x.shape[-1]).index_copy(0, self.flat, x[0].index_select(0, self.rows))
        return out.view(b, length, x.shape[-1])
