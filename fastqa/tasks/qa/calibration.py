"""Calibrated answer scores: the estimated probability that an answer is right.

A reader's raw score (the span's probability over the document, ``windows``) ranks answers well but is not a
probability of being right: a small reader gives 0.8 to wrong answers and 0.6 to right ones. Platt scaling
maps it to one: ``p(right) = sigmoid(slope * logit(raw) + bias)``, the two numbers fitted by maximum likelihood
on questions the reader was not trained on, "right" meaning an exact match with a gold answer after the
official SQuAD normalisation. The map is monotone, so it never changes which answer comes first.

A fitted ``Calibration`` lives in ``calibration.json`` beside the weights (a run folder or an export; written
by ``fastqa qa-calibrate``) and in an export's meta (``fastqa export`` carries it); ``QAModel`` reports
calibrated scores whenever its model has one.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Mapping, Sequence

from ...errors import UserError

__all__ = ["CALIBRATION_NAME", "Calibration", "fit_platt"]

#: the file holding a model's calibration, beside its weights
CALIBRATION_NAME = "calibration.json"
# Raw scores are clipped this far from 0 and 1 before the logit: a float32 softmax can round to either.
_EPS = 1e-7


def _logit(p: float) -> float:
    p = min(max(float(p), _EPS), 1.0 - _EPS)
    return math.log(p) - math.log1p(-p)


@dataclass(frozen=True)
class Calibration:
    """Platt scaling of a reader's raw answer score: ``p = sigmoid(slope * logit(raw) + bias)``.

    fitted_on: what it was fitted on (file and articles); questions: how many."""

    slope: float
    bias: float
    fitted_on: str
    questions: int
    method: str = "platt"

    def __call__(self, raw: float) -> float:
        z = self.slope * _logit(raw) + self.bias
        return 1.0 / (1.0 + math.exp(-z)) if z >= 0 else math.exp(z) / (1.0 + math.exp(z))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, obj: Any, where: str = "calibration") -> "Calibration":
        """The calibration stored as ``obj``; anything else is a ``UserError`` naming ``where``."""
        if not isinstance(obj, Mapping) or obj.get("method", "platt") != "platt":
            raise UserError(f"{where}: not a Platt calibration (expected {{'method': 'platt', 'slope', 'bias', ...}})")
        try:
            slope, bias = float(obj["slope"]), float(obj["bias"])
            questions = int(obj.get("questions", 0))
        except (KeyError, TypeError, ValueError) as e:
            raise UserError(f"{where}: unreadable calibration ({e!r})") from None
        if not (math.isfinite(slope) and math.isfinite(bias)) or slope <= 0:
            raise UserError(f"{where}: the calibration's slope must be a positive number and its bias finite, "
                            f"got slope {slope}, bias {bias}")
        return cls(slope, bias, str(obj.get("fitted_on", "")), questions)


def fit_platt(raw_scores: Sequence[float], right: Sequence[bool], *, fitted_on: str) -> Calibration:
    """The Platt scaling that maximises the likelihood of ``right`` (one bool per answer) given the answers'
    ``raw_scores`` in [0, 1]. Needs right and wrong answers both, or there is nothing to separate."""
    import torch

    if len(raw_scores) != len(right):
        raise ValueError(f"raw_scores and right differ in length ({len(raw_scores)} vs {len(right)})")
    n_right = sum(bool(r) for r in right)
    if n_right in (0, len(right)):
        raise UserError(f"{fitted_on}: the calibration needs right and wrong answers, got {n_right} right of "
                        f"{len(right)}; fit it on more questions")
    if any(not (0.0 <= float(s) <= 1.0) for s in raw_scores):
        raise ValueError("raw_scores must lie in [0, 1]")
    x = torch.tensor([_logit(s) for s in raw_scores], dtype=torch.float64)
    y = torch.tensor([float(bool(r)) for r in right], dtype=torch.float64)
    # A log-parametrised slope keeps the map increasing: a calibration never reorders answers.
    params = torch.zeros(2, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([params], lr=1.0, max_iter=200, tolerance_grad=1e-10, tolerance_change=1e-12,
                            line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(params[0].exp() * x + params[1], y)
        loss.backward()
        return loss

    opt.step(closure)
    log_slope, bias = params.detach().tolist()
    return Calibration(math.exp(log_slope), bias, fitted_on, len(right))

