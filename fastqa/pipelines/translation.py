"""Deprecated: ``fastqa.pipelines.translation`` moved to ``fastqa.tasks.translation`` (this alias goes in the
next version)."""
from __future__ import annotations

import warnings

from ..plots import figure_format as plot_format
from ..plots import plot_attention_map
from ..tasks.translation.task import MTOptions, MTTask, build_task, train_translation
from ..tasks.translation.translator import AttentionMap, Translator

__all__ = ["MTOptions", "MTTask", "build_task", "train_translation", "Translator", "AttentionMap",
           "plot_attention_map", "plot_format"]

warnings.warn("fastqa.pipelines.translation is deprecated; import from fastqa.tasks.translation",
              DeprecationWarning, stacklevel=2)
