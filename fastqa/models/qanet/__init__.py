"""QANet (Yu et al. 2018) built from fastqa's layers: ``QANet(config, layers="fast"|"reference"|"naive")``."""
from .config import LAYERS, PRESETS, QANetConfig
from .modeling import QANet

__all__ = ["LAYERS", "PRESETS", "QANet", "QANetConfig"]
