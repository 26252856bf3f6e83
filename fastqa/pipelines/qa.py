"""Deprecated: ``fastqa.pipelines.qa`` moved to ``fastqa.tasks.qa`` (this alias goes in the next version)."""
from __future__ import annotations

import warnings

from ..tasks.qa.decode import decode_spans
from ..tasks.qa.predictor import QAModel
from ..tasks.qa.readers import MODELS
from ..tasks.qa.task import PredictOutput, QATask, Recipe, predict, span_loss

__all__ = ["MODELS", "Recipe", "QATask", "QAModel", "decode_spans", "span_loss", "predict", "PredictOutput"]

warnings.warn("fastqa.pipelines.qa is deprecated; import from fastqa.tasks.qa", DeprecationWarning, stacklevel=2)
