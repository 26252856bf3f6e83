"""Pure-PyTorch seeded dropout + residual add: the ground truth and fallback of ``fastqa.dropout_add``.

The keep-mask is a counter-based hash of (seed, element index), computed here with int64 tensor ops
bit for bit as the kernel computes it (``csrc/cpu/dropout_add.cpp`` states the hash): the same seed gives
the same mask on every backend and device, and the backward recomputes it instead of storing it.
"""
from __future__ import annotations

import torch
from torch import nn

__all__ = ["DropoutAdd", "DropoutSeeds", "draw_device_seed", "draw_seed", "dropout_add", "keep_mask",
           "share_dropout_seeds"]

_M32 = 0xFFFFFFFF


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """lowbias32 on int64 tensors holding uint32 values (the multipliers are < 2^31: no int64 overflow)."""
    x = x ^ (x >> 16)
    x = (x * 0x21F0AAAD) & _M32
    x = x ^ (x >> 15)
    x = (x * 0x735A2D97) & _M32
    return x ^ (x >> 15)


def drop_threshold(p: float) -> int:
    """p quantised to 1/65536: an element is kept when its 16 random bits are >= this."""
    return round(p * 65536)


def keep_mask(shape: torch.Size | tuple[int, ...], p: float, seed: int | torch.Tensor,
              device: torch.device | str = "cpu") -> torch.Tensor:
    """Bool [shape]: element i (row-major index) is kept. P(keep) = 1 - round(p * 65536) / 65536.
    seed: an int64, or a one-element int64 tensor on ``device`` (read there, not by the host)."""
    numel = 1
    for s in shape:
        numel *= int(s)
    if isinstance(seed, torch.Tensor):
        seed = seed.reshape(())
    # An arithmetic shift then the mask: the high word's bits, for a negative seed too (int or tensor).
    s0, s1 = seed & _M32, (seed >> 32) & _M32
    j = torch.arange((numel + 1) // 2, dtype=torch.int64, device=device)
    h = _mix32(_mix32((j & _M32) ^ s0) ^ s1 ^ (j >> 32))
    u16 = torch.stack([h & 0xFFFF, h >> 16], dim=1).reshape(-1)[:numel]   # element 2j: low half, 2j+1: high
    return (u16 >= drop_threshold(p)).view(shape)


def dropout_add(branch: torch.Tensor, p: float, seed: int | torch.Tensor, residual: torch.Tensor | None = None,
                example_scale: torch.Tensor | None = None) -> torch.Tensor:
    """residual + branch * keep / P(keep) * example_scale[b] (residual 0 and example_scale 1 when None).

    branch: [B, ...]; residual: branch's shape; example_scale: [B] (e.g. stochastic depth: 0 for an example
    whose sublayer is dropped, 1 / P(survive) otherwise). p in [0, 1], quantised to 1/65536; seed: int64, or
    a one-element int64 tensor on branch's device.
    """
    drop = drop_threshold(p)
    keep_scale = 0.0 if drop >= 65536 else 65536.0 / (65536 - drop)
    factor = keep_mask(branch.shape, p, seed, branch.device).to(branch.dtype) * keep_scale
    if example_scale is not None:
        factor = factor * example_scale.view(-1, *([1] * (branch.dim() - 1)))
    out = branch * factor
    return out if residual is None else residual + out


def draw_seed(generator: torch.Generator | None = None) -> int:
    """A fresh int64 seed from ``generator`` (torch's default CPU generator when None): one draw, so a run
    seeded with torch.manual_seed repeats its masks."""
    return int(torch.randint(-2 ** 63, 2 ** 63 - 1, (), dtype=torch.int64, generator=generator))


def draw_device_seed(device: torch.device, generator: torch.Generator | None = None) -> torch.Tensor:
    """A fresh seed as a one-element int64 tensor on ``device``, drawn there by ``device``'s default generator
    (or ``generator``): no host read, so a GPU step never waits for its seeds, a compiled step has no graph
    break, and a captured CUDA graph draws new seeds at each replay (torch advances the generator's offset on
    the device). torch.manual_seed repeats the seeds; a checkpoint that saves the generators' states resumes
    them. On the CPU the draw is ``draw_seed``'s, so the masks are the ones an int seed from it gives."""
    return _draw_device_seeds(1, device, generator)


def _draw_device_seeds(count: int, device: torch.device, generator: torch.Generator | None = None) -> torch.Tensor:
    """``count`` fresh seeds, int64 [count] on ``device``, in one draw (``draw_device_seed``'s rules)."""
    if generator is not None and generator.device != torch.device(device):
        return _draw_device_seeds(count, generator.device, generator).to(device)
    return torch.randint(-2 ** 63, 2 ** 63 - 1, (count,), dtype=torch.int64, device=device, generator=generator)


class DropoutSeeds:
    """The dropout seeds of one forward of a model, drawn at once: ``draw(device)`` at the start of a training
    forward draws ``per_forward`` seeds in one ``torch.randint`` on the device (where every dropout call drew
    its own), and each dropout call takes the next, ``take()``: a one-element view of that block, nothing
    allocated of its own. Each call has its own seed (masks differ between calls), each forward a fresh block
    (masks differ between steps), torch.manual_seed repeats them, and the draw stays on the device, so a
    captured CUDA graph draws a new block at each replay and a compiled step reads no seed on the host.
    A forward with more dropout calls than ``per_forward`` draws a further block when one runs out (the same
    draws for the same model and input: reproducible still). ``release()`` at the end of the forward: outside
    a drawn forward ``take()`` gives None and the layer draws its own seed, as a layer used alone does."""

    def __init__(self, per_forward: int) -> None:
        if isinstance(per_forward, bool) or not isinstance(per_forward, int) or per_forward < 1:
            raise ValueError(f"per_forward must be a positive int, got {per_forward!r}")
        self.per_forward = per_forward
        self._block: torch.Tensor | None = None
        self._taken = 0

    def draw(self, device: torch.device) -> None:
        """A fresh block of seeds on ``device`` for the forward that starts (the device's default generator)."""
        self._block = _draw_device_seeds(self.per_forward, device)
        self._taken = 0

    def take(self) -> torch.Tensor | None:
        """The next seed of the block ([1] int64, a view), or None outside a drawn forward."""
        if self._block is None:
            return None
        if self._taken == self.per_forward:
            self.draw(self._block.device)
        self._taken += 1
        return self._block[self._taken - 1:self._taken]

    def release(self) -> None:
        """The forward is over: later calls draw their own seeds until the next ``draw``."""
        self._block = None


def share_dropout_seeds(model: nn.Module, per_forward: int) -> DropoutSeeds | None:
    """One ``DropoutSeeds`` of ``per_forward`` seeds for every seeded ``DropoutAdd`` in ``model`` (those whose
    masks hash a seed: this one and ``fastqa.layers.DropoutAdd``); None when it has none (a layer set whose
    dropout draws its masks otherwise), so nothing is drawn for it."""
    layers = [m for m in model.modules() if isinstance(m, DropoutAdd) and m.SEEDED]
    if not layers:
        return None
    seeds = DropoutSeeds(per_forward)
    for layer in layers:
        layer.seeds = seeds
    return seeds


class DropoutAdd(nn.Module):
    """``residual + dropout(branch) * example_scale`` in training, ``residual + branch`` in evaluation (no
    parameters): a sublayer's output dropped and added to its residual. Each training call draws a seed on
    branch's device from its default generator (or ``generator``): ``draw_device_seed``; inside a model's
    forward that shares a ``DropoutSeeds`` (``seeds``, set by ``share_dropout_seeds``), it takes the next seed
    of the forward's block instead."""

    #: Its masks hash a seed (``share_dropout_seeds`` gives it the model's ``DropoutSeeds``).
    SEEDED = True

    def __init__(self, p: float) -> None:
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"p must be in [0, 1], got {p!r}")
        self.p = float(p)
        self.seeds: DropoutSeeds | None = None

    def seed(self, device: torch.device, generator: torch.Generator | None) -> torch.Tensor:
        """This call's seed, [1] int64 on ``device``: the forward's next shared one, or one drawn now (alone,
        or with an explicit ``generator``)."""
        shared = self.seeds.take() if self.seeds is not None and generator is None else None
        return draw_device_seed(device, generator) if shared is None else shared

    def apply_dropout(self, branch: torch.Tensor, residual: torch.Tensor | None, example_scale: torch.Tensor | None,
                      generator: torch.Generator | None) -> torch.Tensor:
        """The training-time computation (forward's arguments)."""
        return dropout_add(branch, self.p, self.seed(branch.device, generator), residual, example_scale)

    def forward(self, branch: torch.Tensor, residual: torch.Tensor | None = None,
                example_scale: torch.Tensor | None = None, generator: torch.Generator | None = None
                ) -> torch.Tensor:
        """branch: [B, ...]; residual: like branch or None; example_scale: [B] or None (training only)."""
        if not self.training or (self.p == 0.0 and example_scale is None):
            return branch if residual is None else residual + branch
        return self.apply_dropout(branch, residual, example_scale, generator)

    def extra_repr(self) -> str:
        return f"p={self.p}"
