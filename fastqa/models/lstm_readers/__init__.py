"""The attention tutorial's recurrent QA baselines (LSTM, LSTM + attention, LSTM + pointer):
``LSTMReader(LSTMReaderConfig.from_preset("small", variant="lstm-pointer", word_vocab_size=V))``."""
from .config import PRESETS, VARIANTS, LSTMReaderConfig
from .modeling import LSTMReader

__all__ = ["PRESETS", "VARIANTS", "LSTMReader", "LSTMReaderConfig"]
