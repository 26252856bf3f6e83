"""A padded batch's real positions packed into one row (``PackedBatch``), and when the models pack
(``should_pack``)."""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from .device import reads_are_free

__all__ = ["PACK_BELOW", "PackedBatch", "should_pack"]


# The fast models pack a batch's real positions into one row when they fill less than this share of it (length-
# bucketed training batches rarely do; a batch of mixed lengths -- decoding, evaluation -- does).
PACK_BELOW = 0.875


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

