"""Models built from fastqa layers (QANet, ConvS2S): they arrive with the model issues."""
