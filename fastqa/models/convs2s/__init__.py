"""ConvS2S (Gehring et al. 2017) on fastqa's GLU convolutions: config with presets, the model (fast or
reference layers, one state_dict), and incremental greedy / beam search decoding."""
from .config import ConvS2SConfig
from .decoding import Hypothesis, beam_search, greedy_decode
from .modeling import ConvS2S
from .state import DecoderState, EncoderOut

__all__ = ["ConvS2S", "ConvS2SConfig", "DecoderState", "EncoderOut", "Hypothesis", "beam_search", "greedy_decode"]
