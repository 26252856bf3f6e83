"""The inference contract both tasks implement, and the one loader behind it.

``QAModel`` (question answering) and ``Translator`` (translation) are both a ``Predictor``: a trained model with
what it needs to read text, loaded the same way from a shipped model's name, a run folder or an export::

    QAModel.load()                                   # the task's shipped model
    Translator.load("runs/convs2s", device="cuda", layers="reference", threads=2)
    QAModel.load(precision="bf16")                   # weights and activations in bfloat16

``open_model`` reads the payload and checks its kind; ``unreadable_meta`` and ``load_weights`` turn what can go
wrong with a checkpoint into one ``UserError`` format naming the file; ``inference_dtype`` is the one precision
rule and ``cpu_threads`` the one thread rule. The device rule (a CUDA GPU when there is one, else the CPU) is
``fastqa.train.distributed.default_device``, shared with training.
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Collection, Iterator, Protocol, TypeVar

from ..bounds import checked
from ..errors import UserError

if TYPE_CHECKING:
    import torch
    from torch import nn

__all__ = ["Predictor", "cpu_threads", "inference_dtype", "open_model", "unreadable_meta", "load_weights"]

P = TypeVar("P", bound="Predictor")


class Predictor(Protocol):
    """What every task's inference object offers: ``load`` and the device it runs on."""

    device: "torch.device"

    @classmethod
    def load(cls: type[P], name_or_path: str | os.PathLike | None = None, *, device: "str | torch.device | None" = None,
             layers: str | None = None, threads: int | None = None, precision: str | None = None) -> P:
        """The model ``name_or_path`` names (None: the task's shipped model) on ``device`` (None:
        ``fastqa.train.distributed.default_device``), with ``layers`` (the model's layer set; None: its fast layers), ``threads``
        CPU threads (None: PyTorch's default) and ``precision`` (``inference_dtype``)."""
        ...


def inference_dtype(precision: str | None, device: "torch.device") -> "torch.dtype | None":
    """The dtype a model's weights are cast to for ``precision`` on ``device``: None for None (the weights as
    saved, in float32, and the task's own default: a reader on a GPU runs under bf16 autocast); float32 for
    "fp32"; bfloat16 for "bf16" (on a CPU only where the processor multiplies bf16 natively: elsewhere a
    ``UserError`` says so)."""
    import torch

    from .._backend import cpu_bf16_refusal

    if precision is None:
        return None
    if precision not in ("fp32", "bf16"):
        raise ValueError(f"precision must be 'fp32', 'bf16' or None, got {precision!r}")
    if precision == "fp32":
        return torch.float32
    refusal = cpu_bf16_refusal("precision='bf16'") if device.type == "cpu" else None
    if refusal is not None:
        raise UserError(refusal)
    return torch.bfloat16


class cpu_threads:
    """The one thread rule: ``cpu_threads(n)`` sets torch's intra-op CPU thread count to ``n`` (checked against
    its bound; None leaves it as it is). Used as ``with cpu_threads(n):`` the count from before is put back on
    leaving, so a command run in-process leaves its caller's count as it found it."""

    def __init__(self, n: int | None) -> None:
        import torch

        (n,) = checked(threads=n)
        self.before = torch.get_num_threads()
        if n is not None:
            torch.set_num_threads(n)

    def __enter__(self) -> "cpu_threads":
        return self

    def __exit__(self, *exc: object) -> None:
        import torch

        torch.set_num_threads(self.before)


def open_model(name_or_path: str | os.PathLike | None, shipped: str, kinds: Collection[str], what: str,
               map_location: "str | torch.device" = "cpu") -> tuple[dict, Path, dict]:
    """(payload, the file it came from, its meta) of a model: a shipped model's name, a run folder, a checkpoint
    or an export; None: ``shipped``, the task's shipped model (``TaskSpec.shipped``). A payload of a kind not in
    ``kinds`` is a ``UserError`` naming the file and ``what`` the task needs ("a reader")."""
    from ..pretrained import load_payload

    payload, where = load_payload(shipped if name_or_path is None else name_or_path, map_location)
    kind = payload.get("kind")
    if kind not in kinds:
        raise UserError(f"{where}: a {kind!r} checkpoint, not {what} (one of {', '.join(kinds)})")
    return payload, where, payload.get("meta") or {}


@contextlib.contextmanager
def unreadable_meta(where: Path) -> Iterator[None]:
    """Reading a checkpoint's config and vocabularies: a missing key or a bad value is a ``UserError`` naming
    the file."""
    try:
        yield
    except (KeyError, TypeError, ValueError) as e:
        if isinstance(e, UserError):
            raise
        raise UserError(f"{where}: the checkpoint's config or vocabularies are missing or invalid ({e!r})") from None


def load_weights(model: "nn.Module", payload: dict[str, Any], where: Path) -> None:
    """The payload's inference weights (the EMA's when the run kept them) into ``model``; weights that do not
    fit the model are a ``UserError`` naming the file and the first mismatch."""
    from ..train.checkpoint import inference_weights

    try:
        model.load_state_dict(inference_weights(payload))
    except RuntimeError as e:
        lines = str(e).strip().splitlines()
        first = lines[1].strip() if len(lines) > 1 else lines[0]
        raise UserError(f"{where}: the weights do not fit the checkpoint's config ({first})") from None
