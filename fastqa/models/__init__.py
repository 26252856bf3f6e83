"""Models built from fastqa layers: QANet, ConvS2S and the recurrent QA baselines."""
